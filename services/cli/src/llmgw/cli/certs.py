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


def add_parser(sub) -> None:
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
    show = cs.add_parser("show", help="the identity, names and expiry of a certificate")
    show.add_argument("file")


def certs_command(args: argparse.Namespace) -> str:
    try:
        if args.action == "ca":
            crt, key = pki.create_ca(Path(args.dir), args.cluster, args.days)
            return f"created {crt} and {key} (keep the key private: it signs every identity)"
        if args.action == "issue":
            out = Path(args.out) if args.out else None
            crt, key = pki.issue(Path(args.dir), args.role, args.name, args.host, args.days, out)
            return f"issued {crt} and {key} for {args.role} {args.name}"
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
        f"valid:    {cert.not_valid_before_utc:%Y-%m-%d %H:%M} UTC "
        f"to {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC",
    ]
    return "\n".join(lines)
