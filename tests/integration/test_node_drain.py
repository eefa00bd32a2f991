"""Draining a machine, end to end, over real processes: no client notices.

A real etcd, one control plane, one router and three agents (two simulated
GPUs each); the model wants two replicas, placed on node-a and node-b. Four
clients stream chat completions through the router with the official openai
client, without pause, for the whole test. Then an operator runs
``llmgw nodes hold node-a``.

What must hold:

- node-a shows ``held`` in ``llmgw nodes``, with the reason;
- its replica is moved: a replacement starts on node-c, and node-a's
  replica is stopped only once the replacement is ready, so the admin API
  never shows fewer than two ready replicas (sampled throughout);
- the router ends up routing to two endpoints, none on node-a;
- no client request fails, not one (the old replica leaves the router's
  table before it is stopped, and the simulator finishes in-flight
  requests on SIGTERM);
- ``llmgw nodes release node-a`` makes it ready again.

The test prints the count of requests and failures and the time the drain took.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.integration.test_node_loss import (
    READY,
    Clients,
    Cluster,
    _node_state,
    _replicas,
    _router_endpoints,
    _wait,
    start_cluster,
    stop_cluster,
)
from tests.support.procs import tool

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b", "node-c")
HELD = "node-a"
WANTED = 2
CLIENTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = start_cluster(
        tmp_path_factory.mktemp("node-drain"),
        "drain",
        NODES,
        WANTED,
        # Every agent registers before the first placement, so node-a and node-b get one each.
        placement_settle_seconds=5.0,
    )
    try:
        _wait(
            lambda: _ready_nodes(c) == ["node-a", "node-b"] and _router_endpoints(c) == WANTED,
            90,
            "a replica ready on node-a and node-b, both routed",
            c,
        )
    except BaseException:
        stop_cluster(c, NODES)
        raise
    yield c
    stop_cluster(c, NODES)


def _ready_nodes(c: Cluster) -> list[str]:
    return sorted(r.node_id for r in _replicas(c) if r.state == READY)


def llmgw(c: Cluster, *args: str) -> str:
    done = subprocess.run(
        [tool("llmgw"), *args, "--control", c.control_address],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=Path(c.state),
    )
    assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def test_holding_a_node_moves_its_replica_first_and_no_request_fails(cluster):
    c = cluster
    fewest_ready = WANTED
    with Clients(c.router_url) as clients:
        _wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients streaming before the hold", c)
        before = clients.requests
        held_at = time.monotonic()
        out = llmgw(c, "nodes", "hold", HELD, "--reason", "disk swap")
        assert f"node {HELD} held (disk swap)" in out

        def drained() -> bool:
            nonlocal fewest_ready
            ready = _ready_nodes(c)
            fewest_ready = min(fewest_ready, len(ready))
            on_held = [r for r in _replicas(c) if r.node_id == HELD]
            return (
                len(ready) == WANTED and not on_held and HELD not in ready and _router_endpoints(c) == WANTED
            )

        done = _wait(drained, 60, f"{HELD} drained with {WANTED} ready replicas elsewhere", c)
        settled = clients.requests
        _wait(lambda: clients.requests >= settled + 2 * CLIENTS, 30, "clients streaming after the drain", c)

    listing = llmgw(c, "nodes")
    assert any(line.startswith(HELD) and "held (disk swap)" in line for line in listing.splitlines()), listing
    print(
        f"\nnode drain: {clients.requests} requests ({before} before the hold), "
        f"outcomes {dict(clients.outcomes)}"
        f"\n  hold -> drained {done - held_at:.2f}s; fewest ready replicas seen {fewest_ready}"
        f"\n  replicas after: {[(r.replica_id, r.node_id) for r in _replicas(c)]}"
    )
    for e in clients.errors:
        print("  " + e)
    assert _ready_nodes(c) == ["node-b", "node-c"]
    assert fewest_ready >= WANTED, "a drain must never leave fewer ready replicas than wanted"
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)

    llmgw(c, "nodes", "release", HELD)
    _wait(lambda: _node_state(c, HELD) == "ready", 10, f"{HELD} ready after release", c)
