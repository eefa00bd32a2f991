"""``llmgw logs REPLICA`` and ``llmgw weights ...``: NodeAdminService, printed for people.

Both are answered by a node's agent through the leading control plane, so
their errors come in three kinds, each printed as the server wrote it:
NOT_FOUND (no such replica or node), UNAVAILABLE (the node's agent is not
connected or did not answer: retry), FAILED_PRECONDITION (this control
plane is a standby: it names the leader to ask, or weights still in use).
"""

from __future__ import annotations

from argparse import Namespace

from llmgw.v1 import agent_pb2, nodeadmin_pb2, nodeadmin_pb2_grpc

from .connection import AdminError, Target, as_json, channel
from .tables import table

# Above the control plane's own wait for the agent (10 s), so its answer wins.
DEADLINE_SECONDS = 15.0


def logs(args: Namespace) -> str:
    """``llmgw logs REPLICA [-n LINES] [--node NODE]``."""
    target, replica_id = Target.from_args(args), args.replica
    with channel(target) as ch:
        stub = nodeadmin_pb2_grpc.NodeAdminServiceStub(ch)
        request = nodeadmin_pb2.GetReplicaLogsRequest(
            replica_id=replica_id, lines=args.lines, node_id=args.node
        )
        msg = target.call(f"logs of {replica_id}", stub.GetReplicaLogs, request, DEADLINE_SECONDS)
    if args.json:
        return as_json(msg)
    return "\n".join(msg.lines)


def _size(size: int) -> str:
    n = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _state(value: int) -> str:
    return agent_pb2.WeightsState.Name(value).removeprefix("WEIGHTS_STATE_").lower()


def _progress(w: agent_pb2.WeightsStatus) -> str:
    if w.state != agent_pb2.WEIGHTS_STATE_FETCHING:
        return _size(w.size_bytes)
    if w.total_bytes:
        return f"{_size(w.fetched_bytes)} of {_size(w.total_bytes)}"
    return f"{_size(w.fetched_bytes)} so far"


def weights(args: Namespace) -> str:
    """``llmgw weights [list [NODE]] | fetch NODE SOURCE [--name N] | remove NODE NAME``."""
    action, node_id, name_or_source, name = args.action, args.node, args.target, args.name
    if action != "list" and not (node_id and name_or_source):
        raise AdminError(f"weights {action} needs NODE and {'SOURCE' if action == 'fetch' else 'NAME'}")
    target = Target.from_args(args)
    with channel(target) as ch:
        stub = nodeadmin_pb2_grpc.NodeAdminServiceStub(ch)
        verb = f"weights {action}"
        if action == "list":
            msg = target.call(
                verb, stub.ListWeights, nodeadmin_pb2.ListWeightsRequest(node_id=node_id), DEADLINE_SECONDS
            )
        elif action == "fetch":
            fetch = nodeadmin_pb2.FetchWeightsRequest(node_id=node_id, source=name_or_source, name=name)
            msg = target.call(verb, stub.FetchWeights, fetch, DEADLINE_SECONDS)
        elif action == "remove":
            remove = nodeadmin_pb2.RemoveWeightsRequest(node_id=node_id, name=name_or_source)
            msg = target.call(verb, stub.RemoveWeights, remove, DEADLINE_SECONDS)
        else:
            raise AdminError(f"unknown action {action!r}")
    if args.json:
        return as_json(msg)
    if action == "fetch":
        return f"weights {msg.name} on {node_id}: {_state(msg.state)} ({msg.source} -> {msg.path})"
    if action == "remove":
        freed = "nothing deleted (in place)" if msg.in_place else f"{_size(msg.size_bytes)} freed"
        return f"weights {msg.name} removed from {node_id}: {freed}"
    rows = []
    for n in msg.nodes:
        for w in n.weights:
            note = (w.message.splitlines() or [""])[0][:70]
            rows.append([n.node_id, w.name, _state(w.state), _progress(w), w.source, note or "-"])
    totals = "\n".join(f"{n.node_id}: {_size(n.disk_bytes)} of weights" for n in msg.nodes)
    return table(["NODE", "NAME", "STATE", "SIZE", "SOURCE", "MESSAGE"], rows) + "\n\n" + totals
