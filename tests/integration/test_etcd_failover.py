"""A 3-member etcd cluster loses the member the leading control plane uses, while clients stream.

Real processes throughout: three etcd members on loopback (etcd's default
timings), two control planes listing all three (the lease TTL and etcd
timeouts are the defaults ``llmgw up`` gets), two agents with simulator
engines, a router, and clients streaming through the official openai
client. The member the leader sends its calls to (its log says which; /proc
shows it connected there) is killed (kill -9) or stopped (SIGSTOP: it keeps
accepting TCP and never answers). What must hold:

- the leader's etcd client moves to another member;
- a lease TTL after the loss, a control plane leads: the same one (it kept
  refreshing its lease through another member) or the standby (it took
  over within the TTL);
- the leader still writes to etcd (a model added and removed);
- no replica restarts (same engine PIDs) and no client request fails.

Both variants share one cluster: the second first brings back the member
the first killed, so the cluster has its three members again.
"""

from __future__ import annotations

import re
import signal
import time

import pytest

from llmgw.control.config import ControlConfig
from llmgw.v1 import admin_pb2
from tests.support.cluster import READY, Cluster, running_cluster, simulator_model
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

MODEL = "demo"
NODES = ("node-a", "node-b")
CONTROLS = ("control-1", "control-2")
CLIENTS = 4


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(
        tmp_path_factory.mktemp("etcd-failover"),
        [simulator_model(MODEL, len(NODES))],
        name="etcd-failover",
        nodes=dict.fromkeys(NODES, 1),
        controls=CONTROLS,
        etcd_members=3,
        admin_token="etcd-failover-test-admin-token",
    ) as c:
        c.wait(lambda: len(_ready(c)) == len(NODES), 90, "two ready replicas")
        yield c


def _leader(c: Cluster) -> str:
    return next((n for n in CONTROLS if c.leads(n)), "")


def _ready(c: Cluster) -> set[str]:
    return {r.replica_id for r in c.replicas(MODEL) if r.state == READY}


def _members(c: Cluster, control: str) -> list[str]:
    """The etcd members ``control`` holds connections to (from /proc)."""
    return c.etcd_cluster.used_by(c.procs[control].popen.pid)


def _in_use(c: Cluster, control: str) -> str:
    """The member ``control`` sends its calls to: the first listed, or the last it moved to (its log)."""
    moved = re.findall(
        r"etcd member \S+ failed \(.*\); using (\S+)$", c.procs[control].log.read_text(errors="replace"), re.M
    )
    return moved[-1] if moved else c.etcd_cluster.endpoints[0]


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_losing_the_etcd_member_the_leader_uses_fails_no_request_and_restarts_no_replica(cluster, how):
    c = cluster
    etcd = c.etcd_cluster
    for endpoint, proc in zip(etcd.endpoints, etcd.procs, strict=True):
        if not proc.alive():
            etcd.restart(endpoint)
    c.wait(etcd.has_leader, 30, "three etcd members with a leader")
    ttl = ControlConfig.model_fields["lease_ttl_seconds"].default  # what `llmgw up` runs with
    leader = c.wait_for(lambda: _leader(c), 30, "a leading control plane")
    standby = next(n for n in CONTROLS if n != leader)
    # Earlier members may still be connected (gRPC redials them); calls go to one.
    lost = _in_use(c, leader)
    c.wait(lambda: lost in _members(c, leader), 10, f"the leader connected to {lost}, the member it uses")
    replicas = _ready(c)
    engines = c.engine_pids()
    assert replicas and replicas <= set(engines), (replicas, engines)

    with Clients(c.router_url, MODEL, CLIENTS) as clients:
        c.wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients streaming before the loss")
        at = time.monotonic()
        etcd.member(lost).signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        c.wait(lambda: _in_use(c, leader) != lost, 3 * ttl, "the leader using another etcd member")
        c.wait(lambda: _in_use(c, leader) in _members(c, leader), 10, "the leader connected to it")
        # Leading a lease TTL after the loss means a refresh sent after it succeeded.
        led = c.wait(
            lambda: time.monotonic() >= at + ttl and (c.leads(leader) or c.leads(standby)),
            3 * ttl,
            "a leader one lease TTL after the loss",
        )
        now = leader if c.leads(leader) else standby
        c.wait(lambda: _ready(c) == replicas, 30, "the leader knows every running replica")
        # The control plane that lost its member still writes to etcd.
        admin, name = c.admin(leader), f"after-{how}"
        document = f"name: {name}\nmin_replicas: 0\nprofile: {{engine: simulator}}\n"
        admin.AddModel(admin_pb2.PutModelRequest(document=document), timeout=10, metadata=c.auth)
        admin.RemoveModel(admin_pb2.RemoveModelRequest(name=name), timeout=10, metadata=c.auth)
        settled = clients.requests
        c.wait(lambda: clients.requests >= settled + 3 * CLIENTS, 30, "clients streaming after the loss")
    if how == "stop":
        etcd.member(lost).signal(signal.SIGCONT)

    print(
        f"\netcd member {lost} {how}: {now} leads {led - at:.2f}s after "
        f"({'kept its lease' if now == leader else 'the standby took over'}); "
        f"{clients.requests} requests, outcomes {dict(clients.outcomes)}"
    )
    assert led - at <= ttl + 2.0, f"no leader for {led - at:.2f}s after the loss"
    assert c.engine_pids() == engines, "no engine may have been restarted"
    assert set(clients.outcomes) == {"ok"}, clients.errors
