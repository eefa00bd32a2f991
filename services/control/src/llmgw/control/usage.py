"""The usage book: the latest load report of every router, aggregated per model.

Soft state, in the leader's memory only: each router's latest
``UsageReport`` replaces its previous one whole (reports are snapshots),
and a router that stops reporting for :attr:`UsageBook.expiry` seconds
(a few of its own ticks, at least ``min_expiry``) drops out of every sum.
Nothing here is ever written to etcd; a new leader rebuilds it from the
routers within one tick of their reconnecting.

What the sums mean:

- A replica's load is the larger of the routers' in-flight counts summed
  (exact, but only traffic through routers) and the engine's own running +
  waiting as the freshest router sample has it (everyone's traffic, but a
  poll old). Engines' numbers are not summed across routers: each router
  reads the same engine.
- A model's demand is the load of its replicas plus the requests routers
  hold for it (waiting for a ready replica), and the latest time any router
  saw it used. That time is kept per model apart from the reports, so a
  router that goes away does not take the model's last use with it.
- Names are resolved through the catalog before summing: a request for an
  alias or an adapter is a request for the replica's model.

Clock: ``now`` is the control plane's monotonic clock; a router sends how
long ago it last saw a model used, never its own time.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmgw.v1 import usage_pb2

from .autoscale import Demand


@dataclass(frozen=True)
class _Endpoint:
    model: str
    in_flight: int
    # Engine-reported running + waiting; None without a sample.
    engine: float | None


@dataclass(frozen=True)
class _Report:
    received: float
    expires: float
    endpoints: Mapping[str, _Endpoint]
    pending: Mapping[str, int]


class UsageBook:
    def __init__(self, expiry_intervals: float = 3.0, min_expiry: float = 3.0):
        self._intervals = expiry_intervals
        self._min_expiry = min_expiry
        self._reports: dict[str, _Report] = {}
        self._last_used: dict[str, float] = {}

    def update(self, report: usage_pb2.UsageReport, now: float) -> None:
        """Replace what ``report.router_id`` said before with ``report``."""
        expiry = max(self._min_expiry, self._intervals * report.interval_seconds)
        endpoints = {
            e.endpoint_id: _Endpoint(
                e.model,
                max(e.in_flight, 0),
                e.engine_running + e.engine_waiting if e.engine_sampled else None,
            )
            for e in report.endpoints
        }
        pending: dict[str, int] = {}
        for m in report.models:
            if m.pending > 0:
                pending[m.model] = pending.get(m.model, 0) + m.pending
            if m.HasField("idle_seconds"):
                used = now - max(m.idle_seconds, 0.0)
                if used > self._last_used.get(m.model, float("-inf")):
                    self._last_used[m.model] = used
        self._reports[report.router_id] = _Report(now, now + expiry, endpoints, pending)

    def clear(self) -> None:
        self._reports.clear()
        self._last_used.clear()

    def _live(self, now: float) -> list[_Report]:
        for rid in [rid for rid, r in self._reports.items() if r.expires <= now]:
            del self._reports[rid]
        return list(self._reports.values())

    def routers(self, now: float) -> int:
        """How many routers report now."""
        return len(self._live(now))

    def router_ids(self, now: float) -> set[str]:
        self._live(now)
        return set(self._reports)

    def demand(self, resolve: Callable[[str], str | None], now: float) -> dict[str, Demand] | None:
        """Each model's demand, by canonical name; None when no router reports at all."""
        live = self._live(now)
        if not live:
            return None
        load: dict[str, float] = defaultdict(float)
        for model, value in self._endpoint_loads(live).values():
            name = resolve(model)
            if name is not None:
                load[name] += value
        pending: dict[str, int] = defaultdict(int)
        for r in live:
            for model, n in r.pending.items():
                name = resolve(model)
                if name is not None:
                    pending[name] += n
        used: dict[str, float] = {}
        for model, at in self._last_used.items():
            name = resolve(model)
            if name is not None and at > used.get(name, float("-inf")):
                used[name] = at
        return {
            name: Demand(load.get(name, 0.0), pending.get(name, 0), used.get(name))
            for name in set(load) | set(pending) | set(used)
        }

    def endpoint_load(self, endpoint_id: str, now: float) -> float:
        """One replica's load as the routers see it (0 when none mentions it)."""
        return self._endpoint_loads(self._live(now)).get(endpoint_id, ("", 0.0))[1]

    def quiet(self, endpoint_id: str, since: float, now: float) -> bool:
        """Whether every live router has reported since ``since``, none with requests on the endpoint.

        True when no router reports: then no router sends it anything either.
        """
        for r in self._live(now):
            if r.received < since:
                return False
            e = r.endpoints.get(endpoint_id)
            if e is not None and e.in_flight > 0:
                return False
        return True

    @staticmethod
    def _endpoint_loads(live: list[_Report]) -> dict[str, tuple[str, float]]:
        in_flight: dict[str, int] = defaultdict(int)
        engine: dict[str, tuple[float, float]] = {}
        models: dict[str, str] = {}
        for r in live:
            for eid, e in r.endpoints.items():
                models[eid] = e.model
                in_flight[eid] += e.in_flight
                # The freshest sample of the engine wins.
                if e.engine is not None and (eid not in engine or r.received > engine[eid][0]):
                    engine[eid] = (r.received, e.engine)
        return {
            eid: (model, max(float(in_flight[eid]), engine[eid][1] if eid in engine else 0.0))
            for eid, model in models.items()
        }
