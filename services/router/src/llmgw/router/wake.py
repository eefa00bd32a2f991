"""Holding a request while an on-demand model wakes.

A model whose catalog entry says ``on_demand`` (``scaling.min: 0``) may have
no replica at all. A request for it then waits here instead of getting a
503 at once: :meth:`WakeHold.routes` counts it as *pending* in the usage
reporter, which sends a report at once (not at the next tick); the control
plane starts a replica, publishes it when Ready, and the router's existing
Watch adds it to the table, which wakes every request waiting for that
model. They then go through the proxy like any other request.

Bounded: after ``timeout`` seconds without a ready replica the request is
answered 503 with ``Retry-After`` (OpenAI-shaped, code ``model_waking``),
and the model stays pending only as long as some request waits for it. A
model that leaves the catalog meanwhile is a 404, as for any unknown model. A
model that is not on demand never waits: no ready replica is a 503 at once,
as before. The wait is not part of ``limits.request_timeout_seconds``,
which starts when the request is first sent to an engine.

One event loop; the table calls :meth:`WakeHold.changed` synchronously on
every update, and waiters re-check their model's routes then.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from .errors import ModelNotFound, ModelWaking
from .table import Model, Route

OUTCOMES = ("woken", "timeout", "removed")


class RouteSource(Protocol):
    def models(self) -> list[Model]: ...
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...
    def subscribe(self, listener: Callable[[], None]) -> None: ...


class DemandSink(Protocol):
    def used(self, model: str) -> None: ...
    def hold(self, model: str) -> None: ...
    def release(self, model: str) -> None: ...


class WakeMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.waiting = Gauge(
            "llmgw_router_wake_waiting",
            "Requests held now, waiting for an on-demand model to get a ready replica",
            ["model"],
            registry=registry,
        )
        self.wakes = Counter(
            "llmgw_router_wakes_total",
            "Requests that waited for an on-demand model, by outcome (woken, timeout, removed)",
            ["model", "outcome"],
            registry=registry,
        )
        self.seconds = Histogram(
            "llmgw_router_wake_seconds",
            "How long a request waited for an on-demand model to wake",
            ["model"],
            buckets=(0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
            registry=registry,
        )

    def model(self, name: str) -> None:
        self.waiting.labels(name)
        self.seconds.labels(name)
        for outcome in OUTCOMES:
            self.wakes.labels(name, outcome)


class WakeHold:
    def __init__(
        self,
        table: RouteSource,
        demand: DemandSink,
        timeout: float,
        retry_after: int,
        metrics: WakeMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._table = table
        self._demand = demand
        self._timeout = timeout
        self._retry_after = retry_after
        self._metrics = metrics
        self._clock = clock
        self._changed = asyncio.Event()
        table.subscribe(self.changed)

    def changed(self) -> None:
        """The table changed: wake every waiter (each re-checks its own model)."""
        self._changed.set()
        self._changed = asyncio.Event()
        if self._metrics is not None:
            for model in self._table.models():
                if model.on_demand:
                    self._metrics.model(model.name)

    def used(self, model: str) -> None:
        self._demand.used(model)

    async def routes(self, model: Model) -> Sequence[Route]:
        """The model's routes, waiting for a replica to wake when it is on demand and has none."""
        routes = self._table.routes(model.name)
        if routes or not model.on_demand:
            return routes
        self._demand.hold(model.name)
        m = self._metrics
        start = self._clock()
        if m is not None:
            m.waiting.labels(model.name).inc()
        outcome = "timeout"
        try:
            async with asyncio.timeout(self._timeout):
                while True:
                    changed = self._changed
                    routes = self._table.routes(model.name)
                    if routes:
                        outcome = "woken"
                        return routes
                    if self._table.resolve(model.name) is None:
                        outcome = "removed"
                        raise ModelNotFound(model.name)
                    await changed.wait()
        except TimeoutError:
            raise ModelWaking(model.name, self._timeout, self._retry_after) from None
        finally:
            self._demand.release(model.name)
            if m is not None:
                m.waiting.labels(model.name).dec()
                m.seconds.labels(model.name).observe(self._clock() - start)
                m.wakes.labels(model.name, outcome).inc()
