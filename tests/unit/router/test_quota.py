"""Per-key quotas on a router (the pure part): admission, Retry-After, token debt, and
shares of the leader's budget, including several routers against one leader ledger."""

from __future__ import annotations

import itertools

import pytest

from llmgw.control.api.quota import QuotaLedger
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


def test_a_view_sets_the_share_to_the_grant_less_what_was_spent_since_the_report():
    q = Quotas()
    q.admit("k", RPM, 0, now=0.0)
    q.report()
    q.admit("k", RPM, 0, now=0.0)  # after the report left: not in the grant
    q.apply_view({"k": (2.0, 0.0)}, routers=2, now=0.0)
    assert q.routers == 2
    assert q.level("k", "requests", 0.0) == 2.0 - 1


def test_a_key_absent_from_the_view_gets_its_full_share_and_is_forgotten_when_idle():
    q = Quotas()
    q.admit("k", RPM, 0, now=0.0)
    q.report()
    q.apply_view({}, routers=3, now=0.0)
    assert q.level("k", "requests", 0.0) is None, "full and unused: no state kept"
    assert q.admit("k", RPM, 0, now=0.0) is None
    assert q.level("k", "requests", 0.0) == 6 / 3 - 1


def test_a_key_first_used_after_a_view_starts_from_the_grant_the_leader_listed():
    q = Quotas()
    q.apply_view({"k": (0.0, 0.0)}, routers=1, now=0.0)
    assert q.admit("k", RPM, 0, now=0.0) is not None, "others spent the budget already"


class _Keys:
    def __init__(self, **limits: tuple[int, int]):
        self.items = {
            key_id: keys_pb2.ApiKey(id=key_id, requests_per_minute=r, tokens_per_minute=t).SerializeToString()
            for key_id, (r, t) in limits.items()
        }


class _Cluster:
    """N routers and the leader's ledger, synced in turn (each router at its own phase)."""

    def __init__(self, n: int, rpm: int):
        self.limits = KeyLimits(requests_per_minute=rpm)
        self.ledger = QuotaLedger(_Keys(k=(rpm, 0)))
        self.routers = [Quotas() for _ in range(n)]
        for i in range(n):
            self.ledger.join(i)
        for i in range(n):
            self.sync(i, 0.0)

    def sync(self, i: int, now: float) -> None:
        router = self.routers[i]
        usage = [keys_pb2.KeyUsage(key_id=k, requests=r, tokens=t) for k, (r, t) in router.report().items()]
        self.ledger.apply(i, usage, now)
        view = self.ledger.view(i, now)
        router.apply_view({b.key_id: (b.requests, b.tokens) for b in view}, self.ledger.routers, now)

    def run(self, busy: list[int], start: float, end: float) -> int:
        """Routers in ``busy`` try a request every ms; each syncs every 0.5 s, phases spread."""
        admitted = 0
        step, per = 0.001, 500
        n = len(self.routers)
        for tick in itertools.count():
            now = start + tick * step
            if now >= end:
                break
            for i in busy:
                admitted += self.routers[i].admit("k", self.limits, 0, now) is None
            for i in range(n):
                if (tick + i * per // n) % per == 0:
                    self.sync(i, now)
        return admitted


@pytest.mark.parametrize(("rpm", "routers"), [(30, 2), (600, 2), (600, 4), (60, 4), (6000, 3)])
def test_routers_hammering_one_key_together_hold_the_cluster_limit(rpm, routers):
    cluster = _Cluster(routers, rpm)
    seconds = 10.0
    admitted = cluster.run(busy=list(range(routers)), start=0.0, end=seconds)
    budget = rpm + rpm / 60 * seconds
    # Shares are whole requests: at most about one over per router per interval.
    assert admitted <= budget + routers * 2, (admitted, budget)
    assert admitted >= budget * 0.9, (admitted, budget)


def test_one_busy_router_among_three_still_gets_the_full_sustained_rate():
    cluster = _Cluster(3, 120)
    cluster.run(busy=[0], start=0.0, end=60.0)  # spend the burst
    admitted = cluster.run(busy=[0], start=60.0, end=90.0)
    assert 2 * 30 * 0.9 <= admitted <= 2 * 30 * 1.1


def test_a_router_that_leaves_frees_its_unspent_grant():
    cluster = _Cluster(2, 60)
    cluster.ledger.apply(0, [keys_pb2.KeyUsage(key_id="k", requests=10)], 0.0)
    assert cluster.ledger.view(0, 0.0)[0].requests == pytest.approx((50 - 30) / 2)
    cluster.ledger.leave(1)
    assert cluster.ledger.view(0, 0.0)[0].requests == pytest.approx(50)


# -- owner budgets -------------------------------------------------------------------

FREE = KeyLimits()
TEAM = {"acme/search": KeyLimits(requests_per_minute=4)}


def test_keys_of_one_owner_share_its_budget_and_the_refusal_names_the_owner():
    q = Quotas()
    q.apply_view({}, routers=1, now=0.0, owners=TEAM)
    team, project = q.owner_budgets("acme/search"), q.owner_budgets("acme/search/qa")
    assert team == project == (("owner:acme/search", KeyLimits(requests_per_minute=4)),)
    admitted = [q.admit(k, FREE, 0, 0.0, team) is None for k in ("a", "b", "a", "b", "a")]
    assert admitted == [True] * 4 + [False]
    refusal = q.admit("c", FREE, 0, 0.0, project)
    assert refusal is not None and refusal.owner == "acme/search" and refusal.limit == 4
    # A key's own limit refuses first, without spending the owner's budget.
    q2 = Quotas()
    q2.apply_view({}, routers=1, now=0.0, owners=TEAM)
    one = KeyLimits(requests_per_minute=1)
    assert q2.admit("k", one, 0, 0.0, team) is None
    refused = q2.admit("k", one, 0, 0.0, team)
    assert refused is not None and refused.owner == ""
    assert q2.level("owner:acme/search", "requests", 0.0) == 3


def test_free_text_owners_and_owners_without_budgets_spend_nothing():
    q = Quotas()
    q.apply_view({}, routers=1, now=0.0, owners=TEAM)
    assert q.owner_budgets("ann@example.com") == () and q.owner_budgets("beta") == ()
    assert q.owner_budgets("") == ()


def test_routers_spending_one_owners_keys_hold_the_owners_cluster_budget():
    rpm, seconds = 120, 10.0
    limits = {"acme": KeyLimits(requests_per_minute=rpm)}
    ledger = QuotaLedger(_Keys(), lambda: {"acme": (rpm, 0)})
    routers = [Quotas(), Quotas()]
    for i, router in enumerate(routers):
        ledger.join(i)
        router.apply_view({}, 2, 0.0, limits)

    def sync(i: int, now: float) -> None:
        report = routers[i].report()
        ledger.apply(
            i, [keys_pb2.KeyUsage(key_id=k, requests=r, tokens=t) for k, (r, t) in report.items()], now
        )
        view = ledger.view(i, now)
        routers[i].apply_view({b.key_id: (b.requests, b.tokens) for b in view}, ledger.routers, now, limits)

    admitted = 0
    for tick in itertools.count():
        now = tick * 0.001
        if now >= seconds:
            break
        for i, router in enumerate(routers):
            key = f"k{i}-{tick % 3}"  # several keys per router, all owned by acme/x
            admitted += router.admit(key, FREE, 0, now, router.owner_budgets("acme/x")) is None
            if tick % 500 == i * 250:
                sync(i, now)
    budget = rpm + rpm / 60 * seconds
    assert budget * 0.9 <= admitted <= budget + 2 * 2, (admitted, budget)


def test_owner_usage_is_tallied_by_owner_and_model_and_handed_over_once(monkeypatch):
    from llmgw.router import quota

    q = Quotas()
    q.tally("acme/search", "demo", 30)
    q.tally("acme/search", "demo", 12)
    q.tally("acme", "other", -5)  # a refund never makes usage negative
    assert q.owner_report() == {("acme/search", "demo"): (2, 42), ("acme", "other"): (1, 0)}
    assert q.owner_report() == {}
    monkeypatch.setattr(quota, "MAX_OWNER_SERIES", 1)
    q.tally("a", "m", 1)
    q.tally("b", "m", 1)
    assert q.owner_report() == {("a", "m"): (1, 1)} and q.owner_usage_dropped == 1
