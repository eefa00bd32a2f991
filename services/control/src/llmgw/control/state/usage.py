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

Cost: the sums are kept up to date as reports arrive and expire (each
report costs its own size), so reading them on a reconcile pass costs the
number of replicas, not replicas x routers.

Clock: ``now`` is the control plane's monotonic clock; a router sends how
long ago it last saw a model used, never its own time.

Beside the load, each router's counts of answered requests and errors go
to a :class:`~.traffic.TrafficHistory` per router, for the operator's view
(:meth:`UsageBook.routers_view`): nothing decides on them.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from llmgw.v1 import usage_pb2

from .traffic import WINDOW_SECONDS, Counts, TrafficHistory, total

# One endpoint in one report: (model, requests in flight from that router,
# engine running + waiting or None without a sample).
_Load = tuple[str, int, float | None]


@dataclass(frozen=True)
class Demand:
    """What every live router reports of one model, summed."""

    # Requests in flight or queued on its replicas.
    load: float = 0.0
    # Requests held at routers, waiting for a ready replica.
    pending: int = 0
    # The latest time (the control plane's monotonic clock) it was used; None: not known.
    last_used: float | None = None


@dataclass(frozen=True)
class _Report:
    router: str
    received: float
    expires: float
    endpoints: Mapping[str, _Load]
    pending: Mapping[str, int]
    interval: float = 0.0


@dataclass(frozen=True)
class RouterFigures:
    """One live router as its latest report has it."""

    router: str
    age: float
    interval: float
    in_flight: int
    pending: int
    # Since it started, and per second over ``window``.
    totals: Counts
    rates: Counts
    window: float


@dataclass(frozen=True)
class RoutersView:
    routers: tuple[RouterFigures, ...]
    # Per model (canonical name), summed over the routers.
    demand: Mapping[str, Demand]
    rates: Mapping[str, Counts]
    window: float = WINDOW_SECONDS


class UsageBook:
    def __init__(self, expiry_intervals: float = 3.0, min_expiry: float = 3.0):
        self._intervals = expiry_intervals
        self._min_expiry = min_expiry
        self._reports: dict[str, _Report] = {}
        self._last_used: dict[str, float] = {}
        # Per endpoint, over live reports: the model, how many reports mention it,
        # the summed in-flight count, and the freshest engine sample (when, value, router).
        self._model: dict[str, str] = {}
        self._mentions: dict[str, int] = {}
        self._in_flight: dict[str, int] = {}
        self._engine: dict[str, tuple[float, float, str]] = {}
        self._traffic: dict[str, TrafficHistory] = {}

    def configure(self, expiry_intervals: float) -> None:
        self._intervals = expiry_intervals

    def update(self, report: usage_pb2.UsageReport, now: float) -> None:
        """Replace what ``report.router_id`` said before with ``report``."""
        expiry = max(self._min_expiry, self._intervals * report.interval_seconds)
        endpoints: dict[str, _Load] = {
            e.endpoint_id: (
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
        old = self._reports.get(report.router_id)
        if old is not None:
            self._subtract(old)
        new = _Report(report.router_id, now, now + expiry, endpoints, pending, report.interval_seconds)
        self._reports[report.router_id] = new
        self._add(new)
        counts: dict[str, Counts] = {}
        for t in report.traffic:
            counts[t.model] = counts.get(t.model, Counts()).plus(
                Counts(t.requests, t.client_errors, t.server_errors)
            )
        self._traffic.setdefault(report.router_id, TrafficHistory()).add(now, counts)

    def _add(self, r: _Report) -> None:
        for eid, (model, in_flight, engine) in r.endpoints.items():
            self._model[eid] = model
            self._mentions[eid] = self._mentions.get(eid, 0) + 1
            self._in_flight[eid] = self._in_flight.get(eid, 0) + in_flight
            if engine is not None:
                self._engine[eid] = (r.received, engine, r.router)

    def _subtract(self, r: _Report) -> None:
        for eid, (_, in_flight, _) in r.endpoints.items():
            self._in_flight[eid] -= in_flight
            self._mentions[eid] -= 1
            sample = self._engine.get(eid)
            if sample is not None and sample[2] == r.router:
                # Its source is gone; another router's next report brings a fresh one.
                del self._engine[eid]
            if not self._mentions[eid]:
                for table in (self._model, self._mentions, self._in_flight):
                    del table[eid]

    def clear(self) -> None:
        for table in (
            self._reports,
            self._last_used,
            self._model,
            self._mentions,
            self._in_flight,
            self._engine,
            self._traffic,
        ):
            table.clear()

    def _live(self, now: float) -> list[_Report]:
        for rid in [rid for rid, r in self._reports.items() if r.expires <= now]:
            self._subtract(self._reports.pop(rid))
            self._traffic.pop(rid, None)
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
        names: dict[str, str | None] = {}

        def canonical(model: str) -> str | None:
            if model not in names:
                names[model] = resolve(model)
            return names[model]

        load: dict[str, float] = defaultdict(float)
        for eid, model in self._model.items():
            name = canonical(model)
            if name is not None:
                load[name] += self._load(eid)
        pending: dict[str, int] = defaultdict(int)
        for r in live:
            for model, n in r.pending.items():
                name = canonical(model)
                if name is not None:
                    pending[name] += n
        used: dict[str, float] = {}
        for model, at in self._last_used.items():
            name = canonical(model)
            if name is not None and at > used.get(name, float("-inf")):
                used[name] = at
        return {
            name: Demand(load.get(name, 0.0), pending.get(name, 0), used.get(name))
            for name in set(load) | set(pending) | set(used)
        }

    def routers_view(self, resolve: Callable[[str], str | None], now: float) -> RoutersView:
        """Every live router's figures, and the models' load and rates summed over them.

        Traffic is kept under the name the router counted it by (the model
        that answered, or empty for a request that named none it knew);
        a name the catalog resolves is summed under its canonical name.
        """
        routers = []
        rates: dict[str, Counts] = {}
        for r in sorted(self._live(now), key=lambda r: r.router):
            history = self._traffic.get(r.router)
            per_model = history.rates() if history is not None else {}
            for model, c in per_model.items():
                name = resolve(model) or model
                rates[name] = rates.get(name, Counts()).plus(c)
            routers.append(
                RouterFigures(
                    router=r.router,
                    age=max(0.0, now - r.received),
                    interval=r.interval,
                    in_flight=sum(e[1] for e in r.endpoints.values()),
                    pending=sum(r.pending.values()),
                    totals=total(history.latest[1].values()) if history is not None else Counts(),
                    rates=total(per_model.values()),
                    window=history.span() if history is not None else 0.0,
                )
            )
        return RoutersView(tuple(routers), self.demand(resolve, now) or {}, rates)

    def endpoint_load(self, endpoint_id: str, now: float) -> float:
        """One replica's load as the routers see it (0 when none mentions it)."""
        self._live(now)
        return self._load(endpoint_id) if endpoint_id in self._model else 0.0

    def _load(self, eid: str) -> float:
        sample = self._engine.get(eid)
        return max(float(self._in_flight[eid]), sample[1] if sample is not None else 0.0)

    def quiet(self, endpoint_id: str, since: float, now: float) -> bool:
        """Whether every live router has reported since ``since``, none with requests on the endpoint.

        True when no router reports: then no router sends it anything either.
        """
        for r in self._live(now):
            if r.received < since:
                return False
            e = r.endpoints.get(endpoint_id)
            if e is not None and e[1] > 0:
                return False
        return True
