"""Real processes for tests: free ports, started services, clean stops.

Every process a test starts is stopped by its PID (process group), never by
name, and its output goes to a log file under the test's tmp dir so a
failure can show what the service said.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BIN = Path(sys.executable).parent


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports handed out by this process: each goes to one listener only. A port picked is free
# until its process binds it, so without this two picks for one test (a control plane's
# and etcd's) could be the same port (seen: etcd took the control plane's).
_handed: set[int] = set()


def free_port() -> int:
    """A port free now, for a process started later to listen on; never one handed out before.

    Chosen below the kernel's ephemeral range: a port the kernel hands out
    (port 0) is also what every outgoing connection gets, so on a busy
    machine one of them could take it before the listener binds it.
    """
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(10000, low) if low > 11000 else 0
        if port in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            port = s.getsockname()[1]
        if port not in _handed:
            _handed.add(port)
            return port
    raise OSError("no free port found below the ephemeral range")


def free_port_pair() -> int:
    """A port P with P + 1 free too (``llmgw up`` puts etcd's peer port at P + 1).

    On a machine busy with client connections, P + 1 of a random free port
    is often some connection's ephemeral port; this checks both.
    """
    for _ in range(100):
        port = free_port()
        if port + 1 in _handed:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        _handed.add(port + 1)
        return port
    raise OSError("no two adjacent free ports found")


def tool(name: str) -> str:
    """Path of a console script or binary installed in this venv (or on PATH)."""
    p = BIN / name
    if p.exists():
        return str(p)
    found = shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name} is not installed; run `make setup`")
    return found


def wait_port(port: int, timeout: float = 20.0, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        with socket.socket() as s:
            s.settimeout(0.2)
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on port {port} within {timeout}s")


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen
    log: Path

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            os.killpg(self.popen.pid, sig)

    def stop(self, timeout: float = 10.0) -> int | None:
        """SIGTERM the process group, then SIGKILL what is left."""
        if self.alive():
            self.signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.popen.wait(5)
        # Reap anything left in the group (engines started by an agent).
        try:
            os.killpg(self.popen.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return self.popen.returncode


def start(name: str, argv: list[str], log_dir: Path, env: dict | None = None) -> Proc:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    fh = open(log, "ab")  # noqa: SIM115 - owned by the child's lifetime
    popen = subprocess.Popen(
        argv,
        stdout=fh,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        start_new_session=True,
    )
    fh.close()
    return Proc(name, popen, log)


def start_etcd(data_dir: Path, log_dir: Path) -> tuple[Proc, str]:
    cluster = start_etcd_cluster(data_dir, log_dir, members=1)
    return cluster.procs[0], cluster.endpoints[0]


@dataclass
class EtcdCluster:
    """etcd members on loopback, each with its own client and peer port; member i is ``procs[i]``."""

    procs: list[Proc]
    endpoints: list[str]

    def member(self, endpoint: str) -> Proc:
        return self.procs[self.endpoints.index(endpoint)]

    def restart(self, endpoint: str) -> None:
        """Start a member again that was killed, with its data and arguments (it rejoins its cluster)."""
        i = self.endpoints.index(endpoint)
        old = self.procs[i]
        old.stop()
        self.procs[i] = start(old.name, list(old.popen.args), old.log.parent)
        wait_port(int(endpoint.rsplit(":", 1)[1]), proc=self.procs[i])

    def used_by(self, pid: int) -> list[str]:
        """The members process ``pid`` holds an established TCP connection to."""
        ports = established_ports(pid)
        return [e for e in self.endpoints if int(e.rsplit(":", 1)[1]) in ports]

    def has_leader(self) -> bool:
        """Whether every running member knows the raft leader, which is one of them."""
        import grpc
        from aetcd import rpc

        leaders = set()
        for proc, endpoint in zip(self.procs, self.endpoints, strict=True):
            if not proc.alive():
                continue
            with grpc.insecure_channel(endpoint) as channel:
                try:
                    status = rpc.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=2)
                except grpc.RpcError:
                    return False
            leaders.add(status.leader)
        return len(leaders) == 1 and 0 not in leaders

    def stop(self) -> None:
        """Kill every member: its data is a test's, and a member without quorum stops slowly."""
        for p in self.procs:
            p.signal(signal.SIGKILL)
            p.stop()


def start_etcd_cluster(data_dir: Path, log_dir: Path, members: int = 3, timeout: float = 30.0) -> EtcdCluster:
    """``members`` etcd members forming one cluster (etcd's default timings), once it has a leader."""
    ports = [(free_port(), free_port()) for _ in range(members)]
    while len({p for pair in ports for p in pair}) < 2 * members:
        ports = [(free_port(), free_port()) for _ in range(members)]
    initial = ",".join(f"m{i}=http://127.0.0.1:{peer}" for i, (_, peer) in enumerate(ports))
    token = f"llmgw-test-{os.getpid()}-{data_dir.name}"
    cluster = EtcdCluster([], [])
    try:
        for i, (client, peer) in enumerate(ports):
            name = "etcd" if members == 1 else f"etcd-m{i}"
            argv = [
                tool("etcd"),
                *("--name", f"m{i}", "--data-dir", str(data_dir / f"m{i}")),
                *("--listen-client-urls", f"http://127.0.0.1:{client}"),
                *("--advertise-client-urls", f"http://127.0.0.1:{client}"),
                *("--listen-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"),
                *("--initial-cluster", initial, "--initial-cluster-token", token),
                *("--log-level", "warn"),
            ]
            cluster.procs.append(start(name, argv, log_dir))
            cluster.endpoints.append(f"127.0.0.1:{client}")
        for proc, (client, _) in zip(cluster.procs, ports, strict=True):
            wait_port(client, timeout, proc=proc)
        until("an etcd leader", cluster.has_leader, timeout, cluster.procs)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def established_ports(pid: int) -> set[int]:
    """Remote ports of the established TCP connections of process ``pid`` (from /proc; Linux)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:  # 01: ESTABLISHED
                ports.add(int(fields[2].rsplit(":", 1)[1], 16))
    return ports


def until(what: str, check, timeout: float, procs: list[Proc], step: float = 0.2):
    """Poll ``check`` until it returns something truthy (returned); fail fast if one of ``procs`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise AssertionError(f"{p.name} exited with {p.popen.returncode}:\n{p.tail()}")
        result = check()
        if result:
            return result
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def write_yaml(path: Path, doc: dict) -> Path:
    import yaml

    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
