"""Joining a cluster with a token: how an agent without a certificate gets one, once.

Like kubeadm's join with ``--discovery-token-ca-cert-hash``: the agent is
given a join token (a file or ``$LLMGW_JOIN_TOKEN``, never its command
line) and the hash of the cluster CA (``sha256:<hex of its
SubjectPublicKeyInfo>``, what ``llmgw nodes join-token create`` prints), and:

1. **Discovery.** It opens a TLS connection to the control plane's join
   port without verifying anything yet, and takes the certificates the
   server presents (the port's chain ends with the CA). Only a CA whose
   hash is the one given is accepted; none: the agent stops, having sent
   nothing. The CA is public; what makes it trusted is the pin.
2. **Join.** It generates its own key (ECDSA P-256; the key never leaves
   the machine) and a CSR naming ``llmgw://node/<node id>`` and its
   advertised host, opens a gRPC channel that verifies the server's
   certificate against that CA (and the name ``llmgw-control``), and only
   then sends the token and the CSR.
3. It checks what comes back (its own key, its node id, signed by that
   CA) and writes the key (0600), the certificate and the CA to the paths
   of its ``tls`` section. From then on it is an ordinary node with mutual
   TLS; a restart finds the files and does not join again.

Python's ssl module reads the chain a server presents through
``get_unverified_chain`` (public from Python 3.13, on the connection's
``_sslobj`` before).
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

# Generated code lives in llmgw.v1, beside this package (libs/common).
from llmgw.v1 import trust_pb2, trust_pb2_grpc  # noqa: E402, I001

from . import pki
from .config import split_host_port
from .errors import InvalidArgument, LlmgwError, Unavailable
from .tls import TlsSettings

PIN_PREFIX = "sha256:"
# Retried by the caller: the control plane is not up yet, or the port is busy.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}


class JoinRefused(LlmgwError):
    """The join cannot succeed as it is: the server said no, or it is not the pinned cluster's."""


def check_pin(pin: str) -> str:
    pin = pin.strip().lower()
    hexpart = pin.removeprefix(PIN_PREFIX)
    if (
        not pin.startswith(PIN_PREFIX)
        or len(hexpart) != 64
        or any(c not in "0123456789abcdef" for c in hexpart)
    ):
        raise InvalidArgument(
            f"join.ca_cert_hash {pin[:80]!r}: sha256: and 64 hex digits, "
            "as `llmgw nodes join-token create` prints"
        )
    return pin


def _chain_der(sock: ssl.SSLSocket) -> list[bytes]:
    getter: Any = getattr(sock, "get_unverified_chain", None)
    if getter is None:
        getter = sock._sslobj.get_unverified_chain  # type: ignore[attr-defined]  # Python < 3.13
    out = []
    for c in getter() or []:
        out.append(c if isinstance(c, bytes) else c.public_bytes(ssl._ssl.ENCODING_DER))  # type: ignore[attr-defined]
    return out


def discover_ca(address: str, pin: str, timeout: float = 10.0) -> bytes:
    """The CA (PEM) the join port at ``address`` presents whose hash is ``pin``; JoinRefused if none."""
    pin = check_pin(pin)
    host, port = split_host_port(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # nothing is sent on this connection; the pin decides
    ctx.set_alpn_protocols(["h2"])
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout) as raw,
            ctx.wrap_socket(raw, server_hostname=pki.CONTROL_NAME) as tls,
        ):
            chain = _chain_der(tls)
    except (OSError, ssl.SSLError) as err:
        raise Unavailable(f"cannot reach the join port {address}: {err}") from None
    seen = []
    for der in chain:
        try:
            cert = x509.load_der_x509_certificate(der)
        except ValueError:
            continue
        got = pki.ca_pin(cert)
        seen.append(got)
        if got == pin:
            return cert.public_bytes(serialization.Encoding.PEM)
    raise JoinRefused(
        f"the server at {address} is not the cluster whose CA hash is {pin}: it presented "
        f"{', '.join(seen) or 'no certificate'}. Nothing was sent. Check join.address and join.ca_cert_hash "
        "(`llmgw nodes join-token create` prints both)"
    )


def make_csr(node_id: str, hosts: list[str] | tuple[str, ...]) -> tuple[bytes, bytes]:
    """(key PEM, CSR PEM): a new P-256 key and a request naming the node and its hosts."""
    key = ec.generate_private_key(ec.SECP256R1())
    alt: list[x509.GeneralName] = [x509.UniformResourceIdentifier(pki.identity_uri("node", node_id))]
    alt += [pki.host_name(h) for h in hosts]
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"node:{node_id}")]))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(key, hashes.SHA256())
    )
    return pki.key_pem(key), csr.public_bytes(serialization.Encoding.PEM)


@dataclass(frozen=True)
class Joined:
    key_pem: bytes
    cert_pem: bytes
    ca_pem: bytes
    serial: str
    hosts: tuple[str, ...]


def join(
    address: str,
    token: str,
    pin: str,
    node_id: str,
    hosts: list[str] | tuple[str, ...],
    timeout: float = 10.0,
) -> Joined:
    """Discovery, CSR, Join: a node certificate for ``node_id``. Unavailable (retry) or JoinRefused."""
    ca_pem = discover_ca(address, pin, timeout)
    key_pem, csr_pem = make_csr(node_id, hosts)
    credentials = grpc.ssl_channel_credentials(root_certificates=ca_pem)
    options = [("grpc.ssl_target_name_override", pki.CONTROL_NAME)]
    with grpc.secure_channel(address, credentials, options=options) as channel:
        stub = trust_pb2_grpc.JoinServiceStub(channel)  # type: ignore[no-untyped-call]
        try:
            reply = stub.Join(
                trust_pb2.JoinRequest(token=token.strip(), csr_pem=csr_pem.decode()), timeout=timeout
            )
        except grpc.RpcError as err:
            code = err.code()
            details = err.details()
            if code in RETRYABLE:
                raise Unavailable(f"join at {address}: {code.name}: {details}") from None
            raise JoinRefused(f"join at {address} refused ({code.name}): {details}") from None
    cert_pem = reply.certificate_pem.encode()
    _check_reply(cert_pem, key_pem, ca_pem, node_id)
    # The server's whole bundle (a CA rotation in progress carries two), if the pinned CA is in it.
    bundle = ca_pem
    try:
        if pin in {pki.ca_pin(c) for c in pki.load_certs(reply.ca_pem.encode())}:
            bundle = reply.ca_pem.encode()
    except InvalidArgument:
        pass
    return Joined(key_pem, cert_pem, bundle, reply.serial, tuple(reply.hosts))


def _check_reply(cert_pem: bytes, key_pem: bytes, ca_pem: bytes, node_id: str) -> None:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca_pem))
    except (ValueError, TypeError, InvalidSignature) as err:
        raise JoinRefused(
            f"the certificate the join returned is not signed by the pinned CA ({err})"
        ) from None
    identity = pki.identity_of(cert_pem)
    if not pki.matching_pair(cert_pem, key_pem) or identity is None or identity.name != node_id:
        raise JoinRefused(f"the certificate the join returned is not node {node_id}'s with this key")


def write(tls: TlsSettings, joined: Joined) -> None:
    """The key (0600) first, then the certificate and the CA, each replaced atomically."""
    pki.write_file(Path(tls.key_file), joined.key_pem, private=True)
    pki.write_file(Path(tls.cert_file), joined.cert_pem, private=False)
    pki.write_file(Path(tls.ca_file), joined.ca_pem, private=False)
