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
  each model wants, sync endpoints, ``plan``, apply the actions;
- every ``publish_interval`` (the backstop): sync endpoints, which costs one
  fingerprint when nothing changed.

Guarantees:

- Traffic leaves before the replica does: replicas that a pass will stop or
  forget are withheld from the table and the table is synced *before* any
  command is sent; if that sync fails, nothing is stopped in that pass.
  Replicas the scaler removes are withheld for longer: until routers report
  them drained (see scaler).
- A record is written before its start command is sent (see replicas).
- The loop never dies on one failing pass: the failure is logged and
  counted and the next pass starts from the state as it then is. Only the
  end of the term stops it, and then agent streams are closed (they come
  back, are redirected, and reach the new leader) and all soft state is
  dropped, so a later term starts from etcd, not from memory.
- Commands are idempotent on the agent; re-sends of the same command for
  the same replica are spaced by ``command_resend_seconds``.

Single event loop: agent events, admin reads and the loop interleave only
at awaits, and every mutation is synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from llmgw.common.etcd import Store
from llmgw.common.keys import engine_key
from llmgw.v1 import agent_pb2

from .autoscale import ModelScale
from .catalog import Catalog
from .inventory import Inventory, Node, NodeOverride
from .leadership import Leadership, NotLeader, Term
from .metrics import ControlMetrics
from .placement import Fleet, Policy
from .publisher import EndpointPublisher, endpoint_table, sync_catalog
from .reconcile import (
    Action,
    Backoff,
    CannotPlace,
    ClearBackoff,
    EnsureRunning,
    EvictReplica,
    ForgetReplica,
    NoteFailure,
    PlanSettings,
    Replica,
    StartReplica,
    StopReplica,
    plan,
)
from .replicas import ReplicaBook, ReplicaRecord, new_replica_id
from .scaler import Scaler
from .weights import WeightsTable

log = logging.getLogger("llmgw.control.controller")


class CommandSink(Protocol):
    """Where commands for a node's agent go (agents.AgentSessions)."""

    def connected(self, node_id: str) -> bool: ...
    def send(self, node_id: str, message: agent_pb2.ControlMessage) -> bool: ...
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
    # How long a Register waits for a term that is still loading.
    ready_timeout_seconds: float = 5.0
    retry_seconds: float = 1.0


class Controller:
    def __init__(
        self,
        store: Store,
        leadership: Leadership,
        catalog: Catalog,
        sessions: CommandSink,
        secret: bytes,
        metrics: ControlMetrics,
        settings: ControllerSettings = ControllerSettings(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        scaler: Scaler | None = None,
    ):
        self._store = store
        self._leadership = leadership
        self._catalog = catalog
        self._sessions = sessions
        self._secret = secret
        self._metrics = metrics
        self._settings = settings
        self._clock = clock
        self._wall = wall
        self._inventory = Inventory(settings.node_timeout_seconds, settings.node_lost_seconds)
        self.weights_table = WeightsTable()
        self._book = ReplicaBook(store, leadership)
        self._publisher = EndpointPublisher(store, leadership, metrics)
        self._term: Term | None = None
        self._ready = asyncio.Event()
        self._wake = asyncio.Event()
        self._backoff: dict[str, Backoff] = {}
        self._placement: dict[str, str] = {}
        self._withheld: set[str] = set()
        self._sent: dict[tuple[str, str], float] = {}
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

    def replace_catalog(self, catalog: Catalog) -> None:
        """Put another catalog in force without a restart.

        Nothing is torn down here: the next pass compares the new desired
        state with what runs. A removed model's endpoints leave the table in
        that pass before its replicas are sent StopReplica, and ``catalog/``
        in etcd is rewritten by the leader in the same pass.
        """
        self._catalog = catalog
        self._catalog_published = False
        log.info("catalog replaced: %s", ", ".join(catalog.names) or "no models")
        self.notify()

    @property
    def settings(self) -> ControllerSettings:
        return self._settings

    def apply_settings(self, settings: ControllerSettings) -> None:
        """New timings from the cluster settings, in force from the next pass."""
        self._settings = settings
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
        return self._backoff

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
        fleet = Fleet(nodes, self._book.records.values(), self._settings.placement_policy)
        return [(p.index, p.describe(), fleet.verdicts(p)) for p in model.profiles]

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
        self._place_after = self._clock() + self._settings.placement_settle_seconds
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
        await self._publish_catalog()
        self._inventory.clear()
        self._inventory.expect({r.node for r in self._book.records.values()}, self._clock())

    def _end_term(self, term: Term) -> None:
        self._ready.clear()
        self._term = None
        self._sessions.close_all("this control plane no longer leads")
        self._inventory.clear()
        self.weights_table.clear()
        self._book.clear()
        self._publisher.reset()
        self._backoff.clear()
        self._placement = {}
        self._withheld.clear()
        self._sent.clear()
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
            self._withheld | self._scaler.draining if self._scaler is not None else self._withheld,
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
        scaled = None
        if self._scaler is not None:
            held = {n.id for n in nodes if n.held}
            leaving = {r.id for r in replicas if r.record.node in held}
            scaled = self._scaler.pass_(self._catalog, replicas, now, leaving)
        actions = plan(
            self._catalog,
            nodes,
            replicas,
            now,
            self._backoff,
            PlanSettings(
                node_lost_seconds=self._settings.node_lost_seconds,
                policy=self._settings.placement_policy,
            ),
            weights_holders=self.weights_table.holders(),
            desired=scaled.desired if scaled is not None else None,
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
        previous, self._placement = (
            self._placement,
            {a.model: a.message for a in actions if isinstance(a, CannotPlace)},
        )
        for model, message in self._placement.items():
            if previous.get(model) != message:
                log.warning("model %s: %s", model, message)
        failed = False
        for action in actions:
            try:
                await self._apply(action, now)
            except NotLeader:
                raise
            except Exception:
                log.exception("applying %s failed", action)
                failed = True
        if failed:
            self._metrics.reconcile_failures.inc()
        self._withheld &= set(self._book.records)
        resend = self._settings.command_resend_seconds
        self._sent = {k: t for k, t in self._sent.items() if now - t < resend}

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
            )
            for model, n in sorted(held.items())
        )
        return kept

    async def _apply(self, action: Action, now: float) -> None:
        match action:
            case StartReplica():
                if not self._sessions.connected(action.node):
                    return
                rid = new_replica_id(action.model, self._book.records)
                rec = ReplicaRecord(
                    rid,
                    action.model,
                    action.node,
                    action.gpu_indices,
                    action.engine,
                    action.served_name,
                    self._wall(),
                    action.profile,
                    action.memory_bytes,
                    action.cpu_cores,
                )
                await self._book.add(rec)
                log.info("placing %s on %s GPUs %s", rid, rec.node, list(rec.gpu_indices))
                self._send_start(rec, action.args, now)
            case EnsureRunning():
                if not self._recently("start", action.record.id, now):
                    log.info("re-sending the start of %s to %s", action.record.id, action.record.node)
                    self._send_start(action.record, action.args, now)
            case StopReplica():
                self._stop(action.replica_id, action.node, action.reason, now)
                if action.forget:
                    await self._book.remove(action.replica_id)
            case EvictReplica():
                log.warning("evicting %s on %s: %s", action.replica_id, action.node, action.reason)
                self._metrics.evictions.inc()
                self._stop(action.replica_id, action.node, action.reason, now)
                await self._book.remove(action.replica_id)
            case ForgetReplica():
                log.info("forgetting %s: %s", action.replica_id, action.reason)
                await self._book.remove(action.replica_id)
            case NoteFailure():
                b = self._backoff.get(action.model)
                n = b.failures + 1 if b else 1
                s = self._settings
                delay = min(s.failure_backoff_seconds * 2 ** (n - 1), s.failure_backoff_max_seconds)
                self._backoff[action.model] = Backoff(
                    n, now + delay, action.message, action.replica_id, action.node, action.profile
                )
                log.warning(
                    "replica %s of %s failed (%d in a row); replacing in %.0fs: %s",
                    action.replica_id,
                    action.model,
                    n,
                    delay,
                    action.message,
                )
            case ClearBackoff():
                self._backoff.pop(action.model, None)
            case CannotPlace():
                pass

    def _stop(self, replica_id: str, node: str, reason: str, now: float) -> None:
        if not self._recently("stop", replica_id, now):
            log.info("stopping %s on %s: %s", replica_id, node, reason)
            msg = agent_pb2.ControlMessage(stop=agent_pb2.StopReplica(replica_id=replica_id, reason=reason))
            if self._sessions.send(node, msg):
                self._sent[("stop", replica_id)] = now
                self._metrics.commands.labels("stop").inc()

    def _recently(self, kind: str, replica_id: str, now: float) -> bool:
        sent = self._sent.get((kind, replica_id))
        return sent is not None and now - sent < self._settings.command_resend_seconds

    def _send_start(self, rec: ReplicaRecord, args: Mapping[str, str], now: float) -> None:
        msg = agent_pb2.ControlMessage(
            start=agent_pb2.StartReplica(
                replica_id=rec.id,
                model=rec.model,
                engine=rec.engine,
                served_name=rec.served_name,
                gpu_indices=list(rec.gpu_indices),
                engine_key=engine_key(self._secret, rec.id),
                engine_args=dict(args),
            )
        )
        if self._sessions.send(rec.node, msg):
            self._sent[("start", rec.id)] = now
            self._metrics.commands.labels("start").inc()
