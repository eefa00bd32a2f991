#!/usr/bin/env python3
"""The autoscaler's share of a reconcile pass at fleet scale, beside plan() itself.

The fleet of bench/reconcile_scale.py (1,000 nodes x 8 GPUs, 500 models,
converged: every replica placed and ready), and N routers (default 20) that
each report every endpoint with a random in-flight count and engine sample
and a recent use of every model. Measured in one run, each call repeated:

- ``report``: one router's report taken in (what the UsageService does per
  router per tick);
- ``scale``: ``Scaler.pass_`` (sum the reports, decide every model, pick
  drains), what the controller adds to every pass;
- ``plan``: ``plan()`` on the same fleet with the scaler's counts;

and the ratio scale/plan. No network, no processes: the pure parts only.

Usage: python bench/autoscale_decision.py [--routers 20] [--runs 30]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from reconcile_scale import NOW, SETTINGS, build_catalog, build_nodes, converge  # noqa: E402

from llmgw.control.decide.reconcile import StartReplica, plan  # noqa: E402
from llmgw.control.leader.scaler import Scaler  # noqa: E402
from llmgw.control.state.usage import UsageBook  # noqa: E402
from llmgw.v1 import usage_pb2  # noqa: E402


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()
    samples = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1000)
    return samples


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--models", type=int, default=500)
    p.add_argument("--routers", type=int, default=20)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()
    rng = random.Random(args.seed)
    catalog = build_catalog(args.models, rng)
    empty = build_nodes(args.nodes, args.gpus)
    starts = [a for a in plan(catalog, empty, [], NOW, settings=SETTINGS) if isinstance(a, StartReplica)]
    nodes, replicas = converge(empty, starts)

    reports = [
        usage_pb2.UsageReport(
            router_id=f"router-{i}",
            interval_seconds=1.0,
            endpoints=[
                usage_pb2.EndpointLoad(
                    endpoint_id=r.id,
                    model=r.record.model,
                    in_flight=rng.randint(0, 4),
                    engine_running=rng.randint(0, 40),
                    engine_waiting=rng.randint(0, 3),
                    engine_sampled=True,
                )
                for r in replicas
            ],
            models=[usage_pb2.ModelDemand(model=m.name, idle_seconds=rng.random()) for m in catalog],
        )
        for i in range(args.routers)
    ]
    book = UsageBook(min_expiry=1e9)
    scaler = Scaler(book, lambda: None)
    for report in reports:
        scaler.report(report, NOW)
    print(
        f"fleet: {args.nodes} nodes x {args.gpus} GPUs, {len(catalog)} models, {len(replicas)} replicas; "
        f"{args.routers} routers each reporting every replica"
    )

    report_ms = timed(lambda: book.update(reports[0], NOW), args.runs)
    scale_ms = timed(lambda: scaler.pass_(catalog, replicas, NOW), args.runs)
    desired = scaler.pass_(catalog, replicas, NOW).desired
    plan_ms = timed(
        lambda: plan(catalog, nodes, replicas, NOW, settings=SETTINGS, desired=desired), args.runs
    )
    rows = [("report (one router)", report_ms), ("scale (Scaler.pass_)", scale_ms), ("plan", plan_ms)]
    print(f"{'step':<22} {'median ms':>10} {'max ms':>8}")
    for name, samples in rows:
        print(f"{name:<22} {statistics.median(samples):>10.2f} {max(samples):>8.2f}")
    ratio = statistics.median(scale_ms) / statistics.median(plan_ms)
    print(f"scale / plan: {ratio:.2f}")


if __name__ == "__main__":
    main()
