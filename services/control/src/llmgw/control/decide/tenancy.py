"""Quotas in placement: what each owner scope holds, and whether one more replica fits its quotas.

:class:`Ledger` is built, like placement's :class:`~.placement.Fleet`, once
per reconcile pass from the replicas that stay, and debited as the pass
places replicas, so two replicas placed in one pass cannot both take the
last GPU of a quota. Pure: a function of the catalog, the nodes, the
records and the quotas in the cluster settings (spec.tenancy).

Decisions:

- A replica counts against every scope of its model's owner (org, team,
  project); a quota on any of them refuses it. The reason names the
  tightest one: ``team acme/search: GPU quota 2, 2 in use, the replica
  needs 1 more``.
- Replicas moving off a draining node do not count: their replacement
  would otherwise need room for both, and a team at its quota could never
  leave a held rack. The overshoot lasts until the old replica stops,
  which the drain does once the replacement is ready.
- Lowering a quota below what runs stops nothing: it only refuses new
  replicas until the scope is under it again (replicas that fail or scale
  down are not replaced past it).
- Quotas bind every capacity class. A critical model is placed before the
  others inside the quota and may evict opportunistic replicas for room on
  a node, but only for a replica its owner's quotas allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ..spec.catalog import GB, Catalog
from ..spec.tenancy import Quota, level, scopes
from ..state.inventory import Node
from ..store.replicas import ReplicaRecord


@dataclass
class Use:
    """What one scope holds: replicas, whole GPUs and those GPUs' memory."""

    replicas: int = 0
    gpus: int = 0
    gpu_memory_bytes: int = 0


def gpu_memory(node: Node | None, indices: Iterable[int]) -> int:
    """The total memory of the GPUs ``indices`` of ``node`` (0 for a node not known)."""
    if node is None:
        return 0
    wanted = set(indices)
    return sum(g.memory_total_bytes for g in node.gpus if g.index in wanted)


class Ledger:
    def __init__(
        self,
        quotas: Mapping[str, Quota],
        catalog: Catalog,
        nodes: Mapping[str, Node],
        records: Iterable[ReplicaRecord],
    ):
        self._quotas = quotas
        self._nodes = nodes
        self.use: dict[str, Use] = {}
        for rec in records:
            model = catalog.get(rec.model)
            if model is not None and model.owner:
                self.add(model.owner, len(rec.gpu_indices), gpu_memory(nodes.get(rec.node), rec.gpu_indices))

    def add(self, owner: str, gpus: int, memory: int) -> None:
        for scope in scopes(owner):
            u = self.use.setdefault(scope, Use())
            u.replicas += 1
            u.gpus += gpus
            u.gpu_memory_bytes += memory

    def refuse(self, owner: str, gpus: int, memory: int = 0) -> str:
        """Why one more replica of ``gpus`` GPUs (``memory`` bytes of them) exceeds a quota; "" if not."""
        if not self._quotas or not owner:
            return ""
        for scope in reversed(scopes(owner)):  # the tightest scope first
            q = self._quotas.get(scope)
            if q is None:
                continue
            u = self.use.get(scope, Use())
            name = f"{level(scope)} {scope}"
            if q.replicas is not None and u.replicas + 1 > q.replicas:
                return f"{name}: replica quota {q.replicas}, {u.replicas} in use"
            if q.gpus is not None and gpus and u.gpus + gpus > q.gpus:
                return f"{name}: GPU quota {q.gpus}, {u.gpus} in use, the replica needs {gpus} more"
            limit = int(q.gpu_memory_gb * GB) if q.gpu_memory_gb is not None else None
            if limit is not None and memory and u.gpu_memory_bytes + memory > limit:
                return (
                    f"{name}: GPU memory quota {q.gpu_memory_gb:g} GiB, {u.gpu_memory_bytes / GB:.3g} GiB "
                    f"in use, the replica needs {memory / GB:.3g} GiB more"
                )
        return ""

    def usage(self, scope: str) -> Use:
        return self.use.get(scope, Use())

    def memory_of(self, node_id: str, indices: Iterable[int]) -> int:
        return gpu_memory(self._nodes.get(node_id), indices)

    def lines(self, owner: str) -> list[str]:
        """Each scope of ``owner`` with a quota, as ``llmgw explain`` shows it."""
        out = []
        for scope in scopes(owner):
            q = self._quotas.get(scope)
            if q is None:
                continue
            u = self.use.get(scope, Use())
            parts = []
            if q.replicas is not None:
                parts.append(f"replicas {u.replicas}/{q.replicas}")
            if q.gpus is not None:
                parts.append(f"GPUs {u.gpus}/{q.gpus}")
            if q.gpu_memory_gb is not None:
                parts.append(f"GPU memory {u.gpu_memory_bytes / GB:.3g}/{q.gpu_memory_gb:g} GiB")
            out.append(f"{level(scope)} {scope}: " + (", ".join(parts) or "no limits"))
        return out
