"""``llmgw status | models | nodes | replicas | model ...``: AdminService, printed for people.

Each command is one unary call with a deadline; an unreachable control plane
is reported in one line that names the address, not a traceback, and a
refusal is the server's own message (it says what to fix).

``llmgw model edit NAME`` fetches the document, opens ``$EDITOR`` (default
``vi``) on it as YAML, and sends the result as an update: the control plane
validates the whole next catalog before writing, so an invalid edit is
refused and nothing changes. An unchanged file sends nothing.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import grpc
from google.protobuf import json_format

from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2

DEADLINE_SECONDS = 5.0


class AdminError(Exception):
    pass


def _state(value: int) -> str:
    return agent_pb2.ReplicaState.Name(value).removeprefix("REPLICA_STATE_").lower()


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [list(map(str, headers))] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def _unavailable(err: grpc.RpcError, address: str, command: str) -> AdminError:
    code = err.code()
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return AdminError(
            f"control plane at {address} is not reachable ({code.name.lower()}); "
            "is it running? set --control or LLMGW_CONTROL"
        )
    return AdminError(f"{command} failed: {code.name}: {err.details()}")


def model_command(action: str, target: str, address: str, as_json: bool = False) -> str:
    """``llmgw model add|update FILE``, ``get|remove|edit NAME``."""
    import yaml

    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            if action in ("add", "update"):
                try:
                    text = Path(target).read_text() if target != "-" else sys.stdin.read()
                except OSError as err:
                    raise AdminError(f"cannot read {target}: {err.strerror}") from None
                call = stub.AddModel if action == "add" else stub.UpdateModel
                msg = call(admin_pb2.PutModelRequest(document=text), timeout=DEADLINE_SECONDS)
            elif action == "get":
                msg = stub.GetModel(admin_pb2.GetModelRequest(name=target), timeout=DEADLINE_SECONDS)
            elif action == "remove":
                stub.RemoveModel(admin_pb2.RemoveModelRequest(name=target), timeout=DEADLINE_SECONDS)
                return f"model {target} removed"
            elif action == "edit":
                current = stub.GetModel(admin_pb2.GetModelRequest(name=target), timeout=DEADLINE_SECONDS)
                before = yaml.safe_dump(json.loads(current.document), sort_keys=False)
                after = _edit(before, f"{current.name}.yaml")
                if after == before:
                    return f"model {current.name} unchanged"
                msg = stub.UpdateModel(admin_pb2.PutModelRequest(document=after), timeout=DEADLINE_SECONDS)
            else:
                raise AdminError(f"unknown action {action!r}")
        except grpc.RpcError as err:
            raise _unavailable(err, address, f"model {action}") from None
    if as_json:
        return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
    body = yaml.safe_dump(json.loads(msg.document), sort_keys=False).rstrip()
    return f"# {msg.name} ({msg.origin})\n{body}"


def _edit(text: str, name: str) -> str:
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name.replace("/", "_")
        path.write_text(text)
        rc = subprocess.call([*shlex.split(editor), str(path)])
        if rc != 0:
            raise AdminError(f"editor {editor!r} exited with {rc}; nothing was changed")
        return path.read_text()


def run(command: str, address: str, as_json: bool = False, model: str = "") -> str:
    with grpc.insecure_channel(address) as channel:
        stub = admin_pb2_grpc.AdminServiceStub(channel)
        try:
            if command == "status":
                msg = stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest(), timeout=DEADLINE_SECONDS)
            elif command == "models":
                msg = stub.ListModels(admin_pb2.ListModelsRequest(), timeout=DEADLINE_SECONDS)
            elif command == "nodes":
                msg = stub.ListNodes(admin_pb2.ListNodesRequest(), timeout=DEADLINE_SECONDS)
            elif command == "replicas":
                msg = stub.ListReplicas(admin_pb2.ListReplicasRequest(model=model), timeout=DEADLINE_SECONDS)
            else:
                raise AdminError(f"unknown command {command!r}")
        except grpc.RpcError as err:
            raise _unavailable(err, address, command) from None
    if as_json:
        return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
    return render(command, msg)


def render(command: str, msg) -> str:
    if command == "status":
        problems = [f"  {p}" for p in msg.placement_problems]
        if problems:
            problems.insert(0, "\ncannot place (llmgw explain MODEL shows every node):")
        return "\n".join(
            [
                f"cluster:        {msg.cluster}",
                f"control plane:  {msg.control_id} ({'leader' if msg.leader else 'standby'})",
                f"leader:         {msg.leader_id or '-'} at {msg.leader_address or '-'}",
                f"nodes:          {msg.nodes}",
                f"models:         {msg.models}",
                f"replicas:       {msg.ready_replicas} ready of {msg.replicas}",
                f"endpoints rev:  {msg.endpoint_revision}",
                *problems,
            ]
        )
    if command == "models":
        return table(
            ["MODEL", "ALIASES", "ORIGIN", "ENGINE", "GPUS", "MIN", "MAX", "WANT", "READY", "PLACEMENT"],
            [
                [
                    m.name,
                    ",".join(m.aliases) or "-",
                    m.origin or "-",
                    m.engine,
                    m.gpus,
                    m.min_replicas,
                    m.max_replicas,
                    m.desired_replicas if m.HasField("desired_replicas") else "-",
                    f"{m.ready_replicas}/{m.replicas}",
                    m.placement_message or "ok",
                ]
                for m in msg.models
            ],
        )
    if command == "nodes":
        return table(
            ["NODE", "STATE", "ADDRESS", "GPUS", "USED", "MEMORY", "CORES", "ENGINES", "LABELS", "SEEN"],
            [
                [
                    n.node_id,
                    n.state + (f" ({n.hold_reason})" if n.hold_reason else ""),
                    n.address,
                    len(n.gpus),
                    ",".join(map(str, n.used_gpu_indices)) or "-",
                    f"{n.memory_bytes / 1024**3:.0f}G" if n.memory_bytes else "-",
                    f"{n.cpu_cores:g}" if n.cpu_cores else "-",
                    ",".join(f"{e.kind}@{e.version}" for e in n.engines) or "-",
                    ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-",
                    f"{n.last_seen_seconds_ago:.1f}s ago",
                ]
                for n in msg.nodes
            ],
        )
    failures = [
        f"{f.model}: {f.failures} failure(s) in a row, last {f.replica_id} on {f.node_id}; "
        + (f"retrying in {f.retry_in_seconds:.0f}s" if f.retry_in_seconds > 0 else "retrying now")
        + f"; last error: {(f.last_error.splitlines() or [''])[0][:120]}"
        for f in msg.failures
    ]
    listed = table(
        ["REPLICA", "MODEL", "NODE", "STATE", "GPUS", "URL", "MESSAGE"],
        [
            [
                r.replica_id,
                r.model,
                r.node_id,
                _state(r.state),
                ",".join(map(str, r.gpu_indices)) or "-",
                r.url or "-",
                (r.message.splitlines() or [""])[0][:60],
            ]
            for r in msg.replicas
        ],
    )
    return "\n".join([listed, *(["", "backing off:"] if failures else []), *(f"  {f}" for f in failures)])
