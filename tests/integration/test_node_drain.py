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

import time

import pytest

from tests.support.cluster import READY, Cluster, running_cluster, simulator_model
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

MODEL = "demo"
NODES = ("node-a", "node-b", "node-c")
HELD = "node-a"
WANTED = 2
CLIENTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(
        tmp_path_factory.mktemp("node-drain"),
        [simulator_model(MODEL, WANTED)],
        name="drain",
        nodes=dict.fromkeys(NODES, 2),
        # Every agent registers before the first placement, so node-a and node-b get one each.
        control={"placement_settle_seconds": 5.0},
    ) as c:
        c.wait(
            lambda: _ready_nodes(c) == ["node-a", "node-b"] and c.router_endpoints(MODEL) == WANTED,
            90,
            "a replica ready on node-a and node-b, both routed",
        )
        yield c


def _ready_nodes(c: Cluster) -> list[str]:
    return sorted(r.node_id for r in c.replicas(MODEL) if r.state == READY)


def llmgw(c: Cluster, *args: str) -> str:
    done = c.llmgw(*args)
    assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def test_holding_a_node_moves_its_replica_first_and_no_request_fails(cluster):
    c = cluster
    fewest_ready = WANTED
    with Clients(c.router_url) as clients:
        c.wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients streaming before the hold")
        before = clients.requests
        held_at = time.monotonic()
        out = llmgw(c, "nodes", "hold", HELD, "--reason", "disk swap")
        assert f"node {HELD} held (disk swap)" in out

        def drained() -> bool:
            nonlocal fewest_ready
            ready = _ready_nodes(c)
            fewest_ready = min(fewest_ready, len(ready))
            on_held = [r for r in c.replicas(MODEL) if r.node_id == HELD]
            return (
                len(ready) == WANTED
                and not on_held
                and HELD not in ready
                and c.router_endpoints(MODEL) == WANTED
            )

        done = c.wait(drained, 60, f"{HELD} drained with {WANTED} ready replicas elsewhere")
        settled = clients.requests
        c.wait(lambda: clients.requests >= settled + 2 * CLIENTS, 30, "clients streaming after the drain")

    listing = llmgw(c, "nodes")
    assert any(line.startswith(HELD) and "held (disk swap)" in line for line in listing.splitlines()), listing
    print(
        f"\nnode drain: {clients.requests} requests ({before} before the hold), "
        f"outcomes {dict(clients.outcomes)}"
        f"\n  hold -> drained {done - held_at:.2f}s; fewest ready replicas seen {fewest_ready}"
        f"\n  replicas after: {[(r.replica_id, r.node_id) for r in c.replicas(MODEL)]}"
    )
    for e in clients.errors:
        print("  " + e)
    assert _ready_nodes(c) == ["node-b", "node-c"]
    assert fewest_ready >= WANTED, "a drain must never leave fewer ready replicas than wanted"
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)

    llmgw(c, "nodes", "release", HELD)
    c.wait(lambda: c.node_state(HELD) == "ready", 10, f"{HELD} ready after release")
