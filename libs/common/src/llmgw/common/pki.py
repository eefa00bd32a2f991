"""A small cluster PKI: one CA, certificates that name a role and an id.

What ``llmgw certs`` runs, and what ``llmgw up`` and the tests use. Larger
deployments bring their own PKI (cert-manager, Vault); what llmgw needs of
a certificate is written here, so any CA can issue one:

- **The identity is one URI SAN** ``llmgw://<role>/<id>``: role ``admin``,
  ``router``, ``node`` or ``control``; the id is the node id (the agent's
  ``node_id``), the router's or the operator's name, the control plane's id.
  A certificate with no such URI, or with two, has no llmgw identity and
  every call it makes is refused.
- **Control planes** also carry the DNS SAN ``llmgw-control``: clients check
  the server's certificate against that name (``tls.server_name``), not the
  address they dialed, so a redirect to the leader's advertised address or
  a NAT needs no new certificate, and no node or router certificate can
  pass for a control plane. Control planes alone get the serverAuth usage.
- **Node certificates list the node's addresses** (IP or DNS SANs): the
  hosts its engine URLs may use. The control plane refuses a ReplicaStatus
  whose URL names another host, so a node cannot send users' prompts and
  the engine key elsewhere.

Keys are ECDSA P-256 (small, fast handshakes); private keys are written
0600. Certificates last ``days`` (default 365; the CA ten years); rotation
is issuing a new pair at the same paths: every llmgw process reads them
again when they change (docs/security.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from .errors import InvalidArgument

ROLES = ("admin", "router", "node", "control")
SCHEME = "llmgw"
CONTROL_NAME = "llmgw-control"
ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
CA_DAYS = 3650


@dataclass(frozen=True)
class Identity:
    """Who a verified certificate names: a role, an id, and (nodes) the hosts it may publish."""

    role: str
    name: str
    hosts: frozenset[str] = frozenset()

    def __str__(self) -> str:
        return f"{self.role} {self.name}"


def identity_uri(role: str, name: str) -> str:
    return f"{SCHEME}://{role}/{name}"


@lru_cache(maxsize=1024)
def identity_of(pem: bytes) -> Identity | None:
    """The llmgw identity a (verified) certificate names; None when it names none or several."""
    try:
        cert = x509.load_pem_x509_certificate(pem)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, x509.ExtensionNotFound):
        return None
    found = []
    for uri in sans.get_values_for_type(x509.UniformResourceIdentifier):
        scheme, sep, rest = uri.partition("://")
        if scheme != SCHEME or not sep:
            continue
        role, _, name = rest.partition("/")
        found.append((role, name))
    if len(found) != 1:
        return None
    role, name = found[0]
    if role not in ROLES or not ID_PATTERN.match(name):
        return None
    hosts = {str(ip) for ip in sans.get_values_for_type(x509.IPAddress)}
    hosts |= {d.lower() for d in sans.get_values_for_type(x509.DNSName)}
    return Identity(role, name, frozenset(hosts))


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def write_file(path: Path, data: bytes, private: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    # Atomic: a process re-reading the file never sees half of it.
    os.replace(tmp, path)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def create_ca(directory: Path, cluster: str = "llmgw", days: int = CA_DAYS) -> tuple[Path, Path]:
    """A new CA at ``directory``/ca.crt and ca.key; refuses to overwrite one."""
    crt, key_path = directory / "ca.crt", directory / "ca.key"
    if crt.exists() or key_path.exists():
        raise InvalidArgument(f"{crt} already exists: a new CA would orphan every certificate it issued")
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} llmgw CA")])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_file(key_path, key_pem(key), private=True)
    write_file(crt, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return crt, key_path


def host_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host.lower())


def issue(
    directory: Path,
    role: str,
    name: str,
    hosts: list[str] | tuple[str, ...] = (),
    days: int = 365,
    out: Path | None = None,
) -> tuple[Path, Path]:
    """Issue ``<role>-<name>.crt``/``.key`` (in ``out``, default ``directory``) signed by its CA."""
    if role not in ROLES:
        raise InvalidArgument(f"role {role!r}: one of {', '.join(ROLES)}")
    if not ID_PATTERN.match(name):
        raise InvalidArgument(f"name {name!r}: letters, digits, '.', '_', '-', at most 63")
    try:
        ca_cert = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    except OSError as err:
        raise InvalidArgument(
            f"no CA in {directory} ({err.strerror}); create one with `llmgw certs ca --dir {directory}`"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidArgument(f"{directory / 'ca.key'}: an ECDSA key is expected (what llmgw certs ca makes)")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = sign(ca_cert, ca_key, key.public_key(), role, name, hosts, days)
    out = out or directory
    crt, key_path = out / f"{role}-{name}.crt", out / f"{role}-{name}.key"
    write_file(key_path, key_pem(key), private=True)
    write_file(crt, cert.public_bytes(serialization.Encoding.PEM), private=False)
    return crt, key_path


def sign(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    public_key: CertificatePublicKeyTypes,
    role: str,
    name: str,
    hosts: list[str] | tuple[str, ...] = (),
    days: int = 365,
    not_before: dt.datetime | None = None,
    seconds: float = 0,
) -> x509.Certificate:
    """A certificate for ``public_key`` naming ``llmgw://role/name`` (and hosts), signed by the CA.

    Valid ``seconds`` from now when given, else ``days``. ``not_before``
    defaults to five minutes ago (clock skew between machines).
    """
    alt: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, name))]
    if role == "control":
        alt.append(x509.DNSName(CONTROL_NAME))
    alt += [host_name(h) for h in hosts]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == "control":
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    now = _now()
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{role}:{name}")]))
        .issuer_name(ca_cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - dt.timedelta(minutes=5))
        .not_valid_after(now + (dt.timedelta(seconds=seconds) if seconds else dt.timedelta(days=days)))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )


def ca_pin(cert: x509.Certificate) -> str:
    """``sha256:<hex>`` of a CA's SubjectPublicKeyInfo: what a joining agent pins (as kubeadm does)."""
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(spki).hexdigest()


def serial_hex(serial: int) -> str:
    """A serial as llmgw shows and stores it: lowercase hex, no colons."""
    return format(serial, "x")


def parse_serial(text: str) -> str:
    """A serial typed by a person (hex, with or without colons or 0x) in :func:`serial_hex`'s form."""
    cleaned = text.strip().lower().removeprefix("0x").replace(":", "")
    if not re.fullmatch(r"[0-9a-f]{1,40}", cleaned):
        raise InvalidArgument(f"serial {text[:60]!r}: hexadecimal digits (colons allowed), at most 40")
    return serial_hex(int(cleaned, 16))


def load_certs(pem: bytes) -> list[x509.Certificate]:
    """Every certificate of a PEM bundle (a ca_file may hold two CAs during a rotation)."""
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise InvalidArgument(f"not a PEM certificate bundle: {err}") from None


def matching_pair(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether the key is the certificate's (a rotation caught between two writes is not)."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        key = serialization.load_pem_private_key(key_pem, None)
    except ValueError:
        return False
    pub = serialization.PublicFormat.SubjectPublicKeyInfo
    enc = serialization.Encoding.DER
    return cert.public_key().public_bytes(enc, pub) == key.public_key().public_bytes(enc, pub)
