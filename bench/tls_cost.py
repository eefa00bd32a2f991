"""What mutual TLS costs on the gRPC paths that matter, with and without it, in one run.

Two real control planes (``llmgw-control``) over one real etcd, one with
``tls`` files (as ``llmgw up`` runs) and one with ``tls.plaintext``, each
measured the same way, alternately:

- **watch propagation**: a router-role client follows EndpointService.Watch;
  the bench writes an endpoint into etcd and times until the update arrives
  (etcd watch -> the control plane's hub -> the gRPC stream), ``--changes``
  times;
- **agent stream CPU**: ``--agents`` simulated agents (each with its own
  node certificate under TLS) register and send a heartbeat every
  ``--heartbeat`` seconds for ``--seconds``; the control plane's CPU time
  over that window is read from /proc.

Routers' request path is not here: a router talks plain HTTP to engines
and TLS touches none of it (docs/security.md: engine traffic).

    .venv/bin/python bench/tls_cost.py                  # about 40 s
    .venv/bin/python bench/tls_cost.py --agents 100 --seconds 20
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness import BIN, cpu_seconds, free_port, spawn, stop, wait_port  # noqa: E402

from llmgw.common.etcd import EtcdStore  # noqa: E402
from llmgw.common.tls import PLAINTEXT, TlsSettings, aio_channel  # noqa: E402
from llmgw.v1 import agent_pb2, agent_pb2_grpc, endpoints_pb2, endpoints_pb2_grpc  # noqa: E402
from tests.support.certs import ClusterPki  # noqa: E402
from tests.support.procs import start_etcd  # noqa: E402

MODES = ("tls", "plaintext")


async def watch_propagation(address: str, tls: TlsSettings, store: EtcdStore, changes: int) -> list[float]:
    """Milliseconds from an etcd put under endpoints/ to the update on a Watch stream."""
    arrived: dict[str, float] = {}
    async with aio_channel(address, tls) as channel:
        call = endpoints_pb2_grpc.EndpointServiceStub(channel).Watch(
            endpoints_pb2.WatchRequest(client_id="bench")
        )
        snapshot = asyncio.Event()

        async def read() -> None:
            async for update in call:
                if update.snapshot:
                    snapshot.set()
                for e in update.upserts:
                    arrived[e.id] = time.perf_counter()

        reader = asyncio.create_task(read())
        async with asyncio.timeout(10):
            await snapshot.wait()
        took = []
        try:
            for i in range(changes):
                eid = f"bench-{time.monotonic_ns()}-{i}"
                value = endpoints_pb2.Endpoint(
                    id=eid, model="bench", url="http://127.0.0.1:1"
                ).SerializeToString()
                sent = time.perf_counter()
                await store.put(f"endpoints/{eid}", value)
                async with asyncio.timeout(10):
                    while eid not in arrived:  # noqa: ASYNC110 - the reader task fills it
                        await asyncio.sleep(0.0005)
                took.append((arrived[eid] - sent) * 1000)
                await store.delete(f"endpoints/{eid}")
        finally:
            call.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return took


async def agent_streams(
    address: str, pid: int, settings: list[TlsSettings], heartbeat: float, seconds: float
) -> float:
    """Control-plane CPU seconds per second while ``len(settings)`` agents heartbeat."""
    stop_at = asyncio.Event()

    async def agent(i: int, tls: TlsSettings) -> None:
        node = f"bench-node-{i:03d}"

        async def messages():
            yield agent_pb2.AgentMessage(register=agent_pb2.Register(node_id=node, address="127.0.0.1"))
            while not stop_at.is_set():
                await asyncio.sleep(heartbeat)
                yield agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat())

        async with aio_channel(address, tls) as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect(messages())
            async for _ in call:
                if stop_at.is_set():
                    break

    tasks = [asyncio.create_task(agent(i, s)) for i, s in enumerate(settings)]
    await asyncio.sleep(2.0)  # registered, past the first reconcile passes
    before, t0 = cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    used = (cpu_seconds(pid) - before) / (time.monotonic() - t0)
    stop_at.set()
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return used


def control_config(path: Path, mode: str, port: int, etcd: str, secret: Path, pki: ClusterPki) -> Path:
    doc = {
        "cluster": f"tlsbench-{mode}",
        "control_id": f"bench-{mode}",
        "listen": f"127.0.0.1:{port}",
        "cluster_secret_file": str(secret),
        "etcd": {"endpoints": [etcd]},
        "tls": pki.control(f"bench-{mode}") if mode == "tls" else {"plaintext": True},
        "log_level": "warning",
    }
    path.write_text(yaml.safe_dump(doc))
    return path


async def bench(args: argparse.Namespace, state: Path) -> None:
    etcd_proc, etcd = start_etcd(state / "etcd", state / "logs")
    procs = []
    try:
        secret = state / "secret"
        secret.write_text("tls-bench-cluster-secret\n")
        pki = ClusterPki.create(state / "tls")
        controls: dict[str, tuple[str, int]] = {}
        for mode in MODES:
            port = free_port()
            cfg = control_config(state / f"{mode}.yaml", mode, port, etcd, secret, pki)
            procs.append(spawn([str(BIN / "llmgw-control"), "--config", str(cfg)], log=state / f"{mode}.log"))
            wait_port(port, procs[-1])
            controls[mode] = (f"127.0.0.1:{port}", procs[-1].pid)
        stores = {m: EtcdStore([etcd], f"/llmgw/tlsbench-{m}/") for m in MODES}
        router = {"tls": pki.settings("router", "bench"), "plaintext": PLAINTEXT}
        nodes = {
            "tls": [pki.settings("node", f"bench-node-{i:03d}", ("127.0.0.1",)) for i in range(args.agents)],
            "plaintext": [PLAINTEXT] * args.agents,
        }
        await asyncio.sleep(3)  # both lead
        prop: dict[str, list[float]] = {m: [] for m in MODES}
        cpu: dict[str, list[float]] = {m: [] for m in MODES}
        for _ in range(args.rounds):
            for mode in MODES:
                address, pid = controls[mode]
                prop[mode] += await watch_propagation(address, router[mode], stores[mode], args.changes)
                cpu[mode].append(await agent_streams(address, pid, nodes[mode], args.heartbeat, args.seconds))
        for s in stores.values():
            await s.close()
    finally:
        stop([*procs, etcd_proc.popen])

    def q(values: list[float], p: float) -> float:
        return statistics.quantiles(values, n=100)[int(p) - 1]

    print(f"\nwatch propagation ({args.changes * args.rounds} changes each), ms:")
    print(f"  {'mode':10} {'p50':>7} {'p95':>7} {'p99':>7}")
    for mode in MODES:
        v = prop[mode]
        print(f"  {mode:10} {q(v, 50):7.2f} {q(v, 95):7.2f} {q(v, 99):7.2f}")
    ratio = q(prop["tls"], 50) / q(prop["plaintext"], 50)
    print(f"  tls / plaintext p50: {ratio:.2f}")
    per_msg = args.agents / args.heartbeat
    print(f"\nagent streams: {args.agents} agents, {per_msg:.0f} heartbeats/s, control-plane CPU (cores):")
    for mode in MODES:
        rounds = ", ".join(f"{c:.3f}" for c in cpu[mode])
        print(f"  {mode:10} {statistics.median(cpu[mode]):.3f}  (rounds: {rounds})")
    print(f"  tls / plaintext: {statistics.median(cpu['tls']) / statistics.median(cpu['plaintext']):.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--changes", type=int, default=100, help="endpoint changes timed per round and mode")
    p.add_argument("--agents", type=int, default=50)
    p.add_argument("--heartbeat", type=float, default=0.1, help="seconds between one agent's heartbeats")
    p.add_argument("--seconds", type=float, default=5.0, help="CPU window per round and mode")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (tls, plaintext, tls, ...)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(bench(args, Path(tmp)))


if __name__ == "__main__":
    main()
