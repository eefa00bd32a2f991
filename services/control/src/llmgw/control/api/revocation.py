"""Revoked certificates, enforced: refused on every call, and their open streams ended.

Every control plane follows ``revocations/`` in etcd (store/trust.py) and
puts the list in force here (:meth:`Enforcer.apply`). The authorization
interceptor (auth.py) asks :meth:`Enforcer.why` for each new call, and
registers each streaming call it admits (:meth:`Enforcer.open`); when a
revocation arrives, the streams of the certificates it covers are ended at
once with PERMISSION_DENIED saying why (their handler task is cancelled,
then aborted by the interceptor), on every control plane, without a
restart. An agent or router whose certificate is revoked reconnects and is
refused.

gRPC verifies certificates at the handshake, which has no hook for a
revocation list; checking each call is what makes a revocation hold on
connections already open, too.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from functools import lru_cache

from cryptography import x509

from llmgw.common.pki import identity_of, serial_hex

from ..store.trust import RevocationList

log = logging.getLogger("llmgw.control.api.revocation")


@dataclass(frozen=True)
class CertFacts:
    serial: str
    role: str
    name: str
    not_before: float


@lru_cache(maxsize=4096)
def facts(pem: bytes) -> CertFacts | None:
    """What a revocation can name of a (verified) certificate; None when it has no llmgw identity."""
    identity = identity_of(pem)
    if identity is None:
        return None
    cert = x509.load_pem_x509_certificate(pem)
    return CertFacts(
        serial_hex(cert.serial_number), identity.role, identity.name, cert.not_valid_before_utc.timestamp()
    )


@dataclass
class _Stream:
    facts: CertFacts
    task: asyncio.Task
    reason: str = ""


class Enforcer:
    """The revocations in force on this control plane, and the streams they may end."""

    def __init__(self) -> None:
        self._list = RevocationList()
        self._streams: dict[int, _Stream] = {}
        self.ended = 0

    @property
    def revocations(self) -> RevocationList:
        return self._list

    def why(self, pem: bytes) -> str:
        """Why the certificate is revoked; "" when it is not (or names no llmgw identity)."""
        f = facts(pem)
        if f is None:
            return ""
        return self._list.why(f.serial, f.role, f.name, f.not_before)

    def apply(self, revocations: RevocationList) -> None:
        """Put a new list in force and end the open streams of what it revokes."""
        self._list = revocations
        for stream in list(self._streams.values()):
            f = stream.facts
            reason = revocations.why(f.serial, f.role, f.name, f.not_before)
            if reason and not stream.reason:
                log.warning("ending a stream of %s %s: %s", f.role, f.name, reason)
                stream.reason = reason
                self.ended += 1
                stream.task.cancel()

    def open(self, pem: bytes) -> int:
        """Register the current task's stream; the key for :meth:`close` (0: nothing to track)."""
        f = facts(pem)
        task = asyncio.current_task()
        if f is None or task is None:
            return 0
        key = id(task)
        self._streams[key] = _Stream(f, task)
        return key

    def close(self, key: int) -> str:
        """Forget a stream; why it was ended by a revocation ("" if it was not)."""
        stream = self._streams.pop(key, None)
        return stream.reason if stream else ""
