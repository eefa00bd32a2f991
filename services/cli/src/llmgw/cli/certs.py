"""``llmgw certs``: a cluster CA and the certificates of its roles, for clusters without a PKI.

``llmgw certs ca`` creates ``ca.crt``/``ca.key``; ``llmgw certs issue ROLE
NAME`` issues ``ROLE-NAME.crt``/``.key`` signed by it (what each names:
common/pki.py); ``llmgw certs show FILE`` prints what a certificate proves.
Files go to ``--dir`` (default ``.llmgw/tls``); private keys are 0600. The
CA key signs every identity of the cluster: keep it off the machines that
run llmgw once the certificates are issued (docs/security.md).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cryptography import x509

from llmgw.common import pki
from llmgw.common.errors import InvalidArgument

from .connection import DEFAULT_TLS_DIR, AdminError
from .trust import revocation_command


def add_parser(sub, admin: argparse.ArgumentParser) -> None:
    c = sub.add_parser("certs", help="create a cluster CA, issue role and node certificates")
    cs = c.add_subparsers(dest="action", required=True)
    ca = cs.add_parser("ca", help="create the cluster CA (ca.crt, ca.key) in --dir")
    ca.add_argument("--dir", default=str(DEFAULT_TLS_DIR), help="where (default .llmgw/tls)")
    ca.add_argument("--cluster", default="llmgw", help="the cluster's name, in the CA's subject")
    ca.add_argument("--days", type=int, default=pki.CA_DAYS)
    issue = cs.add_parser("issue", help="issue ROLE-NAME.crt/.key signed by the CA in --dir")
    issue.add_argument("role", choices=pki.ROLES)
    issue.add_argument("name", help="node id, router name, operator name or control plane id")
    issue.add_argument(
        "--host",
        action="append",
        default=[],
        help="node: an address its engines are published on (repeatable: IP or DNS name)",
    )
    issue.add_argument("--dir", default=str(DEFAULT_TLS_DIR), help="the CA's directory (default .llmgw/tls)")
    issue.add_argument("--out", help="where to write (default --dir)")
    issue.add_argument("--days", type=int, default=365)
    show = cs.add_parser("show", help="the identity, names, serial and expiry of a certificate")
    show.add_argument("file")
    pin = cs.add_parser("pin", help="the CA hash joining agents pin (join.ca_cert_hash)")
    pin.add_argument(
        "file", nargs="?", default=str(DEFAULT_TLS_DIR / "ca.crt"), help="default .llmgw/tls/ca.crt"
    )
    revoke = cs.add_parser(
        "revoke", help="take a certificate out of service on every control plane, now", parents=[admin]
    )
    revoke.add_argument(
        "--serial", default="", help="the certificate's serial (hex; `llmgw certs show FILE`)"
    )
    for role, flag in (
        ("node", "--node"),
        ("router", "--router"),
        ("admin", "--admin"),
        ("control", "--control-plane"),
    ):
        revoke.add_argument(
            flag, default="", metavar="NAME", help=f"every certificate of {role} NAME issued until now"
        )
    revoke.add_argument("--reason", default="", help="kept with the revocation")
    cs.add_parser("revocations", help="the revoked certificates and identities", parents=[admin])
    cs.add_parser("issued", help="the certificates joins obtained (serials, nodes, tokens)", parents=[admin])


def certs_command(args: argparse.Namespace) -> str:
    if args.action in ("revoke", "revocations", "issued"):
        return revocation_command(args)
    try:
        if args.action == "ca":
            crt, key = pki.create_ca(Path(args.dir), args.cluster, args.days)
            return f"created {crt} and {key} (keep the key private: it signs every identity)"
        if args.action == "issue":
            out = Path(args.out) if args.out else None
            crt, key = pki.issue(Path(args.dir), args.role, args.name, args.host, args.days, out)
            return f"issued {crt} and {key} for {args.role} {args.name}"
        if args.action == "pin":
            return _pin(Path(args.file))
        return _show(Path(args.file))
    except InvalidArgument as err:
        raise AdminError(str(err)) from None


def _show(path: Path) -> str:
    try:
        pem = path.read_bytes()
        cert = x509.load_pem_x509_certificate(pem)
    except (OSError, ValueError) as err:
        raise AdminError(f"{path}: not a PEM certificate ({err})") from None
    identity = pki.identity_of(pem)
    lines = [
        f"subject:  {cert.subject.rfc4514_string()}",
        f"issuer:   {cert.issuer.rfc4514_string()}",
        f"identity: {identity or 'none (no single llmgw://ROLE/ID URI): every call is refused'}",
        f"hosts:    {', '.join(sorted(identity.hosts)) if identity and identity.hosts else '-'}",
        f"serial:   {pki.serial_hex(cert.serial_number)}",
        f"valid:    {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
        f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
    ]
    return "\n".join(lines)


def _pin(path: Path) -> str:
    try:
        certs = pki.load_certs(path.read_bytes())
    except OSError as err:
        raise AdminError(f"{path}: {err.strerror}") from None
    return "\n".join(pki.ca_pin(c) for c in certs)
