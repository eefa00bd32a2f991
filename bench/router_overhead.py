#!/usr/bin/env python3
"""Router overhead: the same load straight to one simulator, and through the
router (standalone, two simulators behind it), side by side in one run.

For each mode (non-streaming, streaming) the load generator runs a fixed
number of concurrent clients for a fixed time against each target,
alternating direct / router rounds so machine noise lands on both, and
prints requests/s, p50/p99 latency and p50/p99 time to first byte, then the
router/direct ratios of the medians over rounds.

The simulators run with near-zero token latency so the figures are
dominated by the HTTP path, which is what the router adds to. Every process
runs on this machine, load generator included, so absolute numbers depend on
the cores available; the ratios are the result.

Usage: python bench/router_overhead.py [--concurrency 16] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening")


def spawn(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


@dataclass
class Result:
    requests: int
    errors: int
    seconds: float
    latencies: list[float]
    ttfbs: list[float]

    @property
    def rps(self) -> float:
        return self.requests / self.seconds

    def pct(self, values: list[float], q: float) -> float:
        if not values:
            return float("nan")
        values = sorted(values)
        return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def load(url: str, stream: bool, concurrency: int, seconds: float, tokens: int) -> Result:
    body = json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "measure the router"}],
            "max_tokens": tokens,
            "stream": stream,
        }
    ).encode()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer bench-key"}
    latencies: list[float] = []
    ttfbs: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds
    conn = aiohttp.TCPConnector(limit=concurrency * 2)
    async with aiohttp.ClientSession(connector=conn) as session:

        async def worker():
            nonlocal errors
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    async with session.post(url + "/v1/chat/completions", data=body, headers=headers) as r:
                        first = None
                        async for _ in r.content.iter_any():
                            if first is None:
                                first = time.perf_counter()
                        if r.status != 200:
                            errors += 1
                            continue
                except aiohttp.ClientError:
                    errors += 1
                    continue
                t1 = time.perf_counter()
                latencies.append(t1 - t0)
                ttfbs.append((first or t1) - t0)

        t_start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t_start
    return Result(len(latencies), errors, elapsed, latencies, ttfbs)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    args = ap.parse_args()

    procs: list[subprocess.Popen] = []
    try:
        sims = []
        for _ in range(2):
            port = free_port()
            p = spawn(
                [
                    str(BIN / "llmgw-simulator"),
                    "--port",
                    str(port),
                    "--served-model-name",
                    "bench",
                    "--api-key",
                    "bench-key",
                    "--ttft-ms",
                    "0",
                    "--itl-ms",
                    "0",
                    "--max-num-seqs",
                    "1024",
                ]
            )
            procs.append(p)
            wait_port(port, p)
            sims.append(f"http://127.0.0.1:{port}")
        rport = free_port()
        router = spawn(
            [str(BIN / "llmgw-router"), "--listen", f"127.0.0.1:{rport}", "--log-level", "warning"]
            + [a for s in sims for a in ("--backend", f"bench={s},key=bench-key")]
        )
        procs.append(router)
        wait_port(rport, router)
        targets = {"direct": sims[0], "router": f"http://127.0.0.1:{rport}"}

        # Warm up connections and code paths on both.
        for url in targets.values():
            asyncio.run(load(url, False, 4, 1.0, args.tokens))

        print(
            f"router overhead: {args.concurrency} concurrent clients, {args.seconds:.0f}s x "
            f"{args.rounds} rounds per target, {args.tokens} output tokens, cpus={os.cpu_count()}"
        )
        summary: dict[tuple[str, str], dict[str, float]] = {}
        for stream in (False, True):
            mode = "streaming" if stream else "non-streaming"
            per: dict[str, list[Result]] = {"direct": [], "router": []}
            for _ in range(args.rounds):
                for name, url in targets.items():
                    per[name].append(
                        asyncio.run(load(url, stream, args.concurrency, args.seconds, args.tokens))
                    )
            print(f"\n{mode}")
            print(
                f"  {'target':8} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} "
                f"{'ttfb50':>8} {'ttfb99':>8} {'errors':>6}"
            )
            for name, results in per.items():
                row = {
                    "rps": statistics.median(r.rps for r in results),
                    "p50": statistics.median(r.pct(r.latencies, 0.50) for r in results),
                    "p99": statistics.median(r.pct(r.latencies, 0.99) for r in results),
                    "t50": statistics.median(r.pct(r.ttfbs, 0.50) for r in results),
                    "t99": statistics.median(r.pct(r.ttfbs, 0.99) for r in results),
                    "errors": sum(r.errors for r in results),
                }
                summary[(mode, name)] = row
                print(
                    f"  {name:8} {row['rps']:9.0f} {row['p50']:8.2f} {row['p99']:8.2f} "
                    f"{row['t50']:8.2f} {row['t99']:8.2f} {row['errors']:6d}"
                )
            d, r = summary[(mode, "direct")], summary[(mode, "router")]
            print(
                f"  ratio router/direct: req/s {r['rps'] / d['rps']:.2f}, p50 {r['p50'] / d['p50']:.2f}, "
                f"p99 {r['p99'] / d['p99']:.2f}, ttfb p50 {r['t50'] / d['t50']:.2f}"
            )
        failed = sum(row["errors"] for row in summary.values())
        return 1 if failed else 0
    finally:
        for p in procs:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(p.pid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
