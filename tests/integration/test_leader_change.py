"""No gap at a change of leader (issue 15), with the settings ``llmgw up`` uses.

Two scenarios: the leader killed, and etcd stopped, killed and started
again (every term ends with it: the new one must not withdraw endpoints
either).

Two control planes, two agents, ``llmgw up``'s demo model (two replicas),
four clients looping streamed and whole requests through the official
openai client with a 10 s timeout. kill -9 the leader: the standby leads
within the lease TTL, adopts both engines (same PIDs), and no request
fails -- not while nobody leads, and not after the new leader starts
deciding, when it used to withdraw every endpoint whose agent had not yet
reached it within the node timeout of its election. The load runs until
well past that window (node timeout after the takeover, plus margin).
"""

from __future__ import annotations

import signal
import time

import pytest

from llmgw.cli.localcluster import DEMO_MODEL, demo_model
from tests.support.cluster import Cluster, running_cluster
from tests.support.procs import start
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

CONTROLS = ("control-1", "control-2")
NODES = {"node-a": 2, "node-b": 2}
CLIENTS = 4
# The control plane's defaults (config.py): what a new leader waits for agents.
NODE_TIMEOUT = 3.0
LEASE_TTL = 5


def _leader(c: Cluster) -> str:
    return next((n for n in CONTROLS if c.procs[n].alive() and c.leads(n)), "")


def test_killing_the_leader_fails_no_request(tmp_path):
    with running_cluster(
        tmp_path, [demo_model(2)], name="leader-change", nodes=NODES, controls=CONTROLS
    ) as c:
        c.wait(lambda: c.ready(DEMO_MODEL) == 2 and c.router_endpoints(DEMO_MODEL) == 2, 90, "two replicas")
        c.wait(lambda: _leader(c) != "", 15, "a leader")
        leader = _leader(c)
        standby = next(n for n in CONTROLS if n != leader)
        engines = c.engine_pids()
        with Clients(c.router_url, DEMO_MODEL, CLIENTS, timeout=10, mixed=True) as clients:
            c.wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients running before the kill")
            killed = time.monotonic()
            c.procs[leader].signal(signal.SIGKILL)
            led = c.wait(lambda: c.leads(standby), 3 * LEASE_TTL, "the standby leads")
            c.wait(lambda: c.ready(DEMO_MODEL, standby) == 2, 30, "the new leader sees both replicas ready")
            # Past the window in which a new leader used to give endpoints up.
            after = clients.requests
            c.wait(
                lambda: time.monotonic() > led + NODE_TIMEOUT + 3 and clients.requests >= after + 3 * CLIENTS,
                30,
                "clients running past the new leader's node timeout",
            )
        print(
            f"\nleader change: {standby} leads {led - killed:.2f}s after the kill; "
            f"{clients.requests} requests, {dict(clients.outcomes)}"
        )
        assert set(clients.outcomes) == {"ok"}, clients.errors[:10]
        assert c.engine_pids() == engines, "no engine may have been restarted"
        assert c.router_endpoints(DEMO_MODEL) == 2


def test_etcd_stopped_killed_and_restarted_fails_no_request(tmp_path):
    with running_cluster(tmp_path, [demo_model(2)], name="etcd-outage", nodes=NODES, controls=CONTROLS) as c:
        c.wait(lambda: c.ready(DEMO_MODEL) == 2 and c.router_endpoints(DEMO_MODEL) == 2, 90, "two replicas")
        engines = c.engine_pids()
        with Clients(c.router_url, DEMO_MODEL, CLIENTS, timeout=10, mixed=True) as clients:
            c.wait(lambda: clients.requests >= 3 * CLIENTS, 30, "clients running before the outage")
            etcd = c.procs["etcd"]
            etcd.signal(signal.SIGSTOP)
            # Longer than the lease TTL: the leader's term ends.
            c.wait(lambda: not any(c.leads(n) for n in CONTROLS), 3 * LEASE_TTL, "the leader fenced")
            etcd.signal(signal.SIGKILL)
            etcd.popen.wait(5)
            c.procs["etcd"] = start("etcd", list(etcd.popen.args), tmp_path / "logs")
            back = c.wait(lambda: _leader(c) != "", 30, "a leader again")
            leader = _leader(c)
            c.wait(lambda: c.ready(DEMO_MODEL, leader) == 2, 30, "the leader sees both replicas ready")
            after = clients.requests
            c.wait(
                lambda: (
                    time.monotonic() > back + NODE_TIMEOUT + 3 and clients.requests >= after + 3 * CLIENTS
                ),
                30,
                "clients running past the new term's node timeout",
            )
        print(f"\netcd outage: {clients.requests} requests, {dict(clients.outcomes)}")
        assert set(clients.outcomes) == {"ok"}, clients.errors[:10]
        assert c.engine_pids() == engines, "no engine may have been restarted"
