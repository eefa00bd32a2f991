"""The controller: the leader's duties, for the length of each term.

While this process leads it owns the fleet's soft state (inventory, observed
replica states, failure backoff, placement messages) and runs one loop:

- at the start of a term: read the replica records and the published
  endpoints, publish the catalog, expect every node the records name, and
  only then accept agents (before that a Register would make every running
  replica look like an orphan);
- on every change reported by an agent, every ``reconcile_interval``,
  whenever a node times out and when a router reports a request waiting for
  an on-demand model: ask the scaler (when there is one) how many replicas
  each model wants, ``plan``, sync endpoints, apply the actions, then send
  each ready replica whose LoRA adapters differ from ``plan_adapters``'s
  its set (see decide.adapters);
- every ``publish_interval`` (the backstop): sync endpoints, which costs one
  fingerprint when nothing changed.

Guarantees:

- Traffic leaves before the replica does: replicas that a pass will stop or
  forget are withheld from the table and the table is synced *before* any
  command is sent; if that sync fails, nothing is stopped in that pass.
  Replicas the scaler removes are withheld for longer: until routers report
  them drained (see scaler).
- The loop never dies on one failing pass: the failure is logged and
  counted and the next pass starts from the state as it then is. Only the
  end of the term stops it, and then agent streams are closed (they come
  back, are redirected, and reach the new leader) and all soft state is
  dropped, so a later term starts from etcd, not from memory.
- A record is written before its start command is sent, and re-sends of
  the same command for the same replica are spaced by
  ``command_resend_seconds`` (see applier).

This module is the loop and the term: when a pass runs, what it withholds
from the table and in what order it syncs and acts. Turning the actions
into record writes and agent commands is the applier's, the decision is
reconcile's, and the records themselves are replicas'.

Single event loop: agent events, admin reads and the loop interleave only
at awaits, and every mutation is synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.common.etcd import Store
from llmgw.v1 import agent_pb2

from ..decide.adapters import plan_adapters
from ..decide.autoscale import ModelScale
from ..decide.placement import Fleet, Policy
from ..decide.reconcile import (
    Action,
    Backoff,
    CannotPlace,
    EvictReplica,
    ForgetReplica,
    PlanSettings,
    Replica,
    StartReplica,
    StopReplica,
    plan,
)
from ..decide.tenancy import Ledger
from ..metrics import ControlMetrics
from ..spec.catalog import Catalog, Model, with_federated
from ..spec.evalsuite import EvalSuite
from ..spec.tenancy import Quota
from ..state.gpuhours import GpuHours
from ..state.inventory import DomainHold, Inventory, Node, NodeOverride
from ..state.weights import WeightsTable
from ..store.lifecycle import LifecycleBook
from ..store.replicas import ReplicaBook
from .applier import Applier, ApplySettings, CommandSink
from .leadership import Leadership, NotLeader, Term
from .lifecycle import Lifecycle
from .publisher import EndpointPublisher, endpoint_table, sync_catalog
from .scaler import Scaler

log = logging.getLogger("llmgw.control.leader.controller")


class AgentStreams(CommandSink, Protocol):
    """The agent sessions (agents.AgentSessions): commands go out through them, a term's end closes them."""

    def close_all(self, reason: str) -> None: ...


@dataclass(frozen=True)
class ControllerSettings:
    node_timeout_seconds: float = 10.0
    node_lost_seconds: float = 30.0
    reconcile_interval_seconds: float = 1.0
    publish_interval_seconds: float = 1.0
    failure_backoff_seconds: float = 5.0
    failure_backoff_max_seconds: float = 300.0
    command_resend_seconds: float = 10.0
    placement_settle_seconds: float = 2.0
    placement_policy: Policy = "pack"
    # Quotas per owner path (the cluster settings' quotas; decide.tenancy).
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    # Watts per facility domain (the cluster settings' power_budgets; placement).
    power_budgets: Mapping[str, float] = field(default_factory=dict)
    # Eval suites by name (the cluster settings' eval_suites; leader.lifecycle).
    eval_suites: Mapping[str, EvalSuite] = field(default_factory=dict)
    # How long a Register waits for a term that is still loading.
    ready_timeout_seconds: float = 5.0
    retry_seconds: float = 1.0


class Controller:
    def __init__(
        self,
        store: Store,
        leadership: Leadership,
        catalog: Catalog,
        sessions: AgentStreams,
        secret: bytes,
        metrics: ControlMetrics,
        settings: ControllerSettings = ControllerSettings(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        scaler: Scaler | None = None,
    ):
        self._store = store
        self._leadership = leadership
        # The catalog in force is the declared and runtime models (base) plus
        # the peers' models that federation offers now (see set_federated).
        self._base = catalog
        self._federated: tuple[Model, ...] = ()
        self.federation_clashes: list[str] = []
        self._catalog = catalog
        self._sessions = sessions
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._inventory = Inventory(settings.node_timeout_seconds, settings.node_lost_seconds)
        self.weights_table = WeightsTable()
        self._book = ReplicaBook(store, leadership)
        self._applier = Applier(
            book=self._book,
            sessions=sessions,
            secret=secret,
            metrics=metrics,
            settings=_apply_settings(settings),
            wall=wall,
        )
        self._publisher = EndpointPublisher(store, leadership, metrics)
        self._lifecycle = Lifecycle(LifecycleBook(store, leadership), secret, wall, self.notify)
        # Replicas the eval gate holds back (leader.lifecycle), as of the last pass.
        self._gated: frozenset[str] = frozenset()
        self._term: Term | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._placement: dict[str, str] = {}
        # The last pass's CannotPlace kind per model, and the replicas it wanted per model.
        self.unplaced: dict[str, str] = {}
        self._desired: dict[str, int] = {}
        # GPU-hours per model during this term (owner usage).
        self.gpu_hours = GpuHours()
        self._withheld: set[str] = set()
        self._catalog_published = False
        self._place_after = 0.0
        # Autoscaling; absent: every model runs scaling.min replicas.
        self._scaler = scaler

    # -- what the agent servicer calls ---------------------------------------------

    @property
    def accepting(self) -> bool:
        return self._term is not None and self._ready.is_set() and self._leadership.is_leader

    async def wait_ready(self) -> bool:
        """Wait (``ready_timeout_seconds`` at most) until this term has loaded its state."""
        try:
            async with asyncio.timeout(self._settings.ready_timeout_seconds):
                await self._ready.wait()
        except TimeoutError:
            return False
        return self.accepting

    def register(self, reg: agent_pb2.Register) -> None:
        if not self.accepting:
            raise NotLeader("this control plane is not accepting agents")
        self._inventory.register(reg, self._clock())
        self.weights_table.replace(reg.node_id, reg.weights)
        log.info(
            "node %s registered: %d GPU(s), engines %s, %d replica(s) running",
            reg.node_id,
            len(reg.gpus),
            [e.kind for e in reg.engines],
            len(reg.replicas),
        )
        self.notify()

    def heartbeat(self, node_id: str, hb: agent_pb2.Heartbeat) -> None:
        if self.accepting and self._inventory.get(node_id) is not None:
            self.weights_table.replace(node_id, hb.weights)
        if self.accepting and self._inventory.heartbeat(node_id, hb, self._clock()):
            self.notify()

    def weights(self, node_id: str, status: agent_pb2.WeightsStatus) -> None:
        if self.accepting and self._inventory.get(node_id) is not None:
            self.weights_table.update(node_id, status)

    def report(self, node_id: str, status: agent_pb2.ReplicaStatus) -> None:
        if self.accepting and self._inventory.report(node_id, status, self._clock()):
            log.info(
                "replica %s on %s: %s %s",
                status.replica_id,
                node_id,
                agent_pb2.ReplicaState.Name(status.state),
                status.message,
            )
            self.notify()

    def disconnect(self, node_id: str) -> None:
        if self._term is not None and self._inventory.disconnect(node_id, self._clock()):
            log.warning("node %s disconnected; it is unreachable", node_id)
            self.notify()

    def notify(self) -> None:
        """Something changed: run a pass soon (coalesced)."""
        self._wake.set()

    @property
    def catalog(self) -> Catalog:
        return self._catalog

    def replace_overrides(self, overrides: Mapping[str, NodeOverride]) -> None:
        """Put the operators' node holds and labels in force (every control plane follows them).

        Kept across terms: they come from etcd, not from this term's agents,
        so a standby that takes over already has them.
        """
        if self._inventory.set_overrides(overrides):
            log.info(
                "node overrides changed: held %s",
                ", ".join(sorted(n for n, o in overrides.items() if o.held)) or "none",
            )
            self.notify()

    def replace_domain_holds(self, holds: Iterable[DomainHold]) -> None:
        """Put the operators' domain holds in force (followed from etcd, kept across terms)."""
        holds = list(holds)
        if self._inventory.set_domain_holds(holds):
            log.info(
                "domain holds changed: %s",
                ", ".join(f"{h.label}={h.value}{' (drain)' if h.drain else ''}" for h in holds) or "none",
            )
            self.notify()

    def replace_catalog(self, catalog: Catalog) -> None:
        """Put another catalog in force without a restart.

        Nothing is torn down here: the next pass compares the new desired
        state with what runs. A removed model's endpoints leave the table in
        that pass before its replicas are sent StopReplica, and ``catalog/``
        in etcd is rewritten by the leader in the same pass.
        """
        self._lifecycle.catalog_replaced(self._base, catalog)
        self._base = catalog
        self._merge()
        log.info("catalog replaced: %s", ", ".join(self._catalog.names) or "no models")
        self.notify()

    def set_federated(self, models: Iterable[Model]) -> None:
        """The peers' models to offer now (federation calls it when its checks change what is offered).

        Published like any catalog change: routers drop a withdrawn peer model
        when the catalog delta lands, within a pass of this call.
        """
        self._federated = tuple(models)
        self._merge()
        log.info("peer models offered: %s", ", ".join(m.name for m in self._federated) or "none")
        self.notify()

    def _merge(self) -> None:
        catalog, clashes = with_federated(self._base, self._federated)
        if clashes and clashes != self.federation_clashes:
            log.warning(
                "peer model(s) %s have the name of a model of this cluster; the local model wins",
                ", ".join(clashes),
            )
        self.federation_clashes = clashes
        self._catalog = catalog
        self._catalog_published = False

    @property
    def settings(self) -> ControllerSettings:
        return self._settings

    def apply_settings(self, settings: ControllerSettings) -> None:
        """New timings from the cluster settings, in force from the next pass."""
        self._settings = settings
        self._applier.settings = _apply_settings(settings)
        self._inventory.set_thresholds(settings.node_timeout_seconds, settings.node_lost_seconds)
        self.notify()

    # -- what the admin servicer reads ----------------------------------------------

    def nodes(self) -> list[Node]:
        return self._inventory.nodes()

    def replicas(self) -> list[Replica]:
        out = []
        for rec in sorted(self._book.records.values(), key=lambda r: r.id):
            node = self._inventory.get(rec.node)
            out.append(Replica(rec, node.replicas.get(rec.id) if node else None))
        return out

    @property
    def placement_messages(self) -> Mapping[str, str]:
        return self._placement

    @property
    def backoffs(self) -> Mapping[str, Backoff]:
        """Models whose replicas failed, with the last error, until they are fully ready again."""
        return self._applier.backoffs

    @property
    def now(self) -> float:
        return self._clock()

    @property
    def placement_policy(self) -> str:
        return self._settings.placement_policy

    def explain(self, model_name: str) -> list[tuple[int, str, list[tuple[str, str]]]]:
        """Per profile of the model (index, description), every node's verdict as of now."""
        model = self._catalog.get(model_name)
        if model is None:
            return []
        nodes = {n.id: n for n in self._inventory.nodes()}
        s = self._settings
        fleet = Fleet(nodes, self._book.records.values(), s.placement_policy, s.power_budgets)
        return [(p.index, p.describe(), fleet.verdicts(p)) for p in model.profiles]

    def wanted(self, model_name: str) -> int:
        """Replicas the last pass wanted of the model: the autoscaler's count, else scaling.min."""
        model = self._catalog.get(model_name)
        return self._desired.get(model_name, model.min_replicas if model else 0)

    def lifecycle(self, model_name: str) -> tuple[str, str]:
        """(rolling update, eval gate) of the model, in words; empty when neither applies or not leading."""
        model = self._catalog.get(model_name)
        if model is None or not self.accepting:
            return "", ""
        mine = [r for r in self.replicas() if r.record.model == model_name]
        return self._lifecycle.status(model, mine, self.wanted(model_name))

    def quotas(self) -> Mapping[str, Quota]:
        return self._settings.quotas

    def quota_lines(self, model_name: str) -> list[str]:
        """The quotas over the model's owner with what each scope holds now: ``llmgw explain``."""
        model = self._catalog.get(model_name)
        if model is None or not model.owner:
            return []
        nodes = {n.id: n for n in self._inventory.nodes()}
        held = {n.id for n in nodes.values() if n.draining}
        staying = [r for r in self._book.records.values() if r.node not in held]
        return Ledger(self._settings.quotas, self._catalog, nodes, staying).lines(model.owner)

    def scaling(self, model: str) -> ModelScale | None:
        """What the autoscaler wants for ``model`` and why; None when not leading or not autoscaling."""
        return self._scaler.scale(model) if self._scaler is not None and self.accepting else None

    def used_gpus(self, node: Node) -> set[int]:
        used = {i for rec in self._book.records.values() if rec.node == node.id for i in rec.gpu_indices}
        used.update(i for r in node.replicas.values() if r.holds_gpus for i in r.gpu_indices)
        return used

    # -- the loop ---------------------------------------------------------------------

    async def run(self) -> None:
        """Serve every term this process wins, until cancelled."""
        while True:
            term = await self._leadership.wait_elected()
            self._term = term
            self._metrics.leader.set(1)
            self._metrics.terms.inc()
            serve = asyncio.create_task(self._serve(term), name="controller-term")
            lost = asyncio.create_task(term.lost.wait(), name="controller-term-lost")
            try:
                await asyncio.wait({serve, lost}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                serve.cancel()
                lost.cancel()
                try:
                    await asyncio.wait({serve, lost})
                    await self._lifecycle.stop()
                finally:
                    self._end_term(term)
            if serve.done() and not serve.cancelled() and serve.exception() is not None:
                log.error("leader duties stopped", exc_info=serve.exception())
                await asyncio.sleep(self._settings.retry_seconds)

    async def _serve(self, term: Term) -> None:
        while True:
            try:
                await self._start_term()
                break
            except NotLeader:
                return
            except Exception:
                log.exception("could not load the cluster state for term %d", term.number)
                self._metrics.reconcile_failures.inc()
                await asyncio.sleep(self._settings.retry_seconds)
        # Nodes the records name are expected from this moment, when their
        # agents can first reach this leader: their published endpoints stay
        # for a node timeout counted from here, not from the election.
        now = self._clock()
        self._inventory.expect({r.node for r in self._book.records.values()}, now)
        self._place_after = now + self._settings.placement_settle_seconds
        self.gpu_hours.start(self._wall())
        self._ready.set()
        log.info(
            "term %d: leading with %d replica record(s), %d published endpoint(s)",
            term.number,
            len(self._book.records),
            len(self._publisher.stored),
        )
        s = self._settings
        next_pass = 0.0
        while True:
            now = self._clock()
            for nid in self._inventory.expire(now):
                log.warning("node %s silent for %.0fs; it is unreachable", nid, s.node_timeout_seconds)
                self._wake.set()
            full = self._wake.is_set() or now >= next_pass
            self._wake.clear()
            try:
                if full:
                    next_pass = now + s.reconcile_interval_seconds
                    await self._pass(now)
                else:
                    await self._publish(now)
            except NotLeader:
                return
            except Exception:
                log.exception("reconcile pass failed; the next one starts from current state")
                self._metrics.reconcile_failures.inc()
            timeout = max(0.0, min(s.publish_interval_seconds, next_pass - self._clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()

    async def _start_term(self) -> None:
        await self._book.load()
        await self._publisher.load()
        await self._lifecycle.load()
        await self._publish_catalog()
        self._inventory.clear()

    def _end_term(self, term: Term) -> None:
        self._ready.clear()
        self._term = None
        self._sessions.close_all("this control plane no longer leads")
        self._inventory.clear()
        self.weights_table.clear()
        self._book.clear()
        self._publisher.reset()
        self._applier.clear()
        self._placement, self.unplaced, self._desired = {}, {}, {}
        self._withheld.clear()
        self._gated = frozenset()
        self._catalog_published = False
        if self._scaler is not None:
            self._scaler.reset()
        self._metrics.leader.set(0)
        log.info("term %d ended", term.number)

    async def _publish_catalog(self) -> None:
        catalog = self._catalog
        await sync_catalog(self._store, self._leadership, catalog, self._wall)
        self._catalog_published = catalog is self._catalog

    async def _publish(self, now: float) -> None:
        nodes = {n.id: n for n in self._inventory.nodes()}
        table = endpoint_table(
            self._catalog,
            nodes,
            self.replicas(),
            self._publisher.stored,
            self._withheld
            | self._gated
            | (self._scaler.draining if self._scaler is not None else frozenset()),
            now,
            self._settings.node_timeout_seconds,
        )
        await self._publisher.sync(table)

    async def _pass(self, now: float) -> None:
        self._metrics.reconcile_passes.inc()
        if not self._catalog_published:
            await self._publish_catalog()
        replicas = self.replicas()
        nodes = self._inventory.nodes()
        holding: Counter[str] = Counter()
        for r in replicas:
            holding[r.record.model] += len(r.record.gpu_indices)
        self.gpu_hours.observe(now, holding)
        # A rolled-back model is planned with its previous document (leader.lifecycle).
        catalog = self._lifecycle.effective(self._catalog)
        scaled = None
        if self._scaler is not None:
            held = {n.id for n in nodes if n.draining}
            # Replicas on held nodes and those a rolling update replaces: plan() stops them itself.
            leaving = {r.id for r in replicas if r.record.node in held} | self._lifecycle.replaced(
                catalog, replicas
            )
            scaled = self._scaler.pass_(self._catalog, replicas, now, leaving)
        self._gated = self._lifecycle.gated(catalog, replicas, self._publisher.stored)
        actions = plan(
            catalog,
            nodes,
            replicas,
            now,
            self._applier.backoffs,
            PlanSettings(
                node_lost_seconds=self._settings.node_lost_seconds,
                policy=self._settings.placement_policy,
                quotas=self._settings.quotas,
                power_budgets=self._settings.power_budgets,
            ),
            weights_holders=self.weights_table.holders(),
            desired=scaled.desired if scaled is not None else None,
            gated=self._gated,
        )
        if scaled is not None:
            actions.extend(scaled.stops)
        if now < self._place_after:
            actions = self._hold_placements(actions, self._place_after - now)
        self._withheld |= {
            a.replica_id
            for a in actions
            if isinstance(a, StopReplica | ForgetReplica | EvictReplica)
            and a.replica_id in self._book.records
        }
        # Endpoints first: nothing below may stop a replica that is still published.
        await self._publish(now)
        unplaced = [a for a in actions if isinstance(a, CannotPlace)]
        previous, self._placement = self._placement, {a.model: a.message for a in unplaced}
        kinds, self.unplaced = self.unplaced, {a.model: a.kind for a in unplaced}
        self._desired = dict(scaled.desired) if scaled is not None else {}
        for model, message in self._placement.items():
            if previous.get(model) != message:
                log.warning("model %s: %s", model, message)
            if kinds.get(model) != self.unplaced[model]:
                self._metrics.placement_failures.labels(self.unplaced[model]).inc()
        if not await self._applier.apply(actions, now):
            self._metrics.reconcile_failures.inc()
        self._withheld &= set(self._book.records)
        self._set_adapters(replicas, now)
        await self._lifecycle.after_pass(
            self._catalog, catalog, replicas, actions, self._gated, self._settings.eval_suites, now
        )
        await self._stamp_versions(catalog)

    async def _stamp_versions(self, catalog: Catalog) -> None:
        """Records from before versions were kept get their model's version, once.

        Until then they count as current; stamped, a later change of the
        model replaces them like any other (decide.rollout).
        """
        for rec in list(self._book.records.values()):
            model = catalog.get(rec.model)
            if not rec.version and model is not None and model.version:
                await self._book.add(dataclasses.replace(rec, version=model.version))

    def _set_adapters(self, replicas: list[Replica], now: float) -> None:
        """Each ready replica whose adapters differ from decide.adapters' plan is sent its set."""
        scaler = self._scaler
        wanted = plan_adapters(
            self._catalog,
            [r for r in replicas if r.id not in self._withheld],
            (lambda rid: scaler.endpoint_load(rid, now)) if scaler is not None else (lambda rid: 0.0),
        )
        for r in replicas:
            adapters = wanted.get(r.id)
            if adapters is None or r.reported is None:
                continue
            if {a.name for a in adapters} != set(r.reported.adapters):
                self._applier.set_adapters(r.record, adapters, now)

    @staticmethod
    def _hold_placements(actions: list[Action], wait: float) -> list[Action]:
        """Early in a term: keep every decision except placing new replicas and evicting.

        An eviction decided before every agent is back might free room that
        a node not yet registered already has.
        """
        held = Counter(a.model for a in actions if isinstance(a, StartReplica))
        kept: list[Action] = [a for a in actions if not isinstance(a, StartReplica | EvictReplica)]
        kept.extend(
            CannotPlace(
                model,
                f"{n} replica(s) to place once agents have had {wait:.1f}s more to register "
                "with this new leader",
                kind="settling",
            )
            for model, n in sorted(held.items())
        )
        return kept


def _apply_settings(s: ControllerSettings) -> ApplySettings:
    return ApplySettings(
        failure_backoff_seconds=s.failure_backoff_seconds,
        failure_backoff_max_seconds=s.failure_backoff_max_seconds,
        command_resend_seconds=s.command_resend_seconds,
    )
