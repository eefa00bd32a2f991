"""The reconcile decision: what should change, as a pure function of state.

``plan(catalog, nodes, replicas, now, backoff, settings)`` compares what the
catalog wants with what the records say and the agents report, and returns
actions. It performs no I/O, reads no clock and names nothing at random, so
tests and benchmarks call it directly and the same inputs always give the
same list. Applying the actions (writing records, sending commands) is the
applier's job; the plan is level-based and is simply recomputed on the
next pass, so an action that failed or was skipped costs one pass.

Rules, in the order they are applied:

1. Each recorded replica: its model left the catalog -> stop and forget it;
   its node has been unreachable for ``node_lost_seconds`` -> forget it (it
   is rebuilt elsewhere below; if the node returns, what it still runs is an
   orphan); it FAILED or STOPPED without being asked -> stop, forget, and
   note a failure of its model with its last error (replacement waits out
   the model's backoff, and prefers another node than the one it failed
   on, and after two failures in a row another profile than the one that
   failed); its node is ready but does not report it -> re-send its start
   (commands are idempotent; the applier rate-limits re-sends).
   Otherwise it counts.
2. Each model, critical before standard before opportunistic, then largest
   GPU need first. It wants ``desired[model]`` replicas when given (the
   autoscaler's count, see scaler), else ``scaling.min``. Replicas on a
   draining node (held, or in a domain held with drain) are *leaving*; the
   others stay. More staying replicas than wanted -> stop the least useful
   (not ready before ready, newest first) and every leaving one. Fewer -> place new
   ones (unless the model backs off after a failure): profiles in priority
   order, the first that fits some node wins (see placement for fits,
   spreading and the pack/spread policy; at the same spread, a node that
   already holds the profile's weights ready wins: ``placement.prefer_holders``).
   A profile whose replica would exceed a quota of its model's owner (or of
   an ancestor: org, team, project; see decide.tenancy) is skipped with that
   reason, before any node is tried; GPU memory quotas are checked on the
   GPUs the chosen node would give.
   A model that fits nowhere gets the reason per node. A critical model that fits nowhere evicts
   opportunistic replicas (the fewest, on one node) and waits for them to
   stop; standard and opportunistic models never evict. Leaving replicas
   are stopped only while enough ready replicas remain (a drain never
   leaves a gap: the replacement starts elsewhere, becomes ready, then the
   old one stops; if no replacement fits, the old one keeps serving).
   A model with replicas of another version than its own is rolled instead
   (decide.rollout): one new replica at a time, an old one retired once a
   new one is ready and has passed the eval gate.
3. Each replica a ready node reports with no record (or a record naming
   another node) and that is not already stopping: an orphan -> stop it.
   This is what stops the replicas of a node that comes back after it was
   declared lost (their records were forgotten when it was).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.v1 import agent_pb2

from ..spec.catalog import Catalog, Model, Needs
from ..spec.model import Lora
from ..spec.tenancy import Quota
from ..state.inventory import Node, ReportedReplica
from ..store.replicas import ReplicaRecord
from .actions import (
    UNPLACED_KINDS,
    Action,
    CannotPlace,
    ClearBackoff,
    EnsureRunning,
    EvictReplica,
    ForgetReplica,
    NoteFailure,
    StartReplica,
    StopReplica,
)
from .placement import Fleet, Policy, prefer_holders
from .rollout import outdated, roll
from .tenancy import Ledger

RS = agent_pb2.ReplicaState
# Module constants: an attribute of a protobuf enum wrapper costs a Python-level
# __getattr__ on every read, which showed in the fleet-scale benchmark.
_UNSPECIFIED = RS.REPLICA_STATE_UNSPECIFIED
_READY = RS.REPLICA_STATE_READY
_FAILED = RS.REPLICA_STATE_FAILED
_STOPPED_OR_FAILED = frozenset((RS.REPLICA_STATE_FAILED, RS.REPLICA_STATE_STOPPED))
_STOPPING_OR_STOPPED = frozenset((RS.REPLICA_STATE_STOPPING, RS.REPLICA_STATE_STOPPED))


@dataclass(frozen=True)
class Replica:
    """A record joined with what its node reports of it (None: not reported)."""

    record: ReplicaRecord
    reported: ReportedReplica | None = None

    @property
    def id(self) -> str:
        return self.record.id

    @property
    def state(self) -> agent_pb2.ReplicaState:
        return self.reported.state if self.reported else _UNSPECIFIED

    @property
    def ready(self) -> bool:
        return self.state == _READY


@dataclass(frozen=True)
class Backoff:
    failures: int
    retry_at: float
    # The last failure: its message, replica, node (placement avoids that node)
    # and profile (tried last once it has failed twice in a row).
    last_error: str = ""
    replica_id: str = ""
    node: str = ""
    profile: int = -1


__all__ = [
    "UNPLACED_KINDS",
    "Action",
    "Backoff",
    "CannotPlace",
    "ClearBackoff",
    "EnsureRunning",
    "EvictReplica",
    "ForgetReplica",
    "NoteFailure",
    "PlanSettings",
    "Replica",
    "StartReplica",
    "StopReplica",
    "plan",
]


@dataclass(frozen=True)
class PlanSettings:
    # The same default as ControlConfig.node_lost_seconds.
    node_lost_seconds: float = 10.0
    policy: Policy = "pack"
    # A CannotPlace message lists at most this many nodes (its reasons field has them all).
    reasons_shown: int = 12
    # Quotas per owner path (decide.tenancy): the cluster settings' ``quotas``.
    quotas: Mapping[str, Quota] = field(default_factory=dict)
    # Watts per facility domain (label=value): the cluster settings' ``power_budgets``.
    power_budgets: Mapping[str, float] = field(default_factory=dict)


def plan(
    catalog: Catalog,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    now: float,
    backoff: Mapping[str, Backoff] | None = None,
    settings: PlanSettings = PlanSettings(),
    weights_holders: Mapping[str, frozenset[str]] | None = None,
    desired: Mapping[str, int] | None = None,
    gated: Container[str] = frozenset(),
) -> list[Action]:
    """The actions that move the fleet toward the catalog: the rules of this module's docstring.

    ``weights_holders``: weights source -> nodes holding it ready
    (state.weights.WeightsTable); ``desired``: the autoscaler's replica count
    per model (the model's ``scaling.min`` when absent); ``gated``: replicas
    the eval gate holds back (not published yet), which a rolling update
    does not count as replacements.
    """
    p = _Pass(catalog, nodes, now, backoff or {}, settings, weights_holders or {}, desired or {})
    p.gated = gated
    return p.run(replicas)


class _Pass:
    """One call of :func:`plan`: what it reads, what it has decided so far, one method per rule."""

    def __init__(
        self,
        catalog: Catalog,
        nodes: Iterable[Node],
        now: float,
        backoff: Mapping[str, Backoff],
        settings: PlanSettings,
        weights_holders: Mapping[str, frozenset[str]],
        desired: Mapping[str, int],
    ) -> None:
        self.catalog = catalog
        self.now = now
        self.backoff = backoff
        self.settings = settings
        self.desired = desired
        self.by_id = {n.id: n for n in sorted(nodes, key=lambda n: n.id)}
        # Only holders that are nodes of this pass.
        self.holders = {src: ids & self.by_id.keys() for src, ids in weights_holders.items()}
        self.actions: list[Action] = []
        # Rule 1's verdicts: the replicas that count, per model and in all.
        self.active: dict[str, list[Replica]] = defaultdict(list)
        self.kept: list[Replica] = []
        self.failed_now: set[str] = set()
        # Rule 2's running state: opportunistic replicas evicted so far.
        self.evicted: set[str] = set()
        self.gated: Container[str] = frozenset()

    def run(self, replicas: Iterable[Replica]) -> list[Action]:
        reps = sorted(replicas, key=lambda r: r.id)
        for r in reps:
            self.check_record(r)
        self.fleet = Fleet(
            self.by_id, [r.record for r in self.kept], self.settings.policy, self.settings.power_budgets
        )
        self.spread: dict[str, Counter[str]] = defaultdict(Counter)
        for r in self.kept:
            self.spread[r.record.model][r.record.node] += 1
        # Draining nodes (a node hold, a domain hold with drain): their replicas leave.
        self.held = {n.id for n in self.by_id.values() if n.draining}
        # Replicas leaving draining nodes do not count against quotas (see decide.tenancy).
        staying = [r.record for r in self.kept if r.record.node not in self.held]
        self.ledger = Ledger(self.settings.quotas, self.catalog, self.by_id, staying)
        for model in sorted(self.catalog, key=lambda m: (m.rank, -m.gpus, m.name)):
            if model.profiles:
                self.converge(model)
        self.stop_orphans({r.id: r.record for r in reps})
        return self.actions

    # -- rule 1: each recorded replica ---------------------------------------------

    def check_record(self, r: Replica) -> None:
        """Forget, stop, note a failure or re-send a start; else the replica counts."""
        rec, now, actions = r.record, self.now, self.actions
        model = self.catalog.get(rec.model)
        node = self.by_id.get(rec.node)
        if model is None:
            reason = f"model {rec.model!r} is no longer in the catalog"
            if node is not None and node.ready:
                actions.append(StopReplica(rec.id, rec.node, reason, forget=True))
            else:
                actions.append(ForgetReplica(rec.id, reason))
            return
        if node is None or not node.ready:
            since = node.unreachable_since if node and node.unreachable_since is not None else now
            if node is None or now - since >= self.settings.node_lost_seconds:
                actions.append(
                    ForgetReplica(rec.id, f"node {rec.node} unreachable for {now - since:.0f}s; rebuilding")
                )
                return
        elif r.state in _STOPPED_OR_FAILED:
            what = "failed" if r.state == _FAILED else "stopped on its own"
            message = (r.reported.message if r.reported else "") or "no reason given"
            actions.append(StopReplica(rec.id, rec.node, f"replica {what}: {message}", True))
            actions.append(NoteFailure(model.name, rec.id, message, rec.node, rec.profile))
            self.failed_now.add(model.name)
            return
        elif r.reported is None:
            if rec.version and model.version and rec.version != model.version:
                # Not running, and of an old version: the rolling update replaces it.
                actions.append(
                    ForgetReplica(rec.id, f"{rec.node} no longer runs it; it is of an older version")
                )
                return
            actions.append(EnsureRunning(rec, _args(model, rec), _lora(model)))
        self.active[model.name].append(r)
        self.kept.append(r)

    # -- rule 2: each model --------------------------------------------------------

    def converge(self, model: Model) -> None:
        """Scale down, place (or say why not), and drain held nodes without a gap."""
        want = self.desired.get(model.name, model.min_replicas)
        have = self.active.get(model.name, [])
        if self.evicted:
            have = [r for r in have if r.id not in self.evicted]
        b = self.backoff.get(model.name)
        old = outdated(model, have)
        if old:
            roll(self, model, want, have, old, b)
            return
        if b is not None and sum(r.ready for r in have) >= want:
            self.actions.append(ClearBackoff(model.name))
        staying, leaving = have, []
        if self.held:
            staying = [r for r in have if r.record.node not in self.held]
            leaving = [r for r in have if r.record.node in self.held]
        missing = want - len(staying)
        placed = 0
        if missing < 0:
            dropped = _scale_down(model, staying, want, self.by_id, self.actions)
            staying = [r for r in staying if r.id not in dropped]
        elif missing > 0:
            placed = self.place_missing(model, want, missing, b)
        if leaving:
            self.actions.extend(_drain(model, want, staying, leaving, placed, self.by_id))

    def place_missing(self, model: Model, want: int, missing: int, b: Backoff | None) -> int:
        """Place ``missing`` replicas unless the model backs off; returns how many were placed."""
        if model.name in self.failed_now:
            message = f"{missing} of {want} replica(s) failed just now; replaced after a backoff"
            self.actions.append(CannotPlace(model.name, message, kind="backoff"))
            return 0
        if b is not None and b.retry_at > self.now:
            message = (
                f"{missing} of {want} replica(s) wait to be replaced after "
                f"{b.failures} failure(s); retrying in {b.retry_at - self.now:.0f}s"
                + (f"; last error: {_first_line(b.last_error)}" if b.last_error else "")
            )
            self.actions.append(CannotPlace(model.name, message, kind="backoff"))
            return 0
        return self.place(model, want, missing, b)

    def place(self, model: Model, want: int, missing: int, b: Backoff | None) -> int:
        """Place up to ``missing`` replicas of ``model``; returns how many were."""
        fleet, spread = self.fleet, self.spread[model.name]
        avoid = b.node if b is not None else ""
        profiles = model.profiles
        if b is not None and b.failures >= CRASH_LOOP and len(profiles) > 1:
            # A profile that keeps failing (too little memory for its context
            # length, say) is tried last, so the model runs on another if one fits.
            profiles = tuple(sorted(profiles, key=lambda p: p.index == b.profile))
        ledger = self.ledger
        for placed in range(missing):
            choice = None
            refused: dict[int, str] = {}
            for needs in profiles:
                why = ledger.refuse(model.owner, needs.gpus)
                if why:
                    refused[needs.index] = why
                    continue
                choice = fleet.choose(needs, spread, avoid)
                if choice is None:
                    continue
                choice = prefer_holders(fleet, needs, spread, avoid, self.holders, choice)
                why = ledger.refuse(model.owner, needs.gpus, ledger.memory_of(choice.node, choice.gpus))
                if not why:
                    break
                refused[needs.index] = why
                choice = None
            if choice is None:
                left = missing - placed
                allowed = tuple(p for p in profiles if p.index not in refused)
                if allowed and model.rank == 0 and self.make_room(model, left, allowed):
                    return placed
                self.cannot_place(model, want, left, refused)
                return placed
            needs = choice.needs
            fleet.take(choice)
            spread[choice.node] += 1
            ledger.add(model.owner, len(choice.gpus), ledger.memory_of(choice.node, choice.gpus))
            self.actions.append(
                StartReplica(
                    model.name,
                    choice.node,
                    choice.gpus,
                    needs.engine,
                    model.name,
                    needs.args,
                    needs.index,
                    needs.memory_bytes,
                    needs.cpu_cores,
                    _lora(model),
                    model.version,
                )
            )
        return missing

    def cannot_place(self, model: Model, want: int, left: int, refused: Mapping[int, str]) -> None:
        """Say why ``left`` replicas fit nowhere: a quota, else per node (the first few in the message)."""
        reasons = _explain(model, self.fleet, refused)
        shown = reasons[: self.settings.reasons_shown]
        detail = "; ".join(shown) if shown else "no nodes are registered"
        if len(reasons) > len(shown):
            detail += f"; and {len(reasons) - len(shown)} more (llmgw explain {model.name})"
        message = f"{left} of {want} replica(s) cannot be placed: {detail}"
        kind = "quota" if len(refused) == len(model.profiles) else "no_fit"
        self.actions.append(CannotPlace(model.name, message, tuple(reasons), kind))

    def make_room(self, model: Model, left: int, profiles: Sequence[Needs]) -> bool:
        """Critical only: evict opportunistic replicas for one replica, or wait for ones stopping.

        ``profiles``: the model's profiles its owner's quotas allow.
        """
        victims = [
            r.record
            for r in self.kept
            if r.id not in self.evicted
            and (m := self.catalog.get(r.record.model)) is not None
            and m.rank == _OPPORTUNISTIC
        ]
        room = self.fleet.room(profiles, victims)
        if room is None:
            return False
        if room.evict:
            for rec in room.evict:
                self.evicted.add(rec.id)
                self.actions.append(
                    EvictReplica(
                        rec.id,
                        rec.node,
                        rec.model,
                        f"evicted: critical model {model.name!r} needs room on {room.node} "
                        f"({room.needs.describe()}) and {rec.model!r} is opportunistic",
                    )
                )
            what = f"evicting {', '.join(r.id for r in room.evict)} (opportunistic)"
        else:
            what = "waiting for replicas that are stopping to free it"
        message = f"{left} replica(s) to place on {room.node} once it has room: {what}"
        self.actions.append(CannotPlace(model.name, message, kind="preempting"))
        return True

    # -- rule 3: orphans ---------------------------------------------------------------

    def stop_orphans(self, recorded: Mapping[str, ReplicaRecord]) -> None:
        """Stop what a ready node runs with no record naming that node (unless already stopping)."""
        for node in self.by_id.values():
            if not node.ready:
                continue
            for rep in sorted(node.replicas.values(), key=lambda x: x.id):
                known = recorded.get(rep.id)
                if known is not None and known.node == node.id:
                    continue
                if rep.state in _STOPPING_OR_STOPPED:
                    continue
                self.actions.append(
                    StopReplica(rep.id, node.id, "orphan: the leader has no record of this replica", False)
                )


_OPPORTUNISTIC = 2
# Failures in a row after which the profile that failed last is tried last.
CRASH_LOOP = 2


def _args(model: Model, rec: ReplicaRecord) -> Mapping[str, str]:
    """The engine args of the profile a record runs (the first one's if that profile is gone)."""
    if 0 <= rec.profile < len(model.profiles):
        return model.profiles[rec.profile].args
    return model.args


def _lora(model: Model) -> Lora | None:
    return model.spec.lora_settings if model.spec is not None else None


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


def _explain(model: Model, fleet: Fleet, refused: Mapping[int, str]) -> list[str]:
    """Why nothing fits: a quota, else per node; prefixed per profile when there are several."""
    if len(model.profiles) == 1:
        needs = model.profiles[0]
        return [refused[needs.index]] if needs.index in refused else fleet.reasons(needs)
    out = []
    for needs in model.profiles:
        why = [refused[needs.index]] if needs.index in refused else fleet.reasons(needs)
        out += [f"profile {needs.index + 1} ({needs.describe()}) {r}" for r in why]
    return out


def _drain(
    model: Model,
    want: int,
    staying: Sequence[Replica],
    leaving: Sequence[Replica],
    placed: int,
    nodes: Mapping[str, Node],
) -> list[Action]:
    """Stop replicas on held nodes without ever dropping below ``want`` ready ones.

    A leaving replica that is not ready is stopped once its replacement is
    placed; a ready one only while the ready replicas that stay (and the
    other leaving ones) still make ``want`` without it.
    """
    ready_staying = sum(r.ready for r in staying)
    spare = ready_staying + sum(r.ready for r in leaving) - want
    replaced = len(staying) + placed >= want
    stop = [r for r in leaving if not r.ready and replaced]
    ready_leaving = sorted((r for r in leaving if r.ready), key=lambda r: (-r.record.created, r.id))
    stop += ready_leaving[: max(0, spare)]
    out: list[Action] = []
    for r in sorted(stop, key=lambda r: r.id):
        node = nodes.get(r.record.node)
        domain = node is not None and node.hold_reason.startswith("domain ")
        why = f"in held {node.hold_reason}" if domain and node is not None else "held"
        reason = f"node {r.record.node} is {why}; {model.name!r} has enough ready replicas elsewhere"
        if node is not None and node.ready:
            out.append(StopReplica(r.id, r.record.node, reason, forget=True))
        else:  # a held node that went away: what it still runs is an orphan if it returns
            out.append(ForgetReplica(r.id, reason))
    return out


def _scale_down(
    model: Model, have: Sequence[Replica], want: int, nodes: Mapping[str, Node], out: list[Action]
) -> set[str]:
    """Stop the least useful replicas beyond ``want``; returns their ids."""

    def usefulness(r: Replica) -> tuple[bool, bool, float]:
        node = nodes.get(r.record.node)
        # Lower sorts first and is stopped first: unreachable, not ready, newest.
        return (node is not None and node.ready, r.ready, -r.record.created)

    excess = sorted(have, key=usefulness)[: len(have) - want]
    reason = f"model {model.name!r} wants {want} replica(s), {len(have)} run"
    for r in sorted(excess, key=lambda r: r.id):
        node = nodes.get(r.record.node)
        if node is not None and node.ready:
            out.append(StopReplica(r.id, r.record.node, reason, forget=True))
        else:
            out.append(ForgetReplica(r.id, reason))
    return {r.id for r in excess}
