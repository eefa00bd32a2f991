"""A whole cluster of real processes: etcd, one control plane, one router, agents.

Used by integration tests and by benchmarks that need the real thing (the
autoscaling ones): every role is its own process on free ports, talking
real gRPC and HTTP, stopped by PID (process group) at the end, engines
included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml

from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2

from .procs import Proc, free_port, start, start_etcd, tool, wait_port

READY = agent_pb2.ReplicaState.REPLICA_STATE_READY


@dataclass
class Cluster:
    state: Path
    control_address: str
    router_url: str
    nodes: tuple[str, ...]
    procs: dict[str, Proc] = field(default_factory=dict)
    _channel: grpc.Channel | None = None

    def admin(self) -> admin_pb2_grpc.AdminServiceStub:
        if self._channel is None:
            self._channel = grpc.insecure_channel(self.control_address)
        return admin_pb2_grpc.AdminServiceStub(self._channel)

    def replicas(self, model: str) -> list[admin_pb2.ReplicaInfo]:
        request = admin_pb2.ListReplicasRequest(model=model)
        return list(self.admin().ListReplicas(request, timeout=5).replicas)

    def ready(self, model: str) -> int:
        return sum(r.state == READY for r in self.replicas(model))

    def router_metric(self, name: str, model: str) -> float:
        """One series of the router's /metrics for ``model`` (0 when absent)."""
        with urllib.request.urlopen(self.router_url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + "{") and f'model="{model}"' in line:
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def router_endpoints(self, model: str) -> int:
        return int(self.router_metric("llmgw_router_endpoints", model))

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"----- {name}\n{p.tail(lines)}" for name, p in self.procs.items())

    def wait(self, pred: Callable[[], bool], timeout: float, what: str, step: float = 0.05) -> float:
        """Poll ``pred`` until it holds; returns the monotonic time it first did."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if pred():
                    return time.monotonic()
            except (grpc.RpcError, OSError):
                pass
            time.sleep(step)
        raise AssertionError(f"not within {timeout}s: {what}\n{self.logs()}")

    def stop(self) -> None:
        if self._channel is not None:
            self._channel.close()
        for name in ("router", *(f"agent-{n}" for n in self.nodes), "control", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        for node in self.nodes:
            for f in (self.state / "agents" / node / "replicas").glob("*/pid"):
                with contextlib.suppress(OSError, ValueError):
                    os.killpg(int(f.read_text().strip()), signal.SIGKILL)


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@contextlib.contextmanager
def running_cluster(
    state: Path,
    models: list[dict[str, Any]],
    *,
    nodes: dict[str, int] | None = None,
    control: dict[str, Any] | None = None,
    router: dict[str, Any] | None = None,
) -> Iterator[Cluster]:
    """Start the cluster, yield it once every role listens, stop everything after."""
    nodes = nodes or {"node-a": 4}
    logs = state / "logs"
    secret = state / "cluster.secret"
    secret.write_text("autoscaling-test-secret\n")
    control_port, router_port = free_port(), free_port()
    c = Cluster(state, f"127.0.0.1:{control_port}", f"http://127.0.0.1:{router_port}", tuple(nodes))
    try:
        etcd, etcd_endpoint = start_etcd(state / "etcd", logs)
        c.procs["etcd"] = etcd
        control_cfg = {
            "cluster": "scaling",
            "control_id": "control-1",
            "listen": c.control_address,
            "cluster_secret_file": str(secret),
            "etcd": {"endpoints": [etcd_endpoint]},
            "placement_settle_seconds": 0.5,
            "models": models,
            **(control or {}),
        }
        path = _write(state / "control.yaml", control_cfg)
        c.procs["control"] = start("control", [tool("llmgw-control"), "--config", str(path)], logs)
        wait_port(control_port, proc=c.procs["control"])
        for node, gpus in nodes.items():
            path = _write(
                state / f"agent-{node}.yaml",
                {
                    "node_id": node,
                    "control": [c.control_address],
                    "state_dir": str(state / "agents" / node),
                    "gpus": [{"count": gpus, "name": "Simulated H100", "memory_gb": 80}],
                    "probe_interval_seconds": 0.1,
                    "stop_grace_seconds": 2,
                },
            )
            c.procs[f"agent-{node}"] = start(
                f"agent-{node}", [tool("llmgw-agent"), "--config", str(path)], logs
            )
        router_cfg = {
            "listen": f"127.0.0.1:{router_port}",
            "control": [c.control_address],
            "cluster_secret_file": str(secret),
            **(router or {}),
        }
        path = _write(state / "router.yaml", router_cfg)
        c.procs["router"] = start("router", [tool("llmgw-router"), "--config", str(path)], logs)
        wait_port(router_port, proc=c.procs["router"])
        yield c
    except BaseException:
        print(c.logs())
        raise
    finally:
        c.stop()
