#!/usr/bin/env python3
"""Chaos: faults one after another under load, and what clients saw of each.

A local cluster as ``llmgw up`` runs it, with its default settings, made
larger where the faults need it: one real etcd, two control planes, two
agents with two simulated GPUs each, ``llmgw up``'s demo model (two
replicas, placed with the ``spread`` policy: packed, both would share one
machine, and its death would stop the model), and one router with two worker processes (so that restarting
one is a rolling restart: the other keeps the port). ``--clients`` clients
(the official openai client, no retries, a 10 s timeout) loop streamed and
whole requests the whole time.

A schedule of faults, each kind once per round in an order drawn from
``--seed``, for ``--rounds`` rounds or until ``--minutes`` pass:

- ``leader``: kill -9 the leading control plane; it is started again once
  the standby leads.
- ``agent``: kill -9 an agent and every engine it runs (a machine's
  processes dying together); the agent is started again 2 s later, with no
  engine left to adopt.
- ``engine-hang``: SIGSTOP one engine for ``--hang`` seconds, then SIGCONT
  (shorter than the agent's 30 s grace: nothing should be restarted).
- ``etcd``: SIGSTOP etcd for 3 s, then kill -9 it and start it again on
  its data.
- ``router``: SIGTERM one router worker (it stops accepting and drains);
  the router's supervisor starts a new one.

After each fault the cluster is waited on until it is at full capacity
again (every process up, a leader, two ready replicas, both published to
the router), then 2 s more before the next. Printed per fault kind: the
requests that started from the fault until capacity was back (plus those
2 s) and how many failed, the p99 latency of those requests, and the time
from the fault to full capacity again (max over the faults of that kind).

Usage: python bench/chaos.py [--rounds 3] [--minutes 0] [--seed 1] [--clients 4] [--hang 8]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.cli.localcluster import DEMO_MODEL, demo_model  # noqa: E402
from llmgw.v1 import admin_pb2  # noqa: E402
from tests.support.cluster import Cluster, kill_group, running_cluster  # noqa: E402
from tests.support.procs import start, tool  # noqa: E402
from tests.support.streams import Clients  # noqa: E402

CONTROLS = ("control-1", "control-2")
NODES = {"node-a": 2, "node-b": 2}
FAULTS = ("leader", "agent", "engine-hang", "etcd", "router")
SETTLE_SECONDS = 2.0
RECOVERY_TIMEOUT = 120.0
WORKER_EXIT_SECONDS = 15.0


@dataclass
class Fault:
    kind: str
    began: float
    recovered: float
    detail: str


def leader(c: Cluster) -> str:
    return next((n for n in CONTROLS if c.procs[n].alive() and c.leads(n)), "")


def router_workers(c: Cluster) -> list[int]:
    pid = c.procs["router"].popen.pid
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return []
    # The supervisor's children are its workers (and multiprocessing's resource tracker).
    return [int(p) for p in children if "llmgw" in _cmdline(int(p)) or "spawn_main" in _cmdline(int(p))]


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def full_capacity(c: Cluster, workers: int) -> bool:
    """Every process up, a leader that sees every node ready and two ready replicas, both routed to."""
    if not all(p.alive() for p in c.procs.values()):
        return False
    lead = leader(c)
    if not lead:
        return False
    nodes = c.admin(lead).ListNodes(admin_pb2.ListNodesRequest(), timeout=5, metadata=c.auth).nodes
    if sorted(n.node_id for n in nodes if n.state == "ready") != sorted(NODES):
        return False
    if c.ready(DEMO_MODEL, lead) != 2:
        return False
    return c.router_endpoints(DEMO_MODEL) == 2 and len(router_workers(c)) >= workers


def inject(kind: str, c: Cluster, rng: random.Random, hang: float) -> str:
    """Cause one fault and undo what an operator's automation would (restart what died)."""
    if kind == "leader":
        name = leader(c)
        c.procs[name].signal(signal.SIGKILL)
        other = next(n for n in CONTROLS if n != name)
        c.wait(lambda: c.leads(other), 30, "the standby leads")
        c.procs[name].popen.wait(5)
        c.start_control(name)
        return f"killed {name}"
    if kind == "agent":
        node = rng.choice(sorted(NODES))
        c.procs[f"agent-{node}"].signal(signal.SIGKILL)
        for pid in c.engine_pids([node]).values():
            kill_group(pid)
        time.sleep(2.0)
        path = c.state / f"agent-{node}.yaml"
        c.procs[f"agent-{node}"] = start(
            f"agent-{node}", [tool("llmgw-agent"), "--config", str(path)], c.state / "logs"
        )
        return f"killed {node}"
    if kind == "engine-hang":
        replica, pid = rng.choice(sorted(c.engine_pids().items()))
        os.killpg(pid, signal.SIGSTOP)
        try:
            time.sleep(hang)
        finally:
            os.killpg(pid, signal.SIGCONT)
        return f"froze {replica} for {hang:g}s"
    if kind == "etcd":
        etcd = c.procs["etcd"]
        etcd.signal(signal.SIGSTOP)
        time.sleep(3.0)
        etcd.signal(signal.SIGKILL)
        etcd.popen.wait(5)
        c.procs["etcd"] = start("etcd", list(etcd.popen.args), c.state / "logs")
        return "etcd stopped 3s, killed, restarted"
    if kind == "router":
        pid = rng.choice(router_workers(c))
        os.kill(pid, signal.SIGTERM)
        # Capacity is back once it is gone and its replacement listens. It drains for
        # shutdown_grace_seconds (5); one still there well after is killed, and said so.
        deadline = time.monotonic() + WORKER_EXIT_SECONDS
        while pid in router_workers(c):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                return f"SIGTERM to router worker {pid}: still there after {WORKER_EXIT_SECONDS:g}s, killed"
            time.sleep(0.1)
        return f"SIGTERM to router worker {pid}"
    raise ValueError(kind)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="each fault kind once per round")
    parser.add_argument("--minutes", type=float, default=0, help="stop starting faults after this (0: none)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--hang", type=float, default=8.0, help="seconds an engine stays frozen")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated kinds to use")
    args = parser.parse_args()
    kinds = [k for k in args.faults.split(",") if k]
    unknown = set(kinds) - set(FAULTS)
    if unknown:
        parser.error(f"unknown fault kinds {sorted(unknown)}; known: {', '.join(FAULTS)}")
    rng = random.Random(args.seed)
    schedule = []
    for _ in range(args.rounds):
        schedule += rng.sample(kinds, len(kinds))
    workers = 2
    faults: list[Fault] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmgw-chaos-") as tmp:
        with running_cluster(
            Path(tmp),
            [demo_model(2)],
            name="chaos",
            nodes=NODES,
            controls=CONTROLS,
            # Spread, as an operator who wants a machine's death to leave capacity would
            # set it: packed, both replicas share a node and its death stops the model.
            # Long enough that both agents are registered before the first placement,
            # even on a busy machine (llmgw up uses 5 s).
            control={"placement_policy": "spread", "placement_settle_seconds": 15.0},
            router={"workers": workers},
        ) as c:
            c.wait(lambda: full_capacity(c, workers), 120, "full capacity before the first fault", 0.5)
            placed = sorted(r.node_id for r in c.replicas(DEMO_MODEL, leader(c)))
            print(f"replicas on {', '.join(placed)}", flush=True)
            if len(set(placed)) < 2:
                print("both replicas share a node: a node fault would stop the model; not a fair run")
                return 2
            with Clients(c.router_url, DEMO_MODEL, args.clients, timeout=10, mixed=True) as clients:
                c.wait(lambda: clients.requests >= 3 * args.clients, 30, "clients running")
                for n, kind in enumerate(schedule, 1):
                    if args.minutes and time.monotonic() - started > args.minutes * 60:
                        break
                    began = time.monotonic()
                    detail = inject(kind, c, rng, args.hang)
                    recovered = c.wait(
                        lambda: full_capacity(c, workers), RECOVERY_TIMEOUT, f"capacity after {kind}", 0.25
                    )
                    faults.append(Fault(kind, began, recovered, detail))
                    c.wait(lambda r=recovered: time.monotonic() >= r + SETTLE_SECONDS, 10, "settle")
                    window = [x for x in clients.latencies if began <= x[0] < recovered + SETTLE_SECONDS]
                    failed = sum(not ok for _, _, ok in window)
                    print(
                        f"[{n}/{len(schedule)}] {kind}: {detail}; full capacity after "
                        f"{recovered - began:.1f}s; {failed} of {len(window)} requests failed",
                        flush=True,
                    )
            report(faults, clients, time.monotonic() - started, args)
            return 0 if not any(not ok for _, _, ok in clients.latencies) else 1


def report(faults: list[Fault], clients: Clients, elapsed: float, args: argparse.Namespace) -> None:
    by_kind: dict[str, list[Fault]] = defaultdict(list)
    for f in faults:
        by_kind[f.kind].append(f)
    total_failed = sum(not ok for _, _, ok in clients.latencies)
    print(
        f"\nchaos: {len(faults)} faults in {elapsed / 60:.1f} min, seed {args.seed}, {args.clients} clients; "
        f"{len(clients.latencies)} requests, {total_failed} failed"
    )
    print(f"{'fault':<12} {'times':>5} {'requests':>9} {'failed':>7} {'p99 (s)':>8} {'back (s)':>9}")
    for kind in FAULTS:
        fs = by_kind.get(kind)
        if not fs:
            continue
        window = [x for f in fs for x in clients.latencies if f.began <= x[0] < f.recovered + SETTLE_SECONDS]
        latencies = sorted(d for _, d, _ in window)
        p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] if latencies else 0.0
        failed = sum(not ok for _, _, ok in window)
        back = max(f.recovered - f.began for f in fs)
        print(f"{kind:<12} {len(fs):>5} {len(window):>9} {failed:>7} {p99:>8.2f} {back:>9.1f}")
    for e in clients.errors[:20]:
        print("  " + e)


if __name__ == "__main__":
    sys.exit(main())
