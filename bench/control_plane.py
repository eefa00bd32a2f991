#!/usr/bin/env python3
"""Control-plane benchmarks, in one run: catalog validation, AddModel to first answer, leader failover.

1. Catalog validation for ``--models`` models (default 2,000): parsing every
   document (pydantic), building the whole catalog (the constructor checks
   names, aliases, fallbacks, canaries and cycles), loading them as stored
   runtime models (what every control plane does on each change), and
   validating one AddModel against that catalog. No network; best of rounds.
2. AddModel to answering: a real etcd, two control planes, one agent with
   simulated GPUs, one router. Each round adds a model through
   ``AdminService.AddModel`` and times until a completion for it succeeds
   through the router (the simulator has no artificial start delay, so
   what is measured is the watch, placement, the engine process start and
   its first /health, and the router's table update), then removes it.
3. Leader failover: kill -9 the leader and time until the standby leads
   (bounded below by the lease TTL: the dead leader's lease must expire),
   side by side with a graceful stop (SIGTERM: the leader resigns, revoking
   its lease, so the standby leads at once). The stopped one is started
   again before the next round.

Usage: python bench/control_plane.py [--models 2000] [--adds 5] [--failovers 3] [--lease-ttl 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.common.etcd import MemoryStore, Put  # noqa: E402
from llmgw.control.spec.catalog import Catalog  # noqa: E402
from llmgw.control.store.models import PREFIX, RuntimeModels, encode, parse_document  # noqa: E402
from llmgw.v1 import admin_pb2  # noqa: E402
from tests.support.cluster import Cluster, running_cluster  # noqa: E402

TOKEN = "bench-admin-token-0123456789"


# -- 1. catalog validation ------------------------------------------------------------


def documents(n: int) -> list[str]:
    """``n`` model documents: aliases, fallback chains of ten, a canary every 50."""
    out = []
    for i in range(n):
        doc: dict = {
            "name": f"model-{i:05d}",
            "aliases": [f"alias-{i:05d}"],
            "profiles": [{"engine": "vllm", "gpus": 1 + i % 4, "args": {"max-model-len": "8192"}}],
            "scaling": {"min": i % 2, "max": 4},
            "owner": {"org": "acme", "team": f"team-{i % 7}"},
        }
        if i % 10:
            doc["fallbacks"] = [f"alias-{i - 1:05d}"]
        if i % 50 == 1:
            doc["canary"] = {"model": f"model-{i - 1:05d}", "percent": 5}
        out.append(json.dumps(doc))
    return out


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_catalog(n: int, rounds: int) -> dict[str, float]:
    texts = documents(n)
    specs = [parse_document(t, "bench") for t in texts]
    yamls = [yaml.safe_dump(json.loads(t)) for t in texts]
    results = {
        f"parse {n} documents (JSON, as stored)": best(
            lambda: [parse_document(t, "bench") for t in texts], rounds
        ),
        f"parse {n} documents (YAML, as typed)": best(
            lambda: [parse_document(t, "bench") for t in yamls], rounds
        ),
        f"build the catalog of {n}": best(lambda: Catalog.from_specs(specs), rounds),
    }

    async def stored() -> tuple[float, float]:
        store = MemoryStore()
        await store.commit([], [Put(PREFIX + s.name, encode(s)) for s in specs])
        models = RuntimeModels(store, [])
        load = []
        for _ in range(rounds):
            t = time.perf_counter()
            await models.load()
            load.append(time.perf_counter() - t)
        extra = parse_document(
            json.dumps({"name": "one-more", "fallbacks": ["model-00000"], "profile": {"engine": "vllm"}}), "b"
        )
        add = []
        for _ in range(rounds):
            t = time.perf_counter()
            await models.put(extra, replace=True) if add else await models.put(extra, replace=False)
            add.append(time.perf_counter() - t)
        return min(load), min(add)

    load, add = asyncio.run(stored())
    results[f"load {n} stored runtime models"] = load
    results[f"validate and write one AddModel against {n}"] = add
    return results


# -- the cluster ------------------------------------------------------------------------


def leader(c: Cluster, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for name in c.controls:
            if c.procs[name].alive() and c.leads(name):
                return name
        time.sleep(0.05)
    raise TimeoutError("no control plane leads")


def completes(c: Cluster, model: str) -> bool:
    body = json.dumps({"model": model, "prompt": "hi", "max_tokens": 2}).encode()
    req = urllib.request.Request(c.router_url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError):
        return False


def bench_add(c: Cluster, rounds: int) -> list[float]:
    out = []
    admin = c.admin(leader(c))
    c.wait(lambda: not completes(c, "nothing-yet") and True, 5, "router up", step=0.02)
    for i in range(rounds):
        name = f"bench-{i}"
        document = yaml.safe_dump({"name": name, "profile": {"engine": "simulator", "gpus": 1}})
        t = time.monotonic()
        admin.AddModel(admin_pb2.PutModelRequest(document=document), timeout=10, metadata=c.auth)
        answered = c.wait(lambda n=name: completes(c, n), 120, f"{name} answers", step=0.02)
        out.append(answered - t)
        admin.RemoveModel(admin_pb2.RemoveModelRequest(name=name), timeout=10, metadata=c.auth)
        c.wait(lambda n=name: not completes(c, n), 60, f"{name} leaves", step=0.02)
    return out


def bench_failover(c: Cluster, rounds: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {"kill -9": [], "SIGTERM (resign)": []}
    for _ in range(rounds):
        for how, sig in (("kill -9", signal.SIGKILL), ("SIGTERM (resign)", signal.SIGTERM)):
            led_before = leader(c)
            standby = next(n for n in c.controls if n != led_before)
            c.wait(lambda s=standby: c.procs[s].alive(), 10, "standby up", step=0.02)
            time.sleep(1.0)  # the standby is observing the leader key
            t = time.monotonic()
            c.procs[led_before].signal(sig)
            led = c.wait(lambda s=standby: c.leads(s), 60, f"{standby} leads", step=0.02)
            out[how].append(led - t)
            c.procs[led_before].popen.wait(30)
            c.start_control(led_before)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", type=int, default=2000)
    p.add_argument("--rounds", type=int, default=3, help="rounds of the catalog timings")
    p.add_argument("--adds", type=int, default=5)
    p.add_argument("--failovers", type=int, default=3)
    p.add_argument("--lease-ttl", type=int, default=3)
    args = p.parse_args()

    print(f"## catalog validation ({args.models} models, best of {args.rounds})")
    for what, seconds in bench_catalog(args.models, args.rounds).items():
        print(f"  {what:55s} {seconds * 1000:9.1f} ms")

    with (
        tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp,
        running_cluster(
            Path(tmp),
            [],
            name="bench",
            nodes={"node-a": 4},
            controls=("control-1", "control-2"),
            admin_token=TOKEN,
            control={"lease_ttl_seconds": args.lease_ttl, "placement_settle_seconds": 0},
        ) as c,
    ):
        adds = bench_add(c, args.adds)
        print(f"\n## AddModel to the first answer through the router ({args.adds} models)")
        print("  each: " + ", ".join(f"{s:.2f}s" for s in adds))
        print(f"  median {statistics.median(adds):.2f}s, max {max(adds):.2f}s")
        fail = bench_failover(c, args.failovers)
        print(f"\n## leader failover (lease TTL {args.lease_ttl}s, {args.failovers} rounds each)")
        for how, times in fail.items():
            print(
                f"  {how:18s} each: "
                + ", ".join(f"{s:.2f}s" for s in times)
                + f"; median {statistics.median(times):.2f}s"
            )
        ratio = statistics.median(fail["kill -9"]) / statistics.median(fail["SIGTERM (resign)"])
        print(f"  kill -9 / SIGTERM median ratio: {ratio:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
