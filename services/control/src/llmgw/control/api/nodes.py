"""NodeService (holds, labels) and PlacementService (explanations): the operator's fleet API.

NodeService writes etcd through :class:`~llmgw.control.store.nodeoverrides.NodeOverrides` and
answers from any control plane; the change takes effect on the leader within
a watch round trip. PlacementService reads the leader's inventory, so a
standby refuses with FAILED_PRECONDITION and the leader's address rather
than an empty answer that would look like "fits nowhere".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Protocol

import grpc

from llmgw.common.errors import LlmgwError, NotFound, abort_with, excerpt
from llmgw.v1 import nodes_pb2, nodes_pb2_grpc

from ..decide.reconcile import Replica
from ..leader.leadership import LeaderInfo
from ..spec.catalog import Catalog
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


class NodeServicer(nodes_pb2_grpc.NodeServiceServicer):
    def __init__(self, overrides: NodeOverrides):
        self._overrides = overrides

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


class PlacementView(Protocol):
    @property
    def catalog(self) -> Catalog: ...
    def replicas(self) -> list[Replica]: ...
    @property
    def placement_messages(self) -> Mapping[str, str]: ...
    @property
    def placement_policy(self) -> str: ...
    def explain(self, model_name: str) -> list[tuple[int, str, list[tuple[str, str]]]]: ...


class LeaderReader(Protocol):
    @property
    def is_leader(self) -> bool: ...
    async def leader(self) -> LeaderInfo | None: ...


class PlacementServicer(nodes_pb2_grpc.PlacementServiceServicer):
    def __init__(self, fleet: PlacementView, leadership: LeaderReader):
        self._fleet = fleet
        self._leadership = leadership

    async def ExplainPlacement(  # noqa: N802 - gRPC method name
        self, request: nodes_pb2.ExplainPlacementRequest, context: grpc.aio.ServicerContext
    ) -> nodes_pb2.PlacementExplanation:
        if not self._leadership.is_leader:
            leader = await self._leadership.leader()
            where = f"the leader {leader.id} at {leader.address}" if leader else "the leader (none known yet)"
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"this control plane is a standby and knows no nodes; ask {where}",
            )
        model = self._fleet.catalog.resolve(request.model)
        if model is None:
            known = ", ".join(self._fleet.catalog.names) or "none"
            await abort_with(
                context, NotFound(f"model {excerpt(request.model)} is not in the catalog (known: {known})")
            )
        mine = [r for r in self._fleet.replicas() if r.record.model == model.name]
        return nodes_pb2.PlacementExplanation(
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
        )
