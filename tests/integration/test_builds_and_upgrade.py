"""Engine builds per node and agent upgrades, end to end over real processes.

A real etcd, one control plane, one router and two agents (two simulated
GPUs each), all on mutual TLS. Both nodes have the simulator at version
0.7.0 (their main build); node-b also has build ``next``, version 0.9.1, run
by a program of its own (a wrapper script, so the engine's command line
shows which build runs). Two models: ``demo`` (two replicas, any build, so
one per node) and ``pinned``, whose profile requires ``engine_version:
">=0.9"``.

What must hold, in order (the tests share the cluster):

1. ``pinned`` runs on node-b only, started with build ``next``'s program;
   ``llmgw explain pinned`` gives node-a's mismatch ("simulator 0.7.0 is
   outside >=0.9"); ``llmgw nodes`` lists every build.
2. ``llmgw nodes upgrade`` rolls both agents to a staged release (a real
   entry script of the agent that reports version 9.9.9), one node at a
   time, while four clients stream through the router with the official
   openai client: no request fails, every engine keeps its PID, both nodes
   report 9.9.9.
3. A release staged outside the node's ``upgrade.allowed_dirs`` is refused
   by the agent before anything changes; a release whose agent cannot
   start stops the rollout at the first node with the reason, node-b is
   not attempted, and node-a's engines keep running without an agent.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from llmgw.v1 import admin_pb2
from tests.support.cluster import Cluster, running_cluster, simulator_model
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b")
CLIENTS = 4
NEW = "9.9.9"
BROKEN = "9.9.10"


def _script(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


@pytest.fixture(scope="module")
def releases(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("releases")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, releases):
    state = tmp_path_factory.mktemp("builds-upgrade")
    # Build "next" of the simulator: its own program, so its engines' command lines name it.
    next_build = _script(
        state / "builds" / "simulator-0.9.1",
        f"#!{sys.executable}\nimport runpy\n"
        "runpy.run_module('llmgw.agent.simulator', run_name='__main__', alter_sys=True)\n",
    )
    simulator = {"version": "0.7.0", "args": {"ttft-ms": "20", "itl-ms": "10", "output-tokens": "24"}}
    pinned = {
        **simulator_model("pinned", 1),
        "profile": {"engine": "simulator", "gpus": 1, "engine_version": ">=0.9"},
    }
    with running_cluster(
        state,
        [simulator_model("demo", 2), pinned],
        name="upgrade",
        nodes=dict.fromkeys(NODES, 2),
        control={
            # Every agent registers before the first placement.
            "placement_settle_seconds": 5.0,
            # Endpoints of a node whose agent hands over stay published this long.
            "node_timeout_seconds": 8,
            "node_lost_seconds": 30,
        },
        agent={
            "heartbeat_interval_seconds": 1,
            "probe_interval_seconds": 0.2,
            "upgrade": {"allowed_dirs": [str(releases)]},
            "engines": {"simulator": simulator},
        },
        per_node={
            "node-b": {
                "engines": {
                    "simulator": {
                        **simulator,
                        "builds": [{"name": "next", "version": "0.9.1", "command": [next_build]}],
                    }
                }
            }
        },
    ) as c:
        c.wait(
            lambda: c.ready("demo") == 2 and c.ready("pinned") == 1 and c.router_endpoints("demo") == 2,
            90,
            "demo's two replicas and pinned's one ready",
        )
        yield c


def llmgw(c: Cluster, *args: str) -> str:
    done = c.llmgw(*args)
    assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def _nodes(c: Cluster) -> dict[str, admin_pb2.NodeStatus]:
    listed = c.admin().ListNodes(admin_pb2.ListNodesRequest(), timeout=5, metadata=c.auth)
    return {n.node_id: n for n in listed.nodes}


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_a_profile_requiring_an_engine_version_runs_only_on_the_node_with_that_build(cluster):
    c = cluster
    (replica,) = c.replicas("pinned")
    assert replica.node_id == "node-b"
    pid = c.engine_pids(["node-b"])[replica.replica_id]
    assert "simulator-0.9.1" in _cmdline(pid), "the replica must run build next's program"
    for r in c.replicas("demo"):
        assert "simulator-0.9.1" not in _cmdline(c.engine_pids()[r.replica_id])

    out = llmgw(c, "explain", "pinned")
    assert "profile 1: simulator>=0.9, 1 GPU" in out, out
    assert "no build of simulator matches: simulator 0.7.0 is outside >=0.9" in out, out
    line_b = next(line for line in out.splitlines() if line.startswith("node-b"))
    assert "fits" in line_b or "free GPU" in line_b, out

    nodes = llmgw(c, "nodes")
    assert "simulator@0.9.1[next]" in nodes and "simulator@0.7.0" in nodes, nodes
    b = _nodes(c)["node-b"]
    assert {(e.version, e.build, e.program) for e in b.engines} == {
        ("0.7.0", "", sys.executable),
        ("0.9.1", "next", str(c.state / "builds" / "simulator-0.9.1")),
    }


def test_agents_upgraded_one_node_at_a_time_under_four_streaming_clients_keep_every_engine(cluster, releases):
    c = cluster
    release = _script(
        releases / NEW / "bin" / "llmgw-agent",
        f"#!{sys.executable}\nimport sys\nfrom llmgw.agent.main import main\n"
        f"sys.exit(main(version={NEW!r}))\n",
    )
    before = c.engine_pids()
    assert len(before) == 3
    old = {n: s.version for n, s in _nodes(c).items()}
    assert NEW not in old.values()

    with Clients(c.router_url, "demo", count=CLIENTS) as streamer:
        c.wait(lambda: streamer.outcomes["ok"] >= 2 * CLIENTS, 30, "the first streamed answers")
        start = streamer.requests
        out = llmgw(c, "nodes", "upgrade", "--version", NEW, "--command", release)
        c.wait(lambda: streamer.requests >= start + 4 * CLIENTS, 30, "answers after the rollout")

    print(f"\nagent upgrade under {CLIENTS} streams: {streamer.requests} requests, "
          f"{len(streamer.errors)} failed\n{out}")  # fmt: skip
    assert [line.split(":")[0] for line in out.splitlines()[:2]] == list(NODES), out
    assert "2 engine(s) adopted with the same PIDs" in out and "rollout done: 2 node(s)" in out, out
    assert {n: s.version for n, s in _nodes(c).items()} == dict.fromkeys(NODES, NEW)
    assert c.engine_pids() == before, "engines must be adopted, not restarted"
    for pid in before.values():
        os.killpg(pid, 0)
    assert c.ready("demo") == 2 and c.ready("pinned") == 1
    for node in NODES:
        log = c.procs[f"agent-{node}"].tail(400)
        assert f"handing over to agent version {NEW}" in log and "adopted" in log, log
    assert streamer.errors == [], f"client requests failed: {streamer.errors[:5]}"
    # Again: every node is at the version already, nothing is handed over.
    again = llmgw(c, "nodes", "upgrade", "--version", NEW, "--command", release)
    assert "node-a: already at 9.9.9" in again and c.engine_pids() == before, again


def test_a_refused_or_failed_upgrade_stops_the_rollout_with_the_reason(cluster, releases):
    c = cluster
    pids = c.engine_pids(["node-a"])
    refused = c.llmgw("nodes", "upgrade", "node-a", "--version", "1.0", "--command", sys.executable)
    assert refused.returncode == 1
    assert "rollout stopped at node node-a" in refused.stderr, refused.stderr
    assert "outside upgrade.allowed_dirs" in refused.stderr, refused.stderr
    assert _nodes(c)["node-a"].state == "ready" and _nodes(c)["node-a"].version == NEW

    broken = _script(
        releases / BROKEN / "bin" / "llmgw-agent",
        f'#!/bin/sh\nif [ "$1" = --version ]; then echo "llmgw-agent {BROKEN}"; exit 0; fi\n'
        'echo "this release cannot start" >&2\nexit 3\n',
    )
    failed = c.llmgw("nodes", "upgrade", "--version", BROKEN, "--command", broken, "--timeout", "6")
    print(f"\nfailed rollout:\n{failed.stderr}")
    assert failed.returncode == 1
    assert "rollout stopped at node node-a" in failed.stderr, failed.stderr
    assert "did not come back healthy within 6s" in failed.stderr, failed.stderr
    assert "no agent has registered since the hand-over" in failed.stderr, failed.stderr
    assert "not attempted: node-b" in failed.stderr, failed.stderr
    nodes = _nodes(c)
    assert nodes["node-b"].version == NEW and nodes["node-b"].state == "ready"
    assert nodes["node-a"].state != "ready"
    assert "this release cannot start" in c.procs["agent-node-a"].tail(50)
    for pid in pids.values():
        os.killpg(pid, 0)  # its engines serve on without an agent
