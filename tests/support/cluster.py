"""A whole cluster of real processes: etcd, control planes, one router, agents.

The one way integration tests and benchmarks start the real thing (node
loss and drain, control-plane failover, autoscaling): every role is its own
process on free ports, talking real gRPC and HTTP, stopped by PID (process
group) at the end, engines included.

What differs between those tests is data, not code, so ``running_cluster``
takes it as arguments: the nodes and their GPU counts, how many control
planes, the models, config overrides per role, an optional admin token.
What a test asserts stays in the test; the questions several tests ask of
a cluster (its replicas, a node's state, a router metric, who leads) live
on ``Cluster``.

Every gRPC link is mutual TLS, as ``llmgw up`` runs it: ``state/tls`` holds
the CA and a certificate per process (:mod:`.certs`); the test itself calls
with the admin certificate ``admin-test`` (``Cluster.channel``).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import openai

from llmgw.common.tls import TlsSettings, sync_channel
from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2

from .certs import ClusterPki
from .procs import (
    EtcdCluster,
    Proc,
    free_port,
    start,
    start_etcd_cluster,
    tool,
    wait_port,
    write_yaml,
)

READY = agent_pb2.ReplicaState.REPLICA_STATE_READY

# Agent settings for tests that time a replica's start or drain: probing
# every 0.1 s shows Ready at once, and a stopping engine gets 2 s, not 10.
QUICK_AGENT = {"probe_interval_seconds": 0.1, "stop_grace_seconds": 2}


def simulator_model(name: str, replicas: int) -> dict[str, Any]:
    """``replicas`` one-GPU simulator replicas, each answer 24 tokens in about a quarter second."""
    return {
        "name": name,
        "min_replicas": replicas,
        "profile": {
            "engine": "simulator",
            "gpus": 1,
            "args": {"ttft-ms": "20", "itl-ms": "10", "output-tokens": "24"},
        },
    }


@dataclass
class Cluster:
    state: Path
    controls: dict[str, str]  # control id -> address, in start order
    router_url: str
    nodes: tuple[str, ...]
    etcd: str = ""  # the first etcd member's endpoint
    etcd_cluster: EtcdCluster | None = None
    token_file: Path | None = None
    pki: ClusterPki | None = None
    procs: dict[str, Proc] = field(default_factory=dict)
    _channels: dict[str, grpc.Channel] = field(default_factory=dict)

    @property
    def first_control(self) -> str:
        """The control plane asked when a call names none: the first started."""
        return next(iter(self.controls))

    @property
    def auth(self) -> tuple[tuple[str, str], ...]:
        """gRPC metadata for the admin API: the bearer token when the cluster has one."""
        if self.token_file is None:
            return ()
        return (("authorization", f"Bearer {self.token_file.read_text().strip()}"),)

    @property
    def admin_tls(self) -> TlsSettings:
        assert self.pki is not None
        return self.pki.settings("admin", "test")

    def channel(self, control: str = "", tls: TlsSettings | None = None) -> grpc.Channel:
        """A new channel to ``control`` (the first by default), as admin unless ``tls`` says who."""
        return sync_channel(self.controls[control or self.first_control], tls or self.admin_tls)

    def admin(self, control: str = "") -> admin_pb2_grpc.AdminServiceStub:
        """The admin API of ``control`` (the first one by default), over a channel kept open."""
        control = control or self.first_control
        if control not in self._channels:
            self._channels[control] = self.channel(control)
        return admin_pb2_grpc.AdminServiceStub(self._channels[control])

    def replicas(self, model: str, control: str = "") -> list[admin_pb2.ReplicaInfo]:
        request = admin_pb2.ListReplicasRequest(model=model)
        return list(self.admin(control).ListReplicas(request, timeout=5, metadata=self.auth).replicas)

    def ready(self, model: str, control: str = "") -> int:
        return sum(r.state == READY for r in self.replicas(model, control))

    def node_state(self, node: str) -> str:
        nodes = self.admin().ListNodes(admin_pb2.ListNodesRequest(), timeout=5, metadata=self.auth).nodes
        return next((n.state for n in nodes if n.node_id == node), "absent")

    def leads(self, control: str) -> bool:
        """Whether ``control`` says it leads; false when it does not answer within a second.

        A fresh channel each time: a kept one to a control plane that was
        killed would be in reconnect backoff after its restart, and a
        failover timed through it would include that backoff.
        """
        with self.channel(control) as channel:
            try:
                status = admin_pb2_grpc.AdminServiceStub(channel).GetClusterStatus(
                    admin_pb2.GetClusterStatusRequest(), timeout=1, metadata=self.auth
                )
            except grpc.RpcError:
                return False
        return status.leader

    def router_metric(self, name: str, model: str) -> float:
        """One series of the router's /metrics for ``model`` (0 when absent)."""
        with urllib.request.urlopen(self.router_url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith(name + "{") and f'model="{model}"' in line:
                    return float(line.rsplit(" ", 1)[1])
        return 0.0

    def router_endpoints(self, model: str) -> int:
        return int(self.router_metric("llmgw_router_endpoints", model))

    def client(self, timeout: float = 30) -> openai.OpenAI:
        # No client retries: a failure from the router must fail the test, not be retried away.
        return openai.OpenAI(
            base_url=self.router_url + "/v1", api_key="unused", max_retries=0, timeout=timeout
        )

    def llmgw(
        self, *args: str, control: str = "", stdin: str | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """The ``llmgw`` CLI against ``control`` (the first by default), as an operator runs it.

        It runs in the cluster's state directory, so no ``.llmgw/admin.token``
        of the working tree is picked up: the token is the cluster's or none.
        """
        argv = [tool("llmgw"), *args, "--control", self.controls[control or self.first_control]]
        assert self.pki is not None
        argv += ["--tls-dir", str(self.pki.dir)]
        if self.token_file is not None:
            argv += ["--token-file", str(self.token_file)]
        return subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=60,
            input=stdin,
            cwd=self.state,
            env={**os.environ, **(env or {})},
        )

    def llmgw_json(self, *args: str, control: str = "") -> dict:
        out = self.llmgw(*args, "--json", control=control)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    def engine_pids(self, nodes: tuple[str, ...] | list[str] = ()) -> dict[str, int]:
        """replica id -> engine PID (its process group), from the agents' state directories."""
        pids = {}
        for node in nodes or self.nodes:
            for f in (self.state / "agents" / node / "replicas").glob("*/pid"):
                with contextlib.suppress(OSError, ValueError):
                    pids[f.parent.name] = int(f.read_text().strip())
        return pids

    def start_control(self, name: str) -> None:
        """Start control plane ``name`` from its config; also how a stopped one is started again."""
        cfg = self.state / f"{name}.yaml"
        self.procs[name] = start(name, [tool("llmgw-control"), "--config", str(cfg)], self.state / "logs")
        wait_port(int(self.controls[name].rsplit(":", 1)[1]), proc=self.procs[name])

    def start_agent(self, node: str, gpus: int, config: dict[str, Any], env: dict | None = None) -> Proc:
        """Start an agent for ``node`` (``config`` over the defaults); stopped by :meth:`stop`."""
        agent_cfg = {
            "node_id": node,
            "control": list(self.controls.values()),
            "state_dir": str(self.state / "agents" / node),
            "gpus": [{"count": gpus, "name": "Simulated H100", "memory_gb": 80}],
            **config,
        }
        path = write_yaml(self.state / f"agent-{node}.yaml", agent_cfg)
        if node not in self.nodes:
            self.nodes = (*self.nodes, node)
        proc = start(f"agent-{node}", [tool("llmgw-agent"), "--config", str(path)], self.state / "logs", env)
        self.procs[f"agent-{node}"] = proc
        return proc

    def logs(self, lines: int = 40) -> str:
        return "\n".join(f"----- {name}\n{p.tail(lines)}" for name, p in self.procs.items())

    def wait(self, pred: Callable[[], object], timeout: float, what: str, step: float = 0.05) -> float:
        """Poll ``pred`` until it holds; returns the monotonic time it first did."""
        return self.wait_for(lambda: bool(pred()) and time.monotonic(), timeout, what, step)

    def wait_for(self, get: Callable[[], Any], timeout: float, what: str, step: float = 0.05) -> Any:
        """Poll ``get`` until it returns something truthy, and return that."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if result := get():
                    return result
            except (grpc.RpcError, OSError):
                pass
            time.sleep(step)
        raise AssertionError(f"not within {timeout}s: {what}\n{self.logs()}")

    def stop(self) -> None:
        for channel in self._channels.values():
            channel.close()
        for name in ("router", *(f"agent-{n}" for n in self.nodes), *self.controls, "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        if self.etcd_cluster is not None:
            self.etcd_cluster.stop()
        # An engine runs in its own process group, which outlives its agent.
        for pid in self.engine_pids().values():
            kill_group(pid)


def kill_group(pid: int) -> None:
    """SIGKILL a process group that may be gone already."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


@contextlib.contextmanager
def running_cluster(
    state: Path,
    models: list[dict[str, Any]],
    *,
    name: str = "test",
    nodes: dict[str, int] | None = None,
    controls: tuple[str, ...] = ("control-1",),
    etcd_members: int = 1,
    admin_token: str | None = None,
    control: dict[str, Any] | None = None,
    agent: dict[str, Any] | None = None,
    router: dict[str, Any] | None = None,
) -> Iterator[Cluster]:
    """Start the cluster, yield it once every role listens, stop everything after.

    ``nodes`` maps node ids to their simulated GPU counts; ``controls`` names
    the control planes (all of one etcd and one cluster ``name``, the first
    listed is the one ``Cluster.admin`` asks); ``etcd_members`` etcd members
    make that etcd, every one listed in the control planes' configs; ``control``, ``agent`` and
    ``router`` add keys to every config of that role. What "ready" means is
    the caller's to wait for.
    """
    nodes = {"node-a": 4} if nodes is None else nodes
    logs = state / "logs"
    secret = state / "cluster.secret"
    secret.write_text(f"{name}-test-secret\n")
    token = None
    if admin_token is not None:
        token = state / "admin.token"
        token.write_text(admin_token + "\n")
    router_port = free_port()
    c = Cluster(
        state,
        {n: f"127.0.0.1:{free_port()}" for n in controls},
        f"http://127.0.0.1:{router_port}",
        tuple(nodes),
        token_file=token,
        pki=ClusterPki.create(state / "tls"),
    )
    pki = c.pki
    pki.tls("admin", "test")
    try:
        c.etcd_cluster = start_etcd_cluster(state / "etcd", logs, members=etcd_members)
        c.etcd = c.etcd_cluster.endpoints[0]
        c.procs.update({p.name: p for p in c.etcd_cluster.procs})
        for control_id, address in c.controls.items():
            control_cfg = {
                "cluster": name,
                "control_id": control_id,
                "listen": address,
                "cluster_secret_file": str(secret),
                "etcd": {"endpoints": c.etcd_cluster.endpoints},
                "placement_settle_seconds": 0.5,
                "models": models,
                "tls": pki.control(control_id),
                **({"admin_token_file": str(token)} if token else {}),
                **(control or {}),
            }
            write_yaml(state / f"{control_id}.yaml", control_cfg)
            c.start_control(control_id)
        c.nodes = ()
        for node, gpus in nodes.items():
            c.start_agent(node, gpus, {"tls": pki.node(node), **(agent or {})})
        router_cfg = {
            "listen": f"127.0.0.1:{router_port}",
            "control": list(c.controls.values()),
            "cluster_secret_file": str(secret),
            "tls": pki.tls("router", "router-1"),
            **(router or {}),
        }
        path = write_yaml(state / "router.yaml", router_cfg)
        c.procs["router"] = start("router", [tool("llmgw-router"), "--config", str(path)], logs)
        wait_port(router_port, proc=c.procs["router"])
        yield c
    except BaseException:
        print(c.logs(), file=sys.stderr)
        raise
    finally:
        c.stop()
