"""Fleet operations end to end over real processes: a team's GPU quota, the leader's metrics, a rack drain.

A real etcd, one control plane (its Prometheus port open), one router and
three agents (two simulated GPUs each). Two models: ``demo`` (two replicas,
no owner) and ``search``, owned by team ``acme/search``, which wants two
one-GPU replicas while the cluster settings give the team a GPU quota of 1.

What must hold, in order (the tests share the cluster):

1. ``search`` runs one replica; ``llmgw explain search`` names the quota
   that refuses the second ("team acme/search: GPU quota 1, 1 in use ...")
   and shows the team's use; raising the quota with ``llmgw settings set``
   places the second, and explain then says every replica is placed.
2. The control plane's /metrics, scraped over HTTP, agrees with the admin
   API: nodes by state, GPUs used and free per node, wanted vs ready per
   model, the team's GPUs and quota, the settings version, and one quota
   refusal counted.
3. The node running one ``demo`` replica is labelled rack=r1 (the others
   r2); ``llmgw nodes hold --domain rack=r1 --drain`` moves everything off
   it while four clients stream through the router: the admin API never
   shows fewer than two ready ``demo`` replicas, no request fails, and
   ``llmgw nodes domains`` lists the hold with its node.
"""

from __future__ import annotations

import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cluster import READY, Cluster, running_cluster, simulator_model
from tests.support.procs import free_port
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

NODES = ("node-a", "node-b", "node-c")
CLIENTS = 4
TEAM = "acme/search"


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, metrics_port):
    search = {**simulator_model("search", 2), "owner": {"org": "acme", "team": "search"}}
    with running_cluster(
        tmp_path_factory.mktemp("fleet-ops"),
        [simulator_model("demo", 2), search],
        name="fleet",
        nodes=dict.fromkeys(NODES, 2),
        control={
            # Every agent registers before the first placement.
            "placement_settle_seconds": 5.0,
            "metrics_listen": f"127.0.0.1:{metrics_port}",
            "quotas": {TEAM: {"gpus": 1}},
        },
    ) as c:
        c.wait(
            lambda: c.ready("demo") == 2 and c.ready("search") == 1 and c.router_endpoints("demo") == 2,
            90,
            "demo's two replicas and search's one ready",
        )
        yield c


def llmgw(c: Cluster, *args: str) -> str:
    done = c.llmgw(*args)
    assert done.returncode == 0, f"llmgw {' '.join(args)} failed: {done.stderr}"
    return done.stdout


def test_a_replica_refused_by_its_teams_gpu_quota_is_placed_once_the_quota_is_raised(cluster):
    c = cluster
    c.wait(lambda: "GPU quota 1" in llmgw(c, "explain", "search"), 30, "the quota refusal explained")
    out = llmgw(c, "explain", "search")
    assert "cannot be placed: team acme/search: GPU quota 1, 1 in use, the replica needs 1 more" in out, out
    assert "owner: acme/search" in out and "quota team acme/search: GPUs 1/1" in out, out
    assert c.ready("search") == 1 and len(c.replicas("search")) == 1

    llmgw(c, "settings", "set", "quotas={acme/search: {gpus: 2}}")
    c.wait(lambda: c.ready("search") == 2, 60, "search's second replica ready once the quota is 2")
    out = llmgw(c, "explain", "search")
    assert "every wanted replica is placed" in out and "quota team acme/search: GPUs 2/2" in out, out
    rows = {line.split()[0]: line.split() for line in llmgw(c, "usage").splitlines()[1:] if line.strip()}
    assert rows["acme/search"][1:3] == ["2", "2/2"] and rows["acme/search"][-1] == "search", rows
    assert rows["acme"][1:3] == ["2", "2"], rows


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_the_leaders_metrics_show_the_running_cluster(cluster, metrics_port):
    c = cluster
    c.wait(lambda: c.ready("search") == 2, 60, "search's two replicas ready")
    replicas = c.replicas("demo") + c.replicas("search")
    used = {n: sum(len(r.gpu_indices) for r in replicas if r.node_id == n) for n in NODES}
    m = scrape(metrics_port)
    assert m[("llmgw_control_leader", ())] == 1
    assert m[("llmgw_control_settings_version", ())] == 2  # the import, then the quota raised
    assert m[("llmgw_control_nodes", (("state", "ready"),))] == len(NODES)
    assert m[("llmgw_control_nodes", (("state", "unreachable"),))] == 0
    for n in NODES:
        assert m[("llmgw_control_node_gpus", (("node", n),))] == 2
        assert m[("llmgw_control_node_gpus_used", (("node", n),))] == used[n], (n, used)
        assert m[("llmgw_control_node_gpus_free", (("node", n),))] == 2 - used[n], (n, used)
    for model in ("demo", "search"):
        assert m[("llmgw_control_model_replicas_wanted", (("model", model),))] == 2
        assert m[("llmgw_control_model_replicas_ready", (("model", model),))] == c.ready(model)
        assert m[("llmgw_control_replicas", (("model", model), ("state", "ready")))] == c.ready(model)
    assert m[("llmgw_control_owner_gpus", (("owner", TEAM),))] == 2
    assert m[("llmgw_control_owner_gpus", (("owner", "acme"),))] == 2
    assert m[("llmgw_control_owner_quota_gpus", (("owner", TEAM),))] == 2
    assert m[("llmgw_control_placement_failures_total", (("reason", "quota"),))] == 1
    assert m[("llmgw_control_models_unplaced", (("reason", "quota"),))] == 0


def test_draining_a_rack_moves_its_replicas_out_and_no_request_fails(cluster):
    c = cluster
    rack = next(r.node_id for r in c.replicas("demo") if r.state == READY)
    for n in NODES:
        llmgw(c, "nodes", "label", n, f"rack={'r1' if n == rack else 'r2'}")
    fewest_ready = 2
    with Clients(c.router_url, model="demo") as clients:
        c.wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients streaming before the hold")
        out = llmgw(c, "nodes", "hold", "--domain", "rack=r1", "--drain", "--reason", "power work")
        assert f"domain rack=r1 held (power work; nodes: {rack})" in out, out

        def drained() -> bool:
            nonlocal fewest_ready
            demo = c.replicas("demo")
            ready = [r for r in demo if r.state == READY]
            fewest_ready = min(fewest_ready, len(ready))
            everything = demo + c.replicas("search")
            return (
                len(ready) == 2
                and not any(r.node_id == rack for r in everything)
                and c.ready("search") == 2
                and c.router_endpoints("demo") == 2
            )

        c.wait(drained, 90, f"rack r1 ({rack}) drained with two ready demo replicas elsewhere")
        settled = clients.requests
        c.wait(lambda: clients.requests >= settled + 2 * CLIENTS, 30, "clients streaming after the drain")

    print(
        f"\nrack drain: {clients.requests} requests, outcomes {dict(clients.outcomes)}, "
        f"fewest ready {fewest_ready}"
    )
    for e in clients.errors:
        print("  " + e)
    assert fewest_ready >= 2, "a drain must never leave fewer ready replicas than wanted"
    assert clients.outcomes["ok"] == clients.requests, "\n".join(clients.errors)
    listing = llmgw(c, "nodes", "domains")
    assert "rack=r1" in listing and rack in listing and "power work" in listing, listing
    assert c.node_state(rack) == "held"
    llmgw(c, "nodes", "release", "--domain", "rack=r1")
    c.wait(lambda: c.node_state(rack) == "ready", 10, f"{rack} ready after the release")
