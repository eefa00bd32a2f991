"""``llmgw peers [list] | add | remove``: federated peer clusters through FederationService.

``list`` shows each peer's health, when it was last checked, what it
offers here (``PEER/MODEL``), names a local model already has (the local
model wins; shown as clashes), and models asked for that it does not list.
``add`` and ``remove`` change the cluster settings (``federation.peers``): a
new settings version, with who and why, like ``llmgw settings set``.
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from argparse import Namespace

from llmgw.v1 import federation_pb2, federation_pb2_grpc

from .connection import AdminError, Target, as_json, channel
from .tables import table


def _author(args: Namespace) -> str:
    if args.author:
        return args.author
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def _ago(ts: float) -> str:
    if not ts:
        return "never"
    return f"{max(0.0, time.time() - ts):.1f}s ago"


def peers_command(args: Namespace) -> str:
    """``llmgw peers list|add|remove`` from parsed arguments."""
    action, target = args.action, Target.from_args(args)
    command = f"peers {action}"
    with channel(target) as ch:
        stub = federation_pb2_grpc.FederationServiceStub(ch)
        if action == "list":
            msg = target.call(command, stub.ListPeers, federation_pb2.ListPeersRequest())
        elif action == "add":
            if not args.name or not args.url:
                raise AdminError("peers add NAME --url URL [--key-file FILE] [--model M ...] [--send-tags]")
            doc = {
                "name": args.name,
                "url": args.url,
                "api_key_file": args.key_file,
                "models": args.models or "all",
                "send_tags": args.send_tags,
            }
            request = federation_pb2.AddPeerRequest(
                document=json.dumps(doc), author=_author(args), reason=args.reason
            )
            msg = target.call(command, stub.AddPeer, request)
        elif action == "remove":
            if not args.name:
                raise AdminError("peers remove NAME")
            request_rm = federation_pb2.RemovePeerRequest(
                name=args.name, author=_author(args), reason=args.reason
            )
            msg = target.call(command, stub.RemovePeer, request_rm)
        else:
            raise AdminError(f"unknown action {action!r}")
    if args.json:
        return as_json(msg)
    if action != "list":
        verb = "added" if action == "add" else "removed"
        return f"peer {args.name} {verb}: settings version {msg.settings_version} stored"
    head = f"check every {msg.check_interval_seconds:g}s, hop limit {msg.hop_limit}"
    if not msg.peers:
        return f"no peers ({head}); add one with `llmgw peers add NAME --url URL --key-file FILE`"
    rows = [
        [
            p.name,
            p.url,
            p.health,
            _ago(p.last_check),
            ",".join(p.offered) or "-",
            ",".join(p.clashes) or "-",
            ",".join(p.missing) or "-",
            p.error[:80] or "-",
        ]
        for p in msg.peers
    ]
    columns = ["PEER", "URL", "HEALTH", "CHECKED", "OFFERED", "CLASHES", "MISSING", "ERROR"]
    return head + "\n" + table(columns, rows)
