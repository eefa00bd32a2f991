"""The autoscaling decision: how many replicas each model should run, as a pure function.

``decide(models, demand, current, state, now)`` reads what the routers
report (aggregated by :mod:`llmgw.control.state.usage`), the replica count each model has now
and the autoscaler's own memory of the previous call, and returns the
desired count per model plus the next memory. It performs no I/O and reads
no clock, so tests drive it with a fake clock and the controller calls it on
every pass; how often it is called does not change what it decides, because
every window is measured in time, never in calls.

Rules, per model (``scaling`` of its document; external models are skipped):

- **Bounds.** The answer is always within ``[scaling.min, scaling.max]``.
  A model seen for the first time (a new model, or a new leader that has
  just read the replica records) starts from the count it runs now, so a
  change of leader neither adds nor stops anything.
- **Load** is requests in flight on the model's replicas (the larger of the
  routers' own count and the engines' running + waiting) plus requests held
  at routers waiting for a replica, divided by the desired count.
- **Up** when load per replica stays above ``target_load`` for
  ``scale_up_seconds``: to the smallest count the load asked for during that
  window (at least one more), so a short burst inside the window does not
  buy replicas the rest of it did not need.
- **Down** when the load would still fit in fewer replicas at
  :data:`HEADROOM` of the target, continuously for ``scale_down_seconds``
  (longer than up, by default): to the largest count asked for during the
  window. Never below one through this rule; only idleness reaches zero.
- **Hysteresis.** The down threshold sits below the up threshold (a count
  chosen on the way down has load at most ``HEADROOM`` x target per
  replica, so it takes 1/HEADROOM more load to go back up), and every change
  restarts both windows, so the count never flaps at a boundary.
- **Wake.** An on-demand model (``min: 0``) at zero goes up at once, with
  no window, when a request waits for it: to enough replicas for what
  waits (at least one).
- **Idle.** An on-demand model with nothing in flight, nothing waiting and
  no request for ``idle_timeout_seconds`` goes to zero. The idle clock
  starts no earlier than the model was first seen, so a new leader that has
  no usage history yet never stops a model at once.
- **Blind.** ``demand=None`` means no router reports at all (none
  connected, or all expired): the count is held and windows restart, since
  an absence of reports is not an absence of load.

Models that share a replica: every name a replica answers to (aliases,
adapters) is resolved to its base model before it reaches here, so the
idle clock and the load of a replica are the sum of all its names; a quiet
sibling name never stops a replica another name is using.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..spec.catalog import Model
from ..state.usage import Demand

# A lower count is chosen only if load per replica would then be at most this
# share of the target: the gap between this and 1.0 is the hysteresis band.
HEADROOM = 0.8


@dataclass(frozen=True)
class Policy:
    """The scaling settings of one model, with defaults for a model built without a document."""

    min: int
    max: int
    target_load: float = 16.0
    up_seconds: float = 10.0
    down_seconds: float = 120.0
    idle_seconds: float = 300.0

    @classmethod
    def of(cls, model: Model) -> Policy:
        s = model.spec.scaling if model.spec is not None else None
        low = model.min_replicas
        high = max(model.max_replicas, low, 1)
        if s is None:
            return cls(low, high)
        return cls(low, high, s.target_load, s.scale_up_seconds, s.scale_down_seconds, s.idle_timeout_seconds)


@dataclass(frozen=True)
class ModelScale:
    """The autoscaler's memory of one model between calls."""

    desired: int
    # When ``desired`` last changed (or the model was first seen).
    changed_at: float
    # The latest time the model is known to have been used (at least first seen).
    last_used: float
    # Load has been above target since then; ``up_to`` is the smallest count asked for since.
    above_since: float | None = None
    up_to: int = 0
    # Load has fit fewer replicas since then; ``down_to`` is the largest count asked for since.
    below_since: float | None = None
    down_to: int = 0
    reason: str = "starting from the replicas that run"


@dataclass(frozen=True)
class Change:
    model: str
    before: int
    after: int
    reason: str


@dataclass(frozen=True)
class Decision:
    desired: Mapping[str, int]
    state: Mapping[str, ModelScale]
    changes: tuple[Change, ...]


def decide(
    models: Iterable[Model],
    demand: Mapping[str, Demand] | None,
    current: Mapping[str, int],
    state: Mapping[str, ModelScale],
    now: float,
) -> Decision:
    desired: dict[str, int] = {}
    nxt: dict[str, ModelScale] = {}
    changes: list[Change] = []
    for model in models:
        # A shared environment's member has no replicas: its demand is its entry's.
        if model.external or model.served_by:
            continue
        p = Policy.of(model)
        s = state.get(model.name)
        if s is None:
            s = ModelScale(_clamp(current.get(model.name, p.min), p), now, now)
        elif not p.min <= s.desired <= p.max:
            s = _set(s, s.last_used, _clamp(s.desired, p), now, f"scaling bounds are now {p.min}..{p.max}")
        before = s.desired
        if demand is None:
            s = _windows(s, s.last_used, None, 0, None, 0)
        else:
            s = _step(s, p, demand.get(model.name, Demand()), now)
        desired[model.name] = s.desired
        nxt[model.name] = s
        if s.desired != before:
            changes.append(Change(model.name, before, s.desired, s.reason))
    return Decision(desired, nxt, tuple(changes))


def _step(s: ModelScale, p: Policy, d: Demand, now: float) -> ModelScale:
    busy = d.load > 0 or d.pending > 0
    last_used = now if busy else max(s.last_used, d.last_used if d.last_used is not None else s.last_used)
    total = d.load + d.pending
    if s.desired == 0:
        if not busy:
            return _windows(s, last_used, None, 0, None, 0)
        wake = min(p.max, max(1, math.ceil(total / p.target_load)))
        return _set(s, last_used, wake, now, f"woken: {d.pending} request(s) waiting, load {d.load:g}")
    if p.min == 0 and not busy and now - last_used >= p.idle_seconds:
        reason = f"idle for {now - last_used:.0f}s (idle_timeout_seconds {p.idle_seconds:g})"
        return _set(s, last_used, 0, now, reason)

    above_since, up_to = None, 0
    up = min(p.max, math.ceil(total / p.target_load))
    if up > s.desired:
        above_since = s.above_since if s.above_since is not None else now
        up_to = min(s.up_to, up) if s.above_since is not None else up
        if now - above_since >= p.up_seconds:
            per = total / s.desired
            reason = f"load {per:.1f} per replica above target {p.target_load:g} for {now - above_since:.0f}s"
            return _set(s, last_used, max(s.desired + 1, up_to), now, reason)

    below_since, down_to = None, 0
    down = max(p.min, 1, math.ceil(total / (p.target_load * HEADROOM)))
    if down < s.desired:
        below_since = s.below_since if s.below_since is not None else now
        down_to = max(s.down_to, down) if s.below_since is not None else down
        if now - below_since >= p.down_seconds:
            reason = (
                f"load {total:g} fits {down_to} replica(s) within {HEADROOM:.0%} of target "
                f"{p.target_load:g} for {now - below_since:.0f}s"
            )
            return _set(s, last_used, down_to, now, reason)
    return _windows(s, last_used, above_since, up_to, below_since, down_to)


def _windows(
    s: ModelScale, last_used: float, above: float | None, up_to: int, below: float | None, down_to: int
) -> ModelScale:
    """The same count with updated windows; the same object when nothing changed (the common case)."""
    if (last_used, above, up_to, below, down_to) == (
        s.last_used,
        s.above_since,
        s.up_to,
        s.below_since,
        s.down_to,
    ):
        return s
    return ModelScale(s.desired, s.changed_at, last_used, above, up_to, below, down_to, s.reason)


def _set(s: ModelScale, last_used: float, desired: int, now: float, reason: str) -> ModelScale:
    """A new count: both windows restart, so the next change needs a whole window of its own."""
    return ModelScale(desired, now, last_used, reason=reason)


def _clamp(n: int, p: Policy) -> int:
    return max(p.min, min(p.max, n))
