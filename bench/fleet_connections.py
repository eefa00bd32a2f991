#!/usr/bin/env python3
"""A simulated fleet over real gRPC: many agent streams on one control plane, and a leader change.

Starts a real etcd and two real control planes (``llmgw-control``
processes; the first leads, the second is a standby), then opens ``--agents``
``AgentService.Connect`` streams from this one process, each a fake node
with its own gRPC channel (its own TCP connection): it registers 8 GPUs,
answers StartReplica by reporting the replica READY at once, and sends a
heartbeat with the full status of its replicas at the interval the control
plane asks for. The catalog has ``--models`` one-GPU models of
``--replicas`` replicas each, so the leader places and records real
replicas on the fake nodes and publishes their endpoints.

Measured, from /proc of the leader's process:

- resident memory before any agent connected and with all of them
  connected and placed, and the difference per connection;
- CPU used over a ``--window`` of steady heartbeats, as a share of one
  core, and per connection;
- time from the first dial until every agent is registered.

Then the leader is killed with SIGKILL, and the time is measured until every
agent is registered with the standby that took over (lease TTL
``--lease-ttl``), with the count of Start/Stop commands the fake nodes got
after the change: zero means the new leader adopted every replica instead
of restarting any. Then the old leader comes back as a standby and the new
one is stopped with SIGTERM (it resigns its lease): the same time again,
for a graceful hand-over.

This process and the control planes share the machine's cores; the
fleet's own CPU is printed so the control plane's can be read against it.

Usage: python bench/fleet_connections.py [--agents 500] [--models 50] [--replicas 2] [--window 10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from llmgw.v1 import agent_pb2, agent_pb2_grpc  # noqa: E402
from tests.support.procs import Proc, free_port, start, start_etcd, tool, wait_port  # noqa: E402

RS = agent_pb2.ReplicaState
TICK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


@dataclass
class FakeNode:
    """One agent: a real Connect stream that does what an agent says, with no engines."""

    node_id: str
    addresses: list[str]
    gpus: int = 8
    replicas: dict[str, agent_pb2.ReplicaStatus] = field(default_factory=dict)
    control_id: str = ""
    registered: asyncio.Event = field(default_factory=asyncio.Event)
    commands_after_change: int = 0
    counting: bool = False

    def _register(self) -> agent_pb2.AgentMessage:
        return agent_pb2.AgentMessage(
            register=agent_pb2.Register(
                node_id=self.node_id,
                address="127.0.0.1",
                labels={"rack": f"r{hash(self.node_id) % 20}"},
                gpus=[
                    agent_pb2.Gpu(
                        index=i,
                        uuid=f"GPU-{self.node_id}-{i}",
                        name="Simulated H100",
                        memory_total_bytes=80 << 30,
                        memory_free_bytes=80 << 30,
                    )
                    for i in range(self.gpus)
                ],
                engines=[agent_pb2.EngineInfo(kind="simulator", version="bench")],
                version="bench",
                memory_bytes=512 << 30,
                cpu_cores=64,
                replicas=list(self.replicas.values()),
            )
        )

    async def run(self) -> None:
        """Stay connected to the leader for ever (cancel to stop), as an agent does."""
        target = self.addresses[0]
        i = 0
        while True:
            redirect = await self._session(target)
            if redirect:
                target = redirect
            else:
                i += 1
                target = self.addresses[i % len(self.addresses)]
                await asyncio.sleep(0.1 + random.random() * 0.2)

    async def _session(self, address: str) -> str:
        """One stream; returns a leader address to dial next, or '' to try the next address."""
        outbox: asyncio.Queue[agent_pb2.AgentMessage | None] = asyncio.Queue()
        await outbox.put(self._register())

        async def requests():
            while (msg := await outbox.get()) is not None:
                yield msg

        beat: asyncio.Task | None = None
        try:
            async with grpc.aio.insecure_channel(address) as channel:
                call = agent_pb2_grpc.AgentServiceStub(channel).Connect(requests())
                async for msg in call:
                    kind = msg.WhichOneof("msg")
                    if kind == "redirect":
                        return msg.redirect.leader_address
                    if kind == "registered":
                        self.control_id = msg.registered.control_id
                        self.registered.set()
                        interval = msg.registered.heartbeat_interval_seconds or 1.0
                        beat = asyncio.create_task(self._beat(outbox, interval))
                    elif kind == "start":
                        self._count()
                        s = msg.start
                        status = agent_pb2.ReplicaStatus(
                            replica_id=s.replica_id,
                            model=s.model,
                            state=RS.REPLICA_STATE_READY,
                            url=f"http://127.0.0.1:{20000 + len(self.replicas)}",
                            gpu_indices=list(s.gpu_indices),
                            served_name=s.served_name,
                            engine=s.engine,
                            pid=1,
                        )
                        self.replicas[s.replica_id] = status
                        await outbox.put(agent_pb2.AgentMessage(status=status))
                    elif kind == "stop":
                        self._count()
                        gone = self.replicas.pop(msg.stop.replica_id, None)
                        if gone is not None:
                            stopped = agent_pb2.ReplicaStatus()
                            stopped.CopyFrom(gone)
                            stopped.state = RS.REPLICA_STATE_STOPPED
                            await outbox.put(agent_pb2.AgentMessage(status=stopped))
        except grpc.aio.AioRpcError:
            pass
        finally:
            self.registered.clear()
            await outbox.put(None)
            if beat is not None:
                beat.cancel()
                await asyncio.gather(beat, return_exceptions=True)
        return ""

    def _count(self) -> None:
        if self.counting:
            self.commands_after_change += 1

    async def _beat(self, outbox: asyncio.Queue, interval: float) -> None:
        await asyncio.sleep(random.random() * interval)  # not all in step
        while True:
            await outbox.put(
                agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(replicas=list(self.replicas.values())))
            )
            await asyncio.sleep(interval)


async def until(pred, within: float, what: str, step: float = 0.05) -> float:
    """Seconds until ``pred`` holds (polled: the fleet's state has no event to await)."""
    t0 = time.monotonic()
    while not pred():  # noqa: ASYNC110
        if time.monotonic() - t0 > within:
            raise TimeoutError(f"not within {within}s: {what}")
        await asyncio.sleep(step)
    return time.monotonic() - t0


async def change_leader(fleet: list[FakeNode], leader: Proc, sig: int, successor: str) -> tuple[float, int]:
    """Signal the leader; seconds until every agent is registered with ``successor``, and the
    Start/Stop commands the fleet got in that time and 3 s after (0: every replica adopted)."""
    for n in fleet:
        n.counting = True
        n.commands_after_change = 0
    leader.signal(sig)
    took = await until(
        lambda: all(n.registered.is_set() and n.control_id == successor for n in fleet),
        120,
        f"all agents with {successor}",
    )
    await asyncio.sleep(3)
    return took, sum(n.commands_after_change for n in fleet)


def control_config(path: Path, control_id: str, port: int, etcd: str, secret: Path, args) -> Path:
    doc = {
        "cluster": "fleetbench",
        "control_id": control_id,
        "listen": f"127.0.0.1:{port}",
        "cluster_secret_file": str(secret),
        "etcd": {"endpoints": [etcd]},
        # Thousands of simulated agents would each need a node certificate:
        # plaintext, and TLS's own cost is bench/tls_cost.py's.
        "tls": {"plaintext": True},
        "lease_ttl_seconds": args.lease_ttl,
        "placement_settle_seconds": 2.0,
        "log_level": "warning",
        "models": [
            {
                "name": f"model-{i:03d}",
                "min_replicas": args.replicas,
                "profile": {"engine": "simulator", "gpus": 1},
            }
            for i in range(args.models)
        ],
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


async def bench(args, state: Path) -> None:
    logs = state / "logs"
    secret = state / "secret"
    secret.write_text("fleet-bench-secret\n")
    etcd, etcd_endpoint = start_etcd(state / "etcd", logs)
    procs: dict[str, Proc] = {"etcd": etcd}
    ports = {"control-1": free_port(), "control-2": free_port()}
    cfgs = {
        cid: control_config(state / f"{cid}.yaml", cid, port, etcd_endpoint, secret, args)
        for cid, port in ports.items()
    }

    def start_control(cid: str) -> Proc:
        p = start(cid, [tool("llmgw-control"), "--config", str(cfgs[cid])], logs)
        wait_port(ports[cid], proc=p)
        procs[cid] = p
        return p

    fleet: list[FakeNode] = []
    tasks: list[asyncio.Task] = []
    try:
        leader = start_control("control-1")
        await asyncio.sleep(args.lease_ttl + 1)  # control-1 leads before control-2 starts
        start_control("control-2")
        await asyncio.sleep(2)
        pid = leader.popen.pid
        rss0, cpu_idle0 = rss_bytes(pid), cpu_seconds(pid)
        await asyncio.sleep(3)
        idle_cpu = (cpu_seconds(pid) - cpu_idle0) / 3

        addresses = [f"127.0.0.1:{ports['control-1']}", f"127.0.0.1:{ports['control-2']}"]
        fleet = [FakeNode(f"node-{i:04d}", addresses) for i in range(args.agents)]
        cpu_before_connect = cpu_seconds(pid)
        tasks = [asyncio.create_task(n.run()) for n in fleet]
        registered_s = await until(lambda: all(n.registered.is_set() for n in fleet), 120, "all registered")
        wanted = args.models * args.replicas
        placed_s = await until(lambda: sum(len(n.replicas) for n in fleet) >= wanted, 120, "all placed")
        connect_cpu = cpu_seconds(pid) - cpu_before_connect
        await asyncio.sleep(3)  # let the placements settle into steady heartbeats
        me = os.getpid()
        c0, b0, w0 = cpu_seconds(pid), cpu_seconds(me), time.monotonic()
        await asyncio.sleep(args.window)
        c1, b1, w1 = cpu_seconds(pid), cpu_seconds(me), time.monotonic()
        rss1 = rss_bytes(pid)
        steady = (c1 - c0) / (w1 - w0)
        fleet_cpu = (b1 - b0) / (w1 - w0)

        print(f"fleet: {args.agents} agents x 8 GPUs, {args.models} models x {args.replicas} replicas")
        print(f"  register all:           {registered_s:.2f} s from the first dial")
        print(
            f"  all {wanted} replicas placed: {placed_s:.2f} s after that; "
            f"leader CPU for both {connect_cpu:.2f} s"
        )
        print(f"  leader RSS:             {rss0 / 2**20:.1f} MiB idle -> {rss1 / 2**20:.1f} MiB connected")
        print(f"  per connection:         {(rss1 - rss0) / args.agents / 1024:.1f} KiB RSS")
        print(
            f"  leader CPU, steady:     {steady * 100:.1f}% of one core "
            f"({(steady - idle_cpu) * 1e6 / args.agents:.0f} us/s per connection "
            f"above idle {idle_cpu * 100:.1f}%)"
        )
        print(f"  this fleet process:     {fleet_cpu * 100:.1f}% of one core (same machine)")

        # Leader change 1: SIGKILL; the standby takes over when the lease lapses.
        took, moved = await change_leader(fleet, leader, signal.SIGKILL, "control-2")
        print(
            f"  leader SIGKILL -> all {args.agents} agents registered with the new leader: {took:.2f} s "
            f"(lease TTL {args.lease_ttl} s); start/stop commands after the change: {moved}"
        )
        # Leader change 2: the old one back as a standby, the new leader stopped with SIGTERM (resigns).
        start_control("control-1")
        await asyncio.sleep(2)
        took, moved = await change_leader(fleet, procs["control-2"], signal.SIGTERM, "control-1")
        print(
            f"  leader SIGTERM -> all {args.agents} agents registered with the new leader: {took:.2f} s; "
            f"start/stop commands after the change: {moved}"
        )
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for p in procs.values():
            p.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=500)
    p.add_argument("--models", type=int, default=50)
    p.add_argument("--replicas", type=int, default=2, help="replicas per model")
    p.add_argument("--window", type=float, default=10.0, help="seconds of steady heartbeats measured")
    p.add_argument("--lease-ttl", type=int, default=5, help="the control planes' lease_ttl_seconds")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="llmgw-fleet-") as tmp:
        asyncio.run(bench(args, Path(tmp)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
