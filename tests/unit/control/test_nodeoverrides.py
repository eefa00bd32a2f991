"""Node holds and labels in a real etcd: stored, followed, merged, and guarded against lost updates."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.common.errors import Conflict, InvalidArgument
from llmgw.control.state.inventory import Inventory, NodeOverride
from llmgw.control.store.nodeoverrides import PREFIX, NodeOverrides
from llmgw.v1 import agent_pb2


async def test_followers_see_holds_and_labels_as_they_change_and_an_empty_override_leaves_no_key(etcd_store):
    overrides = NodeOverrides(etcd_store, wall=lambda: 1234.0)
    seen: asyncio.Queue = asyncio.Queue()
    follower = asyncio.create_task(overrides.follow(seen.put_nowait))
    try:
        assert await asyncio.wait_for(seen.get(), 5) == {}
        await overrides.hold("node-a", "disk swap")
        got = await asyncio.wait_for(seen.get(), 5)
        assert got == {"node-a": NodeOverride(True, "disk swap", {})}
        await overrides.label("node-a", {"pool": "inference", "zone": "a"}, [])
        got = await asyncio.wait_for(seen.get(), 5)
        assert dict(got["node-a"].labels) == {"pool": "inference", "zone": "a"}
        await overrides.label("node-a", {}, ["zone"])
        await overrides.release("node-a")
        while (got := await asyncio.wait_for(seen.get(), 5))["node-a"].held:
            pass
        assert dict(got["node-a"].labels) == {"pool": "inference"}
        assert (await overrides.get("node-a")).held_since == 0.0
        await overrides.label("node-a", {}, ["pool"])
        assert (await etcd_store.range(PREFIX)).entries == []
    finally:
        follower.cancel()
        await asyncio.gather(follower, return_exceptions=True)


async def test_a_change_built_on_a_stale_read_is_refused_not_lost(etcd_store, monkeypatch):
    overrides = NodeOverrides(etcd_store)
    await overrides.label("node-a", {"team": "search"}, [])
    real_get = etcd_store.get

    async def get_then_someone_else_writes(key):
        entry = await real_get(key)
        # Another operator's change lands between this one's read and its write.
        await etcd_store.put(key, b'{"labels": {"team": "search", "owner": "bob"}}')
        return entry

    monkeypatch.setattr(etcd_store, "get", get_then_someone_else_writes)
    with pytest.raises(Conflict, match="retry"):
        await overrides.hold("node-a", "x")
    monkeypatch.undo()
    assert dict((await overrides.get("node-a")).labels) == {"team": "search", "owner": "bob"}


async def test_hold_rules_are_checked_before_anything_is_written(etcd_store):
    overrides = NodeOverrides(etcd_store)
    with pytest.raises(InvalidArgument, match="at most 256"):
        await overrides.hold("node-a", "x" * 300)
    with pytest.raises(InvalidArgument, match="both set and removed"):
        await overrides.label("node-a", {"a": "1"}, ["a"])
    assert (await etcd_store.range(PREFIX)).entries == []


def test_inventory_lays_operator_labels_over_the_agents_and_keeps_them_across_reregistration():
    inv = Inventory(node_timeout=3)
    reg = agent_pb2.Register(node_id="node-a", labels={"zone": "a", "pool": "batch"}, memory_bytes=1 << 30)
    inv.register(reg, now=0)
    assert inv.set_overrides({"node-a": NodeOverride(True, "maint", {"pool": "inference"})})
    n = inv.get("node-a")
    assert (dict(n.labels), n.held, n.status, n.memory_bytes) == (
        {"zone": "a", "pool": "inference"},
        True,
        "held",
        1 << 30,
    )
    inv.register(reg, now=1)  # the agent reconnects
    assert inv.get("node-a").held and inv.get("node-a").labels["pool"] == "inference"
    assert inv.set_overrides({})
    assert dict(inv.get("node-a").labels) == {"zone": "a", "pool": "batch"}
    assert not inv.set_overrides({}), "nothing changed"
