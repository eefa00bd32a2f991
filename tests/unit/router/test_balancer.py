"""Endpoint choice as a pure function of routes, live state, exclusions, clock and randomness."""

from __future__ import annotations

import random
from collections import Counter

from llmgw.router.balancer import Balancer, Mode
from llmgw.router.breaker import Breaker
from llmgw.router.config import Balancing
from llmgw.router.table import Endpoint, EndpointState, EngineSample, Route

NOW = 100.0


def route(
    id_: str,
    *,
    in_flight: int = 0,
    weight: int = 1,
    priority: int = 0,
    running: float | None = None,
    waiting: float = 0.0,
    sampled_at: float = NOW,
    own_at_sample: int = 0,
) -> Route:
    url = f"http://{id_}"
    state = EndpointState(in_flight=in_flight)
    if running is not None:
        state.engine = EngineSample(url, running, waiting, own_at_sample, sampled_at)
    return Route(Endpoint(id_, "m", url, weight=weight, priority=priority), state)


class Clock:
    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def balancer(
    clock: Clock | None = None, failures: int = 2, mode: Mode = "least-load", **settings: object
) -> tuple[Balancer, Breaker]:
    breaker = Breaker(failures=failures, cooldown=5.0)
    b = Balancer(mode, Balancing(**settings), breaker, random.Random(3), clock or Clock())
    return b, breaker


def test_of_two_endpoints_the_one_with_fewer_in_flight_always_wins():
    b, _ = balancer()
    routes = [route("a", in_flight=3), route("b", in_flight=1)]
    assert {b.pick(routes).endpoint.id for _ in range(200)} == {"b"}


def test_two_choices_never_picks_the_most_loaded_of_three_and_favours_the_least():
    b, _ = balancer()
    routes = [route("a", in_flight=3), route("b", in_flight=1), route("c", in_flight=2)]
    counts = Counter(b.pick(routes).endpoint.id for _ in range(3000))
    assert "a" not in counts
    # b wins both pairs it is drawn into (2 of 3), c only the pair (a, c).
    assert 1.6 < counts["b"] / counts["c"] < 2.4


def test_engine_queue_from_other_routers_counts_as_load():
    b, _ = balancer()
    # busy: idle here, but its engine runs 6 requests of which 0 are ours; quiet: 2 of ours.
    routes = [route("busy", running=6.0), route("quiet", in_flight=2, running=2.0, own_at_sample=2)]
    assert b.load(routes[0], NOW) == 6.0
    assert b.load(routes[1], NOW) == 2.0
    assert b.pick(routes).endpoint.id == "quiet"


def test_stale_engine_sample_is_ignored():
    b, _ = balancer(engine_metrics_max_age_seconds=10.0)
    old = route("old", running=50.0, waiting=5.0, sampled_at=NOW - 11)
    assert b.load(old, NOW) == 0.0
    assert not b.saturated(old, NOW)


def test_sample_from_another_url_is_ignored():
    b, _ = balancer()
    moved = route("a", running=9.0)
    moved = Route(Endpoint("a", "m", "http://elsewhere"), moved.state)
    assert b.load(moved, NOW) == 0.0


def test_in_flight_is_divided_by_weight():
    b, _ = balancer()
    # a: 4/4 = 1.0, b: 2/1 = 2.0 -> a, although it has more requests in flight.
    routes = [route("a", in_flight=4, weight=4), route("b", in_flight=2)]
    assert b.pick(routes).endpoint.id == "a"


def test_weighted_two_choices_share_idle_endpoints_in_proportion_to_weight():
    b, _ = balancer()
    routes = [route("a", weight=3), route("b", weight=1)]
    counts = Counter(b.pick(routes).endpoint.id for _ in range(4000))
    assert 2.4 < counts["a"] / counts["b"] < 3.8


def test_lowest_priority_tier_is_preferred_even_when_busier():
    b, _ = balancer()
    routes = [route("spill", priority=1), route("main", in_flight=10, priority=0)]
    assert b.pick(routes).endpoint.id == "main"


def test_tier_spills_only_when_every_endpoint_of_it_is_saturated():
    b, _ = balancer(saturation_in_flight=4)
    full = route("full", in_flight=4, priority=0)
    queued = route("queued", running=8.0, waiting=1.0, priority=0)
    spill = route("spill", priority=1)
    assert b.saturated(full, NOW) and b.saturated(queued, NOW)
    assert b.pick([full, queued, spill]).endpoint.id == "spill"
    room = route("room", in_flight=3, priority=0)
    assert b.pick([full, room, spill]).endpoint.id == "room"


def test_when_every_tier_is_saturated_the_best_tier_takes_the_queue():
    b, _ = balancer(saturation_in_flight=1)
    routes = [route("spill", in_flight=1, priority=1), route("main", in_flight=5, priority=0)]
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


def test_open_breaker_spills_to_the_next_tier():
    b, breaker = balancer()
    main, spill = route("main", priority=0), route("spill", priority=1)
    breaker.failure(main.state, NOW)
    breaker.failure(main.state, NOW)
    assert b.pick([main, spill]).endpoint.id == "spill"


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


def test_round_robin_takes_each_endpoint_in_turn_whatever_the_load():
    b, _ = balancer(mode="round-robin")
    routes = [route("a", in_flight=9), route("b"), route("c")]
    picks = [b.pick(routes).endpoint.id for _ in range(6)]
    assert picks == ["a", "b", "c", "a", "b", "c"]
    assert b.pick(routes, {"b"}).endpoint.id in {"a", "c"}


def test_least_load_and_round_robin_ignore_the_affinity_key():
    for mode in ("least-load", "round-robin"):
        b, _ = balancer(mode=mode)
        assert b.affinity("/v1/completions", {"x-session-id": "s"}, {"prompt": "x" * 200}) is None
