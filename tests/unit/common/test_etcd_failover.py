"""EtcdStore over a real 3-member etcd cluster: calls, leases and watches survive the member in use.

Each test gets its own cluster (three etcd processes on loopback, etcd's
default timings) and disturbs the member the store is using: kill -9 (the
connection is refused at once) or SIGSTOP (it accepts TCP and never
answers, so only a deadline can tell). A second store, on the other members
only, plays the rest of the world.
"""

from __future__ import annotations

import asyncio
import signal
import urllib.request
import uuid

import pytest

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import Compacted, EtcdStore, ModRevisionIs, Put
from tests.support.procs import EtcdCluster, start_etcd_cluster, until


@pytest.fixture
def etcd3(tmp_path):
    cluster = start_etcd_cluster(tmp_path / "data", tmp_path / "logs")
    yield cluster
    cluster.stop()


@pytest.fixture
def root() -> str:
    return f"/failover-test/{uuid.uuid4().hex[:8]}/"


async def _retry(write, within: float = 15.0):
    async with asyncio.timeout(within):
        while True:
            try:
                return await write()
            except Unavailable:
                await asyncio.sleep(0.1)


async def _create(store: EtcdStore, key: str, value: bytes) -> None:
    """Write ``key`` once: a retry after a lost answer finds it there and writes nothing."""
    await _retry(lambda: store.commit([ModRevisionIs(key, 0)], [Put(key, value)]))


def _disturb(cluster: EtcdCluster, endpoint: str, how: str) -> None:
    cluster.member(endpoint).signal(signal.SIGKILL if how == "kill" else signal.SIGSTOP)


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_reads_writes_and_the_lease_move_to_another_member(etcd3, root, how):
    store = EtcdStore(etcd3.endpoints, root)
    try:
        lease = await store.grant_lease(10)
        await store.put("held", b"by the lease", lease=lease)
        first = store.endpoint
        assert first == etcd3.endpoints[0], "the first listed member is used first"
        _disturb(etcd3, first, how)
        # If the member led the raft group, no member renews leases until the others
        # elect a leader (seconds): the refresh is repeated, the lease outlives it.
        assert await _retry(lambda: store.keep_alive(lease)) > 0
        assert store.endpoint != first
        assert (await store.get("held")).value == b"by the lease"
        revision = await store.put("after", b"written")
        assert (await store.commit([ModRevisionIs("after", revision)], [Put("after", b"again")])).succeeded
        assert [e.key for e in (await store.range("")).entries] == ["after", "held"]
        assert await store.grant_lease(5) > 0
    finally:
        await store.close()


async def test_a_write_sent_to_a_stopped_member_fails_as_unknown_and_the_next_goes_elsewhere(etcd3, root):
    store = EtcdStore(etcd3.endpoints, root)
    try:
        await store.put("k", b"1")
        first = store.endpoint
        _disturb(etcd3, first, "stop")
        # It was sent: it may have been applied, so it is not repeated on another member.
        with pytest.raises(Unavailable, match="may or may not have been applied"):
            await store.put("k", b"2")
        assert store.endpoint != first
        # If the stopped member led the raft group, no write commits until the
        # others elect a leader (a second or two): retry as every caller does.
        await _retry(lambda: store.put("k", b"3"))
        assert (await store.get("k")).value == b"3"
    finally:
        await store.close()


async def test_a_write_never_sent_goes_to_the_next_member(etcd3, root):
    _disturb(etcd3, etcd3.endpoints[0], "kill")
    store = EtcdStore(etcd3.endpoints, root)
    try:
        # The first member refuses the connection: the write provably never left, so it
        # is made on the next member instead of failing.
        await _retry(lambda: store.put("k", b"written once"))
        assert store.endpoint != etcd3.endpoints[0]
        assert (await store.get("k")).value == b"written once"
    finally:
        await store.close()


@pytest.mark.parametrize("how", ["kill", "stop"])
async def test_a_watch_resumes_on_another_member_missing_and_repeating_nothing(etcd3, root, how):
    watcher = EtcdStore(etcd3.endpoints, root)
    writer = EtcdStore(etcd3.endpoints[1:], root)
    total = 30
    seen: list[bytes] = []
    batch_revisions: list[int] = []
    half = asyncio.Event()

    async def consume(start: int) -> None:
        async for batch in watcher.watch("w/", start):
            batch_revisions.append(batch.revision)
            seen.extend(e.value for e in batch.events)
            if len(seen) >= total // 3:
                half.set()
            if len(seen) >= total:
                return

    try:
        start = await writer.put("other", b"before") + 1
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(consume(start))
            first = etcd3.endpoints[0]
            for n in range(total):
                await _create(writer, f"w/{n:03d}", str(n).encode())
                await _create(writer, f"elsewhere/{n:03d}", b"not watched")
                if n == total // 3:
                    await asyncio.wait_for(half.wait(), 10)
                    _disturb(etcd3, first, how)
            await asyncio.wait_for(task, 20)
        assert seen == [str(n).encode() for n in range(total)]
        assert batch_revisions == sorted(batch_revisions)
        assert watcher.endpoint != first
    finally:
        await watcher.close()
        await writer.close()


async def test_a_watch_from_now_resumes_from_where_etcd_created_it(etcd3, root):
    """Nothing delivered yet: the resumption elsewhere starts at the creation revision, not at "now"."""
    watcher = EtcdStore(etcd3.endpoints, root)
    writer = EtcdStore(etcd3.endpoints[1:], root)
    first = etcd3.endpoints[0]
    seen: list[bytes] = []

    async def consume() -> None:
        async for batch in watcher.watch("w/", 0):
            seen.extend(e.value for e in batch.events)
            if len(seen) >= 5:
                return

    try:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(consume())
            await asyncio.to_thread(
                until, "etcd created the watch", lambda: _watchers(first) >= 1, 10, etcd3.procs
            )
            _disturb(etcd3, first, "stop")
            # Written while the watch still waits on the stopped member.
            for n in range(5):
                await _create(writer, f"w/{n}", str(n).encode())
            await asyncio.wait_for(task, 20)
        assert seen == [str(n).encode() for n in range(5)]
    finally:
        await watcher.close()
        await writer.close()


def _watchers(endpoint: str) -> float:
    """How many watchers the member holds, from its /metrics."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return float(line.split()[1])
    return 0.0


async def test_a_watch_that_fails_over_past_a_compaction_raises_compacted(etcd3, root):
    watcher = EtcdStore(etcd3.endpoints, root)
    writer = EtcdStore(etcd3.endpoints[1:], root)
    try:
        start = await writer.put("w/a", b"0")
        watch = watcher.watch("w/", start)
        first = await anext(watch)
        assert [e.value for e in first.events] == [b"0"]
        _disturb(etcd3, etcd3.endpoints[0], "stop")
        await _create(writer, "w/b", b"1")
        await _create(writer, "w/c", b"2")
        latest = (await _retry(lambda: writer.range(""))).revision
        await _retry(lambda: writer.compact(latest))
        # The watch notices the silent member, resumes at the revision after "0" on
        # another one, and finds it compacted: the caller must re-read.
        with pytest.raises(Compacted):
            async with asyncio.timeout(15):
                await anext(watch)
        await watch.aclose()
    finally:
        await watcher.close()
        await writer.close()


async def test_every_member_down_is_unavailable_within_the_deadline(etcd3, root):
    store = EtcdStore(etcd3.endpoints, root, timeout=2.0)
    try:
        await store.put("k", b"v")
        for endpoint in etcd3.endpoints:
            _disturb(etcd3, endpoint, "stop")
        with pytest.raises(Unavailable, match="every member"):
            async with asyncio.timeout(4):
                await store.get("k")
    finally:
        await store.close()
