"""The Connect stream against a scripted control plane on a real gRPC port."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from llmgw.agent.gpus import GIB, cpu_cores
from llmgw.v1 import agent_pb2 as pb

from .conftest import ENGINE_KEY, start_fields
from .control import ScriptedControl

READY = pb.REPLICA_STATE_READY


async def test_register_carries_node_id_labels_declared_gpus_engines_and_host(control, start_agent):
    start_agent([control.address])
    reg = await control.wait_register()
    assert reg.node_id == "node-t"
    assert reg.address == "127.0.0.1"
    assert dict(reg.labels) == {"zone": "lab", "tier": "test"}
    assert [(g.index, g.name, g.memory_total_bytes) for g in reg.gpus] == [
        (0, "Sim A100", 40 * GIB),
        (1, "Sim A100", 40 * GIB),
        (2, "Sim L4", 24 * GIB),
    ]
    assert len({g.uuid for g in reg.gpus}) == 3
    assert [(e.kind, e.version) for e in reg.engines] == [("simulator", "9.9.9-test")]
    assert reg.version == "9.9.9-test"
    assert reg.memory_bytes > 0 and reg.cpu_cores == cpu_cores()
    assert list(reg.replicas) == []


async def _leader_and_standby() -> tuple[ScriptedControl, ScriptedControl]:
    """Two started control planes: a leader, and a standby that redirects to it."""
    leader = ScriptedControl("leader")
    standby = ScriptedControl("standby")
    await leader.start()
    standby.redirect = leader.address
    await standby.start()
    return leader, standby


async def test_redirect_sends_the_agent_to_the_named_leader(start_agent):
    leader, standby = await _leader_and_standby()
    try:
        start_agent([standby.address])
        await standby.wait_register()
        reg = await leader.wait_register()
        assert reg.node_id == "node-t"
        await leader.wait_for("a live stream", lambda: leader.connected)
        assert len(standby.registers()) == 1
    finally:
        await standby.stop()
        await leader.stop()


async def test_redirect_without_a_leader_makes_the_agent_retry_later(start_agent):
    standby = ScriptedControl("standby", redirect="")
    await standby.start()
    try:
        start_agent([standby.address])
        await standby.wait_register(count=3)
        standby.redirect = None  # a leader is elected here
        await standby.wait_for("a live stream", lambda: standby.connected)
    finally:
        await standby.stop()


async def test_unreachable_control_plane_is_skipped_for_the_next_address(control, start_agent):
    dead = ScriptedControl("dead")
    await dead.start()
    dead_address = dead.address
    await dead.stop()
    start_agent([dead_address, control.address])
    await control.wait_register()


async def test_heartbeats_use_the_control_planes_interval_and_list_every_replica(control, start_agent):
    start_agent([control.address])  # its own interval is 30s
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    control.start_replica(**start_fields("r2", gpu_indices=[1, 2]))
    await control.wait_state("r1", READY)
    await control.wait_state("r2", READY)

    def both_ready():
        return [
            hb
            for hb in control.heartbeats()
            if sorted((r.replica_id, r.state) for r in hb.replicas) == [("r1", READY), ("r2", READY)]
        ]

    hb = (await control.wait_for("a heartbeat with both replicas READY", both_ready, 5))[0]
    assert {r.replica_id: list(r.gpu_indices) for r in hb.replicas} == {"r1": [0], "r2": [1, 2]}
    assert len(hb.gpus) == 3


async def test_stream_drop_keeps_engines_serving_and_reregisters_listing_them(start_agent):
    control = ScriptedControl("control")
    address = await control.start()
    start_agent([address])
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.start_replica(**start_fields("r1"))
    ready = await control.wait_state("r1", READY)

    # The control plane goes away entirely.
    await control.stop()
    async with aiohttp.ClientSession() as http:
        headers = {"Authorization": f"Bearer {ENGINE_KEY}"}
        async with http.get(f"{ready.url}/health", headers=headers) as resp:
            assert resp.status == 200, "the engine must keep serving while control is down"

    # It comes back on the same address; the agent finds it and re-registers.
    back = ScriptedControl("control-again")
    await back.start(port=int(address.rsplit(":", 1)[1]))
    try:
        reg = await back.wait_register(within=15)
        assert [(r.replica_id, r.state, r.pid, r.url) for r in reg.replicas] == [
            ("r1", READY, ready.pid, ready.url)
        ]
    finally:
        await back.stop()


async def test_stream_ended_by_the_control_plane_is_reopened(control, start_agent):
    start_agent([control.address])
    await control.wait_register()
    await control.wait_for("a live stream", lambda: control.connected)
    control.drop()
    await control.wait_register(count=2)


async def test_a_dead_leader_still_named_by_a_standby_costs_no_backoff(start_agent):
    # The leader is killed; for a lease TTL the standby still names it (its
    # key is in etcd). The agent must not back off longer with each refusal:
    # once the standby leads, the agent is there within a poll interval.
    leader, standby = await _leader_and_standby()
    try:
        start_agent([leader.address, standby.address])
        await leader.wait_for("a live stream", lambda: leader.connected)
        await leader.stop()  # kill -9: the standby goes on naming it
        await standby.wait_register(count=6, within=10)
        await asyncio.sleep(2.0)  # the lease's remaining seconds: an old backoff would reach seconds
        asked = len(standby.registers())
        standby.redirect = None  # the standby leads
        elected = time.monotonic()
        await standby.wait_for("a live stream", lambda: standby.connected, within=10)
        took = time.monotonic() - elected
        assert len(standby.registers()) > asked
        assert took < 1.5, f"the agent reached the new leader {took:.2f}s after its election"
    finally:
        await standby.stop()
        await leader.stop()
