"""``llmgw keys create | list | revoke``: client API keys through KeyService.

``create`` prints the secret once, with how to use it; it is stored nowhere
(etcd holds its hash), so a lost key is revoked and replaced, never
recovered. ``list`` shows ids, names and the first characters of each
secret; ``revoke`` takes an id or a name. A refusal is the control plane's
own message (it says what to fix) and a non-zero exit.
"""

from __future__ import annotations

import time
from argparse import Namespace

from llmgw.v1 import keys_pb2, keys_pb2_grpc

from .connection import AdminError, Target, as_json, channel
from .tables import table


def _when(seconds: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(seconds)) if seconds else "never"


def _limit(value: int) -> str:
    return str(value) if value else "-"


def keys_command(args: Namespace) -> str:
    """``llmgw keys create|list|revoke`` from parsed arguments."""
    action, target = args.action, Target.from_args(args)
    command = f"keys {action}"
    with channel(target) as ch:
        stub = keys_pb2_grpc.KeyServiceStub(ch)
        if action == "create":
            request = keys_pb2.CreateKeyRequest(
                name=args.name,
                owner=args.owner,
                models=args.models,
                requests_per_minute=args.rpm,
                tokens_per_minute=args.tpm,
                ttl_seconds=args.ttl,
            )
            msg = target.call(command, stub.CreateKey, request)
        elif action == "list":
            msg = target.call(command, stub.ListKeys, keys_pb2.ListKeysRequest())
        elif action == "revoke":
            msg = target.call(command, stub.RevokeKey, keys_pb2.RevokeKeyRequest(key=args.key))
        else:
            raise AdminError(f"unknown action {action!r}")
    if args.json:
        return as_json(msg)
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
