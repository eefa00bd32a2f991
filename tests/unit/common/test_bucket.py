"""The token bucket: refill, the capacity cap, debt and its floor, and the wait it implies."""

from __future__ import annotations

import pytest

from llmgw.common.bucket import TokenBucket


def test_a_full_bucket_refills_at_its_rate_only_up_to_capacity():
    b = TokenBucket.full(capacity=60, rate=1.0, now=0.0)
    b.take(60, now=0.0)
    assert b.refill(10.0) == pytest.approx(10)
    assert b.refill(1000.0) == 60


def test_debt_is_allowed_down_to_the_floor_and_says_how_long_to_wait():
    b = TokenBucket.full(capacity=100, rate=10.0, now=0.0)
    b.take(130, now=0.0)
    assert b.level == pytest.approx(-30)
    assert b.seconds_until(0.0, 0.0) == pytest.approx(3.0)
    assert b.seconds_until(10.0, 0.0) == pytest.approx(4.0)
    b.take(10_000, now=0.0)
    assert b.level == -100, "debt stops at the floor (one capacity by default)"


def test_a_level_in_hand_needs_no_wait_and_one_over_capacity_never_comes():
    b = TokenBucket.full(capacity=5, rate=1.0, now=0.0)
    assert b.seconds_until(5.0, 0.0) == 0.0
    assert b.is_full(0.0)
    assert b.seconds_until(6.0, 0.0) == float("inf")
