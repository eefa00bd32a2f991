"""The Store contract, checked against real etcd and against MemoryStore alike."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import (
    ETCD_MAX_TXN_OPS,
    Compacted,
    Delete,
    MemoryStore,
    ModRevisionIs,
    Put,
    ValueIs,
    batches,
)


@pytest.fixture(params=["etcd", "memory"])
async def store(request, etcd_store):
    if request.param == "etcd":
        yield etcd_store
    else:
        yield MemoryStore()


async def test_put_get_range_and_revisions_increase(store):
    r1 = await store.put("a/1", b"one")
    r2 = await store.put("a/2", b"two")
    await store.put("b/1", b"other")
    assert r2 > r1
    got = await store.get("a/1")
    assert got.value == b"one" and got.mod_revision == r1
    rng = await store.range("a/")
    assert [e.key for e in rng.entries] == ["a/1", "a/2"]
    assert rng.revision >= r2
    assert await store.get("missing") is None


async def test_commit_is_guarded_by_mod_revision(store):
    created = await store.commit([ModRevisionIs("k", 0)], [Put("k", b"v1")])
    assert created.succeeded
    again = await store.commit([ModRevisionIs("k", 0)], [Put("k", b"v2")])
    assert not again.succeeded
    assert (await store.get("k")).value == b"v1"
    ok = await store.commit([ModRevisionIs("k", created.revision)], [Put("k", b"v3"), Put("j", b"x")])
    assert ok.succeeded and (await store.get("j")).value == b"x"
    assert (await store.commit([ValueIs("k", b"nope")], [Delete("k")])).succeeded is False
    assert (await store.commit([ValueIs("k", b"v3")], [Delete("", prefix=True)])).succeeded
    assert (await store.range("")).entries == []


async def test_lease_keys_vanish_when_lease_is_revoked(store):
    lease = await store.grant_lease(5)
    await store.put("leader", b"me", lease=lease)
    assert await store.keep_alive(lease) > 0
    await store.revoke_lease(lease)
    assert await store.get("leader") is None
    assert await store.keep_alive(lease) == 0


async def test_watch_delivers_changes_after_start_revision_in_order(store):
    base = await store.put("w/a", b"1")
    seen = []

    async def consume():
        async for batch in store.watch("w/", base + 1):
            seen.extend((e.kind, e.key, e.value) for e in batch.events)
            if len(seen) >= 3:
                return

    task = asyncio.create_task(consume())
    await asyncio.sleep(0.1)
    await store.put("w/b", b"2")
    await store.put("other", b"ignored")
    await store.commit([], [Put("w/a", b"3"), Delete("w/b")])
    await asyncio.wait_for(task, 5)
    assert seen == [("put", "w/b", b"2"), ("put", "w/a", b"3"), ("delete", "w/b", b"")]


async def test_watch_from_compacted_revision_raises_compacted(store, etcd_store):
    r = await store.put("c/a", b"1")
    await store.put("c/a", b"2")
    latest = await store.put("c/a", b"3")
    if isinstance(store, MemoryStore):
        await store.compact(latest)
    else:
        await etcd_store.compact(latest)
    with pytest.raises(Compacted):
        async for _ in store.watch("c/", r):
            pass


async def test_a_transaction_over_etcds_limit_is_refused_and_writes_nothing(store):
    # MemoryStore refuses what etcd refuses, so a writer that forgets to split fails in unit tests too.
    with pytest.raises(Unavailable, match="too many operations"):
        await store.commit([], [Put(f"big/{i:03d}", b"x") for i in range(ETCD_MAX_TXN_OPS + 1)])
    assert (await store.range("big/")).entries == []
    assert (await store.commit([], [Put(f"big/{i:03d}", b"x") for i in range(ETCD_MAX_TXN_OPS)])).succeeded


async def test_many_writes_go_in_transactions_etcd_accepts(store):
    # etcd refuses a transaction of over 128 operations (its default --max-txn-ops).
    ops = [Put(f"many/{i:03d}", b"x") for i in range(250)]
    pieces = list(batches(ops))
    assert [len(p) for p in pieces] == [100, 100, 50]
    for piece in pieces:
        await store.commit([], piece)
    assert len((await store.range("many/")).entries) == 250
