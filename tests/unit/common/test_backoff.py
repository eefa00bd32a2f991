"""The one backoff policy (llmgw.common.backoff): floor, exponential ceiling, cap, full jitter."""

import random

import pytest

from llmgw.common.backoff import BackoffPolicy, Retries


def test_first_retry_waits_exactly_the_initial_delay():
    policy = BackoffPolicy(0.2, 5.0)
    assert all(policy.delay(1, random.Random(seed)) == 0.2 for seed in range(20))
    # A loop that counts a clean end as 0 failures waits the floor too.
    assert policy.delay(0, random.Random(1)) == 0.2


def test_ceilings_double_up_to_the_cap():
    policy = BackoffPolicy(0.2, 5.0)
    assert [policy.ceiling(n) for n in range(1, 8)] == pytest.approx([0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert policy.ceiling(10_000) == 5.0  # no overflow after a very long outage


def test_waits_jitter_over_the_whole_window_and_never_below_the_floor():
    policy = BackoffPolicy(1.0, 60.0)
    rng = random.Random(7)
    draws = [policy.delay(5, rng) for _ in range(2000)]  # window [1, 16]
    assert min(draws) >= 1.0 and max(draws) <= 16.0
    # Full jitter: the draws cover the window, not only its top half.
    assert min(draws) < 2.0 and max(draws) > 15.0


def test_retries_count_and_reset():
    retries = Retries(BackoffPolicy(0.5, 4.0), random.Random(3))
    waits = [retries.next() for _ in range(6)]
    assert retries.failures == 6
    assert waits[0] == 0.5 and all(0.5 <= w <= 4.0 for w in waits)
    retries.reset()
    assert retries.failures == 0 and retries.next() == 0.5


@pytest.mark.parametrize("initial, maximum", [(-1.0, 1.0), (2.0, 1.0)])
def test_a_policy_that_cannot_hold_is_refused(initial, maximum):
    with pytest.raises(ValueError, match="initial <= maximum"):
        BackoffPolicy(initial, maximum)
