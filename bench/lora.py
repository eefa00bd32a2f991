#!/usr/bin/env python3
"""LoRA adapters, measured over real processes: adding one to its first answer, and its
requests per second against the base model's.

One cluster (etcd, one control plane, one router, one agent; every role its
own process) serves ``base``: two simulator replicas started with LoRA on.

- **Add to first answer.** Each round adds a new adapter with the admin
  API's ``UpdateModel`` (what ``llmgw model set`` calls; a directory with an
  ``adapter_config.json``; the previous round's adapter is dropped by the
  same change) and sends one chat completion naming it as soon as the
  router lists it; the router holds it until a replica has loaded the
  adapter. Figures, from the start of the call: its return (the load
  check, the etcd transaction), the router listing the adapter (catalog
  watch), and the first answer (reconcile pass, SetAdapters, the agent's
  load call, the endpoint table, the router's watch). No replica restarts
  (the engine PIDs are compared).
- **Throughput.** ``--clients`` threads send non-streaming chat
  completions for ``--seconds`` each, to the base model and then to the
  adapter (held by one replica, as affinity keeps a quiet adapter), with the
  same simulator timings. The ratio shows the cost of routing by adapter:
  the adapter's requests have half the replicas.

Usage: python bench/lora.py [--rounds 3] [--clients 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llmgw.v1 import admin_pb2  # noqa: E402
from tests.support.cluster import QUICK_AGENT, Cluster, running_cluster  # noqa: E402
from tests.support.load import post_chat  # noqa: E402

MODEL = {
    "name": "base",
    "scaling": {"min": 2, "max": 2},
    "lora": {"max_loras": 4},
    "profile": {"engine": "simulator", "args": {"ttft-ms": "5", "itl-ms": "1", "output-tokens": "8"}},
}


def listed(c: Cluster) -> set[str]:
    with urllib.request.urlopen(c.router_url + "/v1/models", timeout=5) as resp:
        return {m["id"] for m in json.load(resp)["data"]}


def add_round(c: Cluster, root: Path, i: int) -> dict[str, float]:
    name = f"adapter-{i}"
    path = root / name
    path.mkdir()
    (path / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    doc = {**MODEL, "adapters": [{"name": name, "source": str(path)}]}
    t0 = time.monotonic()
    # The admin call itself, as `llmgw model update` makes it (without the CLI's start-up).
    c.admin().UpdateModel(admin_pb2.PutModelRequest(document=json.dumps(doc)), timeout=30, metadata=c.auth)
    t1 = time.monotonic()
    seen = c.wait(lambda: name in listed(c), 60, f"{name} listed", step=0.005)
    status, _, _ = post_chat(c.router_url, {"model": name, "messages": [{"role": "user", "content": "q"}]})
    t2 = time.monotonic()
    if status != 200:
        raise RuntimeError(f"{name} answered {status}")
    return {"command": t1 - t0, "listed": seen - t0, "answer": t2 - t0}


def throughput(c: Cluster, model: str, clients: int, seconds: float) -> float:
    body = {"model": model, "messages": [{"role": "user", "content": "tput"}], "max_tokens": 8}
    done = [0] * clients
    errors = [0] * clients
    end = time.monotonic() + seconds

    def client(k: int) -> None:
        while time.monotonic() < end:
            status, _, _ = post_chat(c.router_url, body)
            if status == 200:
                done[k] += 1
            else:
                errors[k] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if sum(errors):
        raise RuntimeError(f"{model}: {sum(errors)} requests failed")
    return sum(done) / (time.monotonic() - t0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-lora-") as tmp:
        root = Path(tmp)
        (root / "cluster").mkdir()
        with running_cluster(
            root / "cluster",
            [],
            nodes={"node-a": 2},
            control={"reconcile_interval_seconds": 0.5, "log_level": "warning"},
            agent=QUICK_AGENT,
            router={"log_level": "warning"},
        ) as c:
            out = c.llmgw("model", "add", "-", stdin=json.dumps(MODEL))
            if out.returncode != 0:
                raise RuntimeError(out.stderr)
            c.wait(lambda: c.ready("base") == 2 and c.router_endpoints("base") == 2, 120, "base up")
            pids = c.engine_pids()
            rounds = []
            for i in range(args.rounds):
                rounds.append(add_round(c, root, i))
                print(f"round {i + 1}: {rounds[-1]}", flush=True)
            adapter = f"adapter-{args.rounds - 1}"
            # Interleaved halves, so a machine that gets busier part-way hurts both alike.
            half = args.seconds / 2
            base_rps = adapter_rps = 0.0
            for _ in range(2):
                base_rps += throughput(c, "base", args.clients, half) / 2
                adapter_rps += throughput(c, adapter, args.clients, half) / 2
            restarted = c.engine_pids() != pids
    print("\nadding an adapter: from the admin call to ... (median over rounds, seconds)")
    for key, what in (
        ("command", "UpdateModel returns"),
        ("listed", "router lists it"),
        ("answer", "first answer"),
    ):
        values = [r[key] for r in rounds]
        print(f"  {what:20} {statistics.median(values):6.2f}  (min {min(values):.2f}, max {max(values):.2f})")
    print(f"  replicas restarted: {'yes' if restarted else 'none'}")
    print(f"\nrequests/s with {args.clients} clients, {args.seconds:g}s each")
    print(
        f"  base {base_rps:7.1f}  adapter {adapter_rps:7.1f}  ratio adapter/base {adapter_rps / base_rps:.2f}"
    )


if __name__ == "__main__":
    main()
