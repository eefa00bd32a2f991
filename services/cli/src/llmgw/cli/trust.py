"""``llmgw nodes join-token ...`` and ``llmgw certs revoke | revocations | issued``: TLS without a PKI.

``join-token create`` prints the token once, with the CA hash and the join
address an agent needs (and the lines of its config); the control plane
keeps only a hash. ``certs revoke`` takes a serial, or an identity (every
certificate of that node, router, admin or control plane issued until
now): every control plane refuses it within a watch round trip and ends
its open streams.
"""

from __future__ import annotations

import re
import time
from argparse import Namespace

from llmgw.v1 import trust_pb2, trust_pb2_grpc

from .connection import AdminError, Target, as_json, channel
from .tables import table

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> int:
    """Seconds of ``90``, ``30m``, ``24h``, ``7d``."""
    m = re.fullmatch(r"\s*(\d+)\s*([smhd]?)\s*", text)
    if m is None:
        raise AdminError(f"--ttl {text!r}: a number of seconds, or with s, m, h or d (30m, 24h, 7d)")
    return int(m.group(1)) * _UNITS[m.group(2) or "s"]


def _when(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(seconds)) if seconds else "-"


def join_token_command(args: Namespace) -> str:
    """``llmgw nodes join-token create [--ttl T] [--uses N] ... | list | revoke ID``."""
    action, target = args.node or "list", Target.from_args(args)
    verb = f"nodes join-token {action}"
    with channel(target) as ch:
        stub = trust_pb2_grpc.JoinTokenServiceStub(ch)
        if action == "create":
            request = trust_pb2.CreateJoinTokenRequest(
                ttl_seconds=parse_duration(args.ttl),
                max_uses=args.uses,
                description=args.description,
                node_id=args.for_node,
                replace=args.replace,
                hosts=args.host,
            )
            msg = target.call(verb, stub.CreateJoinToken, request)
        elif action == "list":
            msg = target.call(verb, stub.ListJoinTokens, trust_pb2.ListJoinTokensRequest())
        elif action == "revoke":
            if len(args.labels) != 1:
                raise AdminError(
                    "nodes join-token revoke needs the token's ID (see `llmgw nodes join-token list`)"
                )
            msg = target.call(verb, stub.RevokeJoinToken, trust_pb2.RevokeJoinTokenRequest(id=args.labels[0]))
        else:
            raise AdminError(f"nodes join-token {action}: create, list or revoke")
    if args.json:
        return as_json(msg)
    if action == "create":
        return _created(msg)
    if action == "revoke":
        return f"join token {msg.id} revoked: a join with it is refused"
    return table(
        ["ID", "STATE", "USES", "EXPIRES", "NODE", "HOSTS", "DESCRIPTION", "USED BY"],
        [
            [
                t.id,
                t.state,
                f"{t.uses}/{t.max_uses}",
                _when(t.expires),
                (t.node_id + (" (replace)" if t.replace else "")) or "any",
                ",".join(t.hosts) or "-",
                t.description or "-",
                ",".join(u.node_id for u in t.used_by) or "-",
            ]
            for t in msg.tokens
        ],
    )


def _created(msg: trust_pb2.CreateJoinTokenResponse) -> str:
    t = msg.token
    address = msg.join_address or (
        "HOST:PORT (this control plane has no join port: join.ca_key_file is unset here; "
        "give the address of one that has it)"
    )
    only = f" for node {t.node_id}" + (", replacing its identity" if t.replace else "") if t.node_id else ""
    return "\n".join(
        [
            f"join token {t.id} created{only}: {t.max_uses} use(s), expires {_when(t.expires)}.",
            "The token is shown once; store it now:",
            "",
            f"  {msg.secret}",
            "",
            "On the new node, put it in a file only the agent's user can read (or in $LLMGW_JOIN_TOKEN;",
            "never on a command line), and in the agent's config:",
            "",
            "  join:",
            f"    address: {address}",
            "    token_file: /etc/llmgw/join.token",
            f"    ca_cert_hash: {msg.ca_cert_hash or '(unknown: this control plane runs without TLS)'}",
            "  tls:   # where the join writes the node's key, certificate and the CA",
            "    ca_file: /etc/llmgw/tls/ca.crt",
            "    cert_file: /etc/llmgw/tls/node.crt",
            "    key_file: /etc/llmgw/tls/node.key",
        ]
    )


# Role -> the argparse dest of its flag (--control is the address of the control plane to ask).
_ROLE_FLAGS = {"node": "node", "router": "router", "admin": "admin", "control": "control_plane"}


def revocation_command(args: Namespace) -> str:
    """``llmgw certs revoke (--serial S | --node ID | ...) [--reason R]``, ``revocations``, ``issued``."""
    target = Target.from_args(args)
    with channel(target) as ch:
        stub = trust_pb2_grpc.CertificateServiceStub(ch)
        if args.action == "revoke":
            named = [(r, getattr(args, dest)) for r, dest in _ROLE_FLAGS.items() if getattr(args, dest)]
            if bool(args.serial) + len(named) != 1:
                raise AdminError(
                    "certs revoke: give one of --serial SERIAL (see `llmgw certs show FILE` or "
                    "`llmgw certs issued`), --node ID, --router NAME, --admin NAME, --control-plane ID"
                )
            role, name = named[0] if named else ("", "")
            request = trust_pb2.RevokeCertificateRequest(
                serial=args.serial or "", role=role, name=name, reason=args.reason
            )
            msg = target.call("certs revoke", stub.RevokeCertificate, request)
        elif args.action == "revocations":
            msg = target.call("certs revocations", stub.ListRevocations, trust_pb2.ListRevocationsRequest())
        else:
            msg = target.call(
                "certs issued", stub.ListIssuedCertificates, trust_pb2.ListIssuedCertificatesRequest()
            )
    if args.json:
        return as_json(msg)
    if args.action == "revoke":
        if msg.serial:
            who = f" ({msg.role} {msg.name})" if msg.role else ""
            return f"certificate {msg.serial}{who} revoked: refused by every control plane, its streams ended"
        return (
            f"every certificate of {msg.role} {msg.name} issued until {_when(msg.revoked_at)} revoked: "
            "refused by every control plane, its streams ended"
        )
    if args.action == "revocations":
        return table(
            ["SERIAL", "IDENTITY", "REVOKED", "REASON"],
            [
                [
                    r.serial or "(all until then)",
                    f"{r.role} {r.name}".strip() or "-",
                    _when(r.revoked_at),
                    r.reason or "-",
                ]
                for r in msg.revocations
            ],
        )
    return table(
        ["SERIAL", "IDENTITY", "HOSTS", "VALID UNTIL", "TOKEN / RENEWAL", "REVOKED"],
        [
            [
                c.serial,
                f"{c.role} {c.name}",
                ",".join(c.hosts) or "-",
                _when(c.not_after),
                c.token_id or (f"renews {c.renewed}" if c.renewed else "-"),
                "yes" if c.revoked else "no",
            ]
            for c in msg.certificates
        ],
    )
