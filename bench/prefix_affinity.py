#!/usr/bin/env python3
"""Prefix affinity against least-load and round-robin, on a shared-prefix chat workload.

One command starts ``--replicas`` (4) simulators that charge prefill time per
prompt token not in their prefix cache (``--prefill-us-per-token``) and keep
a bounded LRU prefix cache (``--prefix-cache-blocks`` of 16 tokens), and one
standalone router per balancer mode (``affinity``, ``least-load``,
``round-robin``) in front of the same four. Then, in rounds, it runs the same
workload through each router in turn (modes interleaved, order rotated each
round, so machine noise and cache state land on all three):

- ``--system-prompts`` system prompts of ``--system-tokens`` tokens each;
- under each, ``--conversations`` conversations of ``--turns`` turns; a turn
  sends the whole conversation so far (system prompt, earlier questions and
  the answers the engine gave) plus a new question;
- ``--concurrency`` conversations in flight at once, each turn waiting for
  the previous answer, as a chat client does.

Every round and mode gets fresh prompt text (a salt), so nothing one mode
leaves in a cache helps another: each starts cold and warms its own.

Measured per request: time to first token at the client (first streamed
content chunk). Printed per mode: mean, p50 and p99 over all rounds, the
engines' prefix-cache hit rate (from their /metrics), and each mode's mean
and p50 against affinity's.

Usage: python bench/prefix_affinity.py [--rounds 3] [--replicas 4] ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, free_port, spawn, stop, wait_port  # noqa: E402

MODES = ("affinity", "least-load", "round-robin")
MODEL = "bench"


def text(rng: random.Random, tokens: int, salt: str) -> str:
    # The simulator counts a word as a token.
    return salt + " " + " ".join(f"w{rng.randrange(100000)}" for _ in range(tokens - 1))


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def first_token(session: aiohttp.ClientSession, url: str, messages: list[dict]) -> tuple[float, str]:
    """(seconds to the first content chunk, the whole answer)."""
    body = {"model": MODEL, "messages": messages, "stream": True}
    started = time.monotonic()
    ttft = None
    parts: list[str] = []
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"{url}: HTTP {resp.status}: {(await resp.text())[:200]}")
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{url}: {event['error']}")
            for choice in event.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    if ttft is None:
                        ttft = time.monotonic() - started
                    parts.append(content)
    if ttft is None:
        raise RuntimeError(f"{url}: stream without content")
    return ttft, "".join(parts)


async def conversation(
    session: aiohttp.ClientSession, url: str, system: str, rng: random.Random, args, out: list[float]
) -> None:
    messages = [{"role": "system", "content": system}]
    for _ in range(args.turns):
        messages.append({"role": "user", "content": text(rng, args.question_tokens, "q")})
        ttft, answer = await first_token(session, url, messages)
        out.append(ttft)
        messages.append({"role": "assistant", "content": answer})


async def run_round(url: str, salt: str, args) -> list[float]:
    rng = random.Random(salt)
    systems = [text(rng, args.system_tokens, f"{salt}-s{i}") for i in range(args.system_prompts)]
    jobs = [s for s in systems for _ in range(args.conversations)]
    rng.shuffle(jobs)
    ttfts: list[float] = []
    gate = asyncio.Semaphore(args.concurrency)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(system: str, seed: int) -> None:
            async with gate:
                await conversation(session, url, system, random.Random(seed), args, ttfts)

        await asyncio.gather(*(one(s, rng.randrange(1 << 30)) for s in jobs))
    return ttfts


async def cache_counters(sims: list[str]) -> tuple[float, float]:
    queries = hits = 0.0
    async with aiohttp.ClientSession() as session:
        for sim in sims:
            async with session.get(sim + "/metrics") as resp:
                for line in (await resp.text()).splitlines():
                    if line.startswith("vllm:prefix_cache_queries_total"):
                        queries += float(line.split()[-1])
                    elif line.startswith("vllm:prefix_cache_hits_total"):
                        hits += float(line.split()[-1])
    return queries, hits


async def bench(args, sims: list[str], routers: dict[str, str]) -> None:
    per_mode: dict[str, list[float]] = {m: [] for m in MODES}
    hit_rate: dict[str, list[float]] = {m: [] for m in MODES}
    for round_ in range(args.rounds):
        order = MODES[round_ % 3 :] + MODES[: round_ % 3]
        for mode in order:
            before = await cache_counters(sims)
            started = time.monotonic()
            ttfts = await run_round(routers[mode], f"r{round_}{mode}", args)
            after = await cache_counters(sims)
            queried, hit = after[0] - before[0], after[1] - before[1]
            hit_rate[mode].append(hit / queried if queried else 0.0)
            per_mode[mode].extend(ttfts)
            print(
                f"round {round_ + 1} {mode:<12} {len(ttfts)} requests in {time.monotonic() - started:5.1f}s, "
                f"mean ttft {statistics.mean(ttfts) * 1000:7.1f} ms, cache hit {hit_rate[mode][-1]:.0%}",
                flush=True,
            )
    print()
    print("| mode | requests | mean TTFT ms | p50 ms | p99 ms | prefix-cache hit rate |")
    print("|---|---|---|---|---|---|")
    for mode in MODES:
        v = per_mode[mode]
        print(
            f"| {mode} | {len(v)} | {statistics.mean(v) * 1000:.1f} | {pct(v, 0.5) * 1000:.1f} | "
            f"{pct(v, 0.99) * 1000:.1f} | {statistics.mean(hit_rate[mode]):.0%} |"
        )
    base = per_mode["affinity"]
    print()
    for mode in MODES[1:]:
        v = per_mode[mode]
        print(
            f"{mode} / affinity: mean TTFT {statistics.mean(v) / statistics.mean(base):.2f}x, "
            f"p50 {pct(v, 0.5) / pct(base, 0.5):.2f}x, p99 {pct(v, 0.99) / pct(base, 0.99):.2f}x"
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--system-prompts", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=1500)
    p.add_argument("--conversations", type=int, default=4, help="per system prompt")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--question-tokens", type=int, default=40)
    p.add_argument("--concurrency", type=int, default=8, help="conversations in flight")
    p.add_argument("--prefill-us-per-token", type=float, default=100.0)
    p.add_argument("--prefix-cache-blocks", type=int, default=1024)
    p.add_argument("--ttft-ms", type=float, default=5.0)
    p.add_argument("--itl-ms", type=float, default=2.0)
    p.add_argument("--output-tokens", type=int, default=16)
    args = p.parse_args()

    procs: list[subprocess.Popen] = []
    try:
        sims = []
        for _ in range(args.replicas):
            port = free_port()
            proc = spawn(
                [
                    str(BIN / "llmgw-simulator"), "--port", str(port), "--served-model-name", MODEL,
                    "--ttft-ms", str(args.ttft_ms), "--itl-ms", str(args.itl_ms),
                    "--output-tokens", str(args.output_tokens), "--max-num-seqs", "64",
                    "--max-model-len", "65536",
                    "--prefill-us-per-token", str(args.prefill_us_per_token),
                    "--prefix-cache-blocks", str(args.prefix_cache_blocks), "--log-level", "warning",
                ]
            )  # fmt: skip
            procs.append(proc)
            wait_port(port, proc)
            sims.append(f"http://127.0.0.1:{port}")
        routers: dict[str, str] = {}
        with tempfile.TemporaryDirectory() as tmp:
            for mode in MODES:
                port = free_port()
                config = {
                    "listen": f"127.0.0.1:{port}",
                    "log_level": "warning",
                    "balancer": mode,
                    "backends": [{"model": MODEL, "url": s} for s in sims],
                }
                path = Path(tmp) / f"{mode}.yaml"
                path.write_text(json.dumps(config))  # JSON is YAML
                proc = spawn([str(BIN / "llmgw-router"), "--config", str(path)])
                procs.append(proc)
                wait_port(port, proc)
                routers[mode] = f"http://127.0.0.1:{port}"
        print(
            f"prefix affinity: {args.replicas} simulators (prefill {args.prefill_us_per_token:g} us/token, "
            f"cache {args.prefix_cache_blocks} blocks), {args.system_prompts} system prompts x "
            f"{args.system_tokens} tokens, {args.conversations} conversations each x {args.turns} turns, "
            f"{args.concurrency} in flight, {args.rounds} rounds; cpus={os.cpu_count()}",
            flush=True,
        )
        asyncio.run(bench(args, sims, routers))
    finally:
        stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
