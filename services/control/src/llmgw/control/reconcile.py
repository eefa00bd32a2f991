"""The reconcile decision: what should change, as a pure function of state.

``plan(catalog, nodes, replicas, now, backoff, settings)`` compares what the
catalog wants with what the records say and the agents report, and returns
actions. It performs no I/O, reads no clock and names nothing at random, so
tests and benchmarks call it directly and the same inputs always give the
same list. Applying the actions (writing records, sending commands) is the
controller's job; the plan is level-based and is simply recomputed on the
next pass, so an action that failed or was skipped costs one pass.

Rules, in the order they are applied:

1. Each recorded replica: its model left the catalog -> stop and forget it;
   its node has been unreachable for ``node_lost_seconds`` -> forget it (it
   is rebuilt elsewhere below; if the node returns, what it still runs is an
   orphan); it FAILED or STOPPED without being asked -> stop, forget, and
   note a failure of its model (replacement waits out the model's backoff);
   its node is ready but does not report it -> re-send its start (commands
   are idempotent; the controller rate-limits re-sends). Otherwise it counts.
2. Each model, largest GPU need first: more replicas than ``min_replicas``
   -> stop the least useful (not ready before ready, newest first); fewer ->
   place new ones, unless the model is backing off after a failure.
   Placement filters nodes (ready, offers the engine, enough free GPUs) and
   keeps the reason each node was dropped, so an unplaceable model explains
   itself per node. Among the rest it spreads (fewest replicas of this model
   on the node), then packs (fewest free GPUs left), then node id.
3. Each replica a ready node reports with no record (or a record naming
   another node) and that is not already stopping: an orphan -> stop it.
"""

from __future__ import annotations

from bisect import insort
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from llmgw.v1 import agent_pb2

from .catalog import Catalog, Model
from .inventory import Node, ReportedReplica
from .replicas import ReplicaRecord

RS = agent_pb2.ReplicaState
# Plain ints: an attribute of a protobuf enum wrapper costs a Python-level
# __getattr__ on every read, which showed in the fleet-scale benchmark.
_UNSPECIFIED = int(RS.REPLICA_STATE_UNSPECIFIED)
_READY = int(RS.REPLICA_STATE_READY)
_FAILED = int(RS.REPLICA_STATE_FAILED)
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
    def state(self) -> int:
        return self.reported.state if self.reported else _UNSPECIFIED

    @property
    def ready(self) -> bool:
        return self.state == _READY


@dataclass(frozen=True)
class Backoff:
    failures: int
    retry_at: float


@dataclass(frozen=True)
class PlanSettings:
    # The same default as ControlConfig.node_lost_seconds.
    node_lost_seconds: float = 10.0


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
class NoteFailure:
    model: str
    replica_id: str
    message: str


@dataclass(frozen=True)
class ClearBackoff:
    model: str


@dataclass(frozen=True)
class CannotPlace:
    model: str
    message: str


Action = StartReplica | EnsureRunning | StopReplica | ForgetReplica | NoteFailure | ClearBackoff | CannotPlace


def plan(
    catalog: Catalog,
    nodes: Iterable[Node],
    replicas: Iterable[Replica],
    now: float,
    backoff: Mapping[str, Backoff] | None = None,
    settings: PlanSettings = PlanSettings(),
) -> list[Action]:
    backoff = backoff or {}
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
            actions.append(NoteFailure(model.name, rec.id, message))
            failed_now.add(model.name)
            continue
        if r.reported is None:
            actions.append(EnsureRunning(rec, model.args))
        active[model.name].append(r)
        kept.append(r)

    used = _used_gpus(by_id.values(), kept)
    free = _FreeGpus(by_id.values(), used)
    spread: dict[str, Counter[str]] = defaultdict(Counter)
    for r in kept:
        spread[r.record.model][r.record.node] += 1

    for model in sorted(catalog, key=lambda m: (-m.gpus, m.name)):
        have = active.get(model.name, [])
        b = backoff.get(model.name)
        if b is not None and sum(r.ready for r in have) >= model.min_replicas:
            actions.append(ClearBackoff(model.name))
        if len(have) > model.min_replicas:
            actions.extend(_scale_down(model, have, by_id))
            continue
        missing = model.min_replicas - len(have)
        if missing <= 0:
            continue
        if model.name in failed_now:
            actions.append(
                CannotPlace(
                    model.name,
                    f"{missing} of {model.min_replicas} replica(s) failed just now; replaced after a backoff",
                )
            )
            continue
        if b is not None and b.retry_at > now:
            actions.append(
                CannotPlace(
                    model.name,
                    f"{missing} of {model.min_replicas} replica(s) wait to be replaced after "
                    f"{b.failures} failure(s); retrying in {b.retry_at - now:.0f}s",
                )
            )
            continue
        for placed in range(missing):
            choice = free.choose(model, spread[model.name])
            if choice is None:
                reasons = _reasons(model, by_id.values(), used)
                detail = "; ".join(reasons) if reasons else "no nodes are registered"
                actions.append(
                    CannotPlace(
                        model.name,
                        f"{missing - placed} of {model.min_replicas} replica(s) cannot be placed: {detail}",
                    )
                )
                break
            node_id, gpus = choice
            used[node_id].update(gpus)
            free.take(node_id, gpus)
            spread[model.name][node_id] += 1
            actions.append(StartReplica(model.name, node_id, gpus, model.engine, model.name, model.args))

    recorded = {r.id: r.record for r in reps}
    for node in by_id.values():
        if not node.ready:
            continue
        for rep in sorted(node.replicas.values(), key=lambda x: x.id):
            rec = recorded.get(rep.id)
            if rec is not None and rec.node == node.id:
                continue
            if rep.state in _STOPPING_OR_STOPPED:
                continue
            actions.append(
                StopReplica(rep.id, node.id, "orphan: the leader has no record of this replica", False)
            )
    return actions


def _used_gpus(nodes: Iterable[Node], kept: Sequence[Replica]) -> dict[str, set[int]]:
    """GPUs taken per node: by kept records, and by any engine a node says still runs."""
    used: dict[str, set[int]] = defaultdict(set)
    for r in kept:
        used[r.record.node].update(r.record.gpu_indices)
    for n in nodes:
        for rep in n.replicas.values():
            if rep.holds_gpus:
                used[n.id].update(rep.gpu_indices)
    return used


class _FreeGpus:
    """The free GPUs of every ready node, indexed for placement.

    Per engine kind, the ready nodes offering it bucketed by how many GPUs
    they have free, each bucket in node id order. The best node for a
    replica is the first by (replicas of this model on it, GPUs left after
    placing, node id): when some fitting node holds none of the model, that
    is the first such node in the smallest bucket that fits, found without
    looking at the others; otherwise every fitting node holds some, and only
    those (a handful) are compared. Same answer as comparing every node, at
    a cost that does not grow with the fleet for each replica placed.
    """

    def __init__(self, nodes: Iterable[Node], used: Mapping[str, set[int]]):
        self._nodes = nodes
        self._used = used
        self._free: dict[str, list[int]] = {}
        self._kinds: dict[str, frozenset[str]] = {}
        self._buckets: dict[str, dict[int, list[str]]] = defaultdict(dict)
        self._built = False

    def _build(self) -> None:
        """Index on first use: a pass that places nothing (a converged fleet) never pays for it."""
        self._built = True
        for n in sorted((n for n in self._nodes if n.ready), key=lambda n: n.id):
            taken = self._used.get(n.id, ())
            free = sorted(g.index for g in n.gpus if g.index not in taken)
            kinds = frozenset(e.kind for e in n.engines)
            self._free[n.id] = free
            self._kinds[n.id] = kinds
            for kind in kinds:
                self._buckets[kind].setdefault(len(free), []).append(n.id)

    def choose(self, model: Model, spread: Mapping[str, int]) -> tuple[str, tuple[int, ...]] | None:
        if not self._built:
            self._build()
        buckets = self._buckets.get(model.engine)
        if not buckets:
            return None
        need = model.gpus
        for count in sorted(c for c in buckets if c >= need):
            for nid in buckets[count]:
                if not spread.get(nid):
                    return nid, tuple(self._free[nid][:need])
        fitting = [
            (spread[nid], len(self._free[nid]) - need, nid)
            for nid in spread
            if nid in self._free and model.engine in self._kinds[nid] and len(self._free[nid]) >= need
        ]
        if not fitting:
            return None
        _, _, nid = min(fitting)
        return nid, tuple(self._free[nid][:need])

    def take(self, node_id: str, gpus: Iterable[int]) -> None:
        taken = set(gpus)
        old = self._free[node_id]
        new = [i for i in old if i not in taken]
        self._free[node_id] = new
        for kind in self._kinds[node_id]:
            buckets = self._buckets[kind]
            bucket = buckets[len(old)]
            bucket.remove(node_id)
            if not bucket:
                del buckets[len(old)]
            insort(buckets.setdefault(len(new), []), node_id)


def _reasons(model: Model, nodes: Iterable[Node], used: Mapping[str, set[int]]) -> list[str]:
    """Why each node cannot take a replica of ``model`` (called only when none can)."""
    reasons: list[str] = []
    for n in nodes:
        if not n.ready:
            reasons.append(f"{n.id}: {n.state.value}")
            continue
        if not n.offers(model.engine):
            offered = ", ".join(sorted({e.kind for e in n.engines})) or "none"
            reasons.append(f"{n.id}: does not offer engine {model.engine!r} (offers {offered})")
            continue
        free = sum(1 for g in n.gpus if g.index not in used.get(n.id, ()))
        if free < model.gpus:
            reasons.append(f"{n.id}: {free} free GPU{'' if free == 1 else 's'}, profile needs {model.gpus}")
    return reasons


def _scale_down(model: Model, have: Sequence[Replica], nodes: Mapping[str, Node]) -> list[Action]:
    def usefulness(r: Replica) -> tuple[bool, bool, float]:
        node = nodes.get(r.record.node)
        # Lower sorts first and is stopped first: unreachable, not ready, newest.
        return (node is not None and node.ready, r.ready, -r.record.created)

    excess = sorted(have, key=usefulness)[: len(have) - model.min_replicas]
    reason = f"model {model.name!r} wants {model.min_replicas} replica(s), {len(have)} run"
    out: list[Action] = []
    for r in sorted(excess, key=lambda r: r.id):
        node = nodes.get(r.record.node)
        if node is not None and node.ready:
            out.append(StopReplica(r.id, r.record.node, reason, forget=True))
        else:
            out.append(ForgetReplica(r.id, reason))
    return out
