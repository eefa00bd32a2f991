#!/usr/bin/env python3
"""Autoscaling, measured over real processes: a load spike to a new replica serving,
and an on-demand model's cold start against its warm answer.

One cluster (etcd, one control plane, one router, one agent with four
simulated GPUs; every role its own process, as in production) serves two
models:

- ``elastic``: ``min 1, max 2``, target load 2 requests per replica,
  ``scale_up_seconds 0`` (so the figure is the mechanism, not a window an
  operator chose; add the window for a real setting). Each round: four
  clients start streaming at once (twice the target); the figures are the
  times from that spike to (a) the second replica's record (the decision
  and placement), (b) its Ready state, (c) the router routing to it, and
  (d) the first response a client gets from it. Then the load stops and the
  round waits for the model to drain back to one replica.
- ``sleepy``: ``min 0``, idle timeout 2 s. Each round: one chat completion
  from zero replicas (cold: the router holds it, the control plane places a
  replica, the simulator starts, the router's watch brings the endpoint),
  then one more at once (warm), then the round waits for zero again. The
  ratio cold/warm is the price of scale-to-zero for this engine.

The simulator starts in about a second; a real engine's start (weights,
CUDA graphs) adds to both figures one for one.

Usage: python bench/autoscale.py [--rounds 3] [--clients 4]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.cluster import QUICK_AGENT, READY, Cluster, running_cluster  # noqa: E402
from tests.support.load import Load, post_chat  # noqa: E402

MODELS = [
    {
        "name": "elastic",
        "scaling": {"min": 1, "max": 2, "target_load": 2, "scale_up_seconds": 0, "scale_down_seconds": 2},
        "profile": {"engine": "simulator", "args": {"ttft-ms": "20", "itl-ms": "40", "output-tokens": "25"}},
    },
    {
        "name": "sleepy",
        "scaling": {"min": 0, "max": 1, "idle_timeout_seconds": 2},
        "profile": {"engine": "simulator", "args": {"ttft-ms": "20", "itl-ms": "5", "output-tokens": "8"}},
    },
]


SPIKE = {"model": "elastic", "stream": True, "messages": [{"role": "user", "content": "spike"}]}


def spike_once(url: str) -> tuple[str, float]:
    status, replica, first = post_chat(url, SPIKE)
    if status != 200:
        raise RuntimeError(f"answered {status}")
    return replica, first


def spike_round(c: Cluster, clients: int) -> dict[str, float]:
    before = {r.replica_id for r in c.replicas("elastic")}
    with Load(lambda: spike_once(c.router_url), clients) as load:
        t0 = load.started
        placed = c.wait(lambda: len(c.replicas("elastic")) == 2, 60, "a second replica placed", step=0.01)
        (new,) = {r.replica_id for r in c.replicas("elastic")} - before
        ready = c.wait(
            lambda: any(r.replica_id == new and r.state == READY for r in c.replicas("elastic")),
            60,
            "the new replica ready",
            step=0.01,
        )
        routed = c.wait(lambda: c.router_endpoints("elastic") == 2, 60, "the router routes to it", step=0.01)
        c.wait(lambda: new in load.first, 60, "a response from the new replica", step=0.01)
    errors = load.outcomes["failed"]
    c.wait(lambda: len(c.replicas("elastic")) == 1 and c.router_endpoints("elastic") == 1, 60, "back to one")
    return {
        "placed": placed - t0,
        "ready": ready - t0,
        "routed": routed - t0,
        "serving": load.first[new] - t0,
        "errors": errors,
    }


def cold_round(c: Cluster) -> dict[str, float]:
    c.wait(lambda: c.replicas("sleepy") == [], 60, "sleepy at zero")
    body = {"model": "sleepy", "messages": [{"role": "user", "content": "wake"}]}
    t0 = time.monotonic()
    cold, _, _ = post_chat(c.router_url, body)
    t1 = time.monotonic()
    warm, _, _ = post_chat(c.router_url, body)
    t2 = time.monotonic()
    if cold != 200 or warm != 200:
        raise RuntimeError(f"sleepy answered {cold}, then {warm}")
    return {"cold": t1 - t0, "warm": t2 - t1}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=4)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-autoscale-") as tmp:
        with running_cluster(
            Path(tmp),
            MODELS,
            control={"reconcile_interval_seconds": 0.5, "log_level": "warning"},
            agent=QUICK_AGENT,
            router={"autoscaling": {"report_interval_seconds": 0.5}, "log_level": "warning"},
        ) as c:
            c.wait(lambda: c.ready("elastic") == 1 and c.router_endpoints("elastic") == 1, 120, "elastic up")
            spikes, colds = [], []
            for i in range(args.rounds):
                spikes.append(spike_round(c, args.clients))
                colds.append(cold_round(c))
                print(f"round {i + 1}: spike {spikes[-1]}, on demand {colds[-1]}", flush=True)
    print("\nspike -> (median over rounds, seconds)")
    for key in ("placed", "ready", "routed", "serving"):
        values = [s[key] for s in spikes]
        print(f"  {key:8} {statistics.median(values):6.2f}  (min {min(values):.2f}, max {max(values):.2f})")
    print(f"  client errors during spikes: {sum(int(s['errors']) for s in spikes)}")
    cold = statistics.median(r["cold"] for r in colds)
    warm = statistics.median(r["warm"] for r in colds)
    print("\non-demand first request -> answer (median over rounds, seconds)")
    print(f"  cold {cold:6.2f}  warm {warm:6.3f}  ratio cold/warm {cold / warm:.0f}x")


if __name__ == "__main__":
    main()
