"""``llmgw nodes hold|release|label|domains``, ``llmgw explain MODEL``, ``llmgw usage``: the fleet services.

Same contract as the other admin commands: one unary call with a deadline
and the admin token (see connection), a one-line reason on failure (the
server's own message, which says what to fix), JSON with ``--json``.
"""

from __future__ import annotations

import time
from argparse import Namespace
from collections.abc import Sequence

from llmgw.v1 import nodes_pb2, nodes_pb2_grpc, owners_pb2, owners_pb2_grpc

from .connection import AdminError, Target, channel
from .connection import as_json as _json
from .tables import table


def _labels(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise AdminError(f"label {p!r} is not KEY=VALUE")
        out[key] = value
    return out


def domain_command(args: Namespace) -> str:
    """``llmgw nodes hold --domain L=V [--drain] [--reason R]``, ``release --domain L=V``, ``domains``."""
    action, target = args.action, Target.from_args(args)
    with channel(target) as ch:
        stub = nodes_pb2_grpc.NodeServiceStub(ch)
        if action == "domains":
            msg = target.call("nodes domains", stub.ListDomainHolds, nodes_pb2.ListDomainHoldsRequest())
            if args.json:
                return _json(msg)
            rows = [
                [f"{h.label}={h.value}", "drain" if h.drain else "hold", ",".join(h.nodes) or "-", h.reason]
                for h in msg.holds
            ]
            return table(["DOMAIN", "HOLD", "NODES", "REASON"], rows) if rows else "no domain is held"
        if action not in ("hold", "release"):
            raise AdminError(f"--domain goes with hold or release, not {action}")
        ((label, value),) = _labels([args.domain]).items()
        verb = f"nodes {action} --domain {args.domain}"
        if action == "hold":
            request = nodes_pb2.HoldDomainRequest(
                label=label, value=value, reason=args.reason, drain=args.drain
            )
            msg = target.call(verb, stub.HoldDomain, request)
        else:
            msg = target.call(
                verb, stub.ReleaseDomain, nodes_pb2.ReleaseDomainRequest(label=label, value=value)
            )
    if args.json:
        return _json(msg)
    nodes = ", ".join(msg.nodes) or "no node known now"
    if action == "release":
        return f"domain {label}={value} released: its nodes ({nodes}) take new replicas again"
    what = (
        "its replicas move out, each once its replacement is ready elsewhere (watch: llmgw replicas)"
        if msg.drain
        else "what runs there stays (--drain moves it out)"
    )
    why = msg.reason or "no reason given"
    return f"domain {label}={value} held ({why}; nodes: {nodes}): no new replicas; {what}"


def node_command(args: Namespace) -> str:
    """``llmgw nodes hold NODE [--reason R]``, ``release NODE``, ``label NODE K=V... [--remove K]``."""
    if args.domain or args.action == "domains":
        return domain_command(args)
    if args.drain:
        raise AdminError("--drain goes with --domain: holding a node always drains it")
    action, node, target = args.action, args.node, Target.from_args(args)
    reason, labels, remove = args.reason, args.labels, args.remove
    if not node:
        raise AdminError(f"nodes {action} needs a NODE")
    verb = f"nodes {action}"
    with channel(target) as ch:
        stub = nodes_pb2_grpc.NodeServiceStub(ch)
        if action == "hold":
            msg = target.call(verb, stub.HoldNode, nodes_pb2.HoldNodeRequest(node_id=node, reason=reason))
        elif action == "release":
            msg = target.call(verb, stub.ReleaseNode, nodes_pb2.ReleaseNodeRequest(node_id=node))
        elif action == "label":
            if not labels and not remove:
                raise AdminError("nodes label needs KEY=VALUE pairs or --remove KEY")
            request = nodes_pb2.LabelNodeRequest(node_id=node, set=_labels(labels), remove=list(remove))
            msg = target.call(verb, stub.LabelNode, request)
        else:
            raise AdminError(f"unknown action {action!r}")
    if args.json:
        return _json(msg)
    if action == "hold":
        return (
            f"node {node} held ({msg.hold_reason or 'no reason given'}): no new replicas; each replica "
            "it runs moves once its replacement is ready elsewhere (watch: llmgw replicas)"
        )
    if action == "release":
        return f"node {node} released: it takes new replicas again"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(msg.labels.items())) or "none"
    return f"node {node} operator labels: {shown}"


def explain(args: Namespace) -> str:
    """``llmgw explain MODEL``."""
    target = Target.from_args(args)
    with channel(target) as ch:
        stub = nodes_pb2_grpc.PlacementServiceStub(ch)
        msg = target.call(
            "explain", stub.ExplainPlacement, nodes_pb2.ExplainPlacementRequest(model=args.model)
        )
    if args.json:
        return _json(msg)
    lines = [
        f"model {msg.model} ({msg.capacity_class}): {msg.ready_replicas} ready of {msg.replicas}, "
        f"wants {msg.wanted}; policy {msg.policy}",
        f"placement: {msg.placement_message or 'every wanted replica is placed'}",
    ]
    if msg.federation:
        lines.append(f"federation: {msg.federation}")
    if msg.rollout:
        lines.append(f"update: {msg.rollout}")
    if msg.eval_gate:
        lines.append(f"eval gate: {msg.eval_gate}")
    if msg.owner:
        lines.append(f"owner: {msg.owner}" + ("" if msg.quotas else " (no quota)"))
        lines += [f"  quota {q}" for q in msg.quotas]
    for p in msg.profiles:
        lines += ["", f"profile {p.profile}: {p.description}"]
        lines.append(
            table(["NODE", "VERDICT"], [[v.node_id, v.reason] for v in p.nodes])
            if p.nodes
            else "  no nodes are registered"
        )
    return "\n".join(lines)


def _of(used: float, quota: float | None, fmt=str) -> str:
    return fmt(used) + (f"/{fmt(quota)}" if quota is not None else "")


def usage(args: Namespace) -> str:
    """``llmgw usage [--owner PATH]``: OwnerService, one row per owner scope."""
    target = Target.from_args(args)
    with channel(target) as ch:
        stub = owners_pb2_grpc.OwnerServiceStub(ch)
        msg = target.call("usage", stub.ListOwnerUsage, owners_pb2.ListOwnerUsageRequest(owner=args.owner))
    if args.json:
        return _json(msg)
    if not msg.owners:
        return "no owner holds anything and no quota is set (models: owner: {org, team, project})"

    def opt(o, name: str) -> float | None:
        return getattr(o, name) if o.HasField(name) else None

    def gib(n: float) -> str:
        return f"{n / 1024**3:.3g}"

    rows = [
        [
            o.owner,
            _of(o.replicas, opt(o, "quota_replicas")),
            _of(o.gpus, opt(o, "quota_gpus")),
            gib(o.gpu_memory_bytes)
            + (f"/{o.quota_gpu_memory_gb:g}" if o.HasField("quota_gpu_memory_gb") else ""),
            f"{o.gpu_hours:.2f}",
            ", ".join(m.model for m in o.models) or "-",
        ]
        for o in msg.owners
    ]
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(msg.since))
    head = ["OWNER", "REPLICAS", "GPUS", "GPU GIB", "GPU-HOURS", "MODELS"]
    return table(head, rows) + f"\n(used/quota; GPU-hours since {since}, when this leader's term began)"
