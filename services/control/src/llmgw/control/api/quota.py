"""QuotaService: the leader's per-key buckets, shared by every router.

The design is written down in the router's :mod:`llmgw.router.quota`; this
is the leader's half. Each router opens one ``Sync`` stream and sends a
report (what each key consumed there since its last report) every sync
interval; the leader debits its buckets (:class:`QuotaLedger`) and answers
each report with that router's grant of every key whose bucket is not
full, and the number of routers syncing now (see :class:`QuotaLedger` for
how a grant is computed).

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
- Only routers may call Sync (api/auth.py), and a report is checked whole
  before anything of it is applied: at most :data:`MAX_USAGE_ENTRIES` keys,
  counts non-negative and at most :data:`MAX_REQUESTS` / :data:`MAX_TOKENS`
  (far above what one router serves between two syncs, far below what
  would overflow a bucket). A report outside them ends the stream with
  INVALID_ARGUMENT and changes nothing.
- One stream per router identity (its certificate's name; in plaintext
  mode, the router_id it reports): a new stream from the same router
  replaces the old one, so opening many streams does not shrink the other
  routers' shares.
- A report is applied once: the leader remembers, per router identity, the
  last (incarnation, sequence) applied in this term, and a report sent
  again (its answer was lost, the router re-sends it until answered) is
  answered without being counted again.
- Usage per owner: a report also carries what each owner path's keys
  consumed, by model (``owner_usage``); it is added to the leader's book
  (:mod:`..state.ownerrequests`) once, with the report, under the same
  (incarnation, sequence) rule, and bounded as the keys' usage is.
- Owner budgets (the cluster settings' quotas with requests_per_minute or
  tokens_per_minute) are buckets like keys', under ``owner:<path>`` ids:
  routers spend them for every request of a key that owner path owns, and
  report and receive them as they do keys. Each view also lists the owner
  limits, so a router learns them with no other stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import grpc
from google.protobuf.message import DecodeError

from llmgw.common.bucket import TokenBucket
from llmgw.common.owners import BUDGET_PREFIX, is_owner_path
from llmgw.v1 import keys_pb2, keys_pb2_grpc

from ..state.ownerrequests import OwnerRequests
from .auth import caller

log = logging.getLogger("llmgw.control.api.quota")


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


MAX_USAGE_ENTRIES = 10_000
MAX_REQUESTS = 10**9
MAX_TOKENS = 10**12
MAX_KEY_ID_CHARS = 128
MAX_NAME_CHARS = 512


def report_problem(report: keys_pb2.QuotaReport) -> str:
    """Why a report cannot be applied; empty when it can."""
    if len(report.usage) > MAX_USAGE_ENTRIES:
        return f"{len(report.usage)} usage entries; at most {MAX_USAGE_ENTRIES} per report"
    for u in report.usage:
        if not 0 < len(u.key_id) <= MAX_KEY_ID_CHARS:
            return f"key_id of {len(u.key_id)} characters; 1 to {MAX_KEY_ID_CHARS}"
        if not 0 <= u.requests <= MAX_REQUESTS:
            return f"key {u.key_id}: requests {u.requests} is outside [0, {MAX_REQUESTS}]"
        if not 0 <= u.tokens <= MAX_TOKENS:
            return f"key {u.key_id}: tokens {u.tokens} is outside [0, {MAX_TOKENS}]"
    if len(report.owner_usage) > MAX_USAGE_ENTRIES:
        return f"{len(report.owner_usage)} owner usage entries; at most {MAX_USAGE_ENTRIES} per report"
    for o in report.owner_usage:
        if not is_owner_path(o.owner):
            return f"owner usage for {o.owner[:64]!r}, which is not an owner path (org/team/project)"
        if not 0 < len(o.model) <= MAX_NAME_CHARS:
            return f"owner usage with a model name of {len(o.model)} characters; 1 to {MAX_NAME_CHARS}"
        if not (0 <= o.requests <= MAX_REQUESTS and 0 <= o.tokens <= MAX_TOKENS):
            return f"owner {o.owner}: requests {o.requests} or tokens {o.tokens} out of bounds"
    return ""


def _bucket(per_minute: int, now: float) -> TokenBucket | None:
    return TokenBucket.full(per_minute, per_minute / 60.0, now) if per_minute > 0 else None


@dataclass
class _Key:
    limits: tuple[int, int]
    buckets: tuple[TokenBucket | None, TokenBucket | None]
    # What each router (by stream) may still spend of its last grant: [requests, tokens].
    granted: dict[int, list[float]] = field(default_factory=dict)


class QuotaLedger:
    """Every limited key's global buckets and the grants made from them. Pure; time passed in.

    A router's grant for a key is what is left in the bucket after the
    unspent grants of the *other* routers are set aside, divided by the
    number of routers: ``(level - sum(others' unspent)) / N``. So the grants
    outstanding never add up to more than the level, whatever the order in
    which routers sync, and a router that spends nothing keeps only its
    1/N-th reserved. A report takes what a router spent off both the bucket
    and its unspent grant. A key not tracked here is full, and every router
    holds its implicit grant of capacity / N.
    """

    def __init__(self, keys: KeyItems, owners: Callable[[], Mapping[str, tuple[int, int]]] = dict):
        self._keys = keys
        # Owner path -> (requests, tokens) per minute: the owner scopes' budgets.
        self._owners = owners
        self._limits: dict[str, tuple[bytes, int, int]] = {}
        self._tracked: dict[str, _Key] = {}
        self._streams: set[int] = set()
        # Router identity -> (incarnation, sequence) of the last report applied.
        self._applied: dict[str, tuple[str, int]] = {}

    def first_time(self, router: str, report: keys_pb2.QuotaReport) -> bool:
        """Whether ``report`` was not applied yet (and remember it was, from now on)."""
        if not report.incarnation:
            return True
        last = self._applied.get(router)
        if last is not None and last[0] == report.incarnation and report.sequence <= last[1]:
            return False
        self._applied[router] = (report.incarnation, report.sequence)
        return True

    @property
    def routers(self) -> int:
        return len(self._streams)

    def join(self, stream: int) -> None:
        self._streams.add(stream)

    def leave(self, stream: int) -> None:
        """A router went away: its unspent grants are free again."""
        self._streams.discard(stream)
        for key in self._tracked.values():
            key.granted.pop(stream, None)

    def limits(self, key_id: str) -> tuple[int, int] | None:
        if key_id.startswith(BUDGET_PREFIX):
            return self._owners().get(key_id.removeprefix(BUDGET_PREFIX))
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

    def apply(self, stream: int, usage: Iterable[keys_pb2.KeyUsage], now: float) -> None:
        """One router's report: debit the buckets and that router's unspent grants."""
        for u in usage:
            limits = self.limits(u.key_id)
            if limits is None or limits == (0, 0):
                continue
            key = self._tracked.get(u.key_id)
            if key is None or key.limits != limits:
                key = self._track(u.key_id, limits, now)
            spent = (float(u.requests), float(u.tokens))
            for bucket, amount in zip(key.buckets, spent, strict=True):
                if bucket is not None:
                    bucket.take(amount, now)
            grant = key.granted.get(stream)
            if grant is not None:
                grant[0] -= spent[0]
                grant[1] -= spent[1]

    def _track(self, key_id: str, limits: tuple[int, int], now: float) -> _Key:
        # Until now every router held the implicit grant of a full bucket.
        n = max(1, len(self._streams))
        key = _Key(
            limits,
            (_bucket(limits[0], now), _bucket(limits[1], now)),
            {s: [limits[0] / n, limits[1] / n] for s in self._streams},
        )
        self._tracked[key_id] = key
        return key

    def view(self, stream: int, now: float) -> list[keys_pb2.KeyBudget]:
        """New grants for ``stream``, one per tracked key; forgets keys that are full again."""
        n = max(1, len(self._streams))
        out = []
        for key_id in list(self._tracked):
            key = self._tracked[key_id]
            full = all(b is None or b.is_full(now) for b in key.buckets)
            if full or self.limits(key_id) is None:
                del self._tracked[key_id]
                continue
            grant = [0.0, 0.0]
            for i, bucket in enumerate(key.buckets):
                if bucket is None:
                    continue
                others = sum(max(0.0, g[i]) for s, g in key.granted.items() if s != stream)
                grant[i] = (bucket.refill(now) - others) / n
            key.granted[stream] = list(grant)
            out.append(keys_pb2.KeyBudget(key_id=key_id, requests=grant[0], tokens=grant[1]))
        return out


class QuotaServicer(keys_pb2_grpc.QuotaServiceServicer):
    def __init__(
        self,
        keys: KeyItems,
        leadership: LeaderDirectory,
        clock: Callable[[], float],
        owners: Callable[[], Mapping[str, tuple[int, int]]] = dict,
        owner_requests: OwnerRequests | None = None,
        wall: Callable[[], float] = time.time,
    ):
        self._keys = keys
        self._leadership = leadership
        self._clock = clock
        self._owners = owners
        # Requests and tokens per owner path and model (OwnerService reads it).
        self.owner_requests = owner_requests if owner_requests is not None else OwnerRequests()
        self._wall = wall
        self._ledger = QuotaLedger(keys, owners)
        self._term: object | None = None
        self._streams = itertools.count(1)
        # Router identity -> the task serving its stream and its context (one stream each).
        self._by_router: dict[str, tuple[asyncio.Task, grpc.aio.ServicerContext]] = {}

    def _current_ledger(self) -> QuotaLedger | None:
        """The ledger of this term (a fresh one per term); None when not leading."""
        term = self._leadership.term
        if term is None:
            return None
        if term is not self._term:
            self._term = term
            self._ledger = QuotaLedger(self._keys, self._owners)
        return self._ledger

    async def _redirect(self) -> keys_pb2.QuotaView:
        return keys_pb2.QuotaView(leader_address=await self._leadership.leader_address())

    async def Sync(  # noqa: N802 - gRPC method name
        self, request_iterator: AsyncIterator[keys_pb2.QuotaReport], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[keys_pb2.QuotaView]:
        joined = self._current_ledger()
        if joined is None:
            # The router's report is read (and dropped: a standby counts nothing) before the
            # redirect ends the call. Ended first, the call races the router's write of it,
            # which then fails with INTERNAL instead of reading where the leader is.
            with contextlib.suppress(StopAsyncIteration):
                await anext(aiter(request_iterator))
            yield await self._redirect()
            return
        stream = next(self._streams)
        me = caller()
        identity = me.name if me is not None and me.verified else ""
        if identity:
            await self._replace(identity, context)
        joined.join(stream)
        who = identity or context.peer()
        try:
            async for report in request_iterator:
                problem = report_problem(report)
                if problem:
                    log.warning("quota report of %s refused: %s", who, problem)
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"QuotaReport: {problem}")
                if not identity:
                    who = report.router_id or who
                ledger = self._current_ledger()
                if ledger is not joined:
                    log.info("quota sync of %s: the term it joined is over; redirecting", who)
                    yield await self._redirect()
                    return
                now = self._clock()
                if ledger.first_time(identity or report.router_id or who, report):
                    ledger.apply(stream, report.usage, now)
                    self._count(report.owner_usage)
                owners = [
                    keys_pb2.OwnerLimits(owner=o, requests_per_minute=r, tokens_per_minute=t)
                    for o, (r, t) in sorted(self._owners().items())
                ]
                yield keys_pb2.QuotaView(
                    budgets=ledger.view(stream, now), routers=ledger.routers, leader=True, owners=owners
                )
        finally:
            joined.leave(stream)
            if identity and self._by_router.get(identity, (None,))[0] is asyncio.current_task():
                del self._by_router[identity]
            log.info("quota sync of %s closed", who)

    def _count(self, usage: Iterable[keys_pb2.OwnerModelUsage]) -> None:
        wall = self._wall()
        book = self.owner_requests.term(self._leadership.term, wall)
        for u in usage:
            book.add(u.owner, u.model, u.requests, u.tokens, wall)

    async def _replace(self, identity: str, context: grpc.aio.ServicerContext) -> None:
        """Make the calling task router ``identity``'s one stream, ending an older one.

        The older call is ended with ALREADY_EXISTS (abort sends the status at
        once, from here), then its task is cancelled so its ``finally`` leaves
        the ledger (a cancelled handler alone would leave its client waiting).
        """
        task = asyncio.current_task()
        assert task is not None
        old = self._by_router.get(identity)
        self._by_router[identity] = (task, context)
        if old is None or old[0].done():
            return
        log.info("quota sync of %s: a newer stream replaces the open one", identity)
        with contextlib.suppress(grpc.aio.AbortError, grpc.aio.UsageError):
            await old[1].abort(
                grpc.StatusCode.ALREADY_EXISTS,
                f"a newer QuotaService.Sync stream of router {identity} replaced this one",
            )
        old[0].cancel()
