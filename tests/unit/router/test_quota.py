"""Per-key quotas on a router (the pure part): admission, Retry-After, token debt, and
shares of the leader's budget, including several routers against one leader ledger."""

from __future__ import annotations

import itertools

from llmgw.control.quota import QuotaLedger
from llmgw.router.quota import KeyLimits, Quotas
from llmgw.v1 import keys_pb2

RPM = KeyLimits(requests_per_minute=6)


def test_a_lone_router_admits_a_minutes_requests_then_refuses_with_retry_after():
    q = Quotas()
    admitted = [q.admit("k", RPM, 0, now=0.0) is None for _ in range(8)]
    assert admitted == [True] * 6 + [False] * 2
    refusal = q.admit("k", RPM, 0, now=0.0)
    assert refusal is not None and refusal.dimension == "requests" and refusal.limit == 6
    # 6 per minute refill one every 10 s.
    assert refusal.retry_after == 10


def test_requests_come_back_at_the_per_minute_rate():
    q = Quotas()
    for _ in range(6):
        assert q.admit("k", RPM, 0, now=0.0) is None
    assert q.admit("k", RPM, 0, now=5.0) is not None
    assert q.admit("k", RPM, 0, now=10.5) is None
    assert q.admit("k", RPM, 0, now=10.6) is not None


def test_tokens_are_admitted_while_positive_and_debt_delays_the_next_request():
    limits = KeyLimits(tokens_per_minute=600)  # 10 tokens per second
    q = Quotas()
    assert q.admit("k", limits, 100, now=0.0) is None
    # The request really used 900 tokens: the key is 300 in debt.
    q.charge("k", limits, 0, 800, now=0.0)
    refusal = q.admit("k", limits, 0, now=0.0)
    assert refusal is not None and refusal.dimension == "tokens"
    assert refusal.retry_after == 30
    assert q.admit("k", limits, 0, now=29.9) is not None
    assert q.admit("k", limits, 0, now=30.1) is None


def test_keys_are_independent():
    q = Quotas()
    for _ in range(6):
        q.admit("a", RPM, 0, now=0.0)
    assert q.admit("a", RPM, 0, now=0.0) is not None
    assert q.admit("b", RPM, 0, now=0.0) is None


def test_report_hands_over_usage_once():
    q = Quotas()
    q.admit("k", KeyLimits(6, 600), 40, now=0.0)
    assert q.report() == {"k": (1, 40)}
    assert q.report() == {}


def test_a_view_sets_the_share_to_the_leaders_level_divided_among_routers():
    q = Quotas()
    q.admit("k", RPM, 0, now=0.0)
    q.report()
    q.admit("k", RPM, 0, now=0.0)  # after the report left: not in the view's level
    q.apply_view({"k": (4.0, 0.0)}, routers=2, now=0.0)
    assert q.routers == 2
    assert q.level("k", "requests", 0.0) == 4.0 / 2 - 1


def test_a_key_absent_from_the_view_gets_its_full_share_and_is_forgotten_when_idle():
    q = Quotas()
    q.admit("k", RPM, 0, now=0.0)
    q.report()
    q.apply_view({}, routers=3, now=0.0)
    assert q.level("k", "requests", 0.0) is None, "full and unused: no state kept"
    assert q.admit("k", RPM, 0, now=0.0) is None
    assert q.level("k", "requests", 0.0) == 6 / 3 - 1


def test_a_key_first_used_after_a_view_starts_from_the_level_the_leader_listed():
    q = Quotas()
    q.apply_view({"k": (0.0, 0.0)}, routers=1, now=0.0)
    assert q.admit("k", RPM, 0, now=0.0) is not None, "others spent the budget already"


class _Keys:
    def __init__(self, **limits: tuple[int, int]):
        self.items = {
            key_id: keys_pb2.ApiKey(id=key_id, requests_per_minute=r, tokens_per_minute=t).SerializeToString()
            for key_id, (r, t) in limits.items()
        }


def _sync(router: Quotas, ledger: QuotaLedger, routers: int, now: float) -> None:
    usage = [keys_pb2.KeyUsage(key_id=k, requests=r, tokens=t) for k, (r, t) in router.report().items()]
    ledger.apply(usage, now)
    router.apply_view({b.key_id: (b.requests, b.tokens) for b in ledger.budgets(now)}, routers, now)


def _run(
    routers: list[Quotas], ledger: QuotaLedger, busy: list[int], start: float, end: float, limits: KeyLimits
) -> int:
    """Routers in ``busy`` try a request every 10 ms; everyone syncs every 0.5 s. Returns admitted."""
    admitted = 0
    step, interval = 0.01, 0.5
    for tick in itertools.count():
        now = start + tick * step
        if now >= end:
            break
        for i in busy:
            admitted += routers[i].admit("k", limits, 0, now) is None
        if tick % int(interval / step) == 0:
            for r in routers:
                _sync(r, ledger, len(routers), now)
    return admitted


def test_two_routers_hammering_one_key_hold_the_cluster_limit_not_twice_it():
    limits = KeyLimits(requests_per_minute=120)  # 2 per second, burst 120
    ledger = QuotaLedger(_Keys(k=(120, 0)))
    routers = [Quotas(), Quotas()]
    for r in routers:
        _sync(r, ledger, 2, 0.0)
    admitted = _run(routers, ledger, busy=[0, 1], start=0.0, end=30.0, limits=limits)
    allowed = 120 + 2 * 30
    # At most one request per router per sync interval over the bucket.
    assert allowed - 2 <= admitted <= allowed + 2 * 2
    assert admitted < 2 * allowed * 0.75, "each router alone would have allowed twice as much"


def test_one_busy_router_among_three_still_gets_the_full_sustained_rate():
    limits = KeyLimits(requests_per_minute=120)
    ledger = QuotaLedger(_Keys(k=(120, 0)))
    routers = [Quotas(), Quotas(), Quotas()]
    for r in routers:
        _sync(r, ledger, 3, 0.0)
    # Spend the burst first, then measure the steady rate.
    _run(routers, ledger, busy=[0], start=0.0, end=60.0, limits=limits)
    admitted = _run(routers, ledger, busy=[0], start=60.0, end=90.0, limits=limits)
    assert 2 * 30 * 0.9 <= admitted <= 2 * 30 * 1.1
