"""Joining with a token: JoinService (the join port), and the admin's JoinTokenService and CertificateService.

JoinService/Join is the one method a caller without a certificate may call,
so it lives on its own port (``join.listen``) with server-only TLS, behind
:class:`JoinGate` (Join, health and reflection; nothing else is served
there). gRPC cannot ask for an optional client certificate, so the mutual
TLS port cannot host it. The port is opened only when the control plane is
given the CA's key (``join.ca_key_file``): off unless given.

What a join checks, in order, and refuses with a message that says which:

1. the rate: per peer address and overall (:class:`JoinLimits`,
   RESOURCE_EXHAUSTED with when to retry), before any etcd read;
2. the size: a token of at most 128 characters, a CSR of at most 8 KiB
   (the port takes no message over 16 KiB at all);
3. the token (store/trust.py: known, the right secret, not revoked, not
   expired, not used up);
4. the CSR: a valid signature, an ECDSA (P-256/P-384) or RSA (2048-4096)
   key, exactly one URI SAN ``llmgw://node/<id>``, only IP and DNS names
   beside it; the token's node id, if it names one; the token's hosts, if
   it lists some (a token without hosts gives a certificate without hosts:
   the node publishes on the address it connects from, nodeguard.py);
5. the node id has no live identity (a certificate the join ledger issued,
   unexpired and unrevoked, or an agent connected here now), unless the
   token was made for that node with ``replace``: then the ledger's
   earlier certificates of the node are revoked in the same transaction.

Then the certificate is signed (``join.cert_seconds`` or ``cert_days``; its validity starts
after any identity revocation of the node) and the use is counted in one
transaction with the ledger record, or nothing is.
"""

from __future__ import annotations

import datetime as dt
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes

from llmgw.common import pki
from llmgw.common.bucket import TokenBucket
from llmgw.common.errors import (
    Conflict,
    InvalidArgument,
    LlmgwError,
    PermissionDenied,
    ResourceExhausted,
    abort_with,
)
from llmgw.v1 import trust_pb2, trust_pb2_grpc

from ..store.trust import JoinTokens, RevocationList, Revocations, TokenRequest, public

log = logging.getLogger("llmgw.control.api.join")

MAX_TOKEN_CHARS = 128
MAX_CSR_BYTES = 8 * 1024
# What the join port takes at all (a token and a CSR, with room to spare).
MAX_MESSAGE_BYTES = 16 * 1024
MAX_HOSTS = 16
# Peers remembered for the per-peer limit; the oldest is forgotten first.
MAX_PEERS = 4096
JOIN_METHOD = "/llmgw.v1.JoinService/Join"
OPEN_ON_JOIN_PORT = frozenset(
    {
        JOIN_METHOD,
        "/grpc.health.v1.Health/Check",
        "/grpc.health.v1.Health/Watch",
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    }
)


class CertificateAuthority:
    """The cluster CA this control plane signs joins with: the key file and its certificate in ca_file."""

    def __init__(self, key_file: str, ca_file: str):
        try:
            key = serialization.load_pem_private_key(Path(key_file).read_bytes(), None)
            certs = pki.load_certs(Path(ca_file).read_bytes())
        except OSError as err:
            raise InvalidArgument(
                f"join.ca_key_file or tls.ca_file: {err.filename}: {err.strerror}"
            ) from None
        except (ValueError, TypeError) as err:
            raise InvalidArgument(
                f"join.ca_key_file {key_file}: not an unencrypted PEM key ({err})"
            ) from None
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise InvalidArgument(f"join.ca_key_file {key_file}: an ECDSA key (what `llmgw certs ca` makes)")
        pub = key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        matching = [
            c
            for c in certs
            if c.public_key().public_bytes(
                serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            == pub
        ]
        if not matching:
            raise InvalidArgument(
                f"join.ca_key_file {key_file} is the key of no certificate in tls.ca_file {ca_file}: "
                "give the key of the CA that signed this cluster's certificates"
            )
        self.key = key
        self.cert = matching[0]
        self.bundle = b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)
        self.pin = pki.ca_pin(self.cert)


class JoinLimits:
    """Token buckets: one per peer host (the most recent MAX_PEERS) and one for the port."""

    def __init__(
        self,
        per_peer_burst: int,
        per_peer_per_minute: float,
        burst: int,
        per_second: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._peer = (per_peer_burst, per_peer_per_minute / 60.0)
        self._all = TokenBucket.full(burst, per_second, clock(), floor=0)
        self._peers: OrderedDict[str, TokenBucket] = OrderedDict()
        self._clock = clock

    def admit(self, peer_host: str) -> None:
        now = self._clock()
        bucket = self._peers.pop(peer_host, None) or TokenBucket.full(*self._peer, now, floor=0)
        self._peers[peer_host] = bucket
        while len(self._peers) > MAX_PEERS:
            self._peers.popitem(last=False)
        for b, whose in ((bucket, f"from {peer_host}"), (self._all, "on this control plane")):
            if b.refill(now) < 1:
                wait = b.seconds_until(1, now)
                raise ResourceExhausted(f"too many join attempts {whose}; retry in {wait:.0f} s")
        bucket.take(1, now)
        self._all.take(1, now)


def peer_host(peer: str) -> str:
    """The host of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    host = rest.rsplit(":", 1)[0]
    return host.strip("[]")


def parse_csr(pem: str) -> tuple[x509.CertificateSigningRequest, CertificatePublicKeyTypes, str, list[str]]:
    """(CSR, public key, node id, hosts) of a well-formed node CSR; InvalidArgument saying what is wrong."""
    if len(pem) > MAX_CSR_BYTES:
        raise InvalidArgument(f"the CSR is {len(pem)} bytes; at most {MAX_CSR_BYTES}")
    try:
        csr = x509.load_pem_x509_csr(pem.encode())
        valid = csr.is_signature_valid
    except ValueError:
        raise InvalidArgument("csr_pem is not a PEM certificate signing request") from None
    if not valid:
        raise InvalidArgument("the CSR's signature does not verify with its own key")
    key = csr.public_key()
    if isinstance(key, ec.EllipticCurvePublicKey):
        if key.curve.name not in ("secp256r1", "secp384r1"):
            raise InvalidArgument(f"the CSR's key is on {key.curve.name}; use P-256 or P-384")
    elif isinstance(key, rsa.RSAPublicKey):
        if not 2048 <= key.key_size <= 4096:
            raise InvalidArgument(f"the CSR's RSA key has {key.key_size} bits; use 2048 to 4096")
    else:
        raise InvalidArgument("the CSR's key must be ECDSA (P-256, P-384) or RSA")
    try:
        sans = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise InvalidArgument("the CSR names no node: add the URI SAN llmgw://node/<node id>") from None
    uris = sans.get_values_for_type(x509.UniformResourceIdentifier)
    prefix = pki.identity_uri("node", "")
    if len(uris) != 1 or not uris[0].startswith(prefix) or not pki.ID_PATTERN.match(uris[0][len(prefix) :]):
        raise InvalidArgument(
            "the CSR must carry exactly one URI SAN llmgw://node/<node id> "
            "(letters, digits, . _ -, at most 63)"
        )
    node_id = uris[0][len(prefix) :]
    hosts = [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    hosts += [d.lower() for d in sans.get_values_for_type(x509.DNSName)]
    if len(sans) != 1 + len(hosts):
        raise InvalidArgument("the CSR may carry only its llmgw://node URI and IP or DNS names")
    if len(hosts) > MAX_HOSTS:
        raise InvalidArgument(f"the CSR names {len(hosts)} hosts; at most {MAX_HOSTS}")
    return csr, key, node_id, hosts


def check_csr(pem: str, token: trust_pb2.JoinToken) -> tuple[CertificatePublicKeyTypes, str, list[str]]:
    """(public key, node id, hosts) of a CSR the token allows; InvalidArgument or PermissionDenied else."""
    _, key, node_id, hosts = parse_csr(pem)
    if token.node_id and node_id != token.node_id:
        raise PermissionDenied(f"join token {token.id} is for node {token.node_id} only, not {node_id}")
    if token.hosts:
        outside = sorted(set(hosts) - set(token.hosts))
        if outside:
            raise PermissionDenied(
                f"join token {token.id} allows the hosts {', '.join(token.hosts)}; the CSR also names "
                f"{', '.join(outside)} (ask for a token with --host for each)"
            )
    else:
        # No hosts granted: the node publishes on the address it connects from.
        hosts = []
    return key, node_id, hosts


class JoinServicer(trust_pb2_grpc.JoinServiceServicer):
    def __init__(
        self,
        ca: CertificateAuthority,
        tokens: JoinTokens,
        revocations: Callable[[], RevocationList],
        connected: Callable[[str], bool],
        limits: JoinLimits,
        lifetime_seconds: int,
        wall: Callable[[], float] = time.time,
    ):
        self._ca = ca
        self._tokens = tokens
        self._revocations = revocations
        self._connected = connected
        self._limits = limits
        self._lifetime = lifetime_seconds
        self._wall = wall

    async def Join(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.JoinRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.JoinResponse:
        peer = context.peer()
        try:
            self._limits.admit(peer_host(peer))
            if len(request.token) > MAX_TOKEN_CHARS:
                raise PermissionDenied(f"the join token is {len(request.token)} characters; tokens have 59")
            cert, issued = await self._join(request, peer)
        except LlmgwError as err:
            log.warning("join from %s refused: %s", peer, err)
            await abort_with(context, err)
        log.info("node %s joined from %s: certificate %s", issued.name, peer, issued.serial)
        return trust_pb2.JoinResponse(
            certificate_pem=cert.public_bytes(serialization.Encoding.PEM).decode(),
            ca_pem=self._ca.bundle.decode(),
            node_id=issued.name,
            hosts=issued.hosts,
            serial=issued.serial,
        )

    async def _join(self, request: trust_pb2.JoinRequest, peer: str):
        for _ in range(3):
            token, revision = await self._tokens.check(request.token)
            key, node_id, hosts = check_csr(request.csr_pem, token)
            replaced = await self._live_identity(node_id, token)
            now = self._wall()
            cutoff = self._revocations().cutoff("node", node_id)
            cert = sign_node(self._ca, key, node_id, hosts, self._lifetime, now, cutoff)
            issued = trust_pb2.IssuedCertificate(
                serial=pki.serial_hex(cert.serial_number),
                role="node",
                name=node_id,
                hosts=hosts,
                not_before=int(cert.not_valid_before_utc.timestamp()),
                not_after=int(cert.not_valid_after_utc.timestamp()),
                token_id=token.id,
            )
            revoke = [
                trust_pb2.Revocation(
                    serial=serial,
                    role="node",
                    name=node_id,
                    revoked_at=int(now),
                    reason=f"replaced by a join with token {token.id}",
                )
                for serial in replaced
            ]
            if await self._tokens.record_use(token, revision, issued, peer, revoke):
                return cert, issued
        raise Conflict("the join token was used by another join at the same moment; retry")

    async def _live_identity(self, node_id: str, token: trust_pb2.JoinToken) -> list[str]:
        """Serials of the node's live certificates, to revoke (replace); else PermissionDenied."""
        now = self._wall()
        revoked = self._revocations()
        live = [
            c.serial
            for c in await self._tokens.issued()
            if c.role == "node"
            and c.name == node_id
            and c.not_after > now
            and not revoked.why(c.serial, "node", node_id, c.not_before)
        ]
        connected = self._connected(node_id)
        if not live and not connected:
            return []
        if token.replace and token.node_id == node_id:
            return live
        what = f"certificate {', '.join(live)}" if live else "an agent connected now"
        raise PermissionDenied(
            f"node {node_id} already has a live identity ({what}); a join token cannot take it over "
            f"unless an admin makes one for it (`llmgw nodes join-token create --node {node_id} --replace`) "
            f"or revokes it first (`llmgw certs revoke --node {node_id}`)"
        )


def _utc(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(seconds, dt.UTC)


def sign_node(
    ca: CertificateAuthority,
    key: CertificatePublicKeyTypes,
    node_id: str,
    hosts: list[str],
    lifetime_seconds: int,
    now: float,
    cutoff: int,
) -> x509.Certificate:
    """A node certificate valid ``lifetime_seconds`` from now, its start after any identity revocation.

    It starts a little in the past for clock skew between machines: five
    minutes, or a tenth of a short lifetime (so an agent renewing at a share
    of the lifetime does not find most of it gone).
    """
    backdate = min(300, lifetime_seconds // 10)
    not_before = max(now - backdate, cutoff + 1)
    return pki.sign(
        ca.cert, ca.key, key, "node", node_id, hosts, not_before=_utc(not_before), seconds=lifetime_seconds
    )


class JoinGate(grpc.aio.ServerInterceptor):
    """The join port's only rule: Join, health and reflection, nothing else (nothing else is served)."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[object]],
        details: grpc.HandlerCallDetails,
    ):
        if details.method not in OPEN_ON_JOIN_PORT:
            return _refuse(details.method)
        return await continuation(details)


def _refuse(method: str):
    async def refuse(request, context):
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} is not served on the join port; call the control plane's mutual-TLS port",
        )

    return grpc.unary_unary_rpc_method_handler(refuse)


class JoinTokenServicer(trust_pb2_grpc.JoinTokenServiceServicer):
    def __init__(
        self,
        tokens: JoinTokens,
        pin: Callable[[], str],
        join_address: str,
        wall: Callable[[], float] = time.time,
    ):
        self._tokens = tokens
        self._pin = pin
        self._address = join_address
        self._wall = wall

    async def CreateJoinToken(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.CreateJoinTokenRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.CreateJoinTokenResponse:
        try:
            token, secret = await self._tokens.create(TokenRequest.parse(request))
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("join token %s created (%d use(s), expires %d)", token.id, token.max_uses, token.expires)
        return trust_pb2.CreateJoinTokenResponse(
            token=public(token, self._wall()),
            secret=secret,
            ca_cert_hash=self._pin(),
            join_address=self._address,
        )

    async def ListJoinTokens(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.ListJoinTokensRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.ListJoinTokensResponse:
        try:
            tokens = await self._tokens.list()
        except LlmgwError as err:
            await abort_with(context, err)
        now = self._wall()
        return trust_pb2.ListJoinTokensResponse(tokens=[public(t, now) for t in tokens])

    async def RevokeJoinToken(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.RevokeJoinTokenRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.JoinToken:
        try:
            token = await self._tokens.revoke(request.id)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("join token %s revoked", token.id)
        return public(token, self._wall())


class CertificateServicer(trust_pb2_grpc.CertificateServiceServicer):
    def __init__(self, revocations: Revocations, tokens: JoinTokens, in_force: Callable[[], RevocationList]):
        self._revocations = revocations
        self._tokens = tokens
        self._in_force = in_force

    async def RevokeCertificate(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.RevokeCertificateRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.Revocation:
        try:
            record = await self._revocations.revoke(request)
        except LlmgwError as err:
            await abort_with(context, err)
        log.warning(
            "certificate revoked: %s",
            f"serial {record.serial}" if record.serial else f"every one of {record.role} {record.name}",
        )
        return record

    async def ListRevocations(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.ListRevocationsRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.ListRevocationsResponse:
        try:
            records, _ = await self._revocations.load()
        except LlmgwError as err:
            await abort_with(context, err)
        records.sort(key=lambda r: (r.revoked_at, r.serial, r.role, r.name))
        return trust_pb2.ListRevocationsResponse(revocations=records)

    async def ListIssuedCertificates(  # noqa: N802 - gRPC method name
        self, request: trust_pb2.ListIssuedCertificatesRequest, context: grpc.aio.ServicerContext
    ) -> trust_pb2.ListIssuedCertificatesResponse:
        try:
            issued = await self._tokens.issued()
        except LlmgwError as err:
            await abort_with(context, err)
        revoked = self._in_force()
        for c in issued:
            c.revoked = bool(revoked.why(c.serial, c.role, c.name, c.not_before))
        issued.sort(key=lambda c: (c.not_before, c.serial))
        return trust_pb2.ListIssuedCertificatesResponse(certificates=issued)
