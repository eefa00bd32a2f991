"""RenewalService: a node renews its own certificate, as kubelet's certificate rotation does.

The call comes over the mutual-TLS port, so gRPC has verified the node's
current certificate against the cluster CA, and the authorization
interceptor (auth.py) has refused it if it is revoked. This servicer then
holds the request to what that certificate is, and refuses, saying which:

1. a control plane without the CA key (``join.ca_key_file``):
   FAILED_PRECONDITION (renewal needs a signer; a cluster with its own PKI
   renews with it);
2. a caller without a node certificate of this CA, or one that expired
   (a connection can outlive its certificate): PERMISSION_DENIED;
3. a node whose identity or certificate is revoked (checked here again,
   against the list in force): PERMISSION_DENIED;
4. too many renewals from one node (``join.renew_burst``,
   ``join.renew_per_hour``): RESOURCE_EXHAUSTED;
5. a CSR that is not well formed (api/join.py's rules), that names
   another node, other hosts than the current certificate's, or carries
   any extension besides its names (a usage, a CA flag): INVALID_ARGUMENT
   or PERMISSION_DENIED.

The new certificate has the join lifetime (``join.cert_seconds`` or
``join.cert_days``), starts after any identity revocation of the node, and
is recorded in the ledger (``issued/<serial>``, ``renewed`` naming the old
serial), so ``llmgw certs revoke --node`` covers it. The old certificate is
left alone: it works until it expires or is revoked.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization

from llmgw.common import pki
from llmgw.common.bucket import TokenBucket
from llmgw.common.errors import (
    FailedPrecondition,
    LlmgwError,
    PermissionDenied,
    ResourceExhausted,
    abort_with,
)
from llmgw.v1 import trust_pb2, trust_pb2_grpc

from ..store.trust import JoinTokens, RevocationList
from .auth import NODE, caller
from .join import CertificateAuthority, parse_csr, sign_node

log = logging.getLogger("llmgw.control.api.renewal")

# Nodes remembered for the per-node limit; the oldest is forgotten first.
MAX_NODES = 4096


class RenewLimits:
    """One token bucket per node id (the most recent MAX_NODES)."""

    def __init__(self, burst: int, per_hour: float, clock: Callable[[], float] = time.monotonic):
        self._policy = (burst, per_hour / 3600.0)
        self._nodes: OrderedDict[str, TokenBucket] = OrderedDict()
        self._clock = clock

    def admit(self, node_id: str) -> None:
        now = self._clock()
        bucket = self._nodes.pop(node_id, None) or TokenBucket.full(*self._policy, now, floor=0)
        self._nodes[node_id] = bucket
        while len(self._nodes) > MAX_NODES:
            self._nodes.popitem(last=False)
        if bucket.refill(now) < 1:
            raise ResourceExhausted(
                f"node {node_id} asked for too many renewals; retry in {bucket.seconds_until(1, now):.0f} s"
            )
        bucket.take(1, now)


def check_renewal_csr(pem: str, current: x509.Certificate, node_id: str):
    """The CSR's public key, when it asks for exactly what ``current`` names; else an LlmgwError."""
    csr, key, named, hosts = parse_csr(pem)
    if named != node_id:
        raise PermissionDenied(f"node {node_id} may renew only its own certificate, not node {named}'s")
    identity = pki.identity_of(current.public_bytes(serialization.Encoding.PEM))
    have = set(identity.hosts) if identity else set()
    if set(hosts) != have:
        raise PermissionDenied(
            f"a renewal keeps the certificate's hosts ({', '.join(sorted(have)) or 'none'}); the CSR names "
            f"{', '.join(sorted(hosts)) or 'none'} (other hosts need a new join token with --host)"
        )
    other = [
        e.oid.dotted_string for e in csr.extensions if not isinstance(e.value, x509.SubjectAlternativeName)
    ]
    if other:
        raise PermissionDenied(
            f"a renewal CSR carries only its names; this one also asks for {', '.join(other)} "
            "(usages and constraints are the control plane's to set)"
        )
    return key


class RenewalServicer(trust_pb2_grpc.RenewalServiceServicer):
    def __init__(
        self,
        ca: CertificateAuthority | None,
        tokens: JoinTokens,
        revocations: Callable[[], RevocationList],
        limits: RenewLimits,
        lifetime_seconds: int,
        wall: Callable[[], float] = time.time,
    ):
        self._ca = ca
        self._tokens = tokens
        self._revocations = revocations
        self._limits = limits
        self._lifetime = lifetime_seconds
        self._wall = wall

    async def RenewCertificate(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.RenewCertificateRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.RenewCertificateResponse:
        who = caller()
        try:
            cert, issued = await self._renew(request, who.identity if who else None, who.cert if who else b"")
        except LlmgwError as err:
            log.warning("renewal for %s refused: %s", who, err)
            await abort_with(context, err)
        log.info("node %s renewed its certificate %s: now %s", issued.name, issued.renewed, issued.serial)
        assert self._ca is not None
        return trust_pb2.RenewCertificateResponse(
            certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            ca_pem=self._ca.bundle.decode(),
            serial=issued.serial,
            not_after=issued.not_after,
        )

    async def _renew(self, request, identity: pki.Identity | None, pem: bytes):
        if self._ca is None:
            raise FailedPrecondition(
                "this control plane holds no CA key (join.ca_key_file), so it cannot renew certificates: "
                "renew them with the PKI that issued them"
            )
        if identity is None or identity.role != NODE or not pem:
            raise PermissionDenied("only a node, with its own certificate, may renew a certificate")
        current = x509.load_pem_x509_certificate(pem)
        try:
            current.verify_directly_issued_by(self._ca.cert)
        except (ValueError, TypeError, InvalidSignature):
            raise PermissionDenied(
                f"node {identity.name}'s certificate was not signed by the CA this control plane holds; "
                "renew it with the PKI that issued it"
            ) from None
        now = self._wall()
        serial = pki.serial_hex(current.serial_number)
        if current.not_valid_after_utc.timestamp() <= now:
            raise PermissionDenied(f"certificate {serial} of node {identity.name} has expired; join again")
        revoked = self._revocations()
        why = revoked.why(serial, NODE, identity.name, current.not_valid_before_utc.timestamp())
        if why:
            raise PermissionDenied(f"node {identity.name} may not renew: {why}")
        self._limits.admit(identity.name)
        key = check_renewal_csr(request.csr_pem, current, identity.name)
        hosts = sorted(identity.hosts)
        cert = sign_node(
            self._ca, key, identity.name, hosts, self._lifetime, now, revoked.cutoff(NODE, identity.name)
        )
        issued = trust_pb2.IssuedCertificate(
            serial=pki.serial_hex(cert.serial_number),
            role=NODE,
            name=identity.name,
            hosts=hosts,
            not_before=int(cert.not_valid_before_utc.timestamp()),
            not_after=int(cert.not_valid_after_utc.timestamp()),
            renewed=serial,
        )
        await self._tokens.record_renewal(issued)
        return cert, issued
