"""The entry point: flags over the file, and a real process that stops cleanly."""

from __future__ import annotations

import gc
import json
import signal
import subprocess
import time
import urllib.request
import weakref

import pytest

from llmgw.common.errors import InvalidArgument
from llmgw.router.flags import build_parser, config_from_args, parse_backend
from llmgw.router.main import GC_THRESHOLD, settle_heap
from tests.support.procs import Proc, free_port, tool, wait_port


def parse(*argv: str):
    return config_from_args(build_parser().parse_args(list(argv)))


def test_backend_flag_spells_every_field():
    assert parse_backend("tiny=http://h:9001,key=k1,served=org/t,alias=a,alias=b,weight=2") == {
        "model": "tiny",
        "url": "http://h:9001",
        "api_key": "k1",
        "served_name": "org/t",
        "aliases": ["a", "b"],
        "weight": "2",
    }
    with pytest.raises(InvalidArgument, match="MODEL=URL"):
        parse_backend("http://h:9001")
    with pytest.raises(InvalidArgument, match="unknown option 'colour=red'"):
        parse_backend("m=http://h,colour=red")


def test_flags_override_the_file_and_are_validated_with_it(tmp_path):
    path = tmp_path / "router.yaml"
    path.write_text("listen: 127.0.0.1:1\nbackends:\n  - {model: a, url: 'http://a'}\nlimits: {retries: 4}\n")
    config = parse("--config", str(path), "--listen", "0.0.0.0:9", "--backend", "b=http://b")
    assert config.listen == "0.0.0.0:9"
    assert [b.model for b in config.backends] == ["b"]
    assert config.limits.retries == 4
    with pytest.raises(InvalidArgument, match="cluster_secret_file"):
        parse("--control", "127.0.0.1:5")
    path.write_text("listen: 127.0.0.1:1\nbackend: []\n")
    with pytest.raises(InvalidArgument, match="backend"):
        parse("--config", str(path), "--backend", "b=http://b")


class _Node:
    next: _Node | None = None


def test_settling_the_heap_freezes_what_lives_and_raises_the_young_threshold():
    before = gc.get_threshold()
    try:
        frozen = settle_heap()
        assert frozen == gc.get_freeze_count() > 10_000  # this interpreter's modules, at least
        assert gc.get_threshold() == (GC_THRESHOLD, before[1], before[2])
        # Garbage made before is collected, not frozen.
        gc.unfreeze()
        cycle = _Node()
        cycle.next = cycle
        ref = weakref.ref(cycle)
        del cycle
        settle_heap()
        assert ref() is None
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_router_process_serves_then_exits_zero_on_sigterm(tmp_path):
    port = free_port()
    log = tmp_path / "router.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [
                tool("llmgw-router"),
                "--listen",
                f"127.0.0.1:{port}",
                "--backend",
                f"m=http://127.0.0.1:{free_port()}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    proc = Proc("router", popen, log)
    try:
        wait_port(port, proc=proc)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as resp:
            assert json.load(resp)["status"] == "ok"
        deadline = time.monotonic() + 5
        while f"router listening on http://127.0.0.1:{port}" not in proc.tail():
            assert time.monotonic() < deadline, proc.tail()
            time.sleep(0.05)
        assert "startup objects out of the collector's way" in proc.tail()
        proc.signal(signal.SIGTERM)
        assert popen.wait(10) == 0, proc.tail()
    finally:
        proc.stop()


def test_router_process_refuses_a_bad_config_with_status_2(tmp_path):
    result = subprocess.run(
        [tool("llmgw-router"), "--listen", "127.0.0.1:1"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert "set `control`" in result.stderr


def test_router_process_with_a_control_plane_and_no_tls_exits_2_saying_how_to_make_certificates(tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a-cluster-secret-of-enough-bytes\n")
    argv = [tool("llmgw-router"), "--listen", f"127.0.0.1:{free_port()}", "--control", "127.0.0.1:1"]
    argv += ["--cluster-secret-file", str(secret)]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert "tls.cert_file" in result.stderr and "llmgw certs" in result.stderr
    assert "tls.plaintext: true for development only" in result.stderr


def test_router_process_without_its_secret_file_exits_1_saying_how_to_make_one(tmp_path):
    missing = tmp_path / "secret"
    result = subprocess.run(
        [
            tool("llmgw-router"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--control",
            "127.0.0.1:1",
            "--cluster-secret-file",
            str(missing),
            "--plaintext",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 1
    assert "head -c 32 /dev/urandom" in result.stderr


def _open_files_limit(pid: int) -> tuple[int, int]:
    for line in open(f"/proc/{pid}/limits"):
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no open-files line in /proc/PID/limits")


def test_router_raises_its_soft_open_file_limit_to_the_hard_one():
    # Started with a soft limit of 256 (about 128 streams), as a system default might start it.
    port = free_port()

    def low_soft_limit() -> None:
        import resource

        resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    popen = subprocess.Popen(
        [tool("llmgw-router"), "--listen", f"127.0.0.1:{port}", "--backend", "m=http://127.0.0.1:1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=low_soft_limit,
    )
    try:
        wait_port(port, timeout=30)
        soft, hard = _open_files_limit(popen.pid)
        assert hard > 256
        assert soft == hard
    finally:
        popen.send_signal(signal.SIGTERM)
        popen.wait(timeout=30)
