"""EtcdStore: the Store over a real etcd cluster, every member of it.

Unary calls go through :class:`~.members.Members` (failover, deadlines).
The watch is the raw Watch RPC, not aetcd's high-level watcher (which hands
events over one at a time and drops the response revision), so a batch is
a whole etcd response -- whole transactions -- and it fails over itself:

- It remembers where it is: the revision after the last event delivered
  (not the response header's revision, which runs ahead of the events
  while a watcher catches up on history), or after the header of an
  eventless progress notification (etcd sends those only to watchers that
  are caught up). A watch from "now" (start revision 0) pins "now" to the
  revision etcd created it at.
- When its member fails, it resumes from there on the next member: no
  event missed, none repeated. If that member has compacted the revision,
  :class:`Compacted` is raised, as for any watch: the caller re-reads.
- A silent stream is probed: after ``2 * member_timeout`` without a
  message it asks etcd for a progress report, and a member that does not
  answer within ``member_timeout`` has failed. So a stopped member is
  noticed by its watches too, not only by unary calls. The answer to a
  probe (watch id -1) only proves the member alive; it moves nothing.
- Watches carry etcd's ``hasleader`` metadata: a member cut off from its
  cluster's leader ends them, so they fail over instead of going quiet.
- After a failure on every member in a row (no message in between), the
  watch raises :class:`Unavailable`, as every Store call does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from typing import Any

import grpc
from aetcd import rpc

from ..config import EtcdSettings, EtcdTls
from ..errors import Unavailable
from ..tasks import cancel_and_wait
from .contract import (
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
from .members import MEMBER_FAILURES, MemberFailed, Members

# etcd's WatchResponse.watch_id for answers to a progress request (clientv3.InvalidWatchID).
PROGRESS_WATCH_ID = -1
# Responses read ahead of the consumer per watch; the reader waits when it is full.
WATCH_QUEUE = 16


def prefix_end(prefix: bytes) -> bytes:
    s = bytearray(prefix)
    for i in reversed(range(len(s))):
        if s[i] < 0xFF:
            s[i] += 1
            return bytes(s[: i + 1])
    return b"\x00"


class EtcdStore:
    """A :class:`~.contract.Store` over a real etcd cluster, failing over between its members."""

    def __init__(
        self,
        endpoints: Sequence[str],
        root: str,
        timeout: float = 5.0,
        *,
        member_timeout: float = 1.0,
        tls: EtcdTls | None = None,
    ):
        self._members = Members(endpoints, timeout=timeout, member_timeout=member_timeout, tls=tls)
        self._root = root.rstrip("/") + "/"

    @classmethod
    def from_settings(cls, settings: EtcdSettings, root: str) -> EtcdStore:
        return cls(
            settings.endpoints,
            root,
            settings.timeout_seconds,
            member_timeout=settings.member_timeout_seconds,
            tls=settings.tls,
        )

    @property
    def root(self) -> str:
        return self._root

    @property
    def endpoint(self) -> str:
        """The member calls go to now."""
        return self._members.endpoint(self._members.current)

    def _k(self, key: str) -> bytes:
        return (self._root + key).encode()

    def _strip(self, key: bytes) -> str:
        return key.decode()[len(self._root) :]

    def _entry(self, kv: Any) -> Entry:  # an aetcd KeyValue (aetcd has no types)
        return Entry(
            key=self._strip(kv.key),
            value=kv.value,
            mod_revision=kv.mod_revision,
            create_revision=kv.create_revision,
            lease=kv.lease,
        )

    async def _range(self, key: bytes, range_end: bytes = b"") -> rpc.RangeResponse:
        request = rpc.RangeRequest(key=key, range_end=range_end)
        return await self._members.call(
            "range", lambda ch, t: rpc.KVStub(ch).Range(request, timeout=t), repeatable=True
        )

    async def get(self, key: str) -> Entry | None:
        resp = await self._range(self._k(key))
        return self._entry(resp.kvs[0]) if resp.kvs else None

    async def range(self, prefix: str) -> RangeResult:
        start = self._k(prefix)
        resp = await self._range(start, prefix_end(start))
        return RangeResult([self._entry(kv) for kv in resp.kvs], resp.header.revision)

    async def put(self, key: str, value: bytes, lease: int = 0) -> int:
        return (await self.commit([], [Put(key, value, lease)])).revision

    async def delete(self, key: str, prefix: bool = False) -> int:
        return (await self.commit([], [Delete(key, prefix)])).revision

    def _compare(self, c: Condition) -> rpc.Compare:
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

    def _op(self, op: Op) -> rpc.RequestOp:
        if isinstance(op, Put):
            return rpc.RequestOp(
                request_put=rpc.PutRequest(key=self._k(op.key), value=op.value, lease=op.lease)
            )
        start = self._k(op.key)
        return rpc.RequestOp(
            request_delete_range=rpc.DeleteRangeRequest(
                key=start, range_end=prefix_end(start) if op.prefix else b""
            )
        )

    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Op]) -> TxnResult:
        request = rpc.TxnRequest(
            compare=[self._compare(c) for c in conditions], success=[self._op(o) for o in ops]
        )
        resp = await self._members.call(
            "transaction", lambda ch, t: rpc.KVStub(ch).Txn(request, timeout=t), repeatable=False
        )
        return TxnResult(resp.succeeded, resp.header.revision)

    async def grant_lease(self, ttl_seconds: int) -> int:
        # Repeatable: a lease granted by an attempt whose answer was lost expires on its own.
        request = rpc.LeaseGrantRequest(TTL=ttl_seconds)
        resp = await self._members.call(
            "lease grant", lambda ch, t: rpc.LeaseStub(ch).LeaseGrant(request, timeout=t), repeatable=True
        )
        return int(resp.ID)

    async def keep_alive(self, lease: int) -> int:
        async def attempt(ch: grpc.aio.Channel, seconds: float) -> int:
            call = rpc.LeaseStub(ch).LeaseKeepAlive(
                iter([rpc.LeaseKeepAliveRequest(ID=lease)]), timeout=seconds
            )
            try:
                async for reply in call:
                    return int(reply.TTL)
            finally:
                call.cancel()
            raise MemberFailed("the keep-alive stream ended without an answer")

        return await self._members.call("lease keep-alive", attempt, repeatable=True)

    async def revoke_lease(self, lease: int) -> None:
        async def attempt(ch: grpc.aio.Channel, seconds: float) -> None:
            try:
                await rpc.LeaseStub(ch).LeaseRevoke(rpc.LeaseRevokeRequest(ID=lease), timeout=seconds)
            except grpc.aio.AioRpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:  # already gone: what revoking wants
                    raise

        await self._members.call("lease revoke", attempt, repeatable=True)

    async def compact(self, revision: int) -> None:
        """Drop history before ``revision`` (operators and tests; llmgw itself never compacts)."""
        request = rpc.CompactionRequest(revision=revision, physical=True)
        await self._members.call(
            "compaction", lambda ch, t: rpc.KVStub(ch).Compact(request, timeout=t), repeatable=True
        )

    async def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]:
        start = self._k(prefix)
        end = prefix_end(start)
        position = start_revision  # the next revision to deliver; 0 until etcd pins "now"
        failures: list[str] = []
        while len(failures) < self._members.count:
            i = self._members.current
            stream = _WatchStream(self._members.channel(i), self._members.member_timeout)
            try:
                async with contextlib.aclosing(stream.responses(start, end, position)) as responses:
                    async for resp in responses:
                        failures.clear()
                        if resp.created and not position:
                            position = resp.header.revision + 1
                        events = [
                            Event(
                                "put" if ev.type == rpc.Event.PUT else "delete",
                                self._strip(ev.kv.key),
                                ev.kv.value,
                                ev.kv.mod_revision,
                            )
                            for ev in resp.events
                        ]
                        if events:
                            position = events[-1].revision + 1
                        elif not resp.created:
                            position = max(position, resp.header.revision + 1)
                        else:
                            continue
                        yield WatchBatch(events, position - 1)
            except MemberFailed as err:
                failures.append(f"{self._members.endpoint(i)}: {err}")
                self._members.failed(i, f"watch: {err}")
        raise Unavailable(f"etcd watch failed on every member: {'; '.join(failures)}")

    async def close(self) -> None:
        await self._members.close()


class _WatchStream:
    """One Watch stream on one member: its responses, with the liveness probe; MemberFailed when it fails."""

    def __init__(self, channel: grpc.aio.Channel, member_timeout: float):
        self._channel = channel
        self._timeout = member_timeout

    async def responses(
        self, start: bytes, end: bytes, revision: int
    ) -> AsyncGenerator[rpc.WatchResponse, None]:
        call = rpc.WatchStub(self._channel).Watch(metadata=(("hasleader", "true"),))
        queue: asyncio.Queue[rpc.WatchResponse | BaseException | None] = asyncio.Queue(WATCH_QUEUE)
        reader = asyncio.create_task(self._read(call, queue))
        try:
            create = rpc.WatchCreateRequest(
                key=start, range_end=end, start_revision=revision, progress_notify=True
            )
            await self._write(call, rpc.WatchRequest(create_request=create))
            while True:
                try:
                    async with asyncio.timeout(2 * self._timeout):
                        item = await queue.get()
                except TimeoutError:
                    await self._write(call, rpc.WatchRequest(progress_request=rpc.WatchProgressRequest()))
                    try:
                        async with asyncio.timeout(self._timeout):
                            item = await queue.get()
                    except TimeoutError:
                        raise MemberFailed(f"no answer within {self._timeout:.1f}s") from None
                if item is None:
                    raise MemberFailed("the watch stream ended")
                if isinstance(item, grpc.aio.AioRpcError):
                    if item.code() in MEMBER_FAILURES:
                        raise MemberFailed(item.details() or item.code().name)
                    raise Unavailable(f"etcd watch failed: {item.details()}")
                if isinstance(item, BaseException):
                    raise item
                if item.compact_revision:
                    raise Compacted(item.compact_revision)
                if item.canceled:
                    raise MemberFailed(f"etcd cancelled the watch: {item.cancel_reason}")
                if item.watch_id == PROGRESS_WATCH_ID and not item.events:
                    continue  # the answer to a probe: alive, nothing more
                yield item
        finally:
            call.cancel()
            await cancel_and_wait(reader)

    async def _write(self, call: Any, request: rpc.WatchRequest) -> None:
        try:
            async with asyncio.timeout(self._timeout):
                await call.write(request)
        except TimeoutError:
            raise MemberFailed(f"could not send to the member within {self._timeout:.1f}s") from None
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as err:
            raise MemberFailed(f"the watch stream broke: {err}") from None

    @staticmethod
    async def _read(call: Any, queue: asyncio.Queue[Any]) -> None:
        try:
            while True:
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    await queue.put(None)
                    return
                await queue.put(resp)
        except asyncio.CancelledError:
            raise
        except BaseException as err:  # handed to the consumer, which decides
            await queue.put(err)
