"""Rolling updates: replacing a model's replicas one at a time when its version changes.

A model's version (ModelSpec.version) is a hash of its weights and
profiles; every replica record keeps the version it was started with. When
the two differ the replica is *outdated*, and reconcile's rule 2 hands the
model to :func:`roll` instead of its usual converge. Pure, like the rest of
``decide``: it only appends actions to the pass.

Rules, each pass:

1. *Admitted* replicas are those of the current version that are ready and
   not held back by the eval gate (``gated``: the pass's input); the others
   of the current version are *pending*.
2. Outdated replicas are retired while the admitted ones and the outdated
   ones that remain still make ``want``: outdated ones that are not ready
   at once, ready ones oldest first. So an old replica leaves only after a
   new one is ready and has passed the gate. (The controller withholds a
   stopped replica from the routers' table before it sends the stop, and
   engines finish in-flight requests on SIGTERM: no request fails.)
3. With fewer current replicas than ``want`` and none pending, one new
   replica is placed: a surge of one, where some node has room for it.
   Where none has, one outdated replica is drained first, but only while at
   least two ready replicas remain, so a one-replica model never goes dark:
   it waits for room instead, and says so.

A new-version replica that fails, or a version the eval gate fails, is the
controller's to judge (leader.lifecycle): it marks the rollout rolled back
and hands ``plan`` the previous version's model, so the same rules roll the
fleet back to it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..spec.catalog import Model
from .actions import CannotPlace, ForgetReplica, StopReplica

if TYPE_CHECKING:
    from .reconcile import Backoff, Replica, _Pass


def outdated(model: Model, replicas: Sequence[Replica]) -> list[Replica]:
    """The replicas recorded with another version than the model's ("" counts as current)."""
    if not model.version:
        return []
    return [r for r in replicas if r.record.version and r.record.version != model.version]


def roll(
    p: _Pass, model: Model, want: int, have: Sequence[Replica], old: Sequence[Replica], b: Backoff | None
) -> None:
    """Move ``model`` one step toward its current version (the module's rules)."""
    old_ids = {r.id for r in old}
    current = [r for r in have if r.id not in old_ids]
    admitted = [r for r in current if r.ready and r.id not in p.gated]
    pending = [r for r in current if not (r.ready and r.id not in p.gated)]
    keep_old = max(0, want - len(admitted))
    ready_old = sorted((r for r in old if r.ready), key=lambda r: (-r.record.created, r.id))
    retire = [r for r in old if not r.ready] + ready_old[keep_old:]
    staying_old = ready_old[:keep_old]
    reason = (
        f"rolling update of {model.name!r} to {model.spec.revision_label if model.spec else model.version}"
    )
    if len(current) < want and not pending:
        if _fits(p, model, b):
            p.place_missing(model, want, 1, b)
        elif len(staying_old) + len(admitted) >= 2 and staying_old:
            # No room for a surge: drain the oldest first; it is replaced next pass.
            retire.append(staying_old[-1])
            reason += ": no node has room for one more replica, so an old one goes first"
        else:
            p.actions.append(
                CannotPlace(
                    model.name,
                    f"rolling update waits for room for one more replica: stopping the only ready "
                    f"one first would leave {model.name!r} without any ({_why(p, model)})",
                    kind="no_fit",
                )
            )
    for r in sorted(retire, key=lambda r: r.id):
        node = p.by_id.get(r.record.node)
        if node is not None and node.ready:
            p.actions.append(StopReplica(r.id, r.record.node, reason, forget=True))
        else:
            p.actions.append(ForgetReplica(r.id, reason))


def _fits(p: _Pass, model: Model, b: Backoff | None) -> bool:
    avoid = b.node if b is not None else ""
    spread = p.spread[model.name]
    return any(p.fleet.choose(needs, spread, avoid) is not None for needs in model.profiles)


def _why(p: _Pass, model: Model) -> str:
    reasons = [r for needs in model.profiles for r in p.fleet.reasons(needs)]
    return "; ".join(reasons[:3]) or "no nodes are registered"
