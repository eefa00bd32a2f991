"""Inventory: the nodes the leader knows, as their agents report them.

Soft state only: rebuilt within a heartbeat from the agents after a restart
or a change of leader, never written to etcd. Each update replaces a
:class:`Node` with a new frozen value, so a snapshot taken by a reconcile
pass cannot change under it.

A node is ``ready`` while its agent's stream is open and it spoke within
``node_timeout`` seconds; otherwise ``unreachable`` from the moment that
stopped being true: at once when the stream ends (an agent killed, its
connection closed), or on the first :meth:`Inventory.expire` after
``node_timeout`` of silence (a hung agent, a network that drops packets
without closing anything). A node unreachable for ``node_lost`` seconds is
``lost``: the decision rebuilds its replicas elsewhere (reconcile rule 1
uses the same ``unreachable_since`` and threshold, so the state shown and the
decision agree). Any Register or message from the node makes it ``ready``
again; what it still runs without a record is then an orphan.

Nodes named by replica records but not yet heard from in this term are
*expected*: unreachable since the term began, not registered, so they are
neither placed on nor given up before they had a chance to
reconnect.

Operator overrides (:class:`NodeOverride`: a hold, extra labels) come from
etcd through :meth:`Inventory.set_overrides` and are folded into each
:class:`Node` as it is written, so a node's ``labels`` are what placement
matches (the agent's, then the operator's on top) and ``held`` says it takes
no new replicas. Domain holds (:class:`DomainHold`, :meth:`Inventory.set_domain_holds`)
hold every node whose merged labels match one, including a node that
registers later; ``draining`` says its replicas move out (a node hold
always drains, a domain hold when asked). A hold is orthogonal to reachability: a held node that
goes silent is unreachable (then lost) like any other; :attr:`Node.status`
is the one word shown to operators.

Every mutator returns whether anything a decision depends on changed, so
the caller wakes the reconcile loop only for real changes (a heartbeat that
repeats the last one is not a change).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

from llmgw.v1 import agent_pb2

RS = agent_pb2.ReplicaState
# A plain set: reading a protobuf enum wrapper's attribute is a slow __getattr__.
_ENDED = frozenset((RS.REPLICA_STATE_FAILED, RS.REPLICA_STATE_STOPPED))

log = logging.getLogger("llmgw.control.state.inventory")


class NodeState(StrEnum):
    READY = "ready"
    UNREACHABLE = "unreachable"
    LOST = "lost"


@dataclass(frozen=True)
class NodeOverride:
    """What an operator set on a node (stored in etcd, see nodeoverrides)."""

    held: bool = False
    hold_reason: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class DomainHold:
    """An operator's hold on every node whose label ``label`` is ``value`` (store.domainholds)."""

    label: str
    value: str
    reason: str = ""
    # Move the replicas out too; without it the domain only gets no new ones.
    drain: bool = False


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str = ""
    name: str = ""
    memory_total_bytes: int = 0
    memory_free_bytes: int = 0
    # What a power budget counts for it (0: not known).
    power_watts: float = 0.0

    @classmethod
    def from_proto(cls, g: agent_pb2.Gpu) -> Gpu:
        return cls(g.index, g.uuid, g.name, g.memory_total_bytes, g.memory_free_bytes, g.power_watts)

    def to_proto(self) -> agent_pb2.Gpu:
        return agent_pb2.Gpu(
            index=self.index,
            uuid=self.uuid,
            name=self.name,
            memory_total_bytes=self.memory_total_bytes,
            memory_free_bytes=self.memory_free_bytes,
            power_watts=self.power_watts,
        )


@dataclass(frozen=True)
class Engine:
    """One engine build a node has (agent EngineInfo); spec.builds matches profiles to them."""

    kind: str
    version: str = ""
    # "": the kind's main build on its node; else the name StartReplica.build gives.
    build: str = ""
    program: str = ""
    # The CUDA version it was built for ("": CPU or unknown).
    cuda: str = ""

    @classmethod
    def from_proto(cls, e: agent_pb2.EngineInfo) -> Engine:
        return cls(e.kind, e.version, e.build, e.program, e.cuda)

    def to_proto(self) -> agent_pb2.EngineInfo:
        return agent_pb2.EngineInfo(
            kind=self.kind, version=self.version, build=self.build, program=self.program, cuda=self.cuda
        )


@dataclass(frozen=True)
class ReportedReplica:
    """A replica as its agent last described it."""

    id: str
    model: str
    state: agent_pb2.ReplicaState
    url: str = ""
    message: str = ""
    gpu_indices: tuple[int, ...] = ()
    engine: str = ""
    served_name: str = ""
    pid: int = 0
    # LoRA adapters its engine has loaded now.
    adapters: tuple[str, ...] = ()

    @classmethod
    def from_proto(cls, s: agent_pb2.ReplicaStatus) -> ReportedReplica:
        return cls(
            id=s.replica_id,
            model=s.model,
            state=s.state,
            url=s.url,
            message=s.message,
            gpu_indices=tuple(s.gpu_indices),
            engine=s.engine,
            served_name=s.served_name,
            pid=s.pid,
            adapters=tuple(s.adapters),
        )

    @property
    def holds_gpus(self) -> bool:
        """Whether its engine process may still occupy its GPUs."""
        return self.state not in _ENDED


@dataclass(frozen=True)
class Node:
    id: str
    state: NodeState
    last_seen: float
    address: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    gpus: tuple[Gpu, ...] = ()
    engines: tuple[Engine, ...] = ()
    version: str = ""
    # When it stopped being ready; None while ready.
    unreachable_since: float | None = None
    # False for a node known only from replica records, not yet heard from this term.
    registered: bool = True
    replicas: Mapping[str, ReportedReplica] = field(default_factory=dict)
    # Host memory and CPU cores the agent reported (0: not reported).
    memory_bytes: int = 0
    cpu_cores: float = 0.0
    # An operator's hold (on the node, or on a domain it is in): no new replicas.
    held: bool = False
    hold_reason: str = ""
    # Held, but what it runs stays (only domain holds without drain cover it).
    keeps_replicas: bool = False
    # The labels its agent reported, before the operator's are laid on top.
    agent_labels: Mapping[str, str] = field(default_factory=dict)
    # The NVIDIA driver and the newest CUDA version it supports ("": not known).
    driver_version: str = ""
    cuda_version: str = ""

    @property
    def ready(self) -> bool:
        return self.state is NodeState.READY

    @property
    def placeable(self) -> bool:
        """Ready and not held: may receive new replicas."""
        return self.state is NodeState.READY and not self.held

    @property
    def draining(self) -> bool:
        """Its replicas move elsewhere: a node hold, or a domain hold with drain."""
        return self.held and not self.keeps_replicas

    @property
    def status(self) -> str:
        """The state shown to operators: ``held`` for a ready node under a hold."""
        return "held" if self.held and self.ready else self.state.value

    def offers(self, engine: str) -> bool:
        return any(e.kind == engine for e in self.engines)


_NO_OVERRIDE = NodeOverride()


def _replicas(statuses: Iterable[agent_pb2.ReplicaStatus]) -> Mapping[str, ReportedReplica]:
    return MappingProxyType({s.replica_id: ReportedReplica.from_proto(s) for s in statuses})


class Inventory:
    """The node table. Single event loop; callers must not hold a Node across a write."""

    def __init__(self, node_timeout: float, node_lost: float = math.inf):
        self._timeout = node_timeout
        self._lost = node_lost
        self._nodes: dict[str, Node] = {}
        self._overrides: Mapping[str, NodeOverride] = {}
        self._domain_holds: tuple[DomainHold, ...] = ()

    def set_domain_holds(self, holds: Iterable[DomainHold]) -> bool:
        """Put the operators' domain holds in force; True when a known node changed."""
        self._domain_holds = tuple(sorted(holds, key=lambda h: (h.label, h.value)))
        return self._remerge()

    def set_overrides(self, overrides: Mapping[str, NodeOverride]) -> bool:
        """Put the operator's holds and labels in force; True when a known node changed."""
        self._overrides = dict(overrides)
        return self._remerge()

    def _remerge(self) -> bool:
        changed = False
        for nid, node in list(self._nodes.items()):
            merged = self._merge(node)
            if merged != node:
                self._nodes[nid] = merged
                changed = True
        return changed

    def _merge(self, node: Node) -> Node:
        o = self._overrides.get(node.id, _NO_OVERRIDE)
        labels = {**node.agent_labels, **o.labels} if o.labels else node.agent_labels
        held, reason, draining = o.held, o.hold_reason, o.held
        for h in self._domain_holds:
            if labels.get(h.label) == h.value:
                draining = draining or h.drain
                if not held:
                    held, reason = True, f"domain {h.label}={h.value}" + (f": {h.reason}" if h.reason else "")
        return dataclasses.replace(
            node,
            labels=MappingProxyType(dict(labels)),
            held=held,
            hold_reason=reason,
            keeps_replicas=held and not draining,
        )

    def set_thresholds(self, node_timeout: float, node_lost: float = math.inf) -> None:
        """New timeouts (cluster settings changed); the next :meth:`expire` uses them."""
        self._timeout = node_timeout
        self._lost = node_lost

    def nodes(self) -> list[Node]:
        return sorted(self._nodes.values(), key=lambda n: n.id)

    def get(self, node_id: str) -> Node | None:
        return self._nodes.get(node_id)

    def clear(self) -> None:
        self._nodes.clear()

    def expect(self, node_ids: Iterable[str], now: float) -> None:
        """Add placeholders for nodes that replica records name, unless already known."""
        for nid in node_ids:
            if nid not in self._nodes:
                self._nodes[nid] = self._merge(
                    Node(
                        nid,
                        NodeState.UNREACHABLE,
                        last_seen=now,
                        unreachable_since=now,
                        registered=False,
                    )
                )

    def register(self, reg: agent_pb2.Register, now: float) -> bool:
        labels = MappingProxyType(dict(reg.labels))
        self._nodes[reg.node_id] = self._merge(
            Node(
                id=reg.node_id,
                state=NodeState.READY,
                last_seen=now,
                address=reg.address,
                labels=labels,
                gpus=tuple(sorted((Gpu.from_proto(g) for g in reg.gpus), key=lambda g: g.index)),
                engines=tuple(Engine.from_proto(e) for e in reg.engines),
                version=reg.version,
                replicas=_replicas(reg.replicas),
                memory_bytes=reg.memory_bytes,
                cpu_cores=float(reg.cpu_cores),
                agent_labels=labels,
                driver_version=reg.driver_version,
                cuda_version=reg.cuda_version,
            )
        )
        return True

    def heartbeat(self, node_id: str, hb: agent_pb2.Heartbeat, now: float) -> bool:
        node = self._nodes.get(node_id)
        if node is None or not node.registered:
            return False
        replicas = _replicas(hb.replicas)
        gpus = (
            tuple(sorted((Gpu.from_proto(g) for g in hb.gpus), key=lambda g: g.index))
            if hb.gpus
            else node.gpus
        )
        changed = (
            not node.ready
            or dict(replicas) != dict(node.replicas)
            or [g.index for g in gpus] != [g.index for g in node.gpus]
        )
        self._nodes[node_id] = dataclasses.replace(
            node,
            state=NodeState.READY,
            last_seen=now,
            unreachable_since=None,
            gpus=gpus,
            replicas=replicas,
        )
        return changed

    def report(self, node_id: str, status: agent_pb2.ReplicaStatus, now: float) -> bool:
        node = self._nodes.get(node_id)
        if node is None or not node.registered:
            return False
        rep = ReportedReplica.from_proto(status)
        changed = not node.ready or node.replicas.get(rep.id) != rep
        replicas = dict(node.replicas)
        replicas[rep.id] = rep
        self._nodes[node_id] = dataclasses.replace(
            node,
            state=NodeState.READY,
            last_seen=now,
            unreachable_since=None,
            replicas=MappingProxyType(replicas),
        )
        return changed

    def disconnect(self, node_id: str, now: float) -> bool:
        node = self._nodes.get(node_id)
        if node is None or not node.ready:
            return False
        self._nodes[node_id] = dataclasses.replace(node, state=NodeState.UNREACHABLE, unreachable_since=now)
        return True

    def expire(self, now: float) -> list[str]:
        """Mark ready nodes silent for longer than the timeout unreachable; returns their ids.

        Also marks nodes unreachable for ``node_lost`` seconds lost (not
        returned: the decision acts on ``unreachable_since`` itself).
        """
        gone = [n.id for n in self._nodes.values() if n.ready and now - n.last_seen > self._timeout]
        for nid in gone:
            self._nodes[nid] = dataclasses.replace(
                self._nodes[nid], state=NodeState.UNREACHABLE, unreachable_since=now
            )
        for n in list(self._nodes.values()):
            if (
                n.state is NodeState.UNREACHABLE
                and n.unreachable_since is not None
                and now - n.unreachable_since >= self._lost
            ):
                self._nodes[n.id] = dataclasses.replace(n, state=NodeState.LOST)
                log.warning("node %s unreachable for %.1fs; it is lost", n.id, now - n.unreachable_since)
        return gone
