"""Watch semantics: the pure mirror core, then the same rules through a real gRPC server."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
from prometheus_client import CollectorRegistry

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import Compacted, MemoryStore, Put
from llmgw.common.grpcserver import GrpcServer
from llmgw.control.api.watches import CatalogWatchServicer, EndpointWatchServicer
from llmgw.control.metrics import ControlMetrics
from llmgw.control.store.watchhub import MirrorCore, WatchHub
from llmgw.v1 import endpoints_pb2, endpoints_pb2_grpc

from .helpers import Reader, until

# -- the pure core ------------------------------------------------------------------


def test_core_without_known_revision_answers_snapshot():
    core = MirrorCore()
    core.reset({"a": b"1", "b": b"2"}, 10)
    u = core.update_since(0)
    assert u.snapshot and u.revision == 10
    assert u.upserts == (("a", b"1"), ("b", b"2")) and u.removals == ()


def test_core_delta_since_known_revision_is_collapsed_per_key():
    core = MirrorCore()
    core.reset({"a": b"1", "b": b"2"}, 10)
    assert core.apply([("a", b"1x")], 11)
    assert core.apply([("a", b"1y"), ("c", b"3")], 12)
    assert core.apply([("b", None)], 13)
    u = core.update_since(10)
    assert not u.snapshot and u.revision == 13
    assert u.upserts == (("a", b"1y"), ("c", b"3"))
    assert u.removals == ("b",)
    later = core.update_since(12)
    assert later.upserts == () and later.removals == ("b",)


def test_core_put_of_the_same_value_is_not_a_change():
    core = MirrorCore()
    core.reset({"a": b"1"}, 5)
    assert not core.apply([("a", b"1")], 6)
    assert not core.apply([("gone", None)], 7)
    assert core.revision == 7
    assert core.update_since(5).empty


def test_core_known_revision_older_than_trimmed_history_answers_snapshot():
    core = MirrorCore(history_limit=2)
    core.reset({}, 1)
    for rev in range(2, 6):
        core.apply([(f"k{rev}", b"v")], rev)
    assert core.floor == 3
    assert core.update_since(2).snapshot
    assert core.update_since(1).snapshot
    assert not core.update_since(3).snapshot
    assert core.update_since(3).upserts == (("k4", b"v"), ("k5", b"v"))


def test_core_known_revision_newer_than_the_mirror_answers_snapshot():
    core = MirrorCore()
    core.reset({"a": b"1"}, 4)
    u = core.update_since(99)
    assert u.snapshot and u.upserts == (("a", b"1"),)


def test_core_known_revision_equal_to_current_answers_empty_delta():
    core = MirrorCore()
    core.reset({"a": b"1"}, 4)
    core.apply([("a", b"2")], 5)
    u = core.update_since(5)
    assert not u.snapshot and u.empty and u.revision == 5


def test_core_reset_restarts_history_and_changes_epoch():
    core = MirrorCore()
    core.reset({"a": b"1"}, 4)
    core.apply([("a", b"2")], 5)
    epoch = core.epoch
    core.reset({"a": b"3"}, 9)
    assert core.epoch != epoch
    assert core.update_since(5).snapshot
    assert core.update_since(9).empty


# -- through gRPC ---------------------------------------------------------------------


def ep(id: str, url: str) -> bytes:
    return endpoints_pb2.Endpoint(id=id, model="m", url=url).SerializeToString()


class Served:
    def __init__(self, store, history_limit: int = 1000):
        self.store = store
        self.metrics = ControlMetrics(CollectorRegistry())
        self.hub = WatchHub(store, "endpoints/", "endpoints", self.metrics, history_limit, 0.05)
        self.catalog = WatchHub(store, "catalog/", "catalog", self.metrics, history_limit, 0.05)
        self.server = GrpcServer(
            "127.0.0.1:0",
            [
                (
                    endpoints_pb2_grpc.add_EndpointServiceServicer_to_server,
                    EndpointWatchServicer(self.hub, self.metrics.watchers),
                    "llmgw.v1.EndpointService",
                ),
                (
                    endpoints_pb2_grpc.add_CatalogServiceServicer_to_server,
                    CatalogWatchServicer(self.catalog, self.metrics.watchers),
                    "llmgw.v1.CatalogService",
                ),
            ],
        )
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.server.port}")
        self.stub = endpoints_pb2_grpc.EndpointServiceStub(self.channel)
        self.catalog_stub = endpoints_pb2_grpc.CatalogServiceStub(self.channel)


@contextlib.asynccontextmanager
async def serving(store, history_limit: int = 1000):
    s = Served(store, history_limit)
    await s.server.start()
    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(s.hub.run()), tg.create_task(s.catalog.run())]
        try:
            yield s
        finally:
            await s.hub.close()
            await s.catalog.close()
            await s.channel.close()
            await s.server.stop(0)
            for t in tasks:
                t.cancel()


async def test_watch_sends_snapshot_then_increasing_deltas_and_skips_unchanged_puts():
    store = MemoryStore()
    await store.put("endpoints/r1", ep("r1", "http://a"))
    await store.put("other/x", b"not mirrored")
    async with serving(store) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest(client_id="t")))
        first = await w.next()
        assert first.snapshot and [e.id for e in first.upserts] == ["r1"]
        await store.put("endpoints/r2", ep("r2", "http://b"))
        d1 = await w.next()
        assert not d1.snapshot and [e.url for e in d1.upserts] == ["http://b"]
        assert d1.revision > first.revision
        await store.put("endpoints/r2", ep("r2", "http://b"))  # same value: not a change
        await store.put("other/y", b"ignored")
        assert await w.quiet()
        await store.delete("endpoints/r1")
        d2 = await w.next()
        assert list(d2.removals) == ["r1"] and not d2.upserts
        assert d2.revision > d1.revision
        await w.close()


async def test_watch_resumed_with_revision_in_history_gets_only_the_delta():
    store = MemoryStore()
    await store.put("endpoints/r1", ep("r1", "http://a"))
    async with serving(store) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest()))
        known = (await w.next()).revision
        await w.close()
        await store.put("endpoints/r2", ep("r2", "http://b"))
        rev = await store.put("endpoints/r1", ep("r1", "http://a2"))
        await until(lambda: s.hub.revision >= rev)
        resumed = Reader(s.stub.Watch(endpoints_pb2.WatchRequest(known_revision=known)))
        u = await resumed.next()
        assert not u.snapshot
        assert sorted((e.id, e.url) for e in u.upserts) == [("r1", "http://a2"), ("r2", "http://b")]
        current = Reader(s.stub.Watch(endpoints_pb2.WatchRequest(known_revision=u.revision)))
        empty = await current.next()
        assert not empty.snapshot and not empty.upserts and not empty.removals
        await resumed.close()
        await current.close()


async def test_watch_resumed_with_revision_older_than_history_gets_snapshot():
    store = MemoryStore()
    async with serving(store, history_limit=2) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest()))
        known = (await w.next()).revision
        await w.close()
        for i in range(4):
            rev = await store.put(f"endpoints/r{i}", ep(f"r{i}", f"http://{i}"))
            await until(lambda rev=rev: s.hub.revision >= rev)
        resumed = Reader(s.stub.Watch(endpoints_pb2.WatchRequest(known_revision=known)))
        u = await resumed.next()
        assert u.snapshot and len(u.upserts) == 4
        await resumed.close()


async def test_watch_with_revision_newer_than_the_store_gets_snapshot():
    store = MemoryStore()
    await store.put("endpoints/r1", ep("r1", "http://a"))
    async with serving(store) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest(known_revision=10_000)))
        u = await w.next()
        assert u.snapshot and [e.id for e in u.upserts] == ["r1"]
        await w.close()


class CompactingStore(MemoryStore):
    """A watch that fails with Compacted on its next batch once asked, as etcd does."""

    def __init__(self):
        super().__init__()
        self.compact_next = False

    async def watch(self, prefix, start_revision):
        async for batch in super().watch(prefix, start_revision):
            if self.compact_next:
                self.compact_next = False
                raise Compacted(batch.revision)
            yield batch


async def test_hub_rereads_after_compaction_and_open_watchers_get_a_fresh_snapshot():
    store = CompactingStore()
    async with serving(store) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest()))
        assert (await w.next()).snapshot
        await store.put("endpoints/r1", ep("r1", "http://a"))
        delta = await w.next()
        assert not delta.snapshot and [e.id for e in delta.upserts] == ["r1"]
        store.compact_next = True
        await store.put("endpoints/r2", ep("r2", "http://b"))
        # The watch broke on that batch: the hub re-reads and says so with a snapshot.
        fresh = await w.next()
        assert fresh.snapshot and [e.id for e in fresh.upserts] == ["r1", "r2"]
        await store.put("endpoints/r3", ep("r3", "http://c"))
        after = await w.next()
        assert not after.snapshot and [e.id for e in after.upserts] == ["r3"]
        assert after.revision > fresh.revision
        await w.close()


async def test_catalog_watch_serves_model_infos_and_removals():
    store = MemoryStore()
    info = endpoints_pb2.ModelInfo(name="m", aliases=["mm"], owned_by="t", created=7)
    await store.commit([], [Put("catalog/m", info.SerializeToString())])
    async with serving(store) as s:
        w = Reader(s.catalog_stub.Watch(endpoints_pb2.WatchRequest()))
        first = await w.next()
        assert first.snapshot and first.upserts[0].aliases == ["mm"]
        await store.delete("catalog/m")
        gone = await w.next()
        assert list(gone.removals) == ["m"]
        await w.close()


class DownAtFirst(MemoryStore):
    """etcd that refuses the first few reads."""

    def __init__(self, failures: int):
        super().__init__()
        self.failures = failures

    async def range(self, prefix):
        if self.failures:
            self.failures -= 1
            raise Unavailable("etcd is down")
        return await super().range(prefix)


async def test_watch_opened_while_etcd_is_down_answers_once_the_first_read_succeeds():
    store = DownAtFirst(failures=3)
    await store.put("endpoints/r1", ep("r1", "http://a"))
    async with serving(store) as s:
        w = Reader(s.stub.Watch(endpoints_pb2.WatchRequest()))
        u = await w.next(within=5)
        assert u.snapshot and [e.id for e in u.upserts] == ["r1"]
        await w.close()
