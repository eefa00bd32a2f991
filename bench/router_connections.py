#!/usr/bin/env python3
"""Many concurrent slow streams through one router: errors, memory, CPU.

Two simulators produce slow streams (``--tokens`` tokens, ``--itl-ms``
apart, so each stream stays open for tokens x itl), and one standalone
``llmgw-router`` in front of them. The bench opens
``--streams`` client connections at ``--ramp`` new streams a second, each
sending one streamed chat completion, and holds them all open together.
While every stream is open it samples the router's resident memory, open
file descriptors and CPU (its process tree, from /proc). Then every stream
must end with ``[DONE]`` after all its tokens: a refused connection, a
non-200 answer, a stream cut short or one with fewer tokens is an error.

File descriptors: a router process holds two per stream (the client's and
the engine's), so the bench raises its own limit (``RLIMIT_NOFILE``; with
CAP_SYS_RESOURCE the hard limit too) before starting the processes, which
inherit it. When that limit is too low for ``--streams`` in one process,
the router runs as several workers sharing the port (``--workers``), each
with a limit of its own; see docs/operations.md.

Usage: python bench/router_connections.py [--streams 10000] [--ramp 250] [--itl-ms 4000] [--tokens 30]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, cpu_seconds, free_port, rss_bytes, simulator, spawn, stop, tree, wait_port  # noqa: E402
from loadgen import ConnectionLost, HttpConnection, request_bytes  # noqa: E402

# Descriptors a router process needs besides its streams' (listener, epoll, logs, pollers).
FDS_OF_ITS_OWN = 64


def raise_fd_limit(wanted: int) -> int:
    """Raise this process's open-file limit to ``wanted`` if allowed; return the limit in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= wanted:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, max(hard, wanted)))
    except (ValueError, OSError):
        # Not privileged: as far as the hard limit goes.
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Tally:
    """Streams by state, across all connections."""

    def __init__(self) -> None:
        self.flowing = 0  # first event received, end not yet
        self.errors: list[str] = []


class CountingConnection(HttpConnection):
    """Counts SSE events (``data:`` lines) as they pass, and whether its stream is flowing."""

    tally: Tally

    def __init__(self) -> None:
        super().__init__()
        self.events = 0

    def data_received(self, data: bytes) -> None:
        if not self.events and b"data: " in data:
            self.tally.flowing += 1
        self.events += data.count(b"data: ")
        super().data_received(data)


async def one_stream(url: str, payload: bytes, tokens: int, tally: Tally) -> None:
    loop = asyncio.get_running_loop()
    host, port = url.removeprefix("http://").split(":")
    transport = conn = None
    try:
        transport, conn = await loop.create_connection(CountingConnection, host, int(port))
        await conn.request(payload)
        if conn.status != 200:
            tally.errors.append(f"status {conn.status}")
        elif b"[DONE]" not in conn.tail:
            tally.errors.append(f"stream ended without [DONE]: {conn.tail!r}")
        elif conn.events < tokens + 1:
            # A role chunk, one per token (the last with finish_reason), [DONE].
            tally.errors.append(f"{conn.events} events, wanted at least {tokens + 1}")
    except (OSError, ConnectionLost) as err:
        tally.errors.append(f"{type(err).__name__}: {err}")
    finally:
        if conn is not None and conn.events:
            tally.flowing -= 1
        if transport is not None:
            transport.close()


async def sample(router_pid: int, tally: Tally, peak: dict) -> None:
    """Keep the largest readings, twice a second, until cancelled."""
    while True:
        readings = {
            "flowing": tally.flowing,
            "router_rss_mib": rss_bytes(router_pid) / 2**20,
            "router_fds": open_fds(router_pid),
        }
        for key, value in readings.items():
            peak[key] = max(peak.get(key, 0), value)
        await asyncio.sleep(0.5)


async def run(args: argparse.Namespace, url: str, router_pid: int) -> dict:
    payload = request_bytes(
        url,
        "/v1/chat/completions",
        json.dumps(
            {
                "model": "bench",
                "messages": [{"role": "user", "content": "hold the line"}],
                "max_tokens": args.tokens,
                "stream": True,
            }
        ).encode(),
        [],
    )
    tally = Tally()
    CountingConnection.tally = tally
    peak: dict = {}
    sampler = asyncio.create_task(sample(router_pid, tally, peak))
    tasks: list[asyncio.Task] = []
    cpu0, t0 = cpu_seconds(router_pid), time.monotonic()
    interval = 1.0 / args.ramp
    for i in range(args.streams):
        tasks.append(asyncio.create_task(one_stream(url, payload, args.tokens, tally)))
        # Pace the opening; catch up in bursts when the loop falls behind.
        delay = t0 + (i + 1) * interval - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
    ramp_s = time.monotonic() - t0
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - t0
    sampler.cancel()
    await asyncio.gather(sampler, return_exceptions=True)
    return {
        "streams": args.streams,
        "ramp_seconds": ramp_s,
        "seconds": elapsed,
        **peak,
        "router_cpu_seconds": cpu_seconds(router_pid) - cpu0,
        "errors": len(tally.errors),
        "error_samples": sorted(set(tally.errors))[:5],
    }


def open_fds(pid: int) -> int:
    """Open file descriptors of ``pid``'s process tree."""
    total = 0
    for p in tree(pid):
        try:
            total += len(os.listdir(f"/proc/{p}/fd"))
        except OSError:
            pass
    return total


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--ramp", type=float, default=250, help="new streams per second")
    ap.add_argument("--itl-ms", type=float, default=4000, help="simulator inter-token latency")
    ap.add_argument("--tokens", type=int, default=30, help="tokens per stream")
    ap.add_argument(
        "--workers",
        type=int,
        default=0,
        help="router worker processes (default: 1, or as many as the open-file limit needs)",
    )
    args = ap.parse_args()

    stream_s = args.tokens * args.itl_ms / 1000
    if stream_s <= args.streams / args.ramp + 2:
        ap.error(
            f"a stream lasts {stream_s:g} s, not longer than the ramp ({args.streams / args.ramp:g} s) "
            "plus 2 s: raise --tokens or --itl-ms so they are all open at once"
        )
    limit = raise_fd_limit(2 * args.streams + 1024)
    # A router process holds two descriptors per stream plus a few of its own.
    per_process = (limit - FDS_OF_ITS_OWN) // 2
    workers = args.workers or -(-args.streams // per_process)
    print(
        f"router connections: {args.streams} streams at {args.ramp:g}/s, {args.tokens} tokens "
        f"{args.itl_ms:g} ms apart ({stream_s:g} s each), RLIMIT_NOFILE {limit} (one router process "
        f"holds up to {per_process} streams), router workers {workers}, cpus={os.cpu_count()}",
        flush=True,
    )
    procs = []
    logs = Path(tempfile.mkdtemp(prefix="llmgw-connections-"))
    try:
        sims = []
        for i in range(2):
            port = free_port()
            p = spawn(
                simulator(port, itl_ms=args.itl_ms, max_num_seqs=args.streams), log=logs / f"sim{i}.log"
            )
            procs.append(p)
            wait_port(port, p)
            sims.append(f"http://127.0.0.1:{port}")
        port = free_port()
        argv = [str(BIN / "llmgw-router"), "--listen", f"127.0.0.1:{port}", "--log-level", "warning"]
        if workers > 1:
            argv += ["--workers", str(workers)]
        router = spawn(argv + [a for s in sims for a in ("--backend", f"bench={s}")], log=logs / "router.log")
        procs.append(router)
        wait_port(port, router)
        rss_idle = rss_bytes(router.pid) / 2**20
        result = uvloop.run(run(args, f"http://127.0.0.1:{port}", router.pid))
        result["router_rss_idle_mib"] = rss_idle
        result["router_alive"] = router.poll() is None
    finally:
        stop(procs)
    print(
        f"  opened {result['streams']} in {result['ramp_seconds']:.1f} s; streaming together at the peak: "
        f"{result['flowing']}\n"
        f"  router at the peak: RSS {result['router_rss_mib']:.0f} MiB "
        f"(idle {result['router_rss_idle_mib']:.0f} MiB), "
        f"{result['router_fds']} open fds\n"
        f"  router CPU {result['router_cpu_seconds']:.1f} s over {result['seconds']:.1f} s "
        f"({result['router_cpu_seconds'] * 1000 / result['streams']:.2f} ms per stream)\n"
        f"  errors {result['errors']}; router still running: {result['router_alive']}"
    )
    for sample in result["error_samples"]:
        print(f"    error: {sample}")
    for log in sorted(logs.iterdir()):
        lines = log.read_text(errors="replace").splitlines()
        if lines:
            print(f"  {log.name}: {len(lines)} lines, the last: {lines[-1][:200]}")
    return 1 if result["errors"] or not result["router_alive"] else 0


if __name__ == "__main__":
    sys.exit(main())
