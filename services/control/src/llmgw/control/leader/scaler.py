"""The scaler: the leader's autoscaling duties, between the usage book and ``plan``.

On every reconcile pass the controller asks :meth:`Scaler.pass_` for the
replica count each model should have; ``plan`` uses that count where it
would otherwise use ``scaling.min``. The decision itself is the pure
:func:`llmgw.control.decide.autoscale.decide`; this class owns its memory and the drains.

Scale-down drains before it stops, so no request is cut:

1. The replicas to remove are chosen: not ready first, then the least
   loaded (as routers report), then the newest.
2. They are *draining*: withheld from the endpoint table at once, so
   routers stop sending them new requests, while ``plan`` is told to keep
   them (the count it gets is the decision plus the replicas draining), so
   it neither stops them early nor places a replacement.
3. A drain ends when every live router has reported, after
   ``drain_settle_seconds``, no request in flight on it (routers keep
   reporting an endpoint they no longer route to until its last request
   ends), or after ``drain_timeout_seconds`` whatever they say. Only then
   is it stopped and its record deleted (a ``StopReplica`` added to the
   pass's actions, after the table sync like every stop).
4. If load comes back first, the most recent drains are cancelled: the
   replica is published again instead of a new one being started.

Soft state only, reset at the end of every term: a new leader starts each
model from the count it runs (see ``decide``) and, having no drain in
progress, publishes every ready replica again.

Concurrency: one event loop; reports arrive between passes and are applied
synchronously.
"""

from __future__ import annotations

import logging
from collections import Counter, defaultdict
from collections.abc import Callable, Container, Iterable, Mapping
from dataclasses import dataclass

from llmgw.v1 import usage_pb2

from ..decide.autoscale import Decision, ModelScale, decide
from ..decide.reconcile import Replica, StopReplica
from ..metrics import AutoscaleMetrics
from ..spec.catalog import Catalog
from ..state.usage import Demand, RoutersView, UsageBook

log = logging.getLogger("llmgw.control.leader.scaler")


@dataclass(frozen=True)
class ScalerSettings:
    drain_settle_seconds: float = 1.0
    drain_timeout_seconds: float = 60.0


@dataclass(frozen=True)
class ScalePass:
    # The count plan() should hold each model at (the decision plus its drains).
    desired: Mapping[str, int]
    # Drained replicas to stop and forget in this pass.
    stops: tuple[StopReplica, ...]


@dataclass(frozen=True)
class _Drain:
    model: str
    started: float
    reason: str


class Scaler:
    def __init__(
        self,
        book: UsageBook,
        notify: Callable[[], None],
        settings: ScalerSettings = ScalerSettings(),
        metrics: AutoscaleMetrics | None = None,
    ):
        self._book = book
        self._notify = notify
        self._settings = settings
        self._metrics = metrics
        self._state: Mapping[str, ModelScale] = {}
        self._draining: dict[str, _Drain] = {}
        # Per router, the models its last report had requests waiting for.
        self._waiting: dict[str, frozenset[str]] = {}

    def configure(self, settings: ScalerSettings, expiry_intervals: float) -> None:
        """New cluster settings, in force from the next report and pass."""
        self._settings = settings
        self._book.configure(expiry_intervals)

    # -- what the usage servicer calls -------------------------------------

    def report(self, report: usage_pb2.UsageReport, now: float) -> None:
        """Take a router's report; a request waiting for a model runs a pass at once."""
        self._book.update(report, now)
        waiting = frozenset(m.model for m in report.models if m.pending > 0)
        if report.urgent or waiting - self._waiting.get(report.router_id, frozenset()):
            self._notify()
        self._waiting[report.router_id] = waiting

    # -- what the controller calls ------------------------------------------

    @property
    def draining(self) -> frozenset[str]:
        """Replica ids to keep out of the endpoint table."""
        return frozenset(self._draining)

    def scale(self, model: str) -> ModelScale | None:
        return self._state.get(model)

    def endpoint_load(self, replica_id: str, now: float) -> float:
        """One replica's load as the routers report it (0 when none does)."""
        return self._book.endpoint_load(replica_id, now)

    def routers(self, now: float) -> int:
        return self._book.routers(now)

    def routers_view(self, catalog: Catalog, now: float) -> RoutersView:
        """What the routers report, for the operator (AdminService.ListRouters)."""
        return self._book.routers_view(_canonical(catalog), now)

    def reset(self) -> None:
        """The term ended: forget everything (the next term starts from the records)."""
        self._book.clear()
        if self._metrics is not None:
            self._metrics.desired.clear()
            self._metrics.load.clear()
        self._state = {}
        self._draining.clear()
        self._waiting.clear()

    def pass_(
        self,
        catalog: Catalog,
        replicas: Iterable[Replica],
        now: float,
        leaving: Container[str] = frozenset(),
    ) -> ScalePass:
        """The counts for plan() and the drained replicas to stop.

        ``leaving`` names replicas plan() is moving away (on held nodes): they
        are neither counted nor drained here, since plan() replaces them
        first and stops them itself.
        """
        by_model: dict[str, list[Replica]] = defaultdict(list)
        for r in replicas:
            by_model[r.record.model].append(r)
        known = {r.id for rs in by_model.values() for r in rs}
        for rid in [rid for rid in self._draining if rid not in known]:
            del self._draining[rid]
        serving = {
            m: [r for r in rs if r.id not in self._draining and r.id not in leaving]
            for m, rs in by_model.items()
        }
        live = self._book.router_ids(now)
        self._waiting = {rid: w for rid, w in self._waiting.items() if rid in live}
        demand = self._book.demand(_canonical(catalog), now)
        decision = decide(catalog, demand, {m: len(rs) for m, rs in serving.items()}, self._state, now)
        self._state = decision.state
        self._log(decision)
        for model, want in decision.desired.items():
            self._rebalance(model, want, serving.get(model, []), by_model.get(model, []), now)
        stops = tuple(self._finished(by_model, now))
        drains = Counter(d.model for d in self._draining.values())
        desired = {m: n + drains[m] for m, n in decision.desired.items()}
        self._measure(decision, demand, now)
        return ScalePass(desired, stops)

    def _measure(self, decision: Decision, demand: Mapping[str, Demand] | None, now: float) -> None:
        m = self._metrics
        if m is None:
            return
        for model, n in decision.desired.items():
            m.desired.labels(model).set(n)
            d = demand.get(model) if demand is not None else None
            m.load.labels(model).set(d.load + d.pending if d is not None else 0)
            for direction in ("up", "down"):
                m.changes.labels(model, direction)
        for c in decision.changes:
            m.changes.labels(c.model, "up" if c.after > c.before else "down").inc()
        m.draining.set(len(self._draining))
        m.routers.set(self._book.routers(now))

    def _rebalance(
        self, model: str, want: int, serving: list[Replica], every: list[Replica], now: float
    ) -> None:
        extra = len(serving) - want
        if extra > 0:
            scale = self._state[model]
            for r in sorted(serving, key=lambda r: self._keep_score(r, now))[:extra]:
                self._draining[r.id] = _Drain(model, now, scale.reason)
                log.info("draining %s of %s before stopping it: %s", r.id, model, scale.reason)
        elif extra < 0:
            drains = sorted(
                (r for r in every if r.id in self._draining), key=lambda r: -self._draining[r.id].started
            )
            for r in drains[:-extra]:
                del self._draining[r.id]
                log.info("load is back: %s of %s serves again instead of being stopped", r.id, model)

    def _keep_score(self, r: Replica, now: float) -> tuple[bool, float, float]:
        """Lower sorts first and is drained first: not ready, least loaded, newest."""
        return (r.ready, self._book.endpoint_load(r.id, now), -r.record.created)

    def _finished(self, by_model: Mapping[str, list[Replica]], now: float) -> list[StopReplica]:
        s = self._settings
        out = []
        for _, rs in sorted(by_model.items()):
            for r in rs:
                d = self._draining.get(r.id)
                if d is None:
                    continue
                waited = now - d.started
                settled = waited >= s.drain_settle_seconds and self._book.quiet(
                    r.id, d.started + s.drain_settle_seconds, now
                )
                if settled or waited >= s.drain_timeout_seconds:
                    how = "drained" if settled else f"not drained after {waited:.0f}s; stopping anyway"
                    out.append(StopReplica(r.id, r.record.node, f"scaled down ({d.reason}); {how}", True))
        return out

    @staticmethod
    def _log(decision: Decision) -> None:
        for c in decision.changes:
            log.info("model %s: %d -> %d replica(s): %s", c.model, c.before, c.after, c.reason)


def _canonical(catalog: Catalog) -> Callable[[str], str | None]:
    def resolve(name: str) -> str | None:
        model = catalog.resolve(name)
        if model is None:
            return None
        # A shared ComfyUI environment's member: its requests load the entry's replicas.
        return model.served_by or model.name

    return resolve
