"""The store: the one small interface llmgw has to etcd, and its implementations.

Everything durable lives under one prefix per cluster (``/llmgw/<cluster>/``);
a :class:`Store` is bound to that prefix and speaks in keys relative to it.
The interface is deliberately narrow (get, range, guarded transactions,
leases, watch) so the client library behind it can be swapped: today it is
aetcd (:class:`EtcdStore`); :class:`MemoryStore` is a genuine in-memory
implementation with the same revision semantics, for unit tests.

Guarantees every implementation keeps:

- Revisions are the store's global revision: every write bumps it, and a
  watch delivers each change exactly once, in revision order.
- ``commit`` is all-or-nothing; its conditions compare against the state at
  the moment it applies (a missing key has mod_revision 0).
- ``watch(prefix, start_revision)`` raises :class:`Compacted` when history
  before ``start_revision`` is gone; callers then re-read with ``range``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from .errors import Unavailable


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int = 0


@dataclass(frozen=True)
class RangeResult:
    entries: list[Entry]
    # Store revision at which the range was read; watch from revision + 1.
    revision: int


@dataclass(frozen=True)
class Event:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    revision: int


@dataclass(frozen=True)
class WatchBatch:
    """Events of one or more whole revisions, in order."""

    events: list[Event]
    # The store revision this batch brings the watcher up to.
    revision: int


# Conditions and operations of a transaction.
@dataclass(frozen=True)
class ModRevisionIs:
    """The key's last modification is at ``revision`` (0: the key is absent)."""

    key: str
    revision: int


@dataclass(frozen=True)
class ValueIs:
    key: str
    value: bytes


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


Condition = ModRevisionIs | ValueIs
Op = Put | Delete


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


class Compacted(Exception):
    """The watch's start revision is older than what the store still holds."""

    def __init__(self, compact_revision: int):
        super().__init__(f"revision compacted; history starts at {compact_revision}")
        self.compact_revision = compact_revision


class Store(Protocol):
    async def get(self, key: str) -> Entry | None: ...
    async def range(self, prefix: str) -> RangeResult: ...
    async def put(self, key: str, value: bytes, lease: int = 0) -> int: ...
    async def delete(self, key: str, prefix: bool = False) -> int: ...
    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Op]) -> TxnResult: ...
    async def grant_lease(self, ttl_seconds: int) -> int: ...
    async def keep_alive(self, lease: int) -> int:
        """Refresh a lease; returns its new TTL in seconds, 0 if it has expired."""
        ...

    async def revoke_lease(self, lease: int) -> None: ...
    def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]: ...
    async def close(self) -> None: ...


def _prefix_end(prefix: bytes) -> bytes:
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\x00"


class EtcdStore:
    """A :class:`Store` over a real etcd, through aetcd's connection and stubs.

    aetcd's high-level watch hands events over one at a time and drops the
    response revision; the watch here uses the raw Watch RPC instead, so a
    batch is a whole etcd response (whole transactions) with its revision.
    """

    def __init__(self, endpoints: Sequence[str], root: str, timeout: float = 5.0):
        import aetcd  # imported here so MemoryStore users need no etcd client

        host, _, port = endpoints[0].rpartition(":")
        self._endpoint = endpoints[0]
        self._client = aetcd.Client(host=host or "127.0.0.1", port=int(port), timeout=timeout)
        self._root = root.rstrip("/") + "/"
        self._timeout = timeout

    @property
    def root(self) -> str:
        return self._root

    def _k(self, key: str) -> bytes:
        return (self._root + key).encode()

    def _strip(self, key: bytes) -> str:
        return key.decode()[len(self._root) :]

    def _entry(self, kv) -> Entry:
        return Entry(
            key=self._strip(kv.key),
            value=kv.value,
            mod_revision=kv.mod_revision,
            create_revision=kv.create_revision,
            lease=kv.lease,
        )

    async def _call(self, coro_fn):
        import aetcd
        import grpc

        try:
            await self._client.connect()
            return await coro_fn()
        except (aetcd.exceptions.ClientError, grpc.aio.AioRpcError, OSError) as err:
            raise Unavailable(f"etcd at {self._endpoint} failed: {err}") from err

    async def get(self, key: str) -> Entry | None:
        from aetcd import rpc

        async def go():
            resp = await self._client.kvstub.Range(rpc.RangeRequest(key=self._k(key)), timeout=self._timeout)
            return self._entry(resp.kvs[0]) if resp.kvs else None

        return await self._call(go)

    async def range(self, prefix: str) -> RangeResult:
        from aetcd import rpc

        async def go():
            start = self._k(prefix)
            resp = await self._client.kvstub.Range(
                rpc.RangeRequest(key=start, range_end=_prefix_end(start)), timeout=self._timeout
            )
            return RangeResult([self._entry(kv) for kv in resp.kvs], resp.header.revision)

        return await self._call(go)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return (await self.commit([], [Put(key, value, lease)])).revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        return (await self.commit([], [Delete(key, prefix)])).revision

    def _compare(self, c: Condition):
        from aetcd import rpc

        if isinstance(c, ModRevisionIs):
            return rpc.Compare(
                key=self._k(c.key),
                result=rpc.Compare.EQUAL,
                target=rpc.Compare.MOD,
                mod_revision=c.revision,
            )
        return rpc.Compare(
            key=self._k(c.key), result=rpc.Compare.EQUAL, target=rpc.Compare.VALUE, value=c.value
        )

    def _op(self, op: Op):
        from aetcd import rpc

        if isinstance(op, Put):
            return rpc.RequestOp(
                request_put=rpc.PutRequest(key=self._k(op.key), value=op.value, lease=op.lease)
            )
        start = self._k(op.key)
        return rpc.RequestOp(
            request_delete_range=rpc.DeleteRangeRequest(
                key=start, range_end=_prefix_end(start) if op.prefix else b""
            )
        )

    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Op]) -> TxnResult:
        from aetcd import rpc

        async def go():
            resp = await self._client.kvstub.Txn(
                rpc.TxnRequest(
                    compare=[self._compare(c) for c in conditions],
                    success=[self._op(o) for o in ops],
                ),
                timeout=self._timeout,
            )
            return TxnResult(resp.succeeded, resp.header.revision)

        return await self._call(go)

    async def grant_lease(self, ttl_seconds: int) -> int:
        from aetcd import rpc

        async def go():
            resp = await self._client.leasestub.LeaseGrant(
                rpc.LeaseGrantRequest(TTL=ttl_seconds), timeout=self._timeout
            )
            return resp.ID

        return await self._call(go)

    async def keep_alive(self, lease: int) -> int:
        async def go():
            reply = await self._client.refresh_lease(lease)
            return int(reply.TTL) if reply is not None else 0

        return await self._call(go)

    async def revoke_lease(self, lease: int) -> None:
        import aetcd

        async def go():
            with contextlib.suppress(aetcd.exceptions.ClientError):
                await self._client.revoke_lease(lease)

        await self._call(go)

    async def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        import grpc
        from aetcd import rpc

        await self._call(self._client.connect)
        start = self._k(prefix)
        create = rpc.WatchRequest(
            create_request=rpc.WatchCreateRequest(
                key=start,
                range_end=_prefix_end(start),
                start_revision=start_revision,
                progress_notify=True,
            )
        )
        done = asyncio.Event()

        async def requests():
            yield create
            await done.wait()

        call = rpc.WatchStub(self._client.channel).Watch(requests())
        try:
            async for resp in call:
                if resp.compact_revision:
                    raise Compacted(resp.compact_revision)
                if resp.canceled:
                    raise Unavailable(f"etcd cancelled the watch: {resp.cancel_reason}")
                events = [
                    Event(
                        "put" if ev.type == rpc.Event.PUT else "delete",
                        self._strip(ev.kv.key),
                        ev.kv.value,
                        ev.kv.mod_revision,
                    )
                    for ev in resp.events
                ]
                if events or not resp.created:
                    yield WatchBatch(events, resp.header.revision)
        except grpc.aio.AioRpcError as err:
            raise Unavailable(f"etcd watch at {self._endpoint} failed: {err.details()}") from err
        finally:
            done.set()
            call.cancel()

    async def close(self) -> None:
        await self._client.close()


@dataclass
class _Lease:
    ttl: int
    deadline: float
    keys: set[str] = field(default_factory=set)


class MemoryStore:
    """An in-memory :class:`Store` with etcd's revision semantics, for unit tests.

    Leases expire by the loop clock when ``keep_alive`` or a read notices
    them; ``expire_lease`` lets a test end one at once. History is kept in
    full unless ``compact`` is called.
    """

    def __init__(self) -> None:
        self._data: dict[str, Entry] = {}
        self._revision = 1
        self._history: list[Event] = []
        self._compacted = 0
        self._leases: dict[int, _Lease] = {}
        self._next_lease = 1000
        self._changed = asyncio.Condition()

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _expire(self) -> list[Op]:
        now = self._now()
        ops: list[Op] = []
        for lid, lease in list(self._leases.items()):
            if lease.deadline <= now:
                ops.extend(Delete(k) for k in lease.keys)
                del self._leases[lid]
        return ops

    async def _apply(self, ops: Sequence[Op]) -> int:
        if not ops:
            return self._revision
        self._revision += 1
        rev = self._revision
        for op in ops:
            if isinstance(op, Put):
                old = self._data.get(op.key)
                self._data[op.key] = Entry(
                    op.key, op.value, rev, old.create_revision if old else rev, op.lease
                )
                if op.lease:
                    self._leases[op.lease].keys.add(op.key)
                self._history.append(Event("put", op.key, op.value, rev))
            else:
                keys = (
                    [k for k in self._data if k.startswith(op.key)]
                    if op.prefix
                    else [op.key]
                    if op.key in self._data
                    else []
                )
                for k in sorted(keys):
                    del self._data[k]
                    self._history.append(Event("delete", k, b"", rev))
        async with self._changed:
            self._changed.notify_all()
        return rev

    async def _sweep(self) -> None:
        ops = self._expire()
        if ops:
            await self._apply(ops)

    async def get(self, key: str) -> Entry | None:
        await self._sweep()
        return self._data.get(key)

    async def range(self, prefix: str) -> RangeResult:
        await self._sweep()
        entries = [e for k, e in sorted(self._data.items()) if k.startswith(prefix)]
        return RangeResult(entries, self._revision)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return (await self.commit([], [Put(key, value, lease)])).revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        return (await self.commit([], [Delete(key, prefix)])).revision

    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Op]) -> TxnResult:
        await self._sweep()
        for c in conditions:
            cur = self._data.get(c.key)
            if isinstance(c, ModRevisionIs):
                ok = (cur.mod_revision if cur else 0) == c.revision
            else:
                ok = cur is not None and cur.value == c.value
            if not ok:
                return TxnResult(False, self._revision)
        for op in ops:
            if isinstance(op, Put) and op.lease and op.lease not in self._leases:
                raise Unavailable(f"lease {op.lease} not found")
        return TxnResult(True, await self._apply(ops))

    async def grant_lease(self, ttl_seconds: int) -> int:
        self._next_lease += 1
        self._leases[self._next_lease] = _Lease(ttl_seconds, self._now() + ttl_seconds)
        return self._next_lease

    async def keep_alive(self, lease: int) -> int:
        await self._sweep()
        held = self._leases.get(lease)
        if held is None:
            return 0
        held.deadline = self._now() + held.ttl
        return held.ttl

    async def revoke_lease(self, lease: int) -> None:
        held = self._leases.pop(lease, None)
        if held:
            await self._apply([Delete(k) for k in held.keys if k in self._data])

    async def expire_lease(self, lease: int) -> None:
        await self.revoke_lease(lease)

    async def compact(self, revision: int) -> None:
        self._compacted = revision
        self._history = [e for e in self._history if e.revision >= revision]

    async def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        if start_revision and start_revision < self._compacted:
            raise Compacted(self._compacted)
        seen = (start_revision or self._revision + 1) - 1
        while True:
            events = [e for e in self._history if e.revision > seen and e.key.startswith(prefix)]
            if events:
                seen = self._revision
                yield WatchBatch(events, seen)
            else:
                seen = self._revision
            async with self._changed:
                await self._changed.wait_for(functools.partial(self._newer_than, seen))

    def _newer_than(self, revision: int) -> bool:
        return self._revision > revision

    async def close(self) -> None:
        return None
