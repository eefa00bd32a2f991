"""``llmgw model ...``: change models added at runtime through AdminService.

``add``/``update`` send a document; ``get`` prints one; ``remove`` removes
one. ``edit``, ``scale``, ``set`` and ``unset`` read the document, change
it here and send it back as an update guarded by the revision they read, so
a concurrent change is refused (ABORTED) rather than overwritten. The
control plane validates the whole next catalog before writing anything: an
invalid result is refused with the reason and nothing changes; a refused
``edit`` is saved to a file whose path is printed, so the work is not lost.
"""

from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import yaml

from llmgw.v1 import admin_pb2, admin_pb2_grpc

from . import documents
from .connection import AdminError, Target, as_json, channel


def _read(target: str) -> str:
    try:
        return Path(target).read_text() if target != "-" else sys.stdin.read()
    except OSError as err:
        raise AdminError(f"cannot read {target}: {err.strerror}") from None


def _render(msg: admin_pb2.ModelDocument, json_out: bool) -> str:
    if json_out:
        return as_json(msg)
    body = documents.dump(json.loads(msg.document)).rstrip()
    return f"# {msg.name} ({msg.origin})\n{body}"


def _changes(args: Namespace, doc: dict[str, Any]) -> None:
    """Apply scale/set/unset arguments to a model document in place."""
    if args.action == "scale":
        if args.min is None and args.max is None and args.idle_timeout is None:
            raise AdminError("give --min, --max or --idle-timeout")
        scaling = doc.setdefault("scaling", {})
        for key, value in (("min", args.min), ("max", args.max), ("idle_timeout_seconds", args.idle_timeout)):
            if value is not None:
                scaling[key] = value
    elif args.action == "set":
        if not args.pairs:
            raise AdminError("give KEY=VALUE pairs, for example capacity_class=critical scaling.max=4")
        for pair in args.pairs:
            documents.set_path(doc, *documents.parse_assignment(pair))
    else:
        if not args.pairs:
            raise AdminError("give the keys to unset, for example canary eval_gate")
        for key in args.pairs:
            documents.unset_path(doc, key)


def model_command(args: Namespace) -> str:
    target = Target.from_args(args)
    verb = f"model {args.action}"
    with channel(target) as ch:
        stub = admin_pb2_grpc.AdminServiceStub(ch)
        if args.action in ("add", "update"):
            call = stub.AddModel if args.action == "add" else stub.UpdateModel
            msg = target.call(verb, call, admin_pb2.PutModelRequest(document=_read(args.target)))
            return _render(msg, args.json)
        if args.action == "remove":
            target.call(verb, stub.RemoveModel, admin_pb2.RemoveModelRequest(name=args.target))
            return f"model {args.target} removed"
        current = target.call(verb, stub.GetModel, admin_pb2.GetModelRequest(name=args.target))
        if args.action == "get":
            return _render(current, args.json)
        doc = json.loads(current.document)
        if args.action == "edit":
            before = documents.dump(doc)
            after = documents.edit(before, f"{current.name}.yaml")
            if after == before:
                return f"model {current.name} unchanged"
            try:
                yaml.safe_load(after)
            except yaml.YAMLError as err:
                kept = documents.keep(after, current.name)
                raise AdminError(
                    f"the edit is not valid YAML ({err}); nothing changed; it is in {kept}"
                ) from None
            text = after
        else:
            _changes(args, doc)
            text = json.dumps(doc)
        request = admin_pb2.PutModelRequest(document=text, if_revision=current.revision)
        try:
            msg = target.call(verb, stub.UpdateModel, request)
        except AdminError as err:
            if args.action == "edit":
                raise AdminError(
                    f"{err}\nnothing changed; your edit is in {documents.keep(text, current.name)}"
                ) from None
            raise
        return _render(msg, args.json)
