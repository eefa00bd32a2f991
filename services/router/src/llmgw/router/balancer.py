"""Endpoint choice: priority tier, then fewest requests in flight per weight.

For one request, among the model's endpoints not yet tried by it:

1. keep those the breaker allows; if that leaves none, keep them all (see
   :mod:`.breaker`: the breaker alone never refuses a request);
2. keep the lowest priority number present (a higher tier is spilled to only
   when the lower one has nothing left: all tried or all open);
3. score each by ``in_flight / weight`` (in-flight as counted by this router,
   which is the only load signal that is current per request) and keep the
   lowest score;
4. break ties at random, weighted by weight, so idle endpoints share load in
   proportion to their weight and several routers do not herd onto the same
   one.

``pick`` is a pure function of the routes, the exclusions, the clock and the
random source, so tests drive it directly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Container, Sequence

from .breaker import Breaker
from .table import Route


class Balancer:
    def __init__(self, breaker: Breaker, rng: random.Random, clock: Callable[[], float]) -> None:
        self._breaker = breaker
        self._rng = rng
        self._clock = clock

    def pick(self, routes: Sequence[Route], exclude: Container[str] = ()) -> Route | None:
        candidates = [r for r in routes if r.endpoint.id not in exclude]
        if not candidates:
            return None
        now = self._clock()
        healthy = [r for r in candidates if self._breaker.allows(r.state, now)]
        pool = healthy or candidates
        tier = min(r.endpoint.priority for r in pool)
        pool = [r for r in pool if r.endpoint.priority == tier]
        scores = [r.state.in_flight / max(r.endpoint.weight, 1) for r in pool]
        best = min(scores)
        ties = [r for r, s in zip(pool, scores, strict=True) if s == best]
        if len(ties) == 1:
            return ties[0]
        return self._rng.choices(ties, weights=[max(r.endpoint.weight, 1) for r in ties])[0]
