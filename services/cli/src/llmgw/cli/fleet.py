"""``llmgw nodes hold|release|label`` and ``llmgw explain MODEL``: NodeService and PlacementService.

Same contract as the other admin commands: one unary call with a deadline,
a one-line reason on failure (the server's own message, which says what to
fix), JSON with ``--json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import grpc
from google.protobuf import json_format

from llmgw.v1 import nodes_pb2, nodes_pb2_grpc

from .admin import DEADLINE_SECONDS, AdminError, _unavailable, table


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise AdminError(f"label {p!r} is not KEY=VALUE")
        out[key] = value
    return out


def node_command(
    action: str,
    node: str,
    address: str,
    *,
    reason: str = "",
    labels: Sequence[str] = (),
    remove: Sequence[str] = (),
    as_json: bool = False,
) -> str:
    """``llmgw nodes hold NODE [--reason R]``, ``release NODE``, ``label NODE K=V... [--remove K]``."""
    if not node:
        raise AdminError(f"nodes {action} needs a NODE")
    with grpc.insecure_channel(address) as channel:
        stub = nodes_pb2_grpc.NodeServiceStub(channel)
        try:
            if action == "hold":
                msg = stub.HoldNode(
                    nodes_pb2.HoldNodeRequest(node_id=node, reason=reason), timeout=DEADLINE_SECONDS
                )
            elif action == "release":
                msg = stub.ReleaseNode(nodes_pb2.ReleaseNodeRequest(node_id=node), timeout=DEADLINE_SECONDS)
            elif action == "label":
                if not labels and not remove:
                    raise AdminError("nodes label needs KEY=VALUE pairs or --remove KEY")
                msg = stub.LabelNode(
                    nodes_pb2.LabelNodeRequest(node_id=node, set=_labels(labels), remove=list(remove)),
                    timeout=DEADLINE_SECONDS,
                )
            else:
                raise AdminError(f"unknown action {action!r}")
        except grpc.RpcError as err:
            raise _unavailable(err, address, f"nodes {action}") from None
    if as_json:
        return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
    if action == "hold":
        return (
            f"node {node} held ({msg.hold_reason or 'no reason given'}): no new replicas; each replica "
            "it runs moves once its replacement is ready elsewhere (watch: llmgw replicas)"
        )
    if action == "release":
        return f"node {node} released: it takes new replicas again"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(msg.labels.items())) or "none"
    return f"node {node} operator labels: {shown}"


def explain(model: str, address: str, as_json: bool = False) -> str:
    with grpc.insecure_channel(address) as channel:
        stub = nodes_pb2_grpc.PlacementServiceStub(channel)
        try:
            request = nodes_pb2.ExplainPlacementRequest(model=model)
            msg = stub.ExplainPlacement(request, timeout=DEADLINE_SECONDS)
        except grpc.RpcError as err:
            raise _unavailable(err, address, "explain") from None
    if as_json:
        return json.dumps(json_format.MessageToDict(msg, preserving_proto_field_name=True), indent=2)
    lines = [
        f"model {msg.model} ({msg.capacity_class}): {msg.ready_replicas} ready of {msg.replicas}, "
        f"wants {msg.wanted}; policy {msg.policy}",
        f"placement: {msg.placement_message or 'every wanted replica is placed'}",
    ]
    for p in msg.profiles:
        lines += ["", f"profile {p.profile}: {p.description}"]
        lines.append(
            table(["NODE", "VERDICT"], [[v.node_id, v.reason] for v in p.nodes])
            if p.nodes
            else "  no nodes are registered"
        )
    return "\n".join(lines)
