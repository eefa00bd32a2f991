"""Join tokens, the ledger of certificates issued through them, and certificate revocations, in etcd.

Keys (under the cluster's prefix):

- ``join-tokens/<id>``: a serialized ``llmgw.v1.JoinToken``: the SHA-256 of
  its secret (never the secret), expiry, uses allowed and made, who used it.
- ``issued/<serial>``: a ``llmgw.v1.IssuedCertificate`` for every
  certificate a join signed: what "this node id has a live identity" is
  checked against, and what a revocation by identity can list.
- ``revocations/serial/<serial>`` and ``revocations/identity/<role>/<name>``:
  ``llmgw.v1.Revocation`` records. A serial revocation takes one certificate
  out of service; an identity revocation takes out every certificate of
  that identity valid from before ``revoked_at`` (``llmgw certs issue``
  backdates a certificate five minutes for clock skew, so one issued in the
  five minutes after the revocation is covered too; a join waits for no
  one: it starts its certificate's validity after the cutoff).

Decisions:

- A token is ``llmgw-jt.<id>.<secret>``: the id (6 characters) is public and
  names the record; the secret (256 random bits) is compared by its SHA-256
  in constant time. A plain hash is enough for a random secret, as for
  client keys (api/keys.py).
- A use is counted in the same transaction that records the certificate,
  guarded on the token's revision: two joins racing for a token's last use
  cannot both succeed (the loser re-reads and is told it is used up).
- Tokens are kept after they expire, are used up or revoked, so a late
  join is told which; they are deleted a week after they expire (when the
  next token is created).
- Every method is a few etcd round trips and validates before it writes.
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import hmac
import logging
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from google.protobuf.message import DecodeError

from llmgw.common.errors import Conflict, InvalidArgument, NotFound, PermissionDenied
from llmgw.common.etcd import Compacted, Delete, Entry, ModRevisionIs, Put, Store
from llmgw.common.pki import ID_PATTERN, ROLES, parse_serial
from llmgw.v1 import trust_pb2

log = logging.getLogger("llmgw.control.store.trust")

TOKENS_PREFIX = "join-tokens/"
ISSUED_PREFIX = "issued/"
REVOCATIONS_PREFIX = "revocations/"
SERIAL_PREFIX = REVOCATIONS_PREFIX + "serial/"
IDENTITY_PREFIX = REVOCATIONS_PREFIX + "identity/"

TOKEN_PREFIX = "llmgw-jt"
TOKEN_PATTERN = re.compile(r"^llmgw-jt\.([a-z0-9]{6})\.([A-Za-z0-9_-]{43})$")
DEFAULT_TTL_SECONDS = 24 * 3600
MAX_TTL_SECONDS = 30 * 24 * 3600
MAX_USES = 1000
MAX_HOSTS = 16
MAX_TEXT = 200
PURGE_AFTER_SECONDS = 7 * 24 * 3600
HOST_PATTERN = re.compile(r"^[A-Za-z0-9:.%_-]{1,253}$")


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(text: str) -> tuple[str, str]:
    """(id, whole token) of a token as given; InvalidArgument naming the expected form."""
    m = TOKEN_PATTERN.match(text.strip())
    if m is None:
        raise PermissionDenied(
            "the join token is not of the form llmgw-jt.<6 characters>.<43 characters>; "
            "copy it whole from `llmgw nodes join-token create`"
        )
    return m.group(1), text.strip()


def token_state(token: trust_pb2.JoinToken, now: float) -> str:
    if token.revoked:
        return "revoked"
    if token.expires and now >= token.expires:
        return "expired"
    if token.uses >= token.max_uses:
        return "used up"
    return "usable"


def public(token: trust_pb2.JoinToken, now: float) -> trust_pb2.JoinToken:
    out = trust_pb2.JoinToken()
    out.CopyFrom(token)
    out.hash = ""
    out.state = token_state(token, now)
    return out


@dataclass(frozen=True)
class TokenRequest:
    """A CreateJoinTokenRequest, checked."""

    ttl_seconds: int
    max_uses: int
    description: str
    node_id: str
    replace: bool
    hosts: tuple[str, ...]

    @classmethod
    def parse(cls, r: trust_pb2.CreateJoinTokenRequest) -> TokenRequest:
        ttl = r.ttl_seconds or DEFAULT_TTL_SECONDS
        if not 0 < ttl <= MAX_TTL_SECONDS:
            raise InvalidArgument(f"join token: ttl_seconds {r.ttl_seconds}: between 1 and {MAX_TTL_SECONDS}")
        uses = r.max_uses or 1
        if not 0 < uses <= MAX_USES:
            raise InvalidArgument(f"join token: max_uses {r.max_uses}: between 1 and {MAX_USES}")
        if len(r.description) > MAX_TEXT:
            raise InvalidArgument(f"join token: the description is at most {MAX_TEXT} characters")
        if r.node_id and not ID_PATTERN.match(r.node_id):
            raise InvalidArgument(
                f"join token: node_id {r.node_id[:64]!r}: letters, digits, '.', '_', '-', at most 63"
            )
        if r.replace and not r.node_id:
            raise InvalidArgument(
                "join token: replace takes over one node's identity: name the node (node_id / --node)"
            )
        if len(r.hosts) > MAX_HOSTS or any(not HOST_PATTERN.match(h) for h in r.hosts):
            raise InvalidArgument(f"join token: hosts: at most {MAX_HOSTS} IP addresses or DNS names")
        return cls(ttl, uses, r.description, r.node_id, r.replace, tuple(h.lower() for h in r.hosts))


def _parse(message_type: Any, entries: Iterable[Entry]) -> builtins.list[Any]:
    out = []
    for e in entries:
        try:
            out.append(message_type.FromString(e.value))
        except DecodeError:
            log.warning("%s does not parse; skipped", e.key)
    return out


class JoinTokens:
    """``join-tokens/``: create, list, revoke, and the check-and-count a join makes."""

    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self._store = store
        self._wall = wall

    async def create(self, checked: TokenRequest) -> tuple[trust_pb2.JoinToken, str]:
        await self._purge()
        token_id = "".join(secrets.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6))
        secret = f"{TOKEN_PREFIX}.{token_id}.{secrets.token_urlsafe(32)}"
        now = int(self._wall())
        token = trust_pb2.JoinToken(
            id=token_id,
            description=checked.description,
            created=now,
            expires=now + checked.ttl_seconds,
            max_uses=checked.max_uses,
            node_id=checked.node_id,
            replace=checked.replace,
            hosts=checked.hosts,
            hash=secret_hash(secret),
        )
        key = TOKENS_PREFIX + token_id
        result = await self._store.commit([ModRevisionIs(key, 0)], [Put(key, token.SerializeToString())])
        if not result.succeeded:
            raise Conflict("join token: the generated id collided; retry")
        return token, secret

    async def _purge(self) -> None:
        cutoff = self._wall() - PURGE_AFTER_SECONDS
        for token in await self.list():
            if token.expires < cutoff:
                await self._store.delete(TOKENS_PREFIX + token.id)

    async def list(self) -> builtins.list[trust_pb2.JoinToken]:
        tokens = _parse(trust_pb2.JoinToken, (await self._store.range(TOKENS_PREFIX)).entries)
        return sorted(tokens, key=lambda t: (t.created, t.id))

    async def revoke(self, token_id: str) -> trust_pb2.JoinToken:
        if not re.fullmatch(r"[a-z0-9]{6}", token_id):
            raise InvalidArgument(f"join token id {token_id[:64]!r}: 6 lowercase letters and digits")
        key = TOKENS_PREFIX + token_id
        entry = await self._store.get(key)
        if entry is None:
            raise NotFound(f"no join token has the id {token_id}; `llmgw nodes join-token list` shows them")
        token = trust_pb2.JoinToken.FromString(entry.value)
        token.revoked = True
        result = await self._store.commit(
            [ModRevisionIs(key, entry.mod_revision)], [Put(key, token.SerializeToString())]
        )
        if not result.succeeded:
            raise Conflict(f"join token {token_id} changed while it was being revoked; retry")
        return token

    async def check(self, given: str) -> tuple[trust_pb2.JoinToken, int]:
        """The token ``given`` names and its revision, when it may be used now; else PermissionDenied."""
        token_id, whole = parse_token(given)
        entry = await self._store.get(TOKENS_PREFIX + token_id)
        if entry is None:
            raise PermissionDenied(
                f"join token {token_id} is not known to this cluster (never created, or deleted a week "
                "after it expired); ask an admin for a new one (`llmgw nodes join-token create`)"
            )
        token = trust_pb2.JoinToken.FromString(entry.value)
        if not hmac.compare_digest(secret_hash(whole), token.hash):
            raise PermissionDenied(
                f"join token {token_id}: the secret is wrong; copy the token whole as it was printed"
            )
        state = token_state(token, self._wall())
        if state == "revoked":
            raise PermissionDenied(f"join token {token_id} was revoked; ask an admin for a new one")
        if state == "expired":
            raise PermissionDenied(
                f"join token {token_id} expired at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(token.expires))}; "
                "ask an admin for a new one"
            )
        if state == "used up":
            raise PermissionDenied(
                f"join token {token_id} was used {token.uses} time(s), all it allows; ask an admin for "
                "a new one (a node that joined keeps its certificate: restart it without a token)"
            )
        return token, entry.mod_revision

    async def record_use(
        self,
        token: trust_pb2.JoinToken,
        revision: int,
        issued: trust_pb2.IssuedCertificate,
        peer: str,
        revocations: Iterable[trust_pb2.Revocation] = (),
    ) -> bool:
        """Count the use and record the certificate in one transaction; False if the token moved."""
        used = trust_pb2.JoinToken()
        used.CopyFrom(token)
        used.uses += 1
        used.used_by.append(
            trust_pb2.JoinUse(
                node_id=issued.name, serial=issued.serial, at=int(self._wall()), peer=peer[:200]
            )
        )
        ops: list[Put | Delete] = [
            Put(TOKENS_PREFIX + token.id, used.SerializeToString()),
            Put(ISSUED_PREFIX + issued.serial, issued.SerializeToString()),
        ]
        ops += [Put(revocation_key(r), r.SerializeToString()) for r in revocations]
        result = await self._store.commit([ModRevisionIs(TOKENS_PREFIX + token.id, revision)], ops)
        return result.succeeded

    async def record_renewal(self, issued: trust_pb2.IssuedCertificate) -> None:
        """Record a renewed certificate; the node's records expired a week ago go (the ledger stays small)."""
        cutoff = self._wall() - PURGE_AFTER_SECONDS
        stale = [
            Delete(ISSUED_PREFIX + c.serial)
            for c in await self.issued()
            if c.role == issued.role and c.name == issued.name and c.not_after < cutoff
        ]
        await self._store.commit([], [Put(ISSUED_PREFIX + issued.serial, issued.SerializeToString()), *stale])

    async def issued(self) -> builtins.list[trust_pb2.IssuedCertificate]:
        return _parse(trust_pb2.IssuedCertificate, (await self._store.range(ISSUED_PREFIX)).entries)


def revocation_key(r: trust_pb2.Revocation) -> str:
    if r.serial:
        return SERIAL_PREFIX + r.serial
    return f"{IDENTITY_PREFIX}{r.role}/{r.name}"


@dataclass
class RevocationList:
    """The revocations in force: what every control plane checks each call against."""

    serials: dict[str, trust_pb2.Revocation] = field(default_factory=dict)
    identities: dict[tuple[str, str], trust_pb2.Revocation] = field(default_factory=dict)

    @classmethod
    def of(cls, records: Iterable[trust_pb2.Revocation]) -> RevocationList:
        out = cls()
        for r in records:
            if r.serial:
                out.serials[r.serial] = r
            else:
                out.identities[(r.role, r.name)] = r
        return out

    def why(self, serial: str, role: str, name: str, not_before: float) -> str:
        """Why a certificate is revoked, or "" when it is not."""
        r = self.serials.get(serial)
        if r is not None:
            return f"certificate {serial} ({role} {name}) was revoked" + (f": {r.reason}" if r.reason else "")
        r = self.identities.get((role, name))
        if r is not None and not_before <= r.revoked_at:
            return (
                f"every certificate of {role} {name} issued before "
                f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(r.revoked_at))} was revoked"
                + (f": {r.reason}" if r.reason else "")
            )
        return ""

    def cutoff(self, role: str, name: str) -> int:
        """The identity revocation's time for role/name (0: none): a new certificate starts after it."""
        r = self.identities.get((role, name))
        return r.revoked_at if r else 0


class Revocations:
    """``revocations/``: revoke, list, follow."""

    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self._store = store
        self._wall = wall

    async def revoke(self, request: trust_pb2.RevokeCertificateRequest) -> trust_pb2.Revocation:
        if len(request.reason) > MAX_TEXT:
            raise InvalidArgument(f"revoke: the reason is at most {MAX_TEXT} characters")
        record = trust_pb2.Revocation(revoked_at=int(self._wall()), reason=request.reason)
        if request.serial:
            if request.role or request.name:
                raise InvalidArgument("revoke: give a serial, or a role and a name, not both")
            record.serial = parse_serial(request.serial)
            issued = await self._store.get(ISSUED_PREFIX + record.serial)
            if issued is not None:
                cert = trust_pb2.IssuedCertificate.FromString(issued.value)
                record.role, record.name = cert.role, cert.name
        else:
            if request.role not in ROLES or not ID_PATTERN.match(request.name):
                raise InvalidArgument(
                    f"revoke: a serial (--serial), or an identity: role one of {', '.join(ROLES)} "
                    "and its name (--node ID, --router NAME, --admin NAME, --control-plane ID)"
                )
            record.role, record.name = request.role, request.name
        await self._store.put(revocation_key(record), record.SerializeToString())
        return record

    async def load(self) -> tuple[list[trust_pb2.Revocation], int]:
        result = await self._store.range(REVOCATIONS_PREFIX)
        return _parse(trust_pb2.Revocation, result.entries), result.revision

    async def follow(self, apply: Callable[[RevocationList], None], retry_seconds: float = 1.0) -> None:
        """Call ``apply`` with the revocations in force, at start and after each change (cancel to stop)."""
        while True:
            try:
                records, revision = await self.load()
                apply(RevocationList.of(records))
                async for _ in self._store.watch(REVOCATIONS_PREFIX, revision + 1):
                    records, _ = await self.load()
                    apply(RevocationList.of(records))
            except asyncio.CancelledError:
                raise
            except Compacted:
                continue
            except Exception as err:  # etcd away: keep what is in force, try again
                log.warning("following certificate revocations failed (%s); retrying", err)
                await asyncio.sleep(retry_seconds)
