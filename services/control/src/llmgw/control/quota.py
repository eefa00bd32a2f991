"""QuotaService: the leader's per-key buckets, shared by every router.

The design is written down in the router's :mod:`llmgw.router.quota`; this
is the leader's half. Each router opens one ``Sync`` stream and sends a
report (what each key consumed there since its last report) every sync
interval; the leader debits its buckets (:class:`QuotaLedger`) and answers
each report with the level of every bucket that is not full and the number
of routers syncing now, so each router takes its share of what is left.

Decisions:

- Only the leader aggregates, so there is one set of buckets per cluster. A
  standby answers with the leader's address and ends the stream; routers
  go there. A leader that loses its term ends its streams the same way, and
  a new term starts from full buckets (usage is soft state, never written
  to etcd).
- Limits come from this control plane's mirror of ``keys/`` (the keys watch
  hub), so a revoked key's bucket is dropped and a key unknown here (not yet
  mirrored) is ignored rather than guessed.
- Full buckets are forgotten: memory is bounded by the keys used in the
  last minute.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from llmgw.common.bucket import TokenBucket
from llmgw.v1 import keys_pb2, keys_pb2_grpc

log = logging.getLogger("llmgw.control.quota")


class KeyItems(Protocol):
    """The mirrored ``keys/`` prefix: key id -> serialized ApiKey."""

    @property
    def items(self) -> Mapping[str, bytes]: ...


class LeaderDirectory(Protocol):
    @property
    def is_leader(self) -> bool: ...
    @property
    def term(self) -> object | None: ...
    async def leader_address(self) -> str: ...


def _bucket(per_minute: int, now: float) -> TokenBucket | None:
    return TokenBucket.full(per_minute, per_minute / 60.0, now) if per_minute > 0 else None


class QuotaLedger:
    """Every limited key's global buckets (requests, tokens). Pure; time passed in."""

    def __init__(self, keys: KeyItems):
        self._keys = keys
        self._limits: dict[str, tuple[bytes, int, int]] = {}
        self._buckets: dict[str, tuple[TokenBucket | None, TokenBucket | None]] = {}

    def limits(self, key_id: str) -> tuple[int, int] | None:
        raw = self._keys.items.get(key_id)
        if raw is None:
            self._limits.pop(key_id, None)
            return None
        cached = self._limits.get(key_id)
        if cached is None or cached[0] is not raw:
            try:
                key = keys_pb2.ApiKey.FromString(raw)
            except DecodeError:
                return None
            cached = (raw, key.requests_per_minute, key.tokens_per_minute)
            self._limits[key_id] = cached
        return cached[1], cached[2]

    def apply(self, usage: Iterable[keys_pb2.KeyUsage], now: float) -> None:
        for u in usage:
            limits = self.limits(u.key_id)
            if limits is None:
                continue
            buckets = self._buckets.get(u.key_id)
            if buckets is None or _changed(buckets, limits):
                buckets = (_bucket(limits[0], now), _bucket(limits[1], now))
                self._buckets[u.key_id] = buckets
            requests, tokens = buckets
            if requests is not None:
                requests.take(u.requests, now)
            if tokens is not None:
                tokens.take(u.tokens, now)

    def budgets(self, now: float) -> list[keys_pb2.KeyBudget]:
        out = []
        for key_id in list(self._buckets):
            requests, tokens = self._buckets[key_id]
            full = (requests is None or requests.is_full(now)) and (tokens is None or tokens.is_full(now))
            if full or self.limits(key_id) is None:
                del self._buckets[key_id]
                continue
            out.append(
                keys_pb2.KeyBudget(
                    key_id=key_id,
                    requests=requests.level if requests is not None else 0.0,
                    tokens=tokens.level if tokens is not None else 0.0,
                )
            )
        return out


def _changed(buckets: tuple[TokenBucket | None, TokenBucket | None], limits: tuple[int, int]) -> bool:
    return any(
        (b.capacity if b is not None else 0) != limit for b, limit in zip(buckets, limits, strict=True)
    )


class QuotaServicer(keys_pb2_grpc.QuotaServiceServicer):
    def __init__(self, keys: KeyItems, leadership: LeaderDirectory, clock: Callable[[], float]):
        self._keys = keys
        self._leadership = leadership
        self._clock = clock
        self._ledger = QuotaLedger(keys)
        self._term: object | None = None
        self._routers = 0

    @property
    def routers(self) -> int:
        return self._routers

    def _current_ledger(self) -> QuotaLedger | None:
        """The ledger of this term (a fresh one per term); None when not leading."""
        term = self._leadership.term
        if term is None:
            return None
        if term is not self._term:
            self._term = term
            self._ledger = QuotaLedger(self._keys)
        return self._ledger

    async def _redirect(self) -> keys_pb2.QuotaView:
        return keys_pb2.QuotaView(leader_address=await self._leadership.leader_address())

    async def Sync(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[keys_pb2.QuotaReport], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[keys_pb2.QuotaView]:
        if self._current_ledger() is None:
            yield await self._redirect()
            return
        self._routers += 1
        who = context.peer()
        try:
            async for report in request_iterator:
                who = report.router_id or who
                ledger = self._current_ledger()
                if ledger is None:
                    log.info("quota sync of %s: no longer leading; redirecting", who)
                    yield await self._redirect()
                    return
                now = self._clock()
                ledger.apply(report.usage, now)
                yield keys_pb2.QuotaView(budgets=ledger.budgets(now), routers=self._routers, leader=True)
        finally:
            self._routers -= 1
            log.info("quota sync of %s closed", who)
