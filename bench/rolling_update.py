#!/usr/bin/env python3
"""Rolling updates, measured over real processes: how long replacing N replicas takes.

One cluster (etcd, one control plane, one router, two agents with room for
one surge replica; every role its own process) serves ``rolled`` on N
simulator replicas while ``--clients`` threads stream chat completions
through the router with the official openai client. Each round changes the
weights' revision with the admin API's ``UpdateModel`` (what ``llmgw model
set`` calls) and times, from the start of the call: the first new replica
ready, and the whole update (every replica of the new version, ready
and routed, no old replica left). With ``--gate``, the model has an eval
gate (a two-case regex suite), so each new version is also judged before
it is published. Client failures are counted over the whole run.

Usage: python bench/rolling_update.py [--replicas 2 4] [--rounds 2] [--clients 4] [--gate]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.v1 import admin_pb2  # noqa: E402
from tests.support.cluster import QUICK_AGENT, READY, Cluster, running_cluster  # noqa: E402
from tests.support.streams import Clients  # noqa: E402

SUITES = {
    "words": {
        "metric": "regex",
        "max_tokens": 4,
        "cases": [{"prompt": "one", "expected": "[a-z]"}, {"prompt": "two", "expected": "[a-z]"}],
    }
}


def document(replicas: int, revision: str, gate: bool) -> dict:
    doc = {
        "name": "rolled",
        "scaling": {"min": replicas, "max": replicas},
        "profile": {"engine": "simulator", "args": {"ttft-ms": "20", "itl-ms": "10", "output-tokens": "16"}},
        "weights": {"revision": revision},
    }
    if gate:
        doc["eval_gate"] = {"suite": "words", "min_score": 1.0}
    return doc


def one_update(c: Cluster, replicas: int, revision: str, gate: bool) -> dict[str, float]:
    old = {r.replica_id for r in c.replicas("rolled")}
    doc = document(replicas, revision, gate)
    t0 = time.monotonic()
    c.admin().UpdateModel(admin_pb2.PutModelRequest(document=json.dumps(doc)), timeout=30, metadata=c.auth)

    def new_ready() -> int:
        return sum(1 for r in c.replicas("rolled") if r.replica_id not in old and r.state == READY)

    first = c.wait(lambda: new_ready() >= 1, 120, "a first new replica", step=0.02)

    def done() -> bool:
        ids = {r.replica_id for r in c.replicas("rolled")}
        return (
            not ids & old
            and len(ids) == replicas
            and c.ready("rolled") == replicas
            and c.router_endpoints("rolled") == replicas
        )

    end = c.wait(done, 300, "every replica replaced", step=0.02)
    return {"first": first - t0, "total": end - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=int, nargs="+", default=[2, 4])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--gate", action="store_true", help="give the model an eval gate")
    args = p.parse_args()
    results: dict[int, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-rolling-") as tmp:
        most = max(args.replicas)
        with running_cluster(
            Path(tmp),
            [],
            # Room for the largest N plus one surge replica, over two nodes.
            nodes={"node-a": (most + 2) // 2, "node-b": (most + 2) // 2},
            control={"reconcile_interval_seconds": 0.5, "eval_suites": SUITES, "log_level": "warning"},
            agent={**QUICK_AGENT, "log_level": "warning"},
            router={"log_level": "warning"},
        ) as c:
            first = document(args.replicas[0], "r0", args.gate)
            if (out := c.llmgw("model", "add", "-", stdin=json.dumps(first))).returncode:
                raise RuntimeError(out.stderr)
            n0 = args.replicas[0]
            c.wait(
                lambda: c.ready("rolled") == n0 and c.router_endpoints("rolled") == n0, 120, "the model up"
            )
            revision = 0
            with Clients(c.router_url, model="rolled", count=args.clients) as clients:
                for n in args.replicas:
                    # The same revision: only the replica count changes.
                    put = admin_pb2.PutModelRequest(
                        document=json.dumps(document(n, f"r{revision}", args.gate))
                    )
                    c.admin().UpdateModel(put, timeout=30, metadata=c.auth)
                    c.wait(
                        lambda n=n: (
                            c.ready("rolled") == n
                            and c.router_endpoints("rolled") == n
                            and len(c.replicas("rolled")) == n
                        ),
                        120,
                        f"{n} replicas up",
                    )
                    for _ in range(args.rounds):
                        revision += 1
                        results.setdefault(n, []).append(one_update(c, n, f"r{revision}", args.gate))
                        print(f"{n} replicas, update {revision}: {results[n][-1]}", flush=True)
                requests, ok = clients.requests, clients.outcomes["ok"]
                errors = list(clients.errors)
    gated = " with an eval gate" if args.gate else ""
    print(f"\nrolling update of N replicas{gated} (seconds, median of {args.rounds})")
    print(f"{'N':>3} {'first new ready':>20} {'whole update':>13} {'per replica':>12}")
    for n, rounds in results.items():
        first = statistics.median(r["first"] for r in rounds)
        total = statistics.median(r["total"] for r in rounds)
        print(f"{n:>3} {first:>20.2f} {total:>13.2f} {total / n:>12.2f}")
    print(f"\n{args.clients} streaming clients: {requests} requests, {requests - ok} failed")
    for e in errors[:5]:
        print("  " + e)


if __name__ == "__main__":
    main()
