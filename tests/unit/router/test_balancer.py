"""Endpoint choice as a pure function of routes, exclusions, clock and randomness."""

from __future__ import annotations

import random
from collections import Counter

from llmgw.router.balancer import Balancer
from llmgw.router.breaker import Breaker
from llmgw.router.table import Endpoint, EndpointState, Route


def route(id_: str, *, in_flight: int = 0, weight: int = 1, priority: int = 0) -> Route:
    return Route(
        Endpoint(id_, "m", f"http://{id_}", weight=weight, priority=priority),
        EndpointState(in_flight=in_flight),
    )


class Clock:
    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def balancer(clock: Clock | None = None, failures: int = 2) -> tuple[Balancer, Breaker]:
    breaker = Breaker(failures=failures, cooldown=5.0)
    return Balancer(breaker, random.Random(3), clock or Clock()), breaker


def test_fewest_in_flight_wins():
    b, _ = balancer()
    routes = [route("a", in_flight=3), route("b", in_flight=1), route("c", in_flight=2)]
    assert b.pick(routes).endpoint.id == "b"


def test_in_flight_is_divided_by_weight():
    b, _ = balancer()
    # a: 4/4 = 1.0, b: 2/1 = 2.0 -> a, although it has more requests in flight.
    routes = [route("a", in_flight=4, weight=4), route("b", in_flight=2)]
    assert b.pick(routes).endpoint.id == "a"


def test_ties_are_broken_at_random_in_proportion_to_weight():
    b, _ = balancer()
    routes = [route("a", weight=3), route("b", weight=1)]
    counts = Counter(b.pick(routes).endpoint.id for _ in range(4000))
    assert set(counts) == {"a", "b"}
    assert 2.4 < counts["a"] / counts["b"] < 3.8


def test_lowest_priority_tier_is_preferred_even_when_busier():
    b, _ = balancer()
    routes = [route("spill", priority=1), route("main", in_flight=10, priority=0)]
    assert b.pick(routes).endpoint.id == "main"


def test_higher_tier_is_used_once_the_lower_is_excluded():
    b, _ = balancer()
    routes = [route("spill", priority=1), route("main", priority=0)]
    assert b.pick(routes, {"main"}).endpoint.id == "spill"
    assert b.pick(routes, {"main", "spill"}) is None


def test_open_breaker_skips_endpoint_until_cooldown_then_half_opens():
    clock = Clock(100.0)
    b, breaker = balancer(clock)
    sick, well = route("sick"), route("well", in_flight=5)
    breaker.failure(sick.state, clock.now)
    assert b.pick([sick, well]).endpoint.id == "sick"  # one failure: still closed
    breaker.failure(sick.state, clock.now)
    assert b.pick([sick, well]).endpoint.id == "well"
    clock.now = 106.0
    assert b.pick([sick, well]).endpoint.id == "sick"
    breaker.failure(sick.state, clock.now)  # a half-open failure reopens at once
    assert b.pick([sick, well]).endpoint.id == "well"


def test_when_every_breaker_is_open_the_endpoints_are_still_tried():
    b, breaker = balancer()
    only = route("only")
    for _ in range(3):
        breaker.failure(only.state, 100.0)
    assert b.pick([only]).endpoint.id == "only"


def test_success_closes_the_breaker():
    b, breaker = balancer()
    sick, other = route("sick"), route("other", in_flight=1)
    breaker.failure(sick.state, 100.0)
    breaker.failure(sick.state, 100.0)
    breaker.success(sick.state)
    assert sick.state.consecutive_failures == 0
    assert b.pick([sick, other]).endpoint.id == "sick"
