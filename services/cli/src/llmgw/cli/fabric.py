"""``llmgw nodes fabric-test A B`` (or ``--all``), and the fabric table under ``llmgw nodes``.

A test runs on the leader, pair after pair, and can take a while (64 MiB
per pair by default): the deadline grows with the pairs. Results are
stored per pair, so ``llmgw nodes`` shows the latest of each.
"""

from __future__ import annotations

import time
from argparse import Namespace
from collections.abc import Sequence

import grpc

from llmgw.v1 import fabric_pb2, fabric_pb2_grpc

from .connection import AdminError, Target, channel
from .connection import as_json as _json
from .tables import table

# Per pair: the leader's own bound on a probe (120 s) and on the listen (10 s), and a margin.
SECONDS_PER_PAIR = 135.0


def _rate(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


def render(results: Sequence[fabric_pb2.FabricResult], now: float | None = None) -> str:
    """The fabric table, and one line per warning beneath it."""
    now = time.time() if now is None else now
    rows = []
    for r in results:
        if r.error:
            figures = ["-", "-", "failed: " + r.error.splitlines()[0][:100]]
        else:
            figures = [
                _rate(r.bandwidth_bytes_per_second),
                f"{r.latency_seconds * 1e3:.3f} ms",
                ("LOW: " + r.warning) if r.warning else "ok",
            ]
        ago = max(0.0, now - r.measured_at)
        rows.append([f"{r.node_a} <-> {r.node_b}", *figures, r.method or "-", f"{ago:.0f}s ago"])
    out = table(["PAIR", "BANDWIDTH", "LATENCY", "VERDICT", "METHOD", "MEASURED"], rows)
    nccl = sorted({r.nccl for r in results if r.nccl})
    if nccl:
        out += "\n" + "\n".join(f"NCCL: {n}" for n in nccl)
    return out


def fabric_section(target: Target, ch: grpc.Channel) -> str:
    """The fabric results for ``llmgw nodes``; empty when none are stored (or the server has none)."""
    stub = fabric_pb2_grpc.FabricServiceStub(ch)
    try:
        msg = target.call("nodes", stub.ListFabricResults, fabric_pb2.ListFabricResultsRequest())
    except AdminError:
        return ""
    if not msg.results:
        return ""
    return "\nfabric (llmgw nodes fabric-test):\n" + render(msg.results)


def fabric_test(args: Namespace) -> str:
    """``llmgw nodes fabric-test A B [C ...] [--bytes N] [--pings N]``, or ``--all``."""
    nodes = [n for n in (args.node, *args.labels) if n]
    if args.all and nodes:
        raise AdminError("fabric-test takes nodes or --all, not both")
    if not args.all and len(nodes) < 2:
        raise AdminError("fabric-test needs two nodes (A B), more, or --all for every connected node")
    target = Target.from_args(args)
    n = len(nodes) if nodes else 64
    pairs = max(1, n * (n - 1) // 2)
    request = fabric_pb2.RunFabricTestRequest(nodes=nodes, bytes=args.bytes, pings=args.pings)
    with channel(target) as ch:
        stub = fabric_pb2_grpc.FabricServiceStub(ch)
        msg = target.call("nodes fabric-test", stub.RunFabricTest, request, timeout=SECONDS_PER_PAIR * pairs)
    if args.json:
        return _json(msg)
    return render(msg.results)
