"""Replica logs and the weights cache through the admin API and the CLI, with real processes.

The session's etcd, a control plane and one agent (node-a) running the
simulator as processes; every request goes `llmgw` -> NodeAdminService on the
control plane -> the agent over its AgentService stream -> back. The agent's
hub endpoint is a closed local port: this machine cannot reach a hub, and
the test proves the failure says so. The model's profile names a local
directory as its weights (``model``), used in place.

Tests share the cluster and run in file order; the last one kills the agent.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.certs import ClusterPki
from tests.support.procs import Proc, free_port, start, tool, until, wait_port, write_yaml

pytestmark = pytest.mark.integration

MODEL = "demo"
NODE = "node-a"
READY_TIMEOUT = 60.0
WEIGHTS_BYTES = 3 * 4096 + 100


def _llmgw(c: dict, *args: str) -> subprocess.CompletedProcess:
    argv = [tool("llmgw"), *args, "--control", c["control"], "--tls-dir", str(c["pki"].dir)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _ok(c: dict, *args: str) -> str:
    out = _llmgw(c, *args)
    assert out.returncode == 0, f"llmgw {' '.join(args)}: {out.stderr}"
    return out.stdout


def _json(c: dict, *args: str) -> dict:
    return json.loads(_ok(c, *args, "--json"))


def _weights_of(c: dict) -> dict[str, dict]:
    nodes = _json(c, "weights", "list", NODE).get("nodes", [])
    return {w["name"]: w for n in nodes for w in n.get("weights", [])}


def _make_weights(d: Path) -> Path:
    d.mkdir(parents=True)
    for i in range(3):
        (d / f"shard-{i}.safetensors").write_bytes(b"w" * 4096)
    (d / "config.json").write_bytes(b"{" + b" " * 98 + b"}")
    return d


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, etcd_endpoint):
    tmp = tmp_path_factory.mktemp("node-requests")
    secret = tmp / "cluster.secret"
    secret.write_text(secrets.token_urlsafe(32) + "\n")
    weights = _make_weights(tmp / "weights" / "demo-weights")
    control_port = free_port()
    control = f"127.0.0.1:{control_port}"
    closed_hub = f"http://127.0.0.1:{free_port()}"
    pki = ClusterPki.create(tmp / "tls")
    pki.tls("admin", "test")
    control_cfg = write_yaml(tmp / "control.yaml", {
        "tls": pki.control(),
        "cluster": "noderequests",
        "control_id": "control-1",
        "listen": control,
        "cluster_secret_file": str(secret),
        "etcd": {"endpoints": [etcd_endpoint], "prefix": f"/llmgw-test/{uuid.uuid4().hex[:12]}"},
        "models": [{
            "name": MODEL,
            "min_replicas": 1,
            "profile": {"engine": "simulator", "gpus": 1,
                        "args": {"model": str(weights), "ttft-ms": "5", "itl-ms": "1"}},
        }],
    })  # fmt: skip
    agent_cfg = write_yaml(tmp / "agent.yaml", {
        "node_id": NODE,
        "control": [control],
        "tls": pki.node(NODE),
        "state_dir": str(tmp / "agent-state"),
        "gpus": [{"count": 2, "name": "Simulated H100", "memory_gb": 80}],
        "heartbeat_interval_seconds": 1,
        "weights": {"hub_endpoint": closed_hub, "hub_timeout_seconds": 2},
    })  # fmt: skip
    logs = tmp / "logs"
    procs: dict[str, Proc] = {}
    procs["control"] = start("control", [tool("llmgw-control"), "--config", str(control_cfg)], logs)
    c = {
        "control": control,
        "pki": pki,
        "procs": procs,
        "state": tmp / "agent-state",
        "agent_cfg": agent_cfg,
        "logs": logs,
        "weights": weights,
        "hub": closed_hub,
        "tmp": tmp,
    }
    try:
        wait_port(control_port, proc=procs["control"])
        procs["agent"] = start("agent", [tool("llmgw-agent"), "--config", str(agent_cfg)], logs)

        def ready():
            reps = _json(c, "replicas").get("replicas", [])
            return [r for r in reps if r.get("state") == "REPLICA_STATE_READY"]

        c["replica"] = until("a ready replica", ready, READY_TIMEOUT, list(procs.values()))[0]
        yield c
    finally:
        for name in ("agent", "control"):
            if name in procs:
                procs[name].stop(timeout=20)
        for f in c["state"].glob("replicas/*/pid"):
            try:
                os.killpg(int(f.read_text().strip()), signal.SIGKILL)
            except (OSError, ValueError):
                pass
        for log in sorted(logs.glob("*.log")):
            print(f"----- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-25:]))


def test_logs_print_the_last_lines_of_the_replicas_engine_log(cluster):
    rid = cluster["replica"]["replica_id"]
    engine_log = cluster["state"] / "replicas" / rid / "engine.log"
    out = _ok(cluster, "logs", rid, "-n", "3")
    shown = out.rstrip("\n").split("\n")
    assert len(shown) == 3
    assert shown == engine_log.read_text().splitlines()[-3:]

    everything = _json(cluster, "logs", rid, "-n", "10000")
    assert everything["node_id"] == NODE
    first = everything["lines"][0]
    assert first.startswith("--- llmgw-agent") and "***" in first, "the header names the command, key masked"
    assert str(cluster["weights"]) in first, "the engine was given the local weights path in place"


def test_logs_of_an_unknown_replica_are_not_found_and_a_bad_count_is_refused(cluster):
    out = _llmgw(cluster, "logs", "no-such-replica")
    assert out.returncode == 1
    assert "NOT_FOUND" in out.stderr and "no-such-replica" in out.stderr
    out = _llmgw(cluster, "logs", cluster["replica"]["replica_id"], "-n", "20000")
    assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stderr and "between 1 and 10000" in out.stderr
    out = _llmgw(cluster, "logs", "x", "--node", "node-zz")
    assert out.returncode == 1 and "NOT_FOUND" in out.stderr and "node-zz" in out.stderr


def test_local_weights_are_used_in_place_with_their_disk_use_and_kept_while_in_use(cluster):
    path = str(cluster["weights"])
    entry = until("the node to report its weights", lambda: _weights_of(cluster).get(path), 10, [])
    assert entry["state"] == "WEIGHTS_STATE_READY"
    assert entry["in_place"] is True and entry["path"] == path
    assert int(entry["size_bytes"]) == WEIGHTS_BYTES
    listed = _json(cluster, "weights")
    node = next(n for n in listed["nodes"] if n["node_id"] == NODE)
    assert int(node["disk_bytes"]) >= WEIGHTS_BYTES
    assert "of weights" in _ok(cluster, "weights")

    out = _llmgw(cluster, "weights", "remove", NODE, path)
    assert out.returncode == 1
    assert "FAILED_PRECONDITION" in out.stderr and "used by a replica" in out.stderr
    assert cluster["weights"].is_dir()


def test_two_weights_of_one_name_are_refused_and_removing_in_place_deletes_nothing(cluster):
    a = _make_weights(cluster["tmp"] / "weights" / "a")
    b = _make_weights(cluster["tmp"] / "weights" / "b")
    out = _ok(cluster, "weights", "fetch", NODE, str(a), "--name", "llama")
    assert "ready" in out
    out = _llmgw(cluster, "weights", "fetch", NODE, str(b), "--name", "llama")
    assert out.returncode == 1
    assert "ALREADY_EXISTS" in out.stderr and str(a) in out.stderr and "remove them first" in out.stderr
    # The same source under its name again is no conflict.
    _ok(cluster, "weights", "fetch", NODE, str(a), "--name", "llama")

    out = _ok(cluster, "weights", "remove", NODE, "llama")
    assert "nothing deleted" in out
    assert a.is_dir() and "llama" not in _weights_of(cluster)
    out = _llmgw(cluster, "weights", "fetch", NODE, str(cluster["tmp"] / "missing"))
    assert out.returncode == 1 and "NOT_FOUND" in out.stderr and "does not exist" in out.stderr


def test_hub_weights_fail_with_a_clear_message_when_the_node_cannot_reach_the_hub(cluster):
    out = _ok(cluster, "weights", "fetch", NODE, "hf://llmgw-test/tiny-llama@main")
    assert "llmgw-test/tiny-llama" in out

    def failed():
        e = _weights_of(cluster).get("llmgw-test/tiny-llama")
        return e if e and e["state"] == "WEIGHTS_STATE_FAILED" else None

    entry = until("the fetch to fail", failed, 60, [])
    msg = entry["message"]
    assert f"cannot fetch hf://llmgw-test/tiny-llama@main from {cluster['hub']}" in msg
    assert "absolute path" in msg and "hub_endpoint" in msg
    out = _llmgw(cluster, "weights", "fetch", NODE, "hf://not a repo")
    assert out.returncode == 1 and "INVALID_ARGUMENT" in out.stderr and "hf://ORG/NAME" in out.stderr


def test_requests_to_a_node_whose_agent_is_gone_are_unavailable_then_answered_after_restart(cluster):
    rid = cluster["replica"]["replica_id"]
    procs = cluster["procs"]
    procs["agent"].signal(signal.SIGKILL)
    procs["agent"].popen.wait(10)
    out = until(
        "the control plane to see the agent gone",
        lambda: (r := _llmgw(cluster, "logs", rid)).returncode == 1 and "UNAVAILABLE" in r.stderr and r,
        30,
        [procs["control"]],
    )
    assert "node-a is not connected" in out.stderr

    procs["agent"] = start(
        "agent", [tool("llmgw-agent"), "--config", str(cluster["agent_cfg"])], cluster["logs"]
    )
    lines = until(
        "logs of the adopted replica",
        lambda: (r := _llmgw(cluster, "logs", rid, "-n", "5")).returncode == 0 and r.stdout,
        30,
        list(procs.values()),
    )
    assert lines.strip()
