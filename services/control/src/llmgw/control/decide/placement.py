"""Placement: which node, and which of its GPUs, one replica of one profile gets.

:class:`Fleet` is the free capacity of the fleet during one reconcile
decision: built from the nodes and the replicas that stay, then debited as
the decision places replicas, so two replicas placed in one pass never
share a GPU. Pure and synchronous, like the decision that owns it.

A profile (:class:`~llmgw.control.spec.catalog.Needs`) *fits* a node when the node is ready
and not held, offers the profile's engine in a build that matches (its
``engine_version`` range, a CUDA version the driver supports: spec.builds;
the replica then runs that build, :attr:`Choice.build`), carries every label of its node
selector, has enough GPUs that no replica uses (each with at least the
profile's free memory, as the agent last reported it), and enough host
memory and CPU cores left after what its replicas claimed, and the GPUs it
would take keep every power-budgeted domain the node is in (spec.facility)
within its watts: a domain's draw is the ``power_watts`` its agents report
for each GPU in use there (a GPU reporting 0 counts nothing). GPUs are whole:
a GPU that any replica uses, or that an engine the node reports still
holds, is not free. Each check that fails is a *reason*, worded for an
operator ("node-3: 1 free GPU, profile needs 2"): placement keeps the
reason each node was dropped, GPUStack-style, so a model that cannot be
placed explains itself per node.

Choosing among the nodes that fit, in order:

1. spread: fewer replicas of the same model on the node first (a node where
   the same model failed last counts as holding one more, so a crash loop
   tries elsewhere when it can);
2. the policy: ``pack`` takes the node left with the fewest free GPUs
   (whole machines stay free for large models); ``spread`` the one left
   with the most (load spread over machines);
3. node id, so the same inputs always give the same answer.

Cost: ready nodes are kept per engine in buckets by free-GPU count, node-id
order inside a bucket; the best node holding none of the model is the first
that fits in the first bucket (smallest for pack, largest for spread) that
can fit, found without comparing the rest. Only nodes that already hold the
model (a handful) are compared one by one. Nothing is indexed until the
first placement, so a converged pass never pays for it.
"""

from __future__ import annotations

from bisect import insort
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from ..spec.builds import choose_build
from ..spec.catalog import GB, Needs
from ..spec.facility import parse_domain
from ..state.inventory import Gpu, Node
from ..store.replicas import ReplicaRecord

Policy = Literal["pack", "spread"]
POLICIES: tuple[str, ...] = ("pack", "spread")


@dataclass(frozen=True)
class Choice:
    node: str
    gpus: tuple[int, ...]
    needs: Needs
    # Which of the node's builds of the engine runs it ("": the kind's main build).
    build: str = ""


@dataclass(frozen=True)
class Room:
    """A node where a profile fits once ``evict`` (possibly none: already stopping) are gone."""

    node: str
    needs: Needs
    evict: tuple[ReplicaRecord, ...]


class Fleet:
    def __init__(
        self,
        nodes: Mapping[str, Node],
        records: Iterable[ReplicaRecord],
        policy: Policy = "pack",
        power_budgets: Mapping[str, float] | None = None,
    ):
        self._nodes = nodes
        self._records = records
        self._spread = policy == "spread"
        # Power budgets: (label, value, domain, watts), and the watts in use per domain.
        self._budgets = [(*parse_domain(d), d, w) for d, w in sorted((power_budgets or {}).items())]
        self._drawn: dict[str, float] = defaultdict(float)
        self._built = False
        self._free: dict[str, list[int]] = {}
        self._mem: dict[str, int] = {}
        self._cpu: dict[str, float] = {}
        # GPUs an engine holds with no record (stopping, orphans): free soon.
        self._pending: dict[str, set[int]] = defaultdict(set)
        self._buckets: dict[str, dict[int, list[str]]] = defaultdict(dict)

    def _build(self) -> None:
        self._built = True
        used: dict[str, set[int]] = defaultdict(set)
        mem: dict[str, int] = defaultdict(int)
        cpu: dict[str, float] = defaultdict(float)
        recorded: set[str] = set()
        for rec in self._records:
            recorded.add(rec.id)
            used[rec.node].update(rec.gpu_indices)
            mem[rec.node] += rec.memory_bytes
            cpu[rec.node] += rec.cpu_cores
        for n in self._nodes.values():
            for rep in n.replicas.values():
                if rep.holds_gpus:
                    used[n.id].update(rep.gpu_indices)
                    if rep.id not in recorded:
                        self._pending[n.id].update(rep.gpu_indices)
        if self._budgets:
            for n in self._nodes.values():
                watts = sum(_gpu_power(n, i) for i in used.get(n.id, ()))
                for domain, _ in self._domains(n):
                    self._drawn[domain] += watts
        for nid in sorted(self._nodes):
            n = self._nodes[nid]
            if not n.placeable:
                continue
            taken = used.get(nid, ())
            free = [g.index for g in n.gpus if g.index not in taken]
            self._free[nid] = free
            self._mem[nid] = n.memory_bytes - mem.get(nid, 0)
            self._cpu[nid] = n.cpu_cores - cpu.get(nid, 0.0)
            for kind in {e.kind for e in n.engines}:
                self._buckets[kind].setdefault(len(free), []).append(nid)

    def used_gpus(self, node_id: str) -> list[int]:
        if not self._built:
            self._build()
        n = self._nodes[node_id]
        free = set(self._free.get(node_id, ()))
        return [g.index for g in n.gpus if g.index not in free] if n.placeable else []

    # -- fitting -----------------------------------------------------------------

    def fit(
        self, node_id: str, needs: Needs, released: Collection[int] = (), mem: int = 0, cpu: float = 0.0
    ) -> tuple[int, ...] | str:
        """The GPUs ``needs`` would take on the node, or why it does not fit.

        ``released``, ``mem`` and ``cpu``: resources to count as free on top
        of what is (replicas about to be evicted or stopping).
        """
        if not self._built:
            self._build()
        n = self._nodes[node_id]
        if not n.ready:
            return n.state.value
        if n.held:
            return "held by an operator" + (f" ({n.hold_reason})" if n.hold_reason else "")
        if not n.offers(needs.engine):
            offered = ", ".join(sorted({e.kind for e in n.engines})) or "none"
            return f"does not offer engine {needs.engine!r} (offers {offered})"
        build = choose_build(n.engines, needs.engine, needs.versions, n.cuda_version)
        if isinstance(build, str):
            return build
        for key, want in needs.node_selector.items():
            have = n.labels.get(key)
            if have != want:
                return (
                    f"label {key}={want} required, node has {key}={have}"
                    if have
                    else f"no label {key}={want}"
                )  # noqa: E501
        free = self._free[node_id]
        if released:
            free = sorted({*free, *released})
        if len(free) < needs.gpus:
            return f"{len(free)} free GPU{'' if len(free) == 1 else 's'}, profile needs {needs.gpus}"
        if needs.gpu_memory_bytes and needs.gpus:
            big = [i for i in free if _gpu_memory(n, i, i in released) >= needs.gpu_memory_bytes]
            if len(big) < needs.gpus:
                return (
                    f"{len(big)} free GPU{'' if len(big) == 1 else 's'} with {_gib(needs.gpu_memory_bytes)} "
                    f"free, profile needs {needs.gpus}"
                )
            free = big
        if needs.memory_bytes:
            left = self._mem[node_id] + mem
            if n.memory_bytes <= 0:
                return "reports no host memory"
            if left < needs.memory_bytes:
                return f"{_gib(max(left, 0))} host memory free, profile needs {_gib(needs.memory_bytes)}"
        if needs.cpu_cores:
            left_cpu = self._cpu[node_id] + cpu
            if left_cpu < needs.cpu_cores:
                return f"{max(left_cpu, 0):g} CPU cores free, profile needs {needs.cpu_cores:g}"
        chosen = tuple(free[: needs.gpus])
        if self._budgets and chosen:
            over = self._over_budget(n, chosen, released)
            if over:
                return over
        return chosen

    def _domains(self, n: Node) -> list[tuple[str, float]]:
        """The budgeted domains the node is in: (``label=value``, watts)."""
        return [(d, w) for label, value, d, w in self._budgets if n.labels.get(label) == value]

    def _over_budget(self, n: Node, gpus: Sequence[int], released: Collection[int]) -> str:
        """Why taking ``gpus`` of ``n`` would exceed a domain's power budget; "" if it would not."""
        adds = sum(_gpu_power(n, i) for i in gpus)
        if not adds:
            return ""
        freed = sum(_gpu_power(n, i) for i in released)
        for domain, budget in self._domains(n):
            drawn = self._drawn[domain] - freed
            if drawn + adds > budget:
                return (
                    f"power budget of {domain}: {drawn:g} W of {budget:g} W in use, "
                    f"the replica adds {adds:g} W"
                )
        return ""

    def choose(self, needs: Needs, spread: Mapping[str, int], avoid: str = "") -> Choice | None:
        """The best node for one replica of ``needs`` (see the module docstring), or None."""
        if not self._built:
            self._build()
        buckets = self._buckets.get(needs.engine)
        if not buckets:
            return None
        for count in sorted((c for c in buckets if c >= needs.gpus), reverse=self._spread):
            for nid in buckets[count]:
                if spread.get(nid) or nid == avoid:
                    continue
                got = self.fit(nid, needs)
                if not isinstance(got, str):
                    return self.choice_at(nid, got, needs)
        best: tuple[tuple[int, int, str], Choice] | None = None
        for nid in {*spread, *([avoid] if avoid else [])}:
            if nid not in self._free:
                continue
            got = self.fit(nid, needs)
            if isinstance(got, str):
                continue
            left = len(self._free[nid]) - needs.gpus
            key = (spread.get(nid, 0) + (nid == avoid), -left if self._spread else left, nid)
            if best is None or key < best[0]:
                best = (key, self.choice_at(nid, got, needs))
        return best[1] if best else None

    def choice_at(self, nid: str, gpus: tuple[int, ...], needs: Needs) -> Choice:
        """A node that fits, with the build it runs (fit checked that one matches)."""
        n = self._nodes[nid]
        build = choose_build(n.engines, needs.engine, needs.versions, n.cuda_version)
        return Choice(nid, gpus, needs, build.build if not isinstance(build, str) else "")

    def take(self, choice: Choice) -> None:
        nid, needs = choice.node, choice.needs
        taken = set(choice.gpus)
        old = self._free[nid]
        new = [i for i in old if i not in taken]
        self._free[nid] = new
        self._mem[nid] -= needs.memory_bytes
        self._cpu[nid] -= needs.cpu_cores
        if self._budgets:
            node = self._nodes[nid]
            adds = sum(_gpu_power(node, i) for i in choice.gpus)
            for domain, _ in self._domains(node):
                self._drawn[domain] += adds
        if len(new) == len(old):
            return
        for kind in {e.kind for e in self._nodes[nid].engines}:
            buckets = self._buckets[kind]
            bucket = buckets[len(old)]
            bucket.remove(nid)
            if not bucket:
                del buckets[len(old)]
            insort(buckets.setdefault(len(new), []), nid)

    # -- explaining --------------------------------------------------------------

    def reasons(self, needs: Needs) -> list[str]:
        """``node: why not`` for every node the profile does not fit ("fits" left out)."""
        out = []
        for nid in sorted(self._nodes):
            got = self.fit(nid, needs)
            if isinstance(got, str):
                out.append(f"{nid}: {got}")
        return out

    def verdicts(self, needs: Needs) -> list[tuple[str, str]]:
        """(node, ``fits on GPUs 0,1`` or why not) for every node: ``llmgw explain``."""
        out = []
        for nid in sorted(self._nodes):
            got = self.fit(nid, needs)
            if isinstance(got, str):
                out.append((nid, got))
            else:
                gpus = ",".join(map(str, got)) or "none"
                out.append((nid, f"fits (GPUs {gpus})"))
        return out

    # -- preemption --------------------------------------------------------------

    def room(self, profiles: Sequence[Needs], victims: Iterable[ReplicaRecord]) -> Room | None:
        """Where a profile fits once engines already stopping are gone, or by evicting the fewest victims.

        Profiles in priority order; for each, first a node that needs no
        eviction (room is already coming), then the node that needs the
        fewest evictions (largest victims first), then node id.
        """
        if not self._built:
            self._build()
        by_node: dict[str, list[ReplicaRecord]] = defaultdict(list)
        for rec in victims:
            if rec.node in self._free:
                by_node[rec.node].append(rec)
        for needs in profiles:
            for nid in sorted(self._pending):
                if nid in self._free and not isinstance(self.fit(nid, needs, self._pending[nid]), str):
                    return Room(nid, needs, ())
            best: Room | None = None
            for nid in sorted(by_node):
                released = set(self._pending.get(nid, ()))
                mem, cpu = 0, 0.0
                chosen: list[ReplicaRecord] = []
                order = sorted(by_node[nid], key=lambda r: (-len(r.gpu_indices), -r.memory_bytes, r.id))
                for rec in order:
                    chosen.append(rec)
                    released.update(rec.gpu_indices)
                    mem += rec.memory_bytes
                    cpu += rec.cpu_cores
                    if not isinstance(self.fit(nid, needs, released, mem, cpu), str):
                        break
                else:
                    continue
                if best is None or len(chosen) < len(best.evict):
                    best = Room(nid, needs, tuple(chosen))
            if best is not None:
                return best
        return None


def _gpu(node: Node, index: int) -> Gpu | None:
    gpus = node.gpus
    # Indices are 0..n-1 in order on every agent; the scan is for anything else.
    g = gpus[index] if index < len(gpus) and gpus[index].index == index else None
    return g if g is not None else next((x for x in gpus if x.index == index), None)


def _gpu_power(node: Node, index: int) -> float:
    g = _gpu(node, index)
    return g.power_watts if g is not None else 0.0


def _gpu_memory(node: Node, index: int, released: bool) -> int:
    g = _gpu(node, index)
    if g is None:
        return 0
    # A GPU an evicted replica gives back frees all of its memory.
    return g.memory_total_bytes if released else g.memory_free_bytes


def _gib(n: int) -> str:
    return f"{n / GB:.3g} GiB"


def prefer_holders(
    fleet: Fleet,
    needs: Needs,
    spread: Mapping[str, int],
    avoid: str,
    weights_holders: Mapping[str, frozenset[str]],
    choice: Choice,
) -> Choice:
    """Tie-break on the weights: at the same spread, a node holding them wins (it skips a fetch).

    Kept apart from placement's own order on purpose: it never outweighs
    spreading, and without holders the choice is placement's unchanged.
    """
    source = needs.args.get("weights") or needs.args.get("model")
    holders = weights_holders.get(source, frozenset()) if source else frozenset()
    if not holders or choice.node in holders:
        return choice

    def load(nid: str) -> int:
        return spread.get(nid, 0) + (nid == avoid)

    for nid in sorted(holders, key=lambda n: (load(n), n)):
        if load(nid) > load(choice.node):
            break
        got = fleet.fit(nid, needs)
        if not isinstance(got, str):
            return fleet.choice_at(nid, got, needs)
    return choice
