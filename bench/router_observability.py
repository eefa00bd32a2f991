#!/usr/bin/env python3
"""What observability costs the router: CPU per request with logs and traces off and on.

Four standalone routers in front of the same two simulators, identical but
for what they record: ``bare`` (metrics only: they are always on; no access
log, no tracing), ``access-log`` (one key=value line per request, to a
file), ``traces`` (access log plus OpenTelemetry spans of every request
exported over OTLP/gRPC to a sink process on this machine) and ``traces-1%``
(the same, sampling 1% of traces by trace id). The same load goes to each in
turn, interleaved over rounds so machine noise lands on all three, in both
modes (non-streaming, streaming). For each it prints requests/s, p50
latency and the router's CPU per request (user + system time from
/proc/<pid>/stat over the round, divided by the requests served), then each
variant's CPU relative to ``bare``.

Usage: python bench/router_observability.py [--concurrency 16] [--seconds 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, cpu_seconds, free_port, spawn, stop, wait_port  # noqa: E402

# An OTLP/gRPC trace sink that accepts and drops: the router's export cost, not a collector's.
SINK = """
import sys, time
from concurrent import futures
import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as pb, trace_service_pb2_grpc as rpc
class Sink(rpc.TraceServiceServicer):
    def Export(self, request, context):
        return pb.ExportTraceServiceResponse()
server = grpc.server(futures.ThreadPoolExecutor(2))
rpc.add_TraceServiceServicer_to_server(Sink(), server)
server.add_insecure_port("127.0.0.1:" + sys.argv[1])
server.start()
server.wait_for_termination()
"""


@dataclass(frozen=True)
class Round:
    requests: int
    seconds: float
    p50_ms: float

    @property
    def rps(self) -> float:
        return self.requests / self.seconds


async def load(url: str, stream: bool, concurrency: int, seconds: float, tokens: int) -> Round:
    """Closed loop: ``concurrency`` clients, each sending the next request when its last ended."""
    body = {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens}
    body["stream"] = stream
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:

        async def client() -> None:
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                async with session.post(url + "/v1/chat/completions", json=body) as resp:
                    await resp.read()
                    if resp.status == 200:
                        latencies.append(time.perf_counter() - started)

        began = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    p50 = statistics.median(latencies) * 1000 if latencies else float("nan")
    return Round(len(latencies), elapsed, p50)


def start_router(
    sims: list[str], work: Path, name: str, *, access_log: bool, otlp: str, sample: float = 1.0
) -> tuple[str, subprocess.Popen]:
    port = free_port()
    config = work / f"{name}.yaml"
    config.write_text(f"access_log: {str(access_log).lower()}\nlog_level: info\n")
    env = {**os.environ}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    if otlp:
        env.update(OTEL_EXPORTER_OTLP_ENDPOINT=otlp, OTEL_EXPORTER_OTLP_INSECURE="true")
        env.update(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG=str(sample))
    log = open(work / f"{name}.log", "wb")  # noqa: SIM115 - the child owns it
    proc = subprocess.Popen(
        [str(BIN / "llmgw-router"), "--config", str(config), "--listen", f"127.0.0.1:{port}"]
        + [a for s in sims for a in ("--backend", f"bench={s},key=bench-key")],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )
    log.close()
    wait_port(port, proc)
    return f"http://127.0.0.1:{port}", proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens per request")
    args = ap.parse_args()

    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp:
        work = Path(tmp)
        try:
            sims = []
            for _ in range(2):
                port = free_port()
                p = spawn(
                    [str(BIN / "llmgw-simulator"), "--port", str(port), "--served-model-name", "bench"]
                    + ["--api-key", "bench-key", "--ttft-ms", "0", "--itl-ms", "0", "--max-num-seqs", "1024"]
                )
                procs.append(p)
                wait_port(port, p)
                sims.append(f"http://127.0.0.1:{port}")
            sink_port = free_port()
            sink = spawn([sys.executable, "-c", SINK, str(sink_port)])
            procs.append(sink)
            wait_port(sink_port, sink)
            variants = {
                "bare": start_router(sims, work, "bare", access_log=False, otlp=""),
                "access-log": start_router(sims, work, "access", access_log=True, otlp=""),
                "traces": start_router(
                    sims, work, "traces", access_log=True, otlp=f"http://127.0.0.1:{sink_port}"
                ),
                "traces-1%": start_router(
                    sims, work, "sampled", access_log=True, otlp=f"http://127.0.0.1:{sink_port}", sample=0.01
                ),
            }
            procs += [proc for _, proc in variants.values()]
            for url, _ in variants.values():
                asyncio.run(load(url, False, 4, 1.0, args.tokens))

            print(
                f"router observability cost: {args.concurrency} concurrent clients, {args.seconds:.0f}s x "
                f"{args.rounds} rounds per variant, {args.tokens} output tokens, cpus={os.cpu_count()}"
            )
            for stream in (False, True):
                mode = "streaming" if stream else "non-streaming"
                rows: dict[str, dict[str, list[float]]] = {
                    n: {"rps": [], "p50": [], "cpu": []} for n in variants
                }
                for _ in range(args.rounds):
                    for name, (url, proc) in variants.items():
                        before = cpu_seconds(proc.pid)
                        result = asyncio.run(load(url, stream, args.concurrency, args.seconds, args.tokens))
                        used = cpu_seconds(proc.pid) - before
                        rows[name]["rps"].append(result.rps)
                        rows[name]["p50"].append(result.p50_ms)
                        rows[name]["cpu"].append(used / max(result.requests, 1) * 1e6)
                print(f"\n{mode}")
                print(f"  {'variant':11} {'req/s':>8} {'p50 ms':>8} {'CPU us/req':>11} {'CPU vs bare':>12}")
                bare = statistics.median(rows["bare"]["cpu"])
                for name, row in rows.items():
                    cpu = statistics.median(row["cpu"])
                    print(
                        f"  {name:11} {statistics.median(row['rps']):8.0f} "
                        f"{statistics.median(row['p50']):8.2f} {cpu:11.0f} {cpu / bare:12.2f}"
                    )
        finally:
            stop(procs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
