"""Which model answers a request: the one asked for, its canary, or its fallbacks.

:meth:`Planner.plan` turns the model a request resolved to into an ordered
list of :class:`Target` models, each with its routes; the proxy tries them
in turn, moving on only while nothing has reached the client.

Decisions:

- **Capacity decides, not names.** A model *has capacity* when one of its
  routes is allowed by the breaker and not saturated (the balancer's own
  tests, :meth:`.balancer.Balancer.has_capacity`). The order is: the canary
  (when drawn and it has capacity), then the model and its fallback chain
  (depth first, in catalog order, each model once) keeping those with
  capacity, then those of the chain that have routes but no capacity. So a
  model with no ready replica, every breaker open or every replica
  saturated answers through its first fallback that can take the request;
  when none can, the request still goes to the first that has any route
  (it queues there, as the balancer would make it queue), and only a chain
  with no route anywhere is a 503.
- **Fallbacks of fallbacks.** A fallback's own fallbacks follow it in the
  chain: the control plane refuses cycles in the catalog, and the walk
  visits each model once, so a cycle from a static configuration cannot
  loop either.
- **Canary by conversation.** ``percent`` of requests go to the candidate
  while it has capacity; when it has none they stay with the model itself.
  A request with an affinity key (a session header or a shared prompt
  prefix, see :mod:`.affinity`) is placed by a hash of that key, so a
  conversation stays with one model version from turn to turn, on every
  router alike; one without a key is drawn from the router's random source. A canary's own canary and
  fallbacks are not followed: the candidate is on trial, and a request it
  cannot take belongs to the model asked for.
- **Cheap when unused.** A model with neither fallbacks nor canary (most of
  them) gets its own routes back without any capacity check.
- **A name that resolves to nothing is skipped** (the control plane checks
  references, a standalone configuration may not), with a debug line rather
  than a warning per request.
"""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Iterator, Sequence
from typing import NamedTuple, Protocol

from .affinity import stable_hash
from .table import Model, Route

log = logging.getLogger(__name__)

# Models one fallback chain may visit; far more than any sane catalog.
MAX_CHAIN = 16


class Models(Protocol):
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class Capacity(Protocol):
    def has_capacity(self, routes: Sequence[Route]) -> bool: ...


class Target(NamedTuple):
    """A model to try and its routes (a tuple: one is built for every request)."""

    model: Model
    routes: Sequence[Route]
    # "" for the model asked for, else "canary" or "fallback".
    via: str = ""


# Target(model, routes, via) without NamedTuple's __new__ (a Python call): built for every request.
_target = functools.partial(tuple.__new__, Target)


class Planner:
    def __init__(self, models: Models, capacity: Capacity, rng: random.Random) -> None:
        self._models = models
        self._capacity = capacity
        self._rng = rng

    def plan(self, model: Model, key: int | None = None) -> list[Target]:
        """Targets in the order to try them; empty when no model of the chain has a route.

        ``key`` is the request's affinity key, if it has one (it places the canary draw).
        """
        if model.canary is None and not model.fallbacks:
            routes = self._models.routes(model.name)
            return [_target((model, routes, ""))] if routes else []
        targets: list[Target] = []
        canary = self._canary(model, key)
        if canary is not None:
            targets.append(canary)
        ready: list[Target] = []
        waiting: list[Target] = []
        for member in self._chain(model):
            routes = self._models.routes(member.name)
            if not routes or (canary is not None and member.name == canary.model.name):
                continue
            target = Target(member, routes, "" if member.name == model.name else "fallback")
            (ready if self._capacity.has_capacity(routes) else waiting).append(target)
        return targets + ready + waiting

    def _canary(self, model: Model, key: int | None) -> Target | None:
        canary = model.canary
        if canary is None:
            return None
        if key is None:
            point = self._rng.random() * 100
        else:
            # Rehashed, so the draw is independent of where the key falls on the balancer's ring.
            point = stable_hash(key.to_bytes(8, "big") + b"canary") % 10_000 / 100
        if point >= canary.percent:
            return None
        candidate = self._models.resolve(canary.model)
        if candidate is None or candidate.name == model.name:
            log.debug("canary %r of model %r is not in the table", canary.model, model.name)
            return None
        routes = self._models.routes(candidate.name)
        if not routes or not self._capacity.has_capacity(routes):
            return None
        return Target(candidate, routes, "canary")

    def _chain(self, model: Model) -> Iterator[Model]:
        seen: set[str] = set()
        stack = [model]
        while stack and len(seen) < MAX_CHAIN:
            member = stack.pop()
            if member.name in seen:
                continue
            seen.add(member.name)
            yield member
            following = []
            for name in member.fallbacks:
                resolved = self._models.resolve(name)
                if resolved is None:
                    log.debug("fallback %r of model %r is not in the table", name, member.name)
                elif resolved.name not in seen:
                    following.append(resolved)
            stack.extend(reversed(following))
