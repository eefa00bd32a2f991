"""MemoryStore: a genuine in-memory Store with etcd's revision semantics, for unit tests."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field

from ..errors import Unavailable
from .contract import (
    ETCD_MAX_TXN_OPS,
    Compacted,
    Condition,
    Delete,
    Entry,
    Event,
    ModRevisionIs,
    Op,
    Put,
    RangeResult,
    TxnResult,
    WatchBatch,
)


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
        if len(ops) > ETCD_MAX_TXN_OPS:
            # As etcd refuses it: a writer must split its writes (contract.batches).
            raise Unavailable(
                "memory store refused transaction: etcdserver: too many operations in txn request"
            )
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
