"""SO_REUSEPORT workers: real llmgw-router processes sharing one port."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.router.workermetrics import merge
from llmgw.router.workers import PortUnavailable, check_port
from tests.support.procs import free_port, start, tool, wait_port

from .engines import FakeEngine


def get_json(url: str, body: dict | None = None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def serving_pids(port: int, want: int, within: float = 60.0) -> set[int]:
    """Pids that answer /health on the port; new connections until ``want`` are seen."""
    seen: set[int] = set()
    deadline = time.monotonic() + within
    while len(seen) < want:
        assert time.monotonic() < deadline, f"only pids {seen} answered"
        try:
            seen.add(get_json(f"http://127.0.0.1:{port}/health")[1]["pid"])
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.05)
    return seen


def wait_dead(pid: int, within: float = 10.0) -> None:
    """Until ``pid`` has exited (a zombie its parent has not reaped yet counts).

    With its other threads gone too: the leader turns zombie while they may
    still be exiting, and the descriptors (the listening socket) are closed
    only when the last thread is; uvloop's resolver threads make this real.
    """
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                zombie = f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
            if zombie and len(os.listdir(f"/proc/{pid}/task")) <= 1:
                return
        except FileNotFoundError:
            return
        time.sleep(0.01)
    raise AssertionError(f"pid {pid} still running after SIGKILL")


def worker_pids(supervisor: int) -> set[int]:
    children = f"/proc/{supervisor}/task/{supervisor}/children"
    with open(children) as f:
        pids = {int(p) for p in f.read().split()}
    # The spawn start method also runs a resource tracker; workers are the ones that serve.
    return {p for p in pids if b"resource_tracker" not in open(f"/proc/{p}/cmdline", "rb").read()}


async def test_workers_share_the_port_and_survive_one_being_killed(tmp_path):
    async with FakeEngine(name="e") as engine:
        # The scenario blocks (processes, urllib); the engine's loop must keep running meanwhile.
        await asyncio.to_thread(_share_then_kill_one, engine.url, tmp_path)


def _share_then_kill_one(engine_url: str, tmp_path) -> None:
    port = free_port()
    argv = [
        tool("llmgw-router"),
        "--listen",
        f"127.0.0.1:{port}",
        "--workers",
        "3",
        "--backend",
        f"m={engine_url}",
    ]
    proc = start("router", argv, tmp_path)
    popen = proc.popen
    try:
        wait_port(port, timeout=60, proc=proc)
        serving = serving_pids(port, 3)
        assert serving == worker_pids(popen.pid)
        for _ in range(6):
            assert get_json(f"http://127.0.0.1:{port}/v1/chat/completions", {"model": "m"})[0] == 200
        # Whichever worker a scrape reaches answers for all three, each sample with its worker.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        served = {
            labels["worker"]: value
            for name, labels, value in _samples(text)
            if name == "llmgw_router_requests_total"
            and labels.get("status") == "200"
            and labels["model"] == "m"
        }
        assert set(served) == {"0", "1", "2"}
        assert sum(served.values()) == 6
        victim = sorted(serving)[0]
        os.kill(victim, signal.SIGKILL)
        # Its socket closes when it has exited; connections queued on it until then are reset.
        wait_dead(victim)
        # The others go on answering (new connections only reach live sockets) ...
        for _ in range(20):
            status, body = get_json(f"http://127.0.0.1:{port}/v1/chat/completions", {"model": "m"})
            assert status == 200, body
        # ... and the supervisor replaces the dead worker.
        replaced = serving_pids(port, 3)
        assert victim not in replaced
        assert len(worker_pids(popen.pid)) == 3
        proc.signal(signal.SIGTERM)
        assert popen.wait(30) == 0, proc.tail()
        assert "restarting" in proc.tail(200)
    finally:
        proc.stop()


def test_workers_refuse_a_port_held_without_reuseport():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        with pytest.raises(PortUnavailable, match="cannot listen"):
            check_port(f"127.0.0.1:{held.getsockname()[1]}")


def test_more_than_one_worker_needs_a_fixed_port():
    result = subprocess.run(
        [tool("llmgw-router"), "--listen", "127.0.0.1:0", "--workers", "2", "--backend", "m=http://h"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "fixed port" in result.stderr


def _samples(text: str):
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            yield sample.name, sample.labels, sample.value


def test_merged_exposition_keeps_each_workers_series_apart_and_valid():
    one = '# HELP x_total c\n# TYPE x_total counter\nx_total{m="a"} 2.0\nx_created{m="a"} 1.0\n'
    two = '# HELP x_total c\n# TYPE x_total counter\nx_total{m="a"} 5.0\n'
    merged = merge({1: two, 0: one}).decode()
    assert merged.count("# TYPE x_total counter") == 1
    assert list(_samples(merged)) == [
        ("x_total", {"m": "a", "worker": "0"}, 2.0),
        ("x_total", {"m": "a", "worker": "1"}, 5.0),
    ]


def test_workers_that_cannot_start_stop_the_router_with_status_1(tmp_path):
    result = subprocess.run(
        [
            tool("llmgw-router"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--workers",
            "2",
            "--control",
            "127.0.0.1:1",
            "--cluster-secret-file",
            str(tmp_path / "missing-secret"),
            "--plaintext",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "could not start" in result.stderr
