"""``llmgw settings show|get|set|unset|edit|history|rollback``: the cluster settings.

Every change is a new version stored with who (``--author``, default
``$USER@host``), when, and why (``-m``/``--reason``, default a summary of
the change). Changes are guarded by the version they were made from, so a
concurrent change is refused (ABORTED) instead of overwritten; the control
plane validates the whole document first, and an invalid one is refused
with nothing written (a refused ``edit`` is saved to a file, path printed).
"""

from __future__ import annotations

import getpass
import json
import socket
import time
from argparse import Namespace
from typing import Any

import yaml

from llmgw.v1 import settings_pb2, settings_pb2_grpc

from . import documents
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


def _when(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "-"


def _header(v: settings_pb2.SettingsVersion) -> str:
    lines = [f"# version {v.version}, {_when(v.created_at)}, by {v.author or '-'}: {v.reason or '-'}"]
    if v.load_error:
        lines.append(f"# does NOT load on this control plane: {v.load_error.splitlines()[0]}")
    elif not v.in_force:
        lines.append("# not in force on this control plane")
    if v.restart_pending:
        lines.append(f"# waiting for a restart to apply: {', '.join(v.restart_pending)}")
    return "\n".join(lines)


def _put(target: Target, stub, args: Namespace, doc: dict[str, Any], base: int, reason: str):
    request = settings_pb2.PutSettingsRequest(
        document=json.dumps(doc), if_version=base, author=_author(args), reason=args.reason or reason
    )
    return target.call(f"settings {args.action}", stub.PutSettings, request)


def _stored(v: settings_pb2.SettingsVersion) -> str:
    return f"settings version {v.version} stored" + (
        f" (changed: {', '.join(v.changed)})" if v.changed else ""
    )


def settings_command(args: Namespace) -> str:
    target = Target.from_args(args)
    verb = f"settings {args.action}"
    with channel(target) as ch:
        stub = settings_pb2_grpc.SettingsServiceStub(ch)
        if args.action == "history":
            msg = target.call(
                verb, stub.ListSettingsVersions, settings_pb2.ListSettingsVersionsRequest(limit=args.limit)
            )
            if args.json:
                return as_json(msg)
            return table(
                ["VERSION", "WHEN", "AUTHOR", "CHANGED", "REASON"],
                [
                    [
                        f"{v.version}{' *' if v.in_force else ''}",
                        _when(v.created_at),
                        v.author or "-",
                        ",".join(v.changed) or "-",
                        (v.reason or "-")[:60],
                    ]
                    for v in msg.versions
                ],
            )
        if args.action == "rollback":
            request = settings_pb2.RollbackSettingsRequest(
                version=args.version, author=_author(args), reason=args.reason or ""
            )
            msg = target.call(verb, stub.RollbackSettings, request)
            return as_json(msg) if args.json else _stored(msg)
        current = target.call(
            verb, stub.GetSettings, settings_pb2.GetSettingsRequest(version=getattr(args, "version", 0) or 0)
        )
        doc = json.loads(current.document)
        if args.action == "show":
            if args.json:
                return as_json(current)
            shown = json.loads(current.effective) if args.effective and current.effective else doc
            return f"{_header(current)}\n{documents.dump(shown).rstrip()}"
        if args.action == "get":
            source = json.loads(current.effective) if current.effective else doc
            value = documents.get_path(source, args.key)
            if args.json:
                return json.dumps(value, indent=2)
            return (
                documents.dump(value).rstrip().removesuffix("\n...")
                if isinstance(value, dict | list)
                else str(value)
            )
        if args.action == "set":
            pairs = [documents.parse_assignment(p) for p in args.pairs]
            for key, value in pairs:
                documents.set_path(doc, key, value)
            reason = "set " + ", ".join(f"{k}={json.dumps(v)}" for k, v in pairs)
            return _stored(_put(target, stub, args, doc, current.version, reason))
        if args.action == "unset":
            for key in args.keys:
                documents.unset_path(doc, key)
            return _stored(_put(target, stub, args, doc, current.version, "unset " + ", ".join(args.keys)))
        # edit
        before = f"{_header(current)}\n{documents.dump(doc)}"
        after = documents.edit(before, "settings.yaml")
        if after == before:
            return "settings unchanged"
        try:
            edited = yaml.safe_load(after) or {}
            if not isinstance(edited, dict):
                raise AdminError("the settings are a mapping of key: value")
            return _stored(_put(target, stub, args, edited, current.version, "edited"))
        except (yaml.YAMLError, AdminError) as err:
            kept = documents.keep(after, "settings")
            raise AdminError(f"{err}\nnothing changed; your edit is in {kept}") from None
