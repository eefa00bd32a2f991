"""GPU-hours per model, integrated over the leader's reconcile passes: soft state of one term.

Each pass reports how many GPUs each model's replicas hold (recorded
replicas, whether starting or ready: a GPU placed is a GPU kept from
everyone else); the time since the previous pass is charged at the previous
pass's holdings. Decisions:

- Soft state, like the rest of the leader's view of the fleet: a new leader
  starts from zero and says since when it counts (``since``, wall clock).
  Billing-grade history belongs in Prometheus (``llmgw_control_owner_gpus``
  integrated over time) or an external meter, not in etcd writes every pass.
- Per model, not per owner: a model's owner is looked up when usage is
  read, so the tree's roll-up (project, team, org) is done in one place.
"""

from __future__ import annotations

from collections.abc import Mapping


class GpuHours:
    def __init__(self) -> None:
        self.since = 0.0
        self._at: float | None = None
        self._holding: Mapping[str, int] = {}
        self._seconds: dict[str, float] = {}

    def start(self, wall: float) -> None:
        """A term begins: count from zero, from ``wall``."""
        self.since, self._at, self._holding, self._seconds = wall, None, {}, {}

    def observe(self, now: float, holding: Mapping[str, int]) -> None:
        """A pass at monotonic ``now`` sees ``holding`` (model -> GPUs held)."""
        if self._at is not None and now > self._at:
            elapsed = now - self._at
            for model, gpus in self._holding.items():
                self._seconds[model] = self._seconds.get(model, 0.0) + gpus * elapsed
        self._at, self._holding = now, dict(holding)

    def hours(self, model: str) -> float:
        return self._seconds.get(model, 0.0) / 3600.0
