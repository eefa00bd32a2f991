"""Which LoRA adapters each ready replica should have loaded: a pure decision.

``plan_adapters(catalog, replicas, load)`` returns, for every ready replica
of a model that declares adapters, the whole set it should hold now. The
leader sends each replica whose reported set differs a ``SetAdapters``
(see the applier); the agent loads and unloads through the engine's API,
never restarting it, and reports what it holds, which is what the endpoint
table publishes and routers route on.

Rules, per model, per adapter in the order the model declares them:

1. **Affinity.** An adapter stays where it is loaded: the replicas that
   report it (its *holders*) keep it while it is wanted there. A request
   for it goes only to its holders, so few holders means a warm adapter on
   each and the engine's adapter slots left for others.
2. **At least one.** Every adapter is wanted on at least one ready replica
   (so a request naming it never waits for a load once the model serves).
3. **More when busy.** When every holder's load (the usage book's: requests
   in flight or queued there, from every router) is at or above the
   model's ``scaling.target_load``, the adapter is wanted on one more
   replica; when every holder is below half of it and it has more than one,
   on one fewer. One step per pass, like the autoscaler's, so a burst does
   not load an adapter everywhere at once. The load is the replica's, not
   the adapter's alone: a replica busy with its base model is no place to
   add work either.
4. **Bounded by max_loras.** A replica never gets more adapters than the
   model's ``lora.max_loras``; adapters declared first get the room first,
   and one that finds none waits for the replicas the autoscaler adds. A
   new holder is the ready replica with the fewest adapters, ties broken
   by a stable hash of (adapter, replica), so different adapters start on
   different replicas and every leader picks the same one.
5. Adapters no longer declared are not in any set: they are unloaded.

No I/O, no clock, no randomness: tests call it directly.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping

from llmgw.v1 import agent_pb2

from ..spec.catalog import Catalog
from ..spec.model import Adapter
from .reconcile import Replica

_READY = agent_pb2.REPLICA_STATE_READY


def _tie(adapter: str, replica_id: str) -> bytes:
    return hashlib.sha256(f"{adapter}\x00{replica_id}".encode()).digest()


def plan_adapters(
    catalog: Catalog, replicas: Iterable[Replica], load: Callable[[str], float]
) -> dict[str, tuple[Adapter, ...]]:
    """Replica id -> the adapters it should hold, for ready replicas of models with LoRA."""
    by_model: dict[str, list[Replica]] = {}
    for r in replicas:
        if r.state == _READY and r.reported is not None:
            by_model.setdefault(r.record.model, []).append(r)
    out: dict[str, tuple[Adapter, ...]] = {}
    for name, ready in sorted(by_model.items()):
        model = catalog.get(name)
        spec = model.spec if model is not None else None
        lora = spec.lora_settings if spec is not None else None
        if spec is None or lora is None:
            continue
        ready.sort(key=lambda r: r.id)
        held = {r.id: set(r.reported.adapters) if r.reported else set() for r in ready}
        loads = {r.id: load(r.id) for r in ready}
        wanted = _model_plan(spec.adapters, held, loads, lora.max_loras, spec.scaling.target_load)
        for r in ready:
            out[r.id] = tuple(a for a in spec.adapters if a.name in wanted[r.id])
    return out


def _model_plan(
    adapters: Iterable[Adapter],
    held: Mapping[str, set[str]],
    loads: Mapping[str, float],
    max_loras: int,
    target: float,
) -> dict[str, set[str]]:
    plan: dict[str, set[str]] = {rid: set() for rid in held}
    ids = sorted(held)
    for adapter in adapters:
        holders = [rid for rid in ids if adapter.name in held[rid]]
        want = max(1, len(holders))
        if holders and all(loads[rid] >= target for rid in holders):
            want = len(holders) + 1
        elif len(holders) > 1 and all(loads[rid] < target / 2 for rid in holders):
            want = len(holders) - 1
        want = min(want, len(ids))
        # Keep the busiest holders when shrinking: their requests are the warm ones.
        keep = sorted(holders, key=lambda rid: (-loads[rid], rid))[:want]
        keep = [rid for rid in keep if len(plan[rid]) < max_loras]
        for rid in keep:
            plan[rid].add(adapter.name)
        while len(keep) < want:
            room = [rid for rid in ids if rid not in keep and len(plan[rid]) < max_loras]
            if not room:
                break
            best = min(room, key=lambda rid: (len(plan[rid]), loads[rid], _tie(adapter.name, rid)))
            plan[best].add(adapter.name)
            keep.append(best)
    return plan
