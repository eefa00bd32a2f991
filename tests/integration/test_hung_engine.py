"""A hung engine is routed around (issue 15), with the settings ``llmgw up`` uses.

One control plane, two agents, ``llmgw up``'s demo model (two replicas),
four clients looping streamed and whole requests through the official
openai client with a 10 s timeout. One engine is SIGSTOPped for 25 s -- a
process that accepts connections and never answers, the way an engine on a
wedged GPU dies -- then SIGCONTed. No request fails; once the first 2 s of
the hang have passed, p99 latency is under 3 s (the router no longer
chooses the frozen engine and moved what waited there); and since the hang
is shorter than the agent's grace, nothing was restarted: the same engine
serves again afterwards.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from llmgw.cli.localcluster import DEMO_MODEL, demo_model
from tests.support.cluster import running_cluster
from tests.support.streams import Clients

pytestmark = pytest.mark.integration

NODES = {"node-a": 2, "node-b": 2}
HANG_SECONDS = 25.0


def test_a_frozen_engine_fails_no_request_and_is_not_restarted(tmp_path):
    with running_cluster(tmp_path, [demo_model(2)], name="hung-engine", nodes=NODES) as c:
        c.wait(lambda: c.ready(DEMO_MODEL) == 2 and c.router_endpoints(DEMO_MODEL) == 2, 90, "two replicas")
        engines = c.engine_pids()
        frozen = min(engines.values())
        with Clients(c.router_url, DEMO_MODEL, 4, timeout=10, mixed=True) as clients:
            c.wait(lambda: clients.requests >= 12, 30, "clients running before the hang")
            hung = time.monotonic()
            os.killpg(frozen, signal.SIGSTOP)
            try:
                c.wait(lambda: c.router_endpoints(DEMO_MODEL) == 1, 10, "the frozen replica withdrawn")
                c.wait(lambda: time.monotonic() >= hung + HANG_SECONDS, HANG_SECONDS + 5, "the hang")
            finally:
                os.killpg(frozen, signal.SIGCONT)
            thawed = time.monotonic()
            c.wait(lambda: c.router_endpoints(DEMO_MODEL) == 2, 15, "the thawed replica back")
            after = clients.requests
            c.wait(lambda: clients.requests >= after + 12, 30, "clients running after the hang")
        during = clients.started_between(hung + 2, thawed)
        p99 = clients.p99(hung + 2, thawed)
        print(
            f"\nhung engine: {clients.requests} requests, {dict(clients.outcomes)}, "
            f"{len(during)} started during the hang after its first 2 s, p99 {p99:.2f}s"
        )
        assert set(clients.outcomes) == {"ok"}, clients.errors[:10]
        assert during and p99 < 3.0
        assert c.engine_pids() == engines, "nothing may be restarted when the engine recovers first"
