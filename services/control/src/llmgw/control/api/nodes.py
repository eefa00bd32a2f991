"""NodeService (holds, labels, domain holds) and PlacementService (explanations): the fleet API.

NodeService writes etcd through :class:`~llmgw.control.store.nodeoverrides.NodeOverrides`
and :class:`~llmgw.control.store.domainholds.DomainHolds` and answers from any
control plane; the change takes effect on the leader within a watch round
trip. PlacementService reads the leader's inventory, so a
standby refuses with FAILED_PRECONDITION and the leader's address rather
than an empty answer that would look like "fits nowhere".
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Protocol

import grpc

from llmgw.common.errors import LlmgwError, NotFound, abort_with, excerpt
from llmgw.v1 import nodes_pb2, nodes_pb2_grpc

from ..decide.reconcile import Replica
from ..leader.leadership import LeaderInfo
from ..spec.catalog import Catalog, Model
from ..state.inventory import Node
from ..store.domainholds import DomainHolds, HoldDocument
from ..store.nodeoverrides import NodeOverrides, OverrideDocument

log = logging.getLogger("llmgw.control.api.nodes")


def _override(node_id: str, doc: OverrideDocument) -> nodes_pb2.NodeOverride:
    return nodes_pb2.NodeOverride(
        node_id=node_id,
        held=doc.held,
        hold_reason=doc.hold_reason,
        held_since=doc.held_since,
        labels=dict(doc.labels),
    )


def _domain_hold(doc: HoldDocument, nodes: list[Node]) -> nodes_pb2.DomainHold:
    return nodes_pb2.DomainHold(
        label=doc.label,
        value=doc.value,
        reason=doc.reason,
        drain=doc.drain,
        held_since=doc.held_since,
        nodes=[n.id for n in nodes if n.labels.get(doc.label) == doc.value],
    )


class NodeServicer(nodes_pb2_grpc.NodeServiceServicer):
    def __init__(self, overrides: NodeOverrides, domains: DomainHolds, nodes: Callable[[], list[Node]]):
        self._overrides = overrides
        self._domains = domains
        # The nodes this control plane knows (none on a standby): which a domain hold covers.
        self._nodes = nodes

    async def HoldNode(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.HoldNodeRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.NodeOverride:
        try:
            doc = await self._overrides.hold(request.node_id, request.reason)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("node %s held: %s", request.node_id, request.reason or "no reason given")
        return _override(request.node_id, doc)

    async def ReleaseNode(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ReleaseNodeRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.NodeOverride:
        try:
            doc = await self._overrides.release(request.node_id)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("node %s released", request.node_id)
        return _override(request.node_id, doc)

    async def LabelNode(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.LabelNodeRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.NodeOverride:
        try:
            doc = await self._overrides.label(request.node_id, dict(request.set), list(request.remove))
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("node %s labels now %s", request.node_id, doc.labels)
        return _override(request.node_id, doc)

    async def ListNodeOverrides(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ListNodeOverridesRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.ListNodeOverridesResponse:
        docs, _ = await self._overrides.load()
        return nodes_pb2.ListNodeOverridesResponse(
            overrides=[_override(n, d) for n, d in sorted(docs.items())]
        )

    async def HoldDomain(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.HoldDomainRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.DomainHold:
        try:
            doc = await self._domains.hold(request.label, request.value, request.reason, request.drain)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info(
            "domain %s=%s held%s: %s",
            request.label,
            request.value,
            " and draining" if request.drain else "",
            request.reason or "no reason given",
        )
        return _domain_hold(doc, self._nodes())

    async def ReleaseDomain(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ReleaseDomainRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.DomainHold:
        try:
            doc = await self._domains.release(request.label, request.value)
        except LlmgwError as err:
            await abort_with(context, err)
        log.info("domain %s=%s released", request.label, request.value)
        return _domain_hold(doc, self._nodes())

    async def ListDomainHolds(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ListDomainHoldsRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.ListDomainHoldsResponse:
        docs, _ = await self._domains.load()
        nodes = self._nodes()
        docs.sort(key=lambda d: (d.label, d.value))
        return nodes_pb2.ListDomainHoldsResponse(holds=[_domain_hold(d, nodes) for d in docs])


class PlacementView(Protocol):
    @property
    def catalog(self) -> Catalog: ...
    def replicas(self) -> list[Replica]: ...
    @property
    def placement_messages(self) -> Mapping[str, str]: ...
    @property
    def placement_policy(self) -> str: ...
    def explain(self, model_name: str) -> list[tuple[int, str, list[tuple[str, str]]]]: ...
    def quota_lines(self, model_name: str) -> list[str]: ...
    @property
    def federation_clashes(self) -> list[str]: ...
    def lifecycle(self, model_name: str) -> tuple[str, str]: ...


class LeaderReader(Protocol):
    @property
    def is_leader(self) -> bool: ...
    async def leader(self) -> LeaderInfo | None: ...


async def abort_unless_leading(
    leadership: LeaderReader, context: grpc.aio.ServicerContext, leading: bool = True
) -> None:
    """FAILED_PRECONDITION naming the leader, unless this control plane leads (and ``leading``)."""
    if leadership.is_leader and leading:
        return
    leader = await leadership.leader()
    where = f"the leader {leader.id} at {leader.address}" if leader else "the leader (none known yet)"
    await context.abort(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"this control plane is a standby and knows no nodes; ask {where}",
    )


class PlacementServicer(nodes_pb2_grpc.PlacementServiceServicer):
    def __init__(self, fleet: PlacementView, leadership: LeaderReader):
        self._fleet = fleet
        self._leadership = leadership

    async def ExplainPlacement(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ExplainPlacementRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.PlacementExplanation:
        await abort_unless_leading(self._leadership, context)
        model = self._fleet.catalog.resolve(request.model)
        if model is None:
            known = ", ".join(self._fleet.catalog.names) or "none"
            await abort_with(
                context, NotFound(f"model {excerpt(request.model)} is not in the catalog (known: {known})")
            )
        mine = [r for r in self._fleet.replicas() if r.record.model == model.name]
        rollout, gate = self._fleet.lifecycle(model.name)
        return nodes_pb2.PlacementExplanation(
            rollout=rollout,
            eval_gate=gate,
            model=model.name,
            capacity_class=model.capacity_class,
            wanted=model.min_replicas,
            replicas=len(mine),
            ready_replicas=sum(r.ready for r in mine),
            placement_message=self._fleet.placement_messages.get(model.name, ""),
            policy=self._fleet.placement_policy,
            profiles=[
                nodes_pb2.ProfileVerdicts(
                    profile=index + 1,
                    description=description,
                    nodes=[
                        nodes_pb2.NodeVerdict(node_id=n, fits=v.startswith("fits"), reason=v)
                        for n, v in verdicts
                    ],
                )
                for index, description, verdicts in self._fleet.explain(model.name)
            ],
            owner=model.owner,
            quotas=self._fleet.quota_lines(model.name),
            federation=_federation_note(model, self._fleet.federation_clashes),
        )


def _federation_note(model: Model, clashes: list[str]) -> str:
    if model.peer is not None:
        return (
            f"served by peer cluster {model.peer.peer}: nothing is placed here, and it is offered "
            "while the peer answers its checks (llmgw peers)"
        )
    mine = [c for c in clashes if c in model.names]
    if mine:
        return (
            f"a peer's model named {', '.join(mine)} is not offered: this cluster's model has the name and "
            "wins (llmgw peers shows the clash)"
        )
    return ""
