"""A per-endpoint circuit breaker over the router's own traffic.

The control plane publishes only ready replicas, but it learns of a dead
engine seconds after this router does. The breaker bridges that gap: after
``failures`` consecutive failures (connect errors, engine 5xx, broken
streams) an endpoint is skipped for ``cooldown`` seconds; then it is tried
again (half-open) and one more failure reopens it at once, while one success
closes it. A 429 is load, not ill health, and does not count.

The breaker never makes a model unavailable on its own: when every endpoint
of a model is open, the balancer still picks among them (a published
endpoint is the control plane's claim that it is ready; better to try it
than to refuse the request).

State lives in :class:`~.table.EndpointState`, so it survives table updates.
"""

from __future__ import annotations

from .table import EndpointState


class Breaker:
    def __init__(self, failures: int, cooldown: float) -> None:
        self._failures = failures
        self._cooldown = cooldown

    def allows(self, state: EndpointState, now: float) -> bool:
        return state.open_until <= now

    def success(self, state: EndpointState) -> None:
        state.consecutive_failures = 0
        state.open_until = 0.0

    def failure(self, state: EndpointState, now: float) -> None:
        state.consecutive_failures += 1
        if state.consecutive_failures >= self._failures:
            state.open_until = now + self._cooldown
