#!/usr/bin/env python3
"""The agent: time from StartReplica to Ready, and its share of the request path (none).

A real ``llmgw-agent`` process registers with a minimal AgentService that
this script serves in-process (it only sends commands and timestamps the
statuses the agent reports, so nothing of a control plane's placement or
settling is counted).

1. Start to Ready: StartReplica is sent, the clock stops at the READY
   status (the agent's probe saw ``/health`` answer and ``/v1/models`` list
   the served name); the replica is then stopped, and the next round
   starts. For the simulator (``--rounds`` times) and, when the vLLM venv
   and the tiny model are there (``make vllm``; scripts/make_tiny_model.py),
   for the tiny real vLLM (``--vllm-rounds`` times).
2. Request path: a simulator replica started by the agent serves a
   standalone router (``--backend``, so routing needs no control plane) under
   load, in rounds that alternate the agent running and the agent frozen
   with SIGSTOP. Equal throughput and latency show the agent is not on the
   path; its CPU time during the running rounds (utime + stime from
   ``/proc/<pid>/stat``) shows what it spends meanwhile (heartbeats).

Usage: python bench/agent_startup.py [--rounds 5] [--vllm-rounds 2] [--load-rounds 4] [--seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from harness import BIN, free_port, loadgen, spawn, wait_port  # noqa: E402

from llmgw.common.grpcserver import GrpcServer  # noqa: E402
from llmgw.v1 import agent_pb2 as pb  # noqa: E402
from llmgw.v1 import agent_pb2_grpc  # noqa: E402
from tests.support.vllm import (  # noqa: E402
    CPU_NODE_ARGS,
    DEFAULT_MODEL,
    ENGINE_ENV,
    TINY_MODEL_ARGS,
    venv_dir,
)

KEY = "bench-key"
READY_TIMEOUT = {"simulator": 60.0, "vllm": 300.0}


class Control(agent_pb2_grpc.AgentServiceServicer):
    """Sends what it is told to the one agent; timestamps every status it reports."""

    def __init__(self) -> None:
        # None ends the stream (the agent half-closed it, as on its shutdown).
        self.outbox: asyncio.Queue[pb.ControlMessage | None] = asyncio.Queue()
        # replica id -> (when, state, message, url), in arrival order
        self.seen: dict[str, list[tuple[float, int, str, str]]] = defaultdict(list)
        self.changed = asyncio.Event()
        self.registered = asyncio.Event()

    async def Connect(self, request_iterator, context):  # noqa: N802 - gRPC method name
        reader = asyncio.create_task(self._read(request_iterator))
        try:
            yield pb.ControlMessage(
                registered=pb.Registered(control_id="bench", heartbeat_interval_seconds=1.0)
            )
            while (msg := await self.outbox.get()) is not None:
                yield msg
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, request_iterator) -> None:
        async for msg in request_iterator:
            kind = msg.WhichOneof("msg")
            if kind == "register":
                self.registered.set()
            elif kind == "status":
                s = msg.status
                self.seen[s.replica_id].append((time.perf_counter(), s.state, s.message, s.url))
                self.changed.set()
        self.outbox.put_nowait(None)

    async def until(self, replica_id: str, state: int, within: float) -> tuple[float, str]:
        """When ``replica_id`` first reported ``state``, and its URL then."""
        async with asyncio.timeout(within):
            while True:
                for t, st, message, url in self.seen[replica_id]:
                    if st == state:
                        return t, url
                    if st == pb.REPLICA_STATE_FAILED:
                        raise RuntimeError(f"replica {replica_id} failed: {message}")
                self.changed.clear()
                await self.changed.wait()


async def start_to_ready(control: Control, rid: str, engine: str, args: dict[str, str]) -> float:
    t0 = time.perf_counter()
    control.outbox.put_nowait(
        pb.ControlMessage(
            start=pb.StartReplica(
                replica_id=rid,
                model="bench",
                engine=engine,
                served_name="bench",
                gpu_indices=[0],
                engine_key=KEY,
                engine_args=args,
            )
        )
    )
    t1, _ = await control.until(rid, pb.REPLICA_STATE_READY, READY_TIMEOUT[engine])
    return t1 - t0


async def stop(control: Control, rid: str) -> None:
    control.outbox.put_nowait(pb.ControlMessage(stop=pb.StopReplica(replica_id=rid, reason="bench")))
    await control.until(rid, pb.REPLICA_STATE_STOPPED, 60)


def load_round(target: str, concurrency: int, seconds: float) -> dict:
    """One streaming load round; loadgen runs in its own process, off this one's GIL."""
    body = json.dumps(
        {"model": "bench", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "stream": True}
    )
    return loadgen([target], body, concurrency=concurrency, seconds=seconds, warmup=0, stream=True)


def cpu_seconds(pid: int) -> float:
    """The agent's own CPU, not its tree's: the engines it started serve the load."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summary(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):6.2f} s   min {min(values):6.2f} s   "
        f"max {max(values):6.2f} s   (n={len(values)})"
    )


async def run(args: argparse.Namespace, work: Path) -> int:
    control = Control()
    server = GrpcServer("127.0.0.1:0", [(agent_pb2_grpc.add_AgentServiceServicer_to_server, control, "x")])
    await server.start()
    vllm_python = venv_dir() / "bin" / "python"
    with_vllm = args.vllm_rounds > 0 and vllm_python.exists() and (DEFAULT_MODEL / "config.json").exists()
    engines: dict = {"simulator": {}}
    if with_vllm:
        engines["vllm"] = {"python": str(vllm_python), "args": CPU_NODE_ARGS, "start_timeout_seconds": 300}
    config = work / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node_id": "bench-node",
                "control": [f"127.0.0.1:{server.port}"],
                # The scripted control plane here is plaintext; TLS costs are bench/tls_cost.py's.
                "tls": {"plaintext": True},
                "state_dir": str(work / "state"),
                "gpus": [{"count": 1}],
                "engines": engines,
                "probe_interval_seconds": 0.1,
                "stop_grace_seconds": 10,
                "log_level": "warning",
            }
        )
    )
    agent = subprocess.Popen(  # noqa: ASYNC220 - started once, before any measurement
        [str(BIN / "llmgw-agent"), "--config", str(config)],
        env={**os.environ, **ENGINE_ENV},
        start_new_session=True,
    )
    router = None
    try:
        async with asyncio.timeout(60):
            await control.registered.wait()
        print(f"agent startup: cpus={os.cpu_count()}, probe interval 0.1 s")
        sim_args = {"ttft-ms": "0", "itl-ms": "0", "max-num-seqs": "1024"}
        times = []
        for i in range(args.rounds):
            times.append(await start_to_ready(control, f"sim-{i}", "simulator", sim_args))
            await stop(control, f"sim-{i}")
        print(f"  StartReplica -> Ready, simulator:  {summary(times)}")
        if with_vllm:
            vtimes = []
            vargs = {"weights": str(DEFAULT_MODEL), **TINY_MODEL_ARGS}
            for i in range(args.vllm_rounds):
                vtimes.append(await start_to_ready(control, f"vllm-{i}", "vllm", vargs))
                await stop(control, f"vllm-{i}")
            print(f"  StartReplica -> Ready, tiny vLLM:  {summary(vtimes)}")
        else:
            print("  tiny vLLM: skipped (make vllm, then scripts/make_tiny_model.py with its python)")

        # The request path, with the agent running and frozen.
        await start_to_ready(control, "served", "simulator", sim_args)
        _, url = await control.until("served", pb.REPLICA_STATE_READY, 1)
        rport = free_port()
        router = spawn(
            [str(BIN / "llmgw-router"), "--listen", f"127.0.0.1:{rport}", "--log-level", "warning"]
            + ["--backend", f"bench={url},key={KEY}"]
        )
        wait_port(rport, router)
        target = f"http://127.0.0.1:{rport}"
        # The load runs in its own process: sharing this one's GIL with the gRPC server
        # that takes the agent's heartbeats would charge the agent for the harness.
        await asyncio.to_thread(load_round, target, 4, 1.0)  # warm up
        # --aa: the second arm leaves the agent running too (an A/A run: the harness's own bias).
        frozen = "running-too" if args.aa else "SIGSTOPped"
        rows: dict[str, list] = {"running": [], frozen: []}
        cpu: list[float] = []
        for i in range(args.load_rounds):
            # ABBA order, so a drift over the run lands on both states alike.
            for state in list(rows) if i % 2 == 0 else list(rows)[::-1]:
                if state == "SIGSTOPped":
                    os.kill(agent.pid, signal.SIGSTOP)
                before = cpu_seconds(agent.pid)
                try:
                    rows[state].append(
                        await asyncio.to_thread(load_round, target, args.concurrency, args.seconds)
                    )
                finally:
                    if state == "SIGSTOPped":
                        os.kill(agent.pid, signal.SIGCONT)
                if state == "running":
                    cpu.append(cpu_seconds(agent.pid) - before)
        print(
            f"\n  request path: streaming through a router to an agent-started simulator, "
            f"{args.concurrency} clients, {args.seconds:g} s x {args.load_rounds} rounds per agent state"
        )
        print(f"  {'agent':11} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'errors':>6}")
        med = {}
        for state, results in rows.items():
            med[state] = (
                statistics.median(r["rps"] for r in results),
                statistics.median(r["p50_ms"] for r in results),
                statistics.median(r["p99_ms"] for r in results),
                sum(r["errors"] for r in results),
            )
            rps, p50, p99, errors = med[state]
            print(f"  {state:11} {rps:8.0f} {p50:8.2f} {p99:8.2f} {errors:6d}")
        run_, stop_ = med["running"], med[frozen]
        print(f"  ratio running/{frozen}: req/s {run_[0] / stop_[0]:.2f}, p50 {run_[1] / stop_[1]:.2f}")
        per_round = statistics.median(cpu)
        print(
            f"  agent CPU time while the load ran: {per_round * 1000:.0f} ms per {args.seconds:g} s round "
            f"({per_round / args.seconds * 100:.1f}% of one core)"
        )
        return 1 if run_[3] or stop_[3] else 0
    finally:
        if router is not None:
            os.killpg(router.pid, signal.SIGTERM)
            router.wait(10)
        os.kill(agent.pid, signal.SIGCONT)
        os.killpg(agent.pid, signal.SIGTERM)  # stop_engines_on_exit: it stops its engines first
        try:
            agent.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(agent.pid, signal.SIGKILL)
        await server.stop(0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="simulator starts")
    ap.add_argument("--vllm-rounds", type=int, default=2, help="tiny vLLM starts (0: none)")
    ap.add_argument("--load-rounds", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=3.0, help="per load round")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--aa", action="store_true", help="never SIGSTOP: both arms with the agent running")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-agent-") as tmp:
        return asyncio.run(run(args, Path(tmp)))


if __name__ == "__main__":
    sys.exit(main())
