"""Per-key quotas on one router: its share of the cluster's budget.

A key's ``requests_per_minute`` and ``tokens_per_minute`` are token buckets
that hold one minute's worth and refill at the limit / 60 per second: a key
idle for a minute may spend that minute's budget at once, and its sustained
rate is the limit. The budget is the cluster's, not each router's.

Decision: the leader holds the true buckets; every router holds a *share*
granted by the leader. Each router reports what each key consumed
(requests, tokens) every sync interval (``quota.sync_interval_seconds``,
0.5 s by default) over ``QuotaService.Sync``; the leader debits its buckets
and answers with this router's grant of every key whose bucket is not full:
the level left after the other routers' unspent grants are set aside,
divided by the number of routers syncing, N (``control/api/quota.py``). The
router then sets its share of the key to that grant minus what it consumed
since the report left, refilling at rate / N, capped at capacity / N; a key
not listed is full and its share is capacity / N. So:

- the grants outstanding never add up to more than the leader's level,
  whatever order the routers sync in, so the routers together admit about
  the budget plus what refills meanwhile, wherever the traffic lands;
- a key whose traffic all lands on one router still gets its full sustained
  rate (the others' grants stay small and the busy router's is renewed
  every interval), but its one-minute burst is spread over a few
  intervals;
- nothing is written to etcd: usage is soft state, rebuilt within an
  interval. After a leader change the new leader's buckets start full, so a
  key can spend one burst again;
- cut off from the leader, a router keeps its share (refilling at rate / N
  with the N it last saw), so the cluster still holds the limit as long as
  traffic is spread evenly; a router that never synced assumes it is alone.

Admission: a request is admitted while its key's request share holds one
request (or, when the share is smaller than one, the whole share) and its
token share is above zero. It is charged one request and an estimate of
its prompt tokens (a quarter of its body bytes) at once, and the difference
to the real count when it ends (the engine's ``usage``, else the estimate
plus the streamed chunks counted). The token share can therefore go
negative (debt), down to one minute's budget, and ``Retry-After`` says when
the request would be admitted. With N routers a burst can overshoot by at
most about one request per router per interval (shares are rounded up to
whole requests); the long-run rate holds, because the debt is the
leader's.

Owners: a key whose ``owner`` is an owner path (``acme/search``) also
spends the request and token budgets the cluster settings give that path
and its ancestors (``quotas``). Each is one more share, under the id
``owner:<path>``, granted, reported and refilled exactly as a key's; the
view carries the owner limits, so a router learns them from the leader.
A request needs room in every share it spends and is charged to all of
them; a refusal names the owner whose budget ran out.

Usage per owner: every request of a key whose owner is an owner path is
also tallied by (owner, model) with the tokens it used, limited or not,
and the tally travels with each report (``owner_usage``), once, under the
report's (incarnation, sequence): the leader's usage per owner (``llmgw
usage``). At most :data:`MAX_OWNER_SERIES` pairs wait unsent; usage of a
pair beyond them is dropped and counted in :attr:`Quotas.owner_usage_dropped`.

Not thread-safe; one event loop owns it. Time is passed in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.common.bucket import TokenBucket
from llmgw.common.owners import BUDGET_PREFIX, is_owner_path, scopes

# Debt is capped at this many minutes' budget.
DEBT_MINUTES = 1.0
# Tokens a share must hold to admit a request (its cost is known only later).
TOKENS_IN_HAND = 1e-9
MAX_RETRY_AFTER = 3600
# (owner, model) pairs waiting for the next report; the leader takes at most 10000 per report.
MAX_OWNER_SERIES = 10_000


@dataclass(frozen=True)
class KeyLimits:
    requests_per_minute: int = 0
    tokens_per_minute: int = 0

    @property
    def limited(self) -> bool:
        return self.requests_per_minute > 0 or self.tokens_per_minute > 0


@dataclass(frozen=True)
class Refusal:
    """Why a request was refused: which limit, and when to retry."""

    dimension: str  # "requests" or "tokens"
    limit: int
    retry_after: int
    # The owner path whose budget refused it; "": the key's own limit.
    owner: str = ""


def share_bucket(per_minute: int, grant: float, routers: int, now: float) -> TokenBucket:
    """This router's share of a key's bucket, starting at ``grant``."""
    n = max(1, routers)
    capacity = per_minute / n
    return TokenBucket(
        capacity=capacity,
        rate=per_minute / 60.0 / n,
        level=max(-DEBT_MINUTES * capacity, min(capacity, grant)),
        at=now,
        floor=-DEBT_MINUTES * capacity,
    )


@dataclass
class _KeyShare:
    limits: KeyLimits
    requests: TokenBucket | None
    tokens: TokenBucket | None
    # Consumed since the last report: (requests, tokens).
    unsent: list[float] = field(default_factory=lambda: [0.0, 0.0])

    def buckets(self) -> tuple[tuple[str, int, TokenBucket | None], ...]:
        return (
            ("requests", self.limits.requests_per_minute, self.requests),
            ("tokens", self.limits.tokens_per_minute, self.tokens),
        )


class Quotas:
    """The shares of every limited key this router has seen used recently."""

    def __init__(self) -> None:
        self._keys: dict[str, _KeyShare] = {}
        self._routers = 1
        # The last view, for keys first used here after it arrived.
        self._view: Mapping[str, tuple[float, float]] = {}
        self._view_at = 0.0
        # Owner path -> its request and token budgets, from the last view.
        self._owners: Mapping[str, KeyLimits] = {}
        # (owner path, model) -> [requests, tokens] not reported yet.
        self._owner_usage: dict[tuple[str, str], list[int]] = {}
        self.owner_usage_dropped = 0

    def tally(self, owner: str, model: str, tokens: int) -> None:
        """One request of a key of ``owner`` (an owner path) on ``model``, which used ``tokens``."""
        key = (owner, model)
        counts = self._owner_usage.get(key)
        if counts is None:
            if len(self._owner_usage) >= MAX_OWNER_SERIES:
                self.owner_usage_dropped += 1
                return
            counts = self._owner_usage[key] = [0, 0]
        counts[0] += 1
        counts[1] += max(0, tokens)

    def owner_report(self) -> dict[tuple[str, str], tuple[int, int]]:
        """What each (owner, model) consumed since the last report; resets it."""
        out = {k: (v[0], v[1]) for k, v in self._owner_usage.items()}
        self._owner_usage = {}
        return out

    def owner_budgets(self, owner: str) -> tuple[tuple[str, KeyLimits], ...]:
        """(budget id, limits) of every scope of ``owner`` with a budget; () for free text or none."""
        if not self._owners or not owner or not is_owner_path(owner):
            return ()
        found = ((s, self._owners.get(s)) for s in scopes(owner))
        return tuple((BUDGET_PREFIX + s, lim) for s, lim in found if lim is not None and lim.limited)

    @property
    def routers(self) -> int:
        """N from the last view: routers sharing each budget."""
        return self._routers

    def _share(self, key_id: str, limits: KeyLimits, now: float) -> _KeyShare:
        share = self._keys.get(key_id)
        if share is None or share.limits != limits:
            n = self._routers
            # Others may have spent this key's budget already: start from the
            # leader's last grant when it listed the key, refilled since.
            known = self._view.get(key_id)
            at = self._view_at if known is not None else now
            requests, tokens = known or _full_grant(limits, n)
            share = _KeyShare(
                limits,
                _level(limits.requests_per_minute, requests, n, at),
                _level(limits.tokens_per_minute, tokens, n, at),
            )
            self._keys[key_id] = share
        return share

    def admit(
        self,
        key_id: str,
        limits: KeyLimits,
        tokens_estimate: int,
        now: float,
        owners: Sequence[tuple[str, KeyLimits]] = (),
    ) -> Refusal | None:
        """Admit one request (and charge it) or say which limit refuses it.

        ``owners``: the key's owner budgets (:meth:`owner_budgets`); the
        request needs room in the key's share and in each of theirs, and is
        charged to all of them or to none.
        """
        budgets = ((key_id, limits), *owners) if limits.limited else tuple(owners)
        for budget_id, budget_limits in budgets:
            share = self._share(budget_id, budget_limits, now)
            for dimension, limit, bucket in share.buckets():
                if bucket is None:
                    continue
                # A request costs one, known now: admit it only if one is in hand
                # (or the whole share, where the share is smaller). Tokens are
                # counted afterwards: admit while any are left.
                wanted = min(1.0, bucket.capacity) if dimension == "requests" else TOKENS_IN_HAND
                if bucket.refill(now) < wanted:
                    wait = bucket.seconds_until(wanted, now)
                    retry = max(1, min(MAX_RETRY_AFTER, math.ceil(wait - 1e-9)))
                    owner = budget_id.removeprefix(BUDGET_PREFIX) if budget_id != key_id else ""
                    return Refusal(dimension, limit, retry, owner)
        for budget_id, budget_limits in budgets:
            self.charge(budget_id, budget_limits, 1, tokens_estimate, now)
        return None

    def charge(self, key_id: str, limits: KeyLimits, requests: float, tokens: float, now: float) -> None:
        """Add consumption (a negative ``tokens`` refunds an over-estimate)."""
        share = self._share(key_id, limits, now)
        if share.requests is not None and requests:
            share.requests.take(requests, now)
        if share.tokens is not None and tokens:
            share.tokens.take(tokens, now)
        share.unsent[0] += requests
        share.unsent[1] += tokens

    def report(self) -> dict[str, tuple[int, int]]:
        """What each key consumed since the last report; resets it."""
        out: dict[str, tuple[int, int]] = {}
        for key_id, share in self._keys.items():
            requests, tokens = share.unsent
            if requests or tokens:
                out[key_id] = (round(requests), round(tokens))
                share.unsent = [requests - round(requests), tokens - round(tokens)]
        return out

    def apply_view(
        self,
        budgets: Mapping[str, tuple[float, float]],
        routers: int,
        now: float,
        owners: Mapping[str, KeyLimits] | None = None,
    ) -> None:
        """Take the leader's grants (answering our last report) as the truth.

        A key absent from ``budgets`` is full: its grant is capacity / N.
        What was consumed here since the report left is not in the grant, so
        it is taken off.
        """
        self._routers = max(1, routers)
        self._view, self._view_at = budgets, now
        if owners is not None:
            self._owners = owners
        for key_id in list(self._keys):
            share = self._keys[key_id]
            limits = share.limits
            requests, tokens = budgets.get(key_id) or _full_grant(limits, self._routers)
            share.requests = _level(limits.requests_per_minute, requests, self._routers, now)
            share.tokens = _level(limits.tokens_per_minute, tokens, self._routers, now)
            pending_requests, pending_tokens = share.unsent
            if share.requests is not None:
                share.requests.take(pending_requests, now)
            if share.tokens is not None:
                share.tokens.take(pending_tokens, now)
            idle = not (pending_requests or pending_tokens) and key_id not in budgets
            if idle:
                # Full and unused: nothing to remember.
                del self._keys[key_id]

    def level(self, key_id: str, dimension: str, now: float) -> float | None:
        """This router's share left (tests and metrics); None when untracked or unlimited."""
        share = self._keys.get(key_id)
        if share is None:
            return None
        bucket = share.requests if dimension == "requests" else share.tokens
        return None if bucket is None else bucket.refill(now)


def _level(per_minute: int, grant: float, routers: int, now: float) -> TokenBucket | None:
    return share_bucket(per_minute, grant, routers, now) if per_minute > 0 else None


def _full_grant(limits: KeyLimits, routers: int) -> tuple[float, float]:
    return limits.requests_per_minute / routers, limits.tokens_per_minute / routers
