#!/usr/bin/env python3
"""Router overhead on the other APIs' streams: chat, Responses and Messages, each
straight from the engine and through the router, side by side in one run.

One simulator (no token latency, so the HTTP path dominates) and one
standalone router that reaches it as a static backend. For each API it
streams ``--tokens`` tokens per request at ``--concurrency``, in interleaved
rounds (direct, routed, next API...) so machine noise lands on all; it
prints streams/s (medians over rounds) and each API's routed/direct ratio.
The Responses stream is the one with extra router work per chunk (its
response ids are rewritten to name the replica, :mod:`llmgw.router.responseids`).
The realtime API (``/v1/realtime``, a WebSocket) is measured as message
round trips per second: ``--concurrency`` sessions, each sending one small
event and reading the engine's answer (the simulator answers an unknown
event with an ``error`` event at once), so the figure is the relay's own
cost per message each way.

Usage: python bench/router_apis.py [--concurrency 8] [--seconds 3] [--rounds 3] [--tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import BIN, cpu_seconds, free_port, simulator, spawn, stop, wait_port  # noqa: E402

BODIES = {
    "chat": ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
    "responses": ("/v1/responses", {"input": "hi", "max_output_tokens": 0}),
    "messages": ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0}),
}
LIMIT_FIELD = {"chat": "max_tokens", "responses": "max_output_tokens", "messages": "max_tokens"}


async def load(url: str, api: str, tokens: int, concurrency: int, seconds: float) -> int:
    path, body = BODIES[api]
    payload = json.dumps({**body, "model": "bench", "stream": True, LIMIT_FIELD[api]: tokens}).encode()
    done = 0
    stop_at = time.monotonic() + seconds
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal done
            while time.monotonic() < stop_at:
                async with session.post(url + path, data=payload, headers=headers) as resp:
                    await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{api} at {url}: {resp.status}")
                done += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    return done


async def load_realtime(url: str, concurrency: int, seconds: float) -> int:
    """Message round trips in ``seconds`` over ``concurrency`` realtime sessions."""
    done = 0
    stop_at = time.monotonic() + seconds
    async with aiohttp.ClientSession() as session:

        async def worker() -> None:
            nonlocal done
            async with session.ws_connect(url.replace("http", "ws", 1) + "/v1/realtime?model=bench") as ws:
                await ws.receive_json()  # session.created
                while time.monotonic() < stop_at:
                    await ws.send_str('{"type": "bench.ping"}')
                    if (await ws.receive_json())["type"] != "error":
                        raise RuntimeError(f"realtime at {url}: not the simulator's answer")
                    done += 1

        async with asyncio.TaskGroup() as group:
            for _ in range(concurrency):
                group.create_task(worker())
    return done


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    procs = []
    with tempfile.TemporaryDirectory() as tmp:
        try:
            sim_port, router_port = free_port(), free_port()
            sim = spawn(simulator(sim_port), log=Path(tmp) / "sim.log")
            procs.append(sim)
            wait_port(sim_port, sim)
            config = Path(tmp) / "router.yaml"
            backend = {"model": "bench", "url": f"http://127.0.0.1:{sim_port}"}
            config.write_text(yaml.safe_dump({"listen": f"127.0.0.1:{router_port}", "backends": [backend]}))
            router = spawn([str(BIN / "llmgw-router"), "--config", str(config)], log=Path(tmp) / "router.log")
            procs.append(router)
            wait_port(router_port, router)
            targets = {"direct": f"http://127.0.0.1:{sim_port}", "routed": f"http://127.0.0.1:{router_port}"}
            rates: dict[tuple[str, str], list[float]] = {}
            # The router's CPU seconds per realtime round trip (two messages relayed).
            relay_cpu: list[float] = []
            for _ in range(args.rounds):
                for api in BODIES:
                    for name, url in targets.items():
                        n = asyncio.run(load(url, api, args.tokens, args.concurrency, args.seconds))
                        rates.setdefault((api, name), []).append(n / args.seconds)
                for name, url in targets.items():
                    before = cpu_seconds(router.pid)
                    n = asyncio.run(load_realtime(url, args.concurrency, args.seconds))
                    rates.setdefault(("realtime", name), []).append(n / args.seconds)
                    if name == "routed":
                        relay_cpu.append((cpu_seconds(router.pid) - before) / max(n, 1))
        finally:
            stop(procs)
    print(f"streams of {args.tokens} tokens, concurrency {args.concurrency}, {args.rounds} rounds")
    print(f"{'api':<10} {'direct/s':>9} {'routed/s':>9} {'routed/direct':>14}  (realtime: round trips/s)")
    for api in (*BODIES, "realtime"):
        direct = statistics.median(rates[(api, "direct")])
        routed = statistics.median(rates[(api, "routed")])
        print(f"{api:<10} {direct:>9.1f} {routed:>9.1f} {routed / direct:>14.2f}")
    print(f"router CPU per realtime round trip: {statistics.median(relay_cpu) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
