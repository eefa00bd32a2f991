"""Endpoint choice: tiers and saturation, then affinity, power of two choices, or rotation.

For one request, among the model's endpoints not yet tried by it:

1. **Breaker.** Keep those the breaker allows and that answer their
   ``/metrics`` poll (an unresponsive, hung engine: see :mod:`.stall`); if
   that leaves none, keep them all (see :mod:`.breaker`: the breaker alone
   never refuses a request).
2. **Tier.** Take the lowest priority number that has an endpoint that is
   not saturated, and keep those unsaturated endpoints. Only when every
   endpoint of a tier is saturated or down (tried, breaker open) does the
   request spill to the next tier. If every tier is saturated, the request
   queues in the best tier rather than wandering.
3. **Choice** (``balancer`` setting):

   - ``affinity`` (the default): a request with an affinity key (see
     :mod:`.affinity`) goes to the first endpoint clockwise from the key on a
     consistent-hash ring that has room under *bounded load* (Mirrokni,
     Thorup, Zadimoghaddam 2018): an endpoint takes the key only while its
     load plus this request stays within ``ceil(c * (total + 1) * w / W)``,
     where total is the pool's load, ``w`` its weight, ``W`` the pool's, and
     ``c = load_factor`` (1.25). A popular prefix therefore fills its home
     replica to c times the average and then overflows to the ring's next
     endpoints, which are the same for every router. A request without a key
     is chosen as in ``least-load``.
   - ``least-load``: weighted power of two choices. Draw two distinct
     endpoints with probability in proportion to weight, keep the one with
     the lower ``load / weight`` (ties at random, weighted). With two
     endpoints this compares both. Two random choices rather than the
     global minimum: several routers with the same stale view would
     otherwise all herd onto the one endpoint that looks idlest.
   - ``round-robin``: the next endpoint of the pool in turn, per model;
     no load signal at all (a baseline, and for engines with no /metrics).

**Load** is this router's in-flight count plus the requests the engine
reports that are not this router's: ``running + waiting`` from its last
``/metrics`` sample minus this router's in-flight count when that sample
arrived (never below zero). The first part is exact and current, the second
is other routers' traffic as of the last poll; a sample older than
``engine_metrics_max_age_seconds``, or read from another URL, counts as none.

**Saturated** means: this router has ``saturation_in_flight`` requests in
flight there, or the engine's fresh sample shows requests waiting (vLLM
queues only when its running batch is full, so ``waiting > 0`` is the
engine saying it is full).

``pick`` is a pure function of the routes, their live state, the
exclusions, the clock and the random source (plus the round-robin cursor),
so tests drive it directly. The ring is built once per routes tuple: the
table swaps tuples whole on every change, so identity says when to rebuild.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Callable, Container, Iterator, Mapping, Sequence
from typing import Any, Literal

from .affinity import key_for, stable_hash
from .breaker import Breaker
from .config import Balancing
from .table import Route

Mode = Literal["affinity", "least-load", "round-robin"]
# One route of a pick's pool: the route, its load, whether it is saturated, whether the breaker allows it.
_Row = tuple[Route, float, bool, bool]

# Ring points per unit of weight, and the most one endpoint gets.
VNODES_PER_WEIGHT = 64
MAX_VNODES = 1024


class _Ring:
    """Consistent-hash ring over one routes tuple: points sorted, each naming a route index."""

    def __init__(self, routes: Sequence[Route]) -> None:
        points: list[tuple[int, int]] = []
        for index, route in enumerate(routes):
            count = min(MAX_VNODES, VNODES_PER_WEIGHT * max(route.endpoint.weight, 1))
            for n in range(count):
                points.append((stable_hash(f"{route.endpoint.id}#{n}".encode()), index))
        points.sort()
        self._hashes = [h for h, _ in points]
        self._owners = [i for _, i in points]

    def walk(self, key: int) -> Iterator[int]:
        """Route indexes clockwise from ``key``, each once."""
        seen: set[int] = set()
        start = bisect.bisect(self._hashes, key)
        size = len(self._owners)
        for step in range(size):
            owner = self._owners[(start + step) % size]
            if owner not in seen:
                seen.add(owner)
                yield owner


def _no_key(path: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> None:
    return None


class Balancer:
    def __init__(
        self,
        mode: Mode,
        settings: Balancing,
        breaker: Breaker,
        rng: random.Random,
        clock: Callable[[], float],
    ) -> None:
        self._mode = mode
        self._settings = settings
        # Read on every pick: plain attributes, not the settings' (see :class:`.proxy.Proxy`).
        self._max_age = settings.engine_metrics_max_age_seconds
        self._saturation = settings.saturation_in_flight
        self._breaker = breaker
        self._rng = rng
        self._clock = clock
        # Model -> (the routes tuple the ring was built from, the ring).
        self._rings: dict[str, tuple[Sequence[Route], _Ring]] = {}
        self._cursors: dict[str, int] = {}
        self._affinity: Callable[[str, Mapping[str, str], Mapping[str, Any]], int | None] = (
            functools.partial(key_for, settings.prefix_chars, settings.min_prefix_chars)
            if mode == "affinity"
            else _no_key
        )
        self.affinity = self._affinity  # type: ignore[method-assign]

    @property
    def mode(self) -> Mode:
        return self._mode

    def affinity(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None:
        """The request's affinity key, or None (always None unless the mode is ``affinity``).

        Replaced in each instance by what it does for the mode (no wrapper per request).
        """
        return self._affinity(path, headers, body)

    def pick(
        self, routes: Sequence[Route], exclude: Container[str] = (), key: int | None = None
    ) -> Route | None:
        now = self._clock()
        pool = self._pool(routes, exclude, now)
        if not pool:
            return None
        mode = self._mode
        if mode == "round-robin":
            return self._next_in_turn([row[0] for row in pool])
        if key is not None and mode == "affinity":
            chosen = self._bounded(routes, pool, key)
            if chosen is not None:
                return chosen
        if len(pool) == 2:
            # Two choices of two: both compared (the common case, inline).
            a, b = pool
            wa, wb = a[0].endpoint.weight, b[0].endpoint.weight
            wa, wb = (wa if wa > 1 else 1), (wb if wb > 1 else 1)
            left, right = a[1] * wb, b[1] * wa
            if left != right:
                return a[0] if left < right else b[0]
            return a[0] if self._rng.random() * (wa + wb) < wa else b[0]
        return self._two_choices(pool)

    def load(self, route: Route, now: float) -> float:
        """This router's in-flight count plus the engine's other work, as of its last fresh sample."""
        return self._measure(route, now)[0]

    def saturated(self, route: Route, now: float) -> bool:
        return self._measure(route, now)[1]

    def has_capacity(self, routes: Sequence[Route]) -> bool:
        """Whether one of ``routes`` is allowed by the breaker and not saturated (see :mod:`.fallbacks`)."""
        now = self._clock()
        return any(
            self._breaker.allows(r.state, now)
            and r.state.unresponsive_since is None
            and not self.saturated(r, now)
            for r in routes
        )

    def _measure(self, route: Route, now: float) -> tuple[float, bool]:
        """(load, saturated): see the module docstring; one look at the engine's sample for both."""
        state, sample = route.state, route.state.engine
        if sample is None or sample.url != route.endpoint.url or now - sample.at > self._max_age:
            return float(state.in_flight), state.in_flight >= self._saturation
        others = max(0.0, sample.running + sample.waiting - sample.own_in_flight)
        saturated = state.in_flight >= self._saturation or sample.waiting > 0
        return state.in_flight + others, saturated

    def _pool(self, routes: Sequence[Route], exclude: Container[str], now: float) -> list[_Row]:
        """The routes a request may go to now, each with its load: steps 1 and 2 of the module docstring.

        One look at each route (breaker, load, saturation: :meth:`_measure`
        and :meth:`.Breaker.allows`, inline, since this runs for every
        attempt); the fallbacks of steps 1 and 2 only when the common case
        (an allowed, unsaturated route) found none.
        """
        max_age, limit = self._max_age, self._saturation
        rows: list[_Row] = []
        free: list[_Row] = []
        tiers = False  # whether the free rows are of more than one priority
        for route in routes:
            endpoint = route.endpoint
            if endpoint.id in exclude:
                continue
            state = route.state
            sample, in_flight = state.engine, state.in_flight
            if sample is None or sample.url != endpoint.url or now - sample.at > max_age:
                load, saturated = float(in_flight), in_flight >= limit
            else:
                others = sample.running + sample.waiting - sample.own_in_flight
                load = in_flight + (others if others > 0.0 else 0.0)
                saturated = in_flight >= limit or sample.waiting > 0
            # Breaker.allows: its cooldown has passed (or it never opened).
            allowed = state.open_until <= now and state.unresponsive_since is None
            row = (route, load, saturated, allowed)
            rows.append(row)
            if allowed and not saturated:
                if free and endpoint.priority != free[0][0].endpoint.priority:
                    tiers = True
                free.append(row)
        if not free:
            allowed_rows = [row for row in rows if row[3]] or rows
            free = [row for row in allowed_rows if not row[2]] or allowed_rows
            tiers = len({row[0].endpoint.priority for row in free}) > 1
        if tiers:
            # The best tier with an unsaturated endpoint is the lowest priority among unsaturated ones.
            tier = min(r[0].endpoint.priority for r in free)
            return [r for r in free if r[0].endpoint.priority == tier]
        return free

    def _bounded(self, routes: Sequence[Route], pool: list[_Row], key: int) -> Route | None:
        model = routes[0].endpoint.model
        cached = self._rings.get(model)
        if cached is None or cached[0] is not routes:
            cached = (routes, _Ring(routes))
            self._rings[model] = cached
        members = {id(row[0]): row for row in pool}
        total = sum(row[1] for row in pool) + 1
        weight = sum(max(row[0].endpoint.weight, 1) for row in pool)
        c = self._settings.load_factor
        for index in cached[1].walk(key):
            row = members.get(id(routes[index]))
            if row is None:
                continue
            route, load = row[0], row[1]
            if load + 1 <= math.ceil(c * total * max(route.endpoint.weight, 1) / weight):
                return route
        return None

    def _two_choices(self, pool: list[_Row]) -> Route:
        if len(pool) == 1:
            return pool[0][0]
        if len(pool) == 2:
            a, b = pool
            wa, wb = max(a[0].endpoint.weight, 1), max(b[0].endpoint.weight, 1)
        else:
            weights = [max(row[0].endpoint.weight, 1) for row in pool]
            total = sum(weights)
            first = self._draw(weights, total, skip=-1)
            second = self._draw(weights, total - weights[first], skip=first)
            a, b = pool[first], pool[second]
            wa, wb = weights[first], weights[second]
        # Compare load / weight without dividing: la / wa < lb / wb.
        left, right = a[1] * wb, b[1] * wa
        if left != right:
            return a[0] if left < right else b[0]
        return a[0] if self._rng.random() * (wa + wb) < wa else b[0]

    def _draw(self, weights: list[int], total: int, skip: int) -> int:
        """An index drawn in proportion to weight, never ``skip``."""
        point = self._rng.random() * total
        last = -1
        for index, weight in enumerate(weights):
            if index == skip:
                continue
            last = index
            point -= weight
            if point < 0:
                return index
        return last

    def _next_in_turn(self, pool: list[Route]) -> Route:
        model = pool[0].endpoint.model
        cursor = self._cursors.get(model, 0)
        self._cursors[model] = cursor + 1
        return pool[cursor % len(pool)]
