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
   autoscaler's count, see scaler), else ``scaling.min``. Replicas on a held
   node are *leaving*; the others stay. More staying replicas than wanted -> stop the least useful (not ready
   before ready, newest first) and every leaving one. Fewer -> place new
   ones (unless the model backs off after a failure): profiles in priority
   order, the first that fits some node wins (see placement for fits,
   spreading and the pack/spread policy; at the same spread, a node that
   already holds the profile's weights ready wins: ``placement.prefer_holders``).
   A model that fits nowhere gets the reason per node. A critical model that fits nowhere evicts
   opportunistic replicas (the fewest, on one node) and waits for them to
   stop; standard and opportunistic models never evict. Leaving replicas
   are stopped only while enough ready replicas remain (a drain never
   leaves a gap: the replacement starts elsewhere, becomes ready, then the
   old one stops; if no replacement fits, the old one keeps serving).
3. Each replica a ready node reports with no record (or a record naming
   another node) and that is not already stopping: an orphan -> stop it.
   This is what stops the replicas of a node that comes back after it was
   declared lost (their records were forgotten when it was).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.v1 import agent_pb2

from ..spec.catalog import Catalog, Model
from ..state.inventory import Node, ReportedReplica
from ..store.replicas import ReplicaRecord
from .placement import Fleet, Policy, prefer_holders

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


@dataclass(frozen=True)
class PlanSettings:
    # The same default as ControlConfig.node_lost_seconds.
    node_lost_seconds: float = 10.0
    policy: Policy = "pack"
    # A CannotPlace message lists at most this many nodes (its reasons field has them all).
    reasons_shown: int = 12


# -- actions --------------------------------------------------------------------


@dataclass(frozen=True)
class StartReplica:
    """Place a new replica of ``model`` on ``node`` using ``gpu_indices``."""

    model: str
    node: str
    gpu_indices: tuple[int, ...]
    engine: str
    served_name: str
    args: Mapping[str, str]
    # Which profile, and what it claims of the node besides GPUs.
    profile: int = 0
    memory_bytes: int = 0
    cpu_cores: float = 0.0


@dataclass(frozen=True)
class EnsureRunning:
    """Re-send the start of a recorded replica its (ready) node does not report."""

    record: ReplicaRecord
    args: Mapping[str, str]


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    node: str
    reason: str
    # Also delete its record (it is not wanted any more).
    forget: bool


@dataclass(frozen=True)
class ForgetReplica:
    """Delete the record only: the node cannot be told (unreachable)."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class EvictReplica:
    """Stop and forget an opportunistic replica to make room for a critical model."""

    replica_id: str
    node: str
    model: str
    reason: str


@dataclass(frozen=True)
class NoteFailure:
    model: str
    replica_id: str
    message: str
    node: str = ""
    profile: int = -1


@dataclass(frozen=True)
class ClearBackoff:
    model: str


@dataclass(frozen=True)
class CannotPlace:
    model: str
    message: str
    # Every node's reason, "node: why" (the message may show only the first few).
    reasons: tuple[str, ...] = ()


Action = (
    StartReplica
    | EnsureRunning
    | StopReplica
    | ForgetReplica
    | EvictReplica
    | NoteFailure
    | ClearBackoff
    | CannotPlace
)


def plan(
    catalog: Catalog,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    now: float,
    backoff: Mapping[str, Backoff] | None = None,
    settings: PlanSettings = PlanSettings(),
    weights_holders: Mapping[str, frozenset[str]] | None = None,
    desired: Mapping[str, int] | None = None,
) -> list[Action]:
    """``weights_holders``: weights source -> nodes holding it ready (weights.WeightsTable)."""
    backoff = backoff or {}
    desired = desired or {}
    by_id = {n.id: n for n in sorted(nodes, key=lambda n: n.id)}
    reps = sorted(replicas, key=lambda r: r.id)
    actions: list[Action] = []
    active: dict[str, list[Replica]] = defaultdict(list)
    failed_now: set[str] = set()
    kept: list[Replica] = []

    for r in reps:
        rec = r.record
        model = catalog.get(rec.model)
        node = by_id.get(rec.node)
        if model is None:
            reason = f"model {rec.model!r} is no longer in the catalog"
            if node is not None and node.ready:
                actions.append(StopReplica(rec.id, rec.node, reason, forget=True))
            else:
                actions.append(ForgetReplica(rec.id, reason))
            continue
        if node is None or not node.ready:
            since = node.unreachable_since if node and node.unreachable_since is not None else now
            if node is None or now - since >= settings.node_lost_seconds:
                actions.append(
                    ForgetReplica(rec.id, f"node {rec.node} unreachable for {now - since:.0f}s; rebuilding")
                )
                continue
            active[model.name].append(r)
            kept.append(r)
            continue
        if r.state in _STOPPED_OR_FAILED:
            what = "failed" if r.state == _FAILED else "stopped on its own"
            message = (r.reported.message if r.reported else "") or "no reason given"
            actions.append(StopReplica(rec.id, rec.node, f"replica {what}: {message}", True))
            actions.append(NoteFailure(model.name, rec.id, message, rec.node, rec.profile))
            failed_now.add(model.name)
            continue
        if r.reported is None:
            actions.append(EnsureRunning(rec, _args(model, rec)))
        active[model.name].append(r)
        kept.append(r)

    fleet = Fleet(by_id, [r.record for r in kept], settings.policy)
    spread: dict[str, Counter[str]] = defaultdict(Counter)
    for r in kept:
        spread[r.record.model][r.record.node] += 1
    evicted: set[str] = set()
    held = {n.id for n in by_id.values() if n.held}

    def victims() -> list[ReplicaRecord]:
        """Opportunistic replicas not yet evicted: what a critical model may take the room of."""
        out = []
        for r in kept:
            m = catalog.get(r.record.model)
            if r.id not in evicted and m is not None and m.rank == _OPPORTUNISTIC:
                out.append(r.record)
        return out

    for model in sorted(catalog, key=lambda m: (m.rank, -m.gpus, m.name)):
        if not model.profiles:
            continue
        want = desired.get(model.name, model.min_replicas)
        have = active.get(model.name, [])
        if evicted:
            have = [r for r in have if r.id not in evicted]
        b = backoff.get(model.name)
        if b is not None and sum(r.ready for r in have) >= want:
            actions.append(ClearBackoff(model.name))
        staying, leaving = have, []
        if held:
            staying = [r for r in have if r.record.node not in held]
            leaving = [r for r in have if r.record.node in held]
        missing = want - len(staying)
        placed = 0
        if missing < 0:
            dropped = _scale_down(model, staying, want, by_id, actions)
            staying = [r for r in staying if r.id not in dropped]
        elif missing > 0:
            if model.name in failed_now:
                actions.append(
                    CannotPlace(
                        model.name,
                        f"{missing} of {want} replica(s) failed just now; replaced after a backoff",
                    )
                )
            elif b is not None and b.retry_at > now:
                actions.append(
                    CannotPlace(
                        model.name,
                        f"{missing} of {want} replica(s) wait to be replaced after "
                        f"{b.failures} failure(s); retrying in {b.retry_at - now:.0f}s"
                        + (f"; last error: {_first_line(b.last_error)}" if b.last_error else ""),
                    )
                )
            else:
                placed = _place(
                    model, want, missing, fleet, spread[model.name], b, victims, evicted, actions, settings,
                    {src: nodes & by_id.keys() for src, nodes in (weights_holders or {}).items()},
                )  # fmt: skip
        if leaving:
            actions.extend(_drain(model, want, staying, leaving, placed, by_id))

    recorded = {r.id: r.record for r in reps}
    for node in by_id.values():
        if not node.ready:
            continue
        for rep in sorted(node.replicas.values(), key=lambda x: x.id):
            known = recorded.get(rep.id)
            if known is not None and known.node == node.id:
                continue
            if rep.state in _STOPPING_OR_STOPPED:
                continue
            actions.append(
                StopReplica(rep.id, node.id, "orphan: the leader has no record of this replica", False)
            )
    return actions


_OPPORTUNISTIC = 2
# Failures in a row after which the profile that failed last is tried last.
CRASH_LOOP = 2


def _args(model: Model, rec: ReplicaRecord) -> Mapping[str, str]:
    """The engine args of the profile a record runs (the first one's if that profile is gone)."""
    if 0 <= rec.profile < len(model.profiles):
        return model.profiles[rec.profile].args
    return model.args


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or [""])[0][:200]


def _place(
    model: Model,
    want: int,
    missing: int,
    fleet: Fleet,
    spread: Counter[str],
    b: Backoff | None,
    victims,
    evicted: set[str],
    actions: list[Action],
    settings: PlanSettings,
    weights_holders: Mapping[str, frozenset[str]],
) -> int:
    """Place up to ``missing`` replicas of ``model``; returns how many were."""
    avoid = b.node if b is not None else ""
    profiles = model.profiles
    if b is not None and b.failures >= CRASH_LOOP and len(profiles) > 1:
        # A profile that keeps failing (too little memory for its context
        # length, say) is tried last, so the model runs on another if one fits.
        profiles = tuple(sorted(profiles, key=lambda p: p.index == b.profile))
    for placed in range(missing):
        choice = None
        for needs in profiles:
            choice = fleet.choose(needs, spread, avoid)
            if choice is not None:
                choice = prefer_holders(fleet, needs, spread, avoid, weights_holders, choice)
                break
        if choice is None:
            left = missing - placed
            if model.rank == 0 and _make_room(model, left, fleet, victims(), evicted, actions):
                return placed
            reasons = _explain(model, fleet)
            shown = reasons[: settings.reasons_shown]
            detail = "; ".join(shown) if shown else "no nodes are registered"
            if len(reasons) > len(shown):
                detail += f"; and {len(reasons) - len(shown)} more (llmgw explain {model.name})"
            actions.append(
                CannotPlace(
                    model.name, f"{left} of {want} replica(s) cannot be placed: {detail}", tuple(reasons)
                )
            )
            return placed
        needs = choice.needs
        fleet.take(choice)
        spread[choice.node] += 1
        actions.append(
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
            )
        )
    return missing


def _explain(model: Model, fleet: Fleet) -> list[str]:
    """Why no node fits: per node, prefixed per profile when there are several."""
    if len(model.profiles) == 1:
        return fleet.reasons(model.profiles[0])
    out = []
    for needs in model.profiles:
        out += [f"profile {needs.index + 1} ({needs.describe()}) {r}" for r in fleet.reasons(needs)]
    return out


def _make_room(
    model: Model,
    left: int,
    fleet: Fleet,
    victims: Sequence[ReplicaRecord],
    evicted: set[str],
    actions: list[Action],
) -> bool:
    """Critical only: evict opportunistic replicas for one replica, or wait for ones stopping."""
    room = fleet.room(model.profiles, victims)
    if room is None:
        return False
    if room.evict:
        for rec in room.evict:
            evicted.add(rec.id)
            actions.append(
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
    actions.append(CannotPlace(model.name, message))
    return True


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
        reason = f"node {r.record.node} is held: {model.name!r} has enough ready replicas elsewhere"
        node = nodes.get(r.record.node)
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
