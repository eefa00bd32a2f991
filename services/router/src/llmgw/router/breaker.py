"""A per-endpoint circuit breaker over the router's own traffic.

The control plane publishes only ready replicas, but it learns of a dead
engine seconds after this router does. The breaker bridges that gap.

States, all held in :class:`~.table.EndpointState` (so they survive table
updates) as ``consecutive_failures`` and ``open_until``:

- **closed** (fewer than ``failures`` consecutive failures): allowed;
- **open** (``failures`` reached, before ``open_until``): skipped;
- **half-open** (``failures`` reached, ``open_until`` passed): allowed, and
  the first request the proxy sends there (:meth:`Breaker.admit`) is the
  probe: admitting it pushes ``open_until`` a cooldown ahead, so requests
  that arrive while the probe runs skip the endpoint as if it were open.
  The probe's success closes the breaker; its failure reopens it for a full
  cooldown. A probe that ends neither way (its client hung up) leaves the
  endpoint to be probed again when that cooldown passes.

Failures are connect errors, engine 5xx, timeouts and broken streams. A 429
is load, not ill health, and does not count either way.

The breaker never makes a model unavailable on its own: when every endpoint
of a model is open, the balancer still picks among them (a published
endpoint is the control plane's claim that it is ready; better to try it
than to refuse the request).

Called only from the event loop; ``now`` is the monotonic clock the
balancer also reads.
"""

from __future__ import annotations

from enum import Enum

from .table import EndpointState


class BreakerState(Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class Breaker:
    def __init__(self, failures: int, cooldown: float) -> None:
        self._failures = failures
        self._cooldown = cooldown

    def state(self, state: EndpointState, now: float) -> BreakerState:
        if state.consecutive_failures < self._failures:
            return BreakerState.CLOSED
        return BreakerState.OPEN if state.open_until > now else BreakerState.HALF_OPEN

    def allows(self, state: EndpointState, now: float) -> bool:
        # The balancer reads this inline, once per route and attempt (:meth:`.Balancer._pool`).
        return state.open_until <= now

    def admit(self, state: EndpointState, now: float) -> None:
        """The proxy is about to send a request here: claim the probe if half-open."""
        if state.consecutive_failures >= self._failures and state.open_until <= now:
            state.open_until = now + self._cooldown

    def success(self, state: EndpointState) -> None:
        state.consecutive_failures = 0
        state.open_until = 0.0

    def failure(self, state: EndpointState, now: float) -> None:
        state.consecutive_failures += 1
        if state.consecutive_failures >= self._failures:
            state.open_until = now + self._cooldown
