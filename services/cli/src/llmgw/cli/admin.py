"""``llmgw status | models | nodes | replicas | routers``: AdminService reads, printed for people.

Each command is one unary call with a deadline and the admin token (see
connection); an unreachable control plane is reported in one line that
names the address, not a traceback, and a refusal is the server's own
message (it says what to fix). Any control plane answers; a standby says
where the leader is for what only the leader knows (nodes, routers).
"""

from __future__ import annotations

from argparse import Namespace

from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2

from .connection import AdminError, Target, as_json, channel
from .fabric import fabric_section
from .tables import table


def _state(value: int) -> str:
    return agent_pb2.ReplicaState.Name(value).removeprefix("REPLICA_STATE_").lower()


def _build(e) -> str:
    """One engine build: ``vllm@0.8.5[cu124]/cuda12.4`` (the name only for a kind's extra builds)."""
    return (
        f"{e.kind}@{e.version}" + (f"[{e.build}]" if e.build else "") + (f"/cuda{e.cuda}" if e.cuda else "")
    )


def _driver(n) -> str:
    if not n.driver_version and not n.cuda_version:
        return "-"
    return f"{n.driver_version or '?'}/cuda{n.cuda_version or '?'}"


def run(args: Namespace) -> str:
    target = Target.from_args(args)
    command = args.command
    with channel(target) as ch:
        stub = admin_pb2_grpc.AdminServiceStub(ch)
        if command == "status":
            msg = target.call(command, stub.GetClusterStatus, admin_pb2.GetClusterStatusRequest())
        elif command == "models":
            msg = target.call(command, stub.ListModels, admin_pb2.ListModelsRequest())
        elif command == "nodes":
            msg = target.call(command, stub.ListNodes, admin_pb2.ListNodesRequest())
            if not args.json:
                return render(command, msg) + fabric_section(target, ch)
        elif command == "routers":
            msg = target.call(command, stub.ListRouters, admin_pb2.ListRoutersRequest())
        elif command == "replicas":
            msg = target.call(command, stub.ListReplicas, admin_pb2.ListReplicasRequest(model=args.model))
        else:
            raise AdminError(f"unknown command {command!r}")
    return as_json(msg) if args.json else render(command, msg)


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
                f"nodes:          {msg.nodes if msg.leader else '- (known to the leader)'}",
                f"models:         {msg.models}",
                f"replicas:       {msg.ready_replicas} ready of {msg.replicas}",
                f"endpoints rev:  {msg.endpoint_revision}",
                f"settings:       version {msg.settings_version or '- (from the file)'}"
                + (f", restarting for {', '.join(msg.restart_pending)}" if msg.restart_pending else ""),
                *problems,
            ]
        )
    if command == "models":
        listed = table(
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
        # Rolling updates and eval gates, one line each under the table (they are sentences).
        notes = [f"{m.name}: update {m.rollout}" for m in msg.models if m.rollout]
        notes += [f"{m.name}: eval gate {m.eval_gate}" for m in msg.models if m.eval_gate]
        return "\n".join([listed, "", *notes]) if notes else listed
    if command == "nodes":
        return table(
            [
                "NODE",
                "STATE",
                "AGENT",
                "ADDRESS",
                "GPUS",
                "USED",
                "MEMORY",
                "CORES",
                "DRIVER",
                "ENGINE BUILDS",
                "LABELS",
                "SEEN",
            ],  # fmt: skip
            [
                [
                    n.node_id,
                    n.state + (f" ({n.hold_reason})" if n.hold_reason else ""),
                    n.version or "-",
                    n.address,
                    len(n.gpus),
                    ",".join(map(str, n.used_gpu_indices)) or "-",
                    f"{n.memory_bytes / 1024**3:.0f}G" if n.memory_bytes else "-",
                    f"{n.cpu_cores:g}" if n.cpu_cores else "-",
                    _driver(n),
                    ",".join(_build(e) for e in n.engines) or "-",
                    ",".join(f"{k}={v}" for k, v in sorted(n.labels.items())) or "-",
                    f"{n.last_seen_seconds_ago:.1f}s ago",
                ]
                for n in msg.nodes
            ],
        )
    if command == "routers":
        return _routers(msg)
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


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _routers(msg: admin_pb2.ListRoutersResponse) -> str:
    """Each router, then each model: requests per second and the 5xx and 4xx shares of them."""
    routers = table(
        ["ROUTER", "REPORTED", "IN FLIGHT", "WAITING", "REQ/S", "5XX", "4XX", "SINCE START"],
        [
            [
                r.router_id,
                f"{r.last_report_seconds_ago:.1f}s ago",
                r.in_flight,
                r.pending,
                f"{r.requests_per_second:.2f}",
                _share(r.server_errors_per_second, r.requests_per_second),
                _share(r.client_errors_per_second, r.requests_per_second),
                f"{r.requests} requests, {r.server_errors} 5xx, {r.client_errors} 4xx",
            ]
            for r in msg.routers
        ],
    )
    models = table(
        ["MODEL", "LOAD", "WAITING", "REQ/S", "5XX", "4XX"],
        [
            [
                m.model or "(no model)",
                f"{m.load:g}",
                m.pending,
                f"{m.requests_per_second:.2f}",
                _share(m.server_errors_per_second, m.requests_per_second),
                _share(m.client_errors_per_second, m.requests_per_second),
            ]
            for m in msg.models
        ],
    )
    window = f"rates over the last {msg.window_seconds:.0f}s of each router's reports"
    return "\n".join([routers, "", models, "", window])
