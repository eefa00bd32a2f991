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
model that is not on demand never waits: no ready replica is a 503 at once,
as before. The wait is not part of ``limits.request_timeout_seconds``,
which starts when the request is first sent to an engine.

One event loop; the table calls :meth:`WakeHold.changed` synchronously on
every update, and waiters re-check their model's routes then.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from .errors import ModelWaking
from .table import Model, Route


class RouteSource(Protocol):
    def routes(self, model: str) -> Sequence[Route]: ...
    def subscribe(self, listener: object) -> None: ...


class DemandSink(Protocol):
    def used(self, model: str) -> None: ...
    def hold(self, model: str) -> None: ...
    def release(self, model: str) -> None: ...


class WakeHold:
    def __init__(self, table: RouteSource, demand: DemandSink, timeout: float, retry_after: int) -> None:
        self._table = table
        self._demand = demand
        self._timeout = timeout
        self._retry_after = retry_after
        self._changed = asyncio.Event()
        table.subscribe(self.changed)

    def changed(self) -> None:
        """The table changed: wake every waiter (each re-checks its own model)."""
        self._changed.set()
        self._changed = asyncio.Event()

    def used(self, model: str) -> None:
        self._demand.used(model)

    async def routes(self, model: Model) -> Sequence[Route]:
        """The model's routes, waiting for a replica to wake when it is on demand and has none."""
        routes = self._table.routes(model.name)
        if routes or not model.on_demand:
            return routes
        self._demand.hold(model.name)
        try:
            async with asyncio.timeout(self._timeout):
                while True:
                    changed = self._changed
                    routes = self._table.routes(model.name)
                    if routes:
                        return routes
                    await changed.wait()
        except TimeoutError:
            raise ModelWaking(model.name, self._timeout, self._retry_after) from None
        finally:
            self._demand.release(model.name)
