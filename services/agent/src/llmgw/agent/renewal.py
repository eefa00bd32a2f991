"""Renewing this node's certificate before it expires, as kubelet's certificate rotation does.

When a share of the current certificate's lifetime has passed
(``renewal.after`` plus a random ``renewal.jitter``, of not-before to
not-after), the agent generates a new key, sends a CSR naming exactly what
the current certificate names (its node id and hosts) to
``RenewalService.RenewCertificate`` over mutual TLS with the current
certificate, checks what comes back (signed by the CA in ``tls.ca_file``,
its node id, its new key), and writes the key (0600) and then the
certificate, each replaced atomically. Nothing restarts: the agent's
channel reads the files again at its next reconnect, and its engines are
not touched. The old certificate keeps working until it expires (or is
revoked); the stream open now keeps the connection it was opened on.

Which certificates: any node certificate, when a control plane holds the
CA key (``join.ca_key_file``): those from a join, and those `llmgw certs
issue` made with that CA. A control plane without the key answers
FAILED_PRECONDITION; the next configured one is asked.

Failures (unreachable, refused, revoked) are retried with backoff
(``llmgw.common.backoff``), never later than a quarter of the time left, and
logged louder as expiry nears: a warning, an error once less than a tenth
of the lifetime is left, and an error saying the node must join again once
it has expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from llmgw.common import pki
from llmgw.common.backoff import BackoffPolicy, Retries
from llmgw.common.errors import InvalidArgument
from llmgw.common.joining import make_csr
from llmgw.common.tls import aio_channel
from llmgw.v1 import trust_pb2, trust_pb2_grpc

from .config import AgentConfig

log = logging.getLogger("llmgw.agent.renewal")

BACKOFF = BackoffPolicy(initial=1.0, maximum=60.0)
# The certificate file is looked at again at least this often (an operator may replace it).
RECHECK_SECONDS = 60.0
# The largest certificate the agent takes back.
MAX_CERT_BYTES = 16 * 1024


class RenewalFailed(Exception):
    """One renewal attempt failed; the message says where and why."""


@dataclass(frozen=True)
class Current:
    serial: str
    not_before: float
    not_after: float
    hosts: tuple[str, ...]

    @property
    def lifetime(self) -> float:
        return max(self.not_after - self.not_before, 1.0)


def read_current(cert_file: str) -> Current:
    """The certificate now in ``cert_file``; InvalidArgument when it cannot be read."""
    try:
        pem = Path(cert_file).read_bytes()
        cert = x509.load_pem_x509_certificate(pem)
    except OSError as err:
        raise InvalidArgument(f"tls.cert_file {cert_file}: {err.strerror}") from None
    except ValueError as err:
        raise InvalidArgument(f"tls.cert_file {cert_file}: not a PEM certificate ({err})") from None
    identity = pki.identity_of(pem)
    return Current(
        serial=pki.serial_hex(cert.serial_number),
        not_before=cert.not_valid_before_utc.timestamp(),
        not_after=cert.not_valid_after_utc.timestamp(),
        hosts=tuple(sorted(identity.hosts)) if identity else (),
    )


def due(current: Current, after: float, jitter: float, rng: random.Random) -> float:
    """When to renew ``current`` (unix seconds): after ``after`` plus up to ``jitter`` of its lifetime."""
    return current.not_before + current.lifetime * (after + rng.uniform(0.0, jitter))


def wanted(config: AgentConfig) -> bool:
    return config.renewal.enabled and not config.tls.plaintext and bool(config.tls.cert_file)


async def renew_once(config: AgentConfig, current: Current) -> str:
    """Ask each control plane in turn; on success write the files and return the new serial."""
    key_pem, csr_pem = make_csr(config.node_id, current.hosts)
    errors = []
    for address in config.control:
        try:
            async with aio_channel(address, config.tls) as channel:
                stub = trust_pb2_grpc.RenewalServiceStub(channel)
                reply = await stub.RenewCertificate(
                    trust_pb2.RenewCertificateRequest(csr_pem=csr_pem.decode()),
                    timeout=config.renewal.timeout_seconds,
                )
        except grpc.aio.AioRpcError as err:
            errors.append(f"{address}: {err.code().name}: {err.details()}")
            continue
        except InvalidArgument as err:  # the tls files as they are now
            raise RenewalFailed(str(err)) from None
        cert_pem = reply.certificate_pem.encode()
        _check(config, cert_pem, key_pem)
        pki.write_file(Path(config.tls.key_file), key_pem, private=True)
        pki.write_file(Path(config.tls.cert_file), cert_pem, private=False)
        return reply.serial
    raise RenewalFailed("; ".join(errors))


def _check(config: AgentConfig, cert_pem: bytes, key_pem: bytes) -> None:
    """The reply is this node's certificate, for this key, signed by a CA of tls.ca_file."""
    if len(cert_pem) > MAX_CERT_BYTES:
        raise RenewalFailed(f"the renewed certificate is {len(cert_pem)} bytes; at most {MAX_CERT_BYTES}")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = pki.load_certs(Path(config.tls.ca_file).read_bytes())
    except (ValueError, OSError, InvalidArgument) as err:
        raise RenewalFailed(f"the renewed certificate cannot be checked: {err}") from None
    signed = False
    for ca in cas:
        with contextlib.suppress(ValueError, TypeError, InvalidSignature):
            cert.verify_directly_issued_by(ca)
            signed = True
    identity = pki.identity_of(cert_pem)
    if not signed or identity is None or identity.name != config.node_id or identity.role != "node":
        raise RenewalFailed(
            "the renewed certificate is not this node's, signed by the cluster CA; kept the old one"
        )
    if not pki.matching_pair(cert_pem, key_pem):
        raise RenewalFailed(
            "the renewed certificate is not for the key this node generated; kept the old one"
        )


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


async def renew_forever(
    config: AgentConfig,
    wall: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    rng: random.Random | None = None,
) -> None:
    """Renew the node certificate whenever it is due; runs until cancelled."""
    rng = rng or random.Random()
    retries = Retries(BACKOFF, rng)
    planned: tuple[str, float] = ("", 0.0)  # (serial, when): drawn once per certificate
    while True:
        try:
            current = read_current(config.tls.cert_file)
        except InvalidArgument as err:
            log.warning("certificate renewal: %s; looking again in %.0f s", err, RECHECK_SECONDS)
            await sleep(RECHECK_SECONDS)
            continue
        if planned[0] != current.serial:
            planned = (current.serial, due(current, config.renewal.after, config.renewal.jitter, rng))
            log.info(
                "certificate %s (valid until %s) will be renewed from %s",
                current.serial,
                _when(current.not_after),
                _when(planned[1]),
            )
        now = wall()
        if now < planned[1]:
            await sleep(min(planned[1] - now, RECHECK_SECONDS))
            continue
        try:
            serial = await renew_once(config, current)
        except RenewalFailed as err:
            left = current.not_after - wall()
            wait = retries.next()
            if left <= 0:
                log.error(
                    "certificate %s EXPIRED at %s and could not be renewed (%s): this node cannot connect "
                    "again; give it a new certificate or a join token. Trying again in %.0f s",
                    current.serial,
                    _when(current.not_after),
                    err,
                    wait,
                )
            else:
                wait = min(wait, max(BACKOFF.initial, left / 4))
                level = logging.ERROR if left < current.lifetime / 10 else logging.WARNING
                log.log(
                    level,
                    "certificate %s expires in %.0f s (%s) and could not be renewed: %s; retrying in %.1f s",
                    current.serial,
                    left,
                    _when(current.not_after),
                    err,
                    wait,
                )
            await sleep(wait)
            continue
        retries.reset()
        log.info(
            "certificate %s renewed: %s written to %s (used from the next connection; the old one works "
            "until it expires)",
            current.serial,
            serial,
            config.tls.cert_file,
        )
