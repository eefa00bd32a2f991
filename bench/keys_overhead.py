#!/usr/bin/env python3
"""What client keys cost the router: the same load through a router with
``auth: none`` and one with ``auth: keys``, side by side in one run.

One etcd, one control plane, one simulator (near-zero token latency, so the
HTTP path dominates) and two routers that reach it as a static backend.
Three targets, in interleaved rounds so machine noise lands on all:

- ``none``: the router without keys;
- ``key``: the keyed router, with a key that has no limits (hash lookup only);
- ``key+quota``: the keyed router, with a key limited to a requests and
  tokens per minute so high that nothing is refused (the whole quota path:
  admission, token settlement from the engine's usage, the 0.5 s sync).

For each it prints requests/s and the router process's CPU per request (from
/proc), medians over rounds, and the ratios to ``none``.

Usage: python bench/keys_overhead.py [--concurrency 16] [--seconds 4] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import BIN, cpu_seconds, free_port, spawn, stop, wait_port  # noqa: E402

from llmgw.common.tls import sync_channel  # noqa: E402
from llmgw.v1 import keys_pb2, keys_pb2_grpc  # noqa: E402
from tests.support.certs import ClusterPki  # noqa: E402
from tests.support.procs import start_etcd  # noqa: E402


async def load(url: str, secret: str, concurrency: int, seconds: float) -> tuple[int, int]:
    body = json.dumps(
        {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    ).encode()
    headers = {"Content-Type": "application/json"}
    if secret:
        headers["Authorization"] = f"Bearer {secret}"
    ok = errors = 0
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency * 2)) as session:

        async def worker() -> None:
            nonlocal ok, errors
            while time.perf_counter() < stop_at:
                async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                    await r.read()
                    if r.status == 200:
                        ok += 1
                    else:
                        errors += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return ok, errors


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    procs: list[subprocess.Popen] = []
    etcd = None
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        try:
            etcd, etcd_endpoint = start_etcd(state / "etcd", state)
            secret = state / "secret"
            secret.write_text("keys-bench-cluster-secret\n")
            control = f"127.0.0.1:{free_port()}"
            pki = ClusterPki.create(state / "tls")
            cfg = state / "control.yaml"
            cfg.write_text(
                yaml.safe_dump(
                    {
                        "cluster": "bench",
                        "listen": control,
                        "cluster_secret_file": str(secret),
                        "tls": pki.control(),
                        "etcd": {"endpoints": [etcd_endpoint]},
                        "models": [{"name": "bench", "min_replicas": 0, "profile": {"engine": "simulator"}}],
                    }
                )
            )
            procs.append(spawn([str(BIN / "llmgw-control"), "--config", str(cfg)]))
            wait_port(int(control.rsplit(":", 1)[1]), procs[-1])
            sim_port = free_port()
            sim_args = [
                "--port",
                str(sim_port),
                "--served-model-name",
                "bench",
                "--ttft-ms",
                "0",
                "--itl-ms",
                "0",
            ]
            procs.append(spawn([str(BIN / "llmgw-simulator"), *sim_args, "--max-num-seqs", "256"]))
            wait_port(sim_port, procs[-1])
            routers: dict[str, tuple[str, int]] = {}
            for auth in ("none", "keys"):
                port = free_port()
                rcfg = state / f"router-{auth}.yaml"
                rcfg.write_text(
                    yaml.safe_dump(
                        {
                            "listen": f"127.0.0.1:{port}",
                            "control": [control],
                            "cluster_secret_file": str(secret),
                            "tls": pki.tls("router", f"router-{auth}"),
                            "auth": auth,
                            "log_level": "warning",
                            "backends": [{"model": "bench", "url": f"http://127.0.0.1:{sim_port}"}],
                        }
                    )
                )
                procs.append(spawn([str(BIN / "llmgw-router"), "--config", str(rcfg)]))
                wait_port(port, procs[-1])
                routers[auth] = (f"http://127.0.0.1:{port}", procs[-1].pid)
            with sync_channel(control, pki.settings("admin", "bench")) as channel:
                stub = keys_pb2_grpc.KeyServiceStub(channel)
                plain = stub.CreateKey(keys_pb2.CreateKeyRequest(name="plain"), timeout=10).secret
                limited = stub.CreateKey(
                    keys_pb2.CreateKeyRequest(
                        name="limited", requests_per_minute=10**9, tokens_per_minute=10**12
                    ),
                    timeout=10,
                ).secret
            targets = {"none": (routers["none"], ""), "key": (routers["keys"], plain)}
            targets["key+quota"] = (routers["keys"], limited)
            for (url, _), key in targets.values():
                deadline = time.monotonic() + 30
                while asyncio.run(load(url, key, 1, 0.2))[0] == 0:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{url} does not answer")
            rps: dict[str, list[float]] = {t: [] for t in targets}
            cpu: dict[str, list[float]] = {t: [] for t in targets}
            for _ in range(args.rounds):
                for name, ((url, pid), key) in targets.items():
                    before, t0 = cpu_seconds(pid), time.perf_counter()
                    ok, errors = asyncio.run(load(url, key, args.concurrency, args.seconds))
                    elapsed = time.perf_counter() - t0
                    if errors:
                        raise RuntimeError(f"{name}: {errors} errors")
                    rps[name].append(ok / elapsed)
                    cpu[name].append((cpu_seconds(pid) - before) / ok * 1000)
            header = ("target", "req/s", "router CPU ms/req", "req/s vs none", "CPU vs none")
            print("{:<10} {:>8} {:>18} {:>14} {:>12}".format(*header))
            base_rps, base_cpu = statistics.median(rps["none"]), statistics.median(cpu["none"])
            for name in targets:
                r, c = statistics.median(rps[name]), statistics.median(cpu[name])
                print(f"{name:<10} {r:>8.0f} {c:>18.3f} {r / base_rps:>14.2f} {c / base_cpu:>12.2f}")
        finally:
            stop(procs)
            if etcd is not None:
                etcd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
