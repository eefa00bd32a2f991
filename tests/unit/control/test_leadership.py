"""Leadership over the Store contract: with MemoryStore and with a real etcd alike."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import MemoryStore, Put
from llmgw.control.leader.leadership import LeaderInfo, Leadership, NotLeader

from .helpers import until

TTL = 2


@pytest.fixture(params=["memory", "etcd"])
async def store(request, etcd_store):
    yield etcd_store if request.param == "etcd" else MemoryStore()


class Partitionable:
    """A store whose lease operations can be cut, as for a leader cut off from etcd's leader.

    The seam is the Store protocol; everything else goes to the real store.
    """

    def __init__(self, inner):
        self._inner = inner
        self.severed = False

    def _check(self):
        if self.severed:
            raise Unavailable("partitioned from etcd (test)")

    async def get(self, key):
        return await self._inner.get(key)

    async def range(self, prefix):
        return await self._inner.range(prefix)

    async def put(self, key, value, lease=0):
        return await self._inner.put(key, value, lease)

    async def delete(self, key, prefix=False):
        return await self._inner.delete(key, prefix)

    async def commit(self, conditions, ops):
        return await self._inner.commit(conditions, ops)

    async def grant_lease(self, ttl_seconds):
        self._check()
        return await self._inner.grant_lease(ttl_seconds)

    async def keep_alive(self, lease):
        self._check()
        return await self._inner.keep_alive(lease)

    async def revoke_lease(self, lease):
        self._check()
        await self._inner.revoke_lease(lease)

    def watch(self, prefix, start_revision):
        return self._inner.watch(prefix, start_revision)

    async def close(self):
        return None


@contextlib.asynccontextmanager
async def candidates(*pairs):
    """Run each (Leadership, address) until the block ends."""
    tasks = [asyncio.create_task(lead.run(addr)) for lead, addr in pairs]
    try:
        yield
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_one_of_two_candidates_leads_and_the_other_takes_over_after_resign(store):
    a = Leadership(store, "a", TTL, retry_seconds=0.1)
    b = Leadership(store, "b", TTL, retry_seconds=0.1)
    async with candidates((a, "10.0.0.1:1")):
        await until(lambda: a.is_leader)
        async with candidates((b, "10.0.0.2:1")):
            await asyncio.sleep(0.4)
            assert a.is_leader and not b.is_leader
            assert await b.leader() == LeaderInfo("a", "10.0.0.1:1", (await a.leader()).since)
            term = a.term
            await a.resign()
            assert term.lost.is_set() and not a.is_leader
            await until(lambda: b.is_leader, within=3)
            info = await a.leader()
            assert (info.id, info.address) == ("b", "10.0.0.2:1")
            # A resigned candidate does not come back.
            await asyncio.sleep(0.3)
            assert not a.is_leader


class HeldReads(Partitionable):
    """Reads that, once armed, come back only when released: a read racing an election."""

    def __init__(self, inner):
        super().__init__(inner)
        self.armed = False
        self.waiting = asyncio.Event()
        self.release = asyncio.Event()

    async def get(self, key):
        value = await self._inner.get(key)
        if self.armed:
            self.armed = False
            self.waiting.set()
            await self.release.wait()
        return value


async def test_a_read_that_started_before_this_process_won_answers_with_its_own_term():
    held = HeldReads(MemoryStore())
    lead = Leadership(held, "a", TTL, retry_seconds=0.1)
    held.armed = True
    read = asyncio.create_task(lead.leader())
    await held.waiting.wait()  # it read "nobody leads" and is not back yet
    async with candidates((lead, "10.0.0.1:1")):
        await until(lambda: lead.is_leader)
        held.release.set()
        info = await read
        assert (info.id, info.address) == ("a", "10.0.0.1:1")
        assert lead.known_leader == info


async def test_leader_cut_off_from_etcd_is_fenced_and_standby_leads_after_the_ttl(store):
    cut = Partitionable(store)
    a = Leadership(cut, "a", TTL, retry_seconds=0.1)
    b = Leadership(store, "b", TTL, retry_seconds=0.1)
    async with candidates((a, "a:1")):
        await until(lambda: a.is_leader)
        async with candidates((b, "b:1")):
            term = a.term
            cut.severed = True
            # Fenced by its own failed keep-alive, within one refresh interval.
            await asyncio.wait_for(term.lost.wait(), TTL / 3 + 0.5)
            assert not a.is_leader
            with pytest.raises(NotLeader):
                await a.commit([Put("replicas/x", b"late")])
            assert await store.get("replicas/x") is None
            # Its key outlives its term until the lease runs out; meanwhile it names no leader
            # rather than itself (agents and routers would go round in circles).
            entry = await store.get("leader")
            if entry is not None and LeaderInfo.from_json(entry.value).id == "a":
                assert await a.leader_address() == ""
            # Nobody revoked a's lease: the standby leads once etcd lets it go.
            await until(lambda: b.is_leader, within=TTL + 2)
            assert not a.is_leader


async def test_write_guarded_by_a_lost_term_is_refused(store):
    a = Leadership(store, "a", TTL, retry_seconds=0.1)
    b = Leadership(store, "b", TTL, retry_seconds=0.1)
    async with candidates((a, "a:1")):
        await until(lambda: a.is_leader)
        await a.commit([Put("replicas/ok", b"1")])
        assert (await store.get("replicas/ok")).value == b"1"
        # Someone else takes the key before "a" notices (an operator, a split brain).
        await store.delete("leader")
        async with candidates((b, "b:1")):
            await until(lambda: b.is_leader, within=3)
            with pytest.raises(NotLeader):
                await a.commit([Put("replicas/late", b"1")])
            assert await store.get("replicas/late") is None
            assert not a.is_leader
            await b.commit([Put("replicas/new", b"1")])


async def test_expired_lease_in_memory_store_fences_at_the_next_refresh():
    store = MemoryStore()
    a = Leadership(store, "a", TTL, retry_seconds=0.1)
    async with candidates((a, "a:1")):
        await until(lambda: a.is_leader)
        first = a.term
        await store.expire_lease(first.lease)
        await asyncio.wait_for(first.lost.wait(), TTL / 3 + 0.5)
        # The key is free again, so the same candidate campaigns and starts a new term.
        await until(lambda: a.is_leader, within=3)
        assert a.term.number == first.number + 1
