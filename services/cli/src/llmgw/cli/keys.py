"""``llmgw keys create | list | revoke``: client API keys through KeyService.

``create`` prints the secret once, with how to use it; it is stored nowhere
(etcd holds its hash), so a lost key is revoked and replaced, never
recovered. ``list`` shows ids, names and the first characters of each
secret; ``revoke`` takes an id or a name. A refusal is the control plane's
own message (it says what to fix) and a non-zero exit.
"""

from __future__ import annotations

import json
import time
from argparse import Namespace

import grpc
from google.protobuf import json_format

from llmgw.v1 import keys_pb2, keys_pb2_grpc

from .admin import DEADLINE_SECONDS, AdminError, table
from .admin import _unavailable as unavailable  # one wording for an unreachable control plane


def _when(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds)) if seconds else "never"


def _limit(value: int) -> str:
    return str(value) if value else "-"


def keys_command(args: Namespace) -> str:
    """``llmgw keys create|list|revoke`` from parsed arguments."""
    action, address = args.action, args.control
    with grpc.insecure_channel(address) as channel:
        stub = keys_pb2_grpc.KeyServiceStub(channel)
        try:
            if action == "create":
                msg = stub.CreateKey(
                    keys_pb2.CreateKeyRequest(
                        name=args.name,
                        owner=args.owner,
                        models=args.models,
                        requests_per_minute=args.rpm,
                        tokens_per_minute=args.tpm,
                        ttl_seconds=args.ttl,
                    ),
                    timeout=DEADLINE_SECONDS,
                )
            elif action == "list":
                msg = stub.ListKeys(keys_pb2.ListKeysRequest(), timeout=DEADLINE_SECONDS)
            elif action == "revoke":
                msg = stub.RevokeKey(keys_pb2.RevokeKeyRequest(key=args.key), timeout=DEADLINE_SECONDS)
            else:
                raise AdminError(f"unknown action {action!r}")
        except grpc.RpcError as err:
            raise unavailable(err, address, f"keys {action}") from None
    if args.json:
        return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
    if action == "create":
        k = msg.key
        named = f" ({k.name})" if k.name else ""
        return "\n".join(
            [
                f"key {k.id}{named} created. The secret is shown once; store it now:",
                "",
                f"  {msg.secret}",
                "",
                f"models: {', '.join(k.models) or 'all'}   requests/min: {_limit(k.requests_per_minute)}"
                f"   tokens/min: {_limit(k.tokens_per_minute)}   expires: {_when(k.expires)}",
                "use it:  OpenAI(base_url=ROUTER/v1, api_key=<secret>), or "
                "curl -H 'Authorization: Bearer <secret>' ...",
            ]
        )
    if action == "revoke":
        return f"key {msg.key.id}{f' ({msg.key.name})' if msg.key.name else ''} revoked"
    return table(
        ["ID", "NAME", "OWNER", "PREFIX", "MODELS", "RPM", "TPM", "CREATED", "EXPIRES"],
        [
            [
                k.id,
                k.name or "-",
                k.owner or "-",
                k.prefix + "...",
                ",".join(k.models) or "all",
                _limit(k.requests_per_minute),
                _limit(k.tokens_per_minute),
                _when(k.created),
                _when(k.expires),
            ]
            for k in msg.keys
        ],
    )
