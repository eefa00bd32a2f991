"""An engine that exits at start: reported FAILED with its log tail, and retried with backoff.

Real processes: the session's etcd, a control plane (failure backoff 1 s,
doubling) and an agent whose simulator program prints a fatal line and
exits 3 before it listens. Each attempt is a new replica with its own
engine log on the node; the test reads their start stamps (the agent's
header line) to show that the attempts are spaced by at least the
backoff, and reads the failure the way an operator would: the control
plane's record of the report, ``llmgw models`` and ``llmgw logs``.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from tests.support.certs import ClusterPki
from tests.support.procs import Proc, free_port, start, tool, wait_port

pytestmark = pytest.mark.integration

FATAL = "fatal: cannot load weights from /models/broken (test engine)"
BACKOFF = 1.0
ATTEMPTS = 4  # started at about 0, 1, 3 and 7 s: backoffs of 1, 2 and 4 s between them


def _write(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _llmgw(control: str, tls: Path, *args: str) -> subprocess.CompletedProcess:
    argv = [tool("llmgw"), *args, "--control", control, "--tls-dir", str(tls)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30)


def _attempts(state: Path) -> list[tuple[dt.datetime, Path]]:
    """Each replica's first start stamp (the agent's header line) and its log, oldest first."""
    out = []
    for log in state.glob("replicas/*/engine.log"):
        first = log.read_text(errors="replace").splitlines()[:1]
        if first and first[0].startswith("--- llmgw-agent "):
            stamp = first[0].split()[2].rstrip(":")
            out.append((dt.datetime.fromisoformat(stamp), log))
    return sorted(out)


def test_engine_exiting_at_start_is_failed_with_its_log_tail_and_retried_with_backoff(
    tmp_path, etcd_endpoint
):
    control_port = free_port()
    control = f"127.0.0.1:{control_port}"
    state = tmp_path / "agent-state"
    secret = tmp_path / "cluster.secret"
    secret.write_text(secrets.token_urlsafe(32) + "\n")
    pki = ClusterPki.create(tmp_path / "tls")
    pki.tls("admin", "test")
    control_cfg = _write(tmp_path / "control.yaml", {
        "tls": pki.control(),
        "cluster": "failing",
        "control_id": "control-1",
        "listen": control,
        "cluster_secret_file": str(secret),
        "etcd": {"endpoints": [etcd_endpoint], "prefix": f"/llmgw-test/{uuid.uuid4().hex[:12]}"},
        "failure_backoff_seconds": BACKOFF,
        "failure_backoff_max_seconds": 30,
        "placement_settle_seconds": 0.5,
        "models": [{"name": "broken", "min_replicas": 1, "profile": {"engine": "simulator", "gpus": 1}}],
    })  # fmt: skip
    exits_at_start = f"import sys; print({FATAL!r}, flush=True); sys.exit(3)"
    agent_cfg = _write(tmp_path / "agent.yaml", {
        "node_id": "node-a",
        "control": [control],
        "tls": pki.node("node-a"),
        "state_dir": str(state),
        "gpus": [{"count": 1}],
        "heartbeat_interval_seconds": 1,
        "engines": {"simulator": {"command": [sys.executable, "-c", exits_at_start]}},
    })  # fmt: skip
    logs = tmp_path / "logs"
    procs: list[Proc] = []
    try:
        procs.append(start("control", [tool("llmgw-control"), "--config", str(control_cfg)], logs))
        wait_port(control_port, proc=procs[0])
        procs.append(start("agent", [tool("llmgw-agent"), "--config", str(agent_cfg)], logs))
        messages: set[str] = set()
        deadline = time.monotonic() + 90
        while len(_attempts(state)) < ATTEMPTS and time.monotonic() < deadline:
            for p in procs:
                assert p.alive(), f"{p.name} exited:\n{p.tail()}"
            out = _llmgw(control, pki.dir, "models", "--json")
            if out.returncode == 0:
                for m in json.loads(out.stdout).get("models", []):
                    messages.add(m.get("placement_message", ""))
            time.sleep(0.2)
        attempts = _attempts(state)
        assert len(attempts) >= ATTEMPTS, f"only {len(attempts)} attempts in 90 s:\n{procs[0].tail()}"

        # Reported FAILED with the reason and the engine's own last lines.
        control_log = (logs / "control.log").read_text()
        assert "REPLICA_STATE_FAILED exited with code 3 before it became ready" in control_log
        assert FATAL in control_log, "the failure report must carry the engine's log tail"
        # The operator sees the backoff in llmgw models.
        assert any("wait to be replaced after" in m for m in messages), messages

        # Spaced by the backoff, doubling: 1, 2, 4 s (stamps have 1 s resolution).
        gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(attempts, attempts[1:], strict=False)]
        for i, gap in enumerate(gaps[: ATTEMPTS - 1]):
            assert gap >= BACKOFF * 2**i - 1, f"attempt {i + 2} came {gap:g}s after the one before: {gaps}"

        # The first, failed and replaced, replica's log is still there through llmgw logs.
        first = attempts[0][1].parent.name
        out = _llmgw(control, pki.dir, "logs", first, "--node", "node-a", "-n", "5")
        assert out.returncode == 0, out.stderr
        assert FATAL in out.stdout
    finally:
        for p in reversed(procs):
            p.stop(timeout=20)
