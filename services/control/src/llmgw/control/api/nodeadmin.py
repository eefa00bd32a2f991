"""NodeAdminService: operator requests a node's agent answers, relayed by the leader.

UpgradeAgent is one of them, with a wait after the answer (api/upgrades.py).

A replica's engine log and a node's weights live on the node, so the
leader asks the agent over its AgentService stream (agents.AgentSessions
.request) and hands back the answer, or the agent's own refusal (its code
and message) unchanged. Only the leader holds the streams: a standby
answers FAILED_PRECONDITION naming the leader's address.

Errors, so a caller knows what to do:

- NOT_FOUND: the replica has no record and no node reports it (name the
  node with ``node_id`` for one that already failed and was replaced), or
  the node is unknown.
- UNAVAILABLE: the node is known but its agent is not connected, or did
  not answer within :data:`REQUEST_TIMEOUT_SECONDS`. Retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Protocol

import grpc

from llmgw.common.errors import FailedPrecondition, LlmgwError, NotFound, Unavailable, abort_with, excerpt
from llmgw.v1 import agent_pb2, nodeadmin_pb2, nodeadmin_pb2_grpc

from ..decide.reconcile import Replica
from ..state.inventory import Node
from ..state.weights import WeightsTable
from . import upgrades
from .upgrades import AgentUpgrade

log = logging.getLogger("llmgw.control.api.nodeadmin")

REQUEST_TIMEOUT_SECONDS = 10.0


class NodeView(Protocol):
    def nodes(self) -> list[Node]: ...
    def replicas(self) -> list[Replica]: ...
    @property
    def weights_table(self) -> WeightsTable: ...


class NodeRequests(Protocol):
    async def request(
        self, node_id: str, build: Callable[[str], agent_pb2.ControlMessage]
    ) -> agent_pb2.AgentReply: ...


class Leader(Protocol):
    @property
    def is_leader(self) -> bool: ...
    async def leader_address(self) -> str: ...


class NodeAdminServicer(nodeadmin_pb2_grpc.NodeAdminServiceServicer):
    def __init__(self, fleet: NodeView, sessions: NodeRequests, leadership: Leader):
        self._fleet = fleet
        self._sessions = sessions
        self._leadership = leadership

    async def GetReplicaLogs(  # noqa: N802 - gRPC method name
        self, request: nodeadmin_pb2.GetReplicaLogsRequest, context: grpc.aio.ServicerContext
    ) -> nodeadmin_pb2.ReplicaLogs:
        node_id = request.node_id
        if not node_id:
            try:
                await self._lead()
                node_id = self._node_of(request.replica_id)
            except LlmgwError as err:
                await abort_with(context, err)
        reply = await self._relay(
            context,
            node_id,
            lambda rid: agent_pb2.ControlMessage(
                get_logs=agent_pb2.GetLogs(request_id=rid, replica_id=request.replica_id, lines=request.lines)
            ),
        )
        return nodeadmin_pb2.ReplicaLogs(
            replica_id=request.replica_id, node_id=node_id, lines=list(reply.lines)
        )

    async def ListWeights(  # noqa: N802 - gRPC method name
        self, request: nodeadmin_pb2.ListWeightsRequest, context: grpc.aio.ServicerContext
    ) -> nodeadmin_pb2.ListWeightsResponse:
        try:
            await self._lead()
            if request.node_id:
                self._known(request.node_id)
        except LlmgwError as err:
            await abort_with(context, err)
        table = self._fleet.weights_table
        ids = [request.node_id] if request.node_id else sorted({n.id for n in self._fleet.nodes()})
        out = []
        for nid in ids:
            entries = table.of(nid)
            out.append(
                nodeadmin_pb2.NodeWeights(
                    node_id=nid, disk_bytes=sum(e.size_bytes for e in entries), weights=entries
                )
            )
        return nodeadmin_pb2.ListWeightsResponse(nodes=out)

    async def FetchWeights(  # noqa: N802 - gRPC method name
        self, request: nodeadmin_pb2.FetchWeightsRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.WeightsStatus:
        reply = await self._relay(
            context,
            request.node_id,
            lambda rid: agent_pb2.ControlMessage(
                fetch_weights=agent_pb2.FetchWeights(request_id=rid, name=request.name, source=request.source)
            ),
        )
        self._fleet.weights_table.update(request.node_id, reply.weights)
        log.info("weights %s on %s: %s", reply.weights.name, request.node_id, reply.weights.source)
        return reply.weights

    async def UpgradeAgent(  # noqa: N802 - gRPC method name
        self, request: nodeadmin_pb2.UpgradeAgentRequest, context: grpc.aio.ServicerContext
    ) -> nodeadmin_pb2.UpgradeAgentResponse:
        try:
            await self._lead()
            self._known(request.node_id)
            upgrade = AgentUpgrade(
                self._fleet, lambda node, build: self._ask(node, build, upgrades.ANSWER_TIMEOUT_SECONDS)
            )
            done = await upgrade.run(request)
        except LlmgwError as err:
            log.warning("upgrade of node %s to %s: %s", request.node_id, request.version, err)
            await abort_with(context, err)
        log.info(
            "node %s: agent %s -> %s in %.1fs, %d engine(s) adopted",
            done.node_id,
            done.previous_version,
            done.version,
            done.seconds,
            len(done.adopted),
        )
        return done

    async def RemoveWeights(  # noqa: N802 - gRPC method name
        self, request: nodeadmin_pb2.RemoveWeightsRequest, context: grpc.aio.ServicerContext
    ) -> agent_pb2.WeightsStatus:
        reply = await self._relay(
            context,
            request.node_id,
            lambda rid: agent_pb2.ControlMessage(
                remove_weights=agent_pb2.RemoveWeights(request_id=rid, name=request.name)
            ),
        )
        self._fleet.weights_table.forget(request.node_id, request.name)
        log.info("weights %s removed from %s", request.name, request.node_id)
        return reply.weights

    # -- helpers ---------------------------------------------------------------------

    async def _lead(self) -> None:
        if not self._leadership.is_leader:
            address = await self._leadership.leader_address()
            raise FailedPrecondition(
                "this control plane does not lead; only the leader reaches the agents: "
                f"ask {address or 'the leader (none is elected yet)'}"
            )

    def _node_of(self, replica_id: str) -> str:
        for r in self._fleet.replicas():
            if r.id == replica_id:
                return r.record.node
        for n in self._fleet.nodes():
            if replica_id in n.replicas:
                return n.id
        raise NotFound(
            f"replica {excerpt(replica_id)} is not recorded and no node reports it (see llmgw replicas); "
            "for one that failed and was replaced, name its node (--node)"
        )

    def _known(self, node_id: str) -> None:
        if not node_id or all(n.id != node_id for n in self._fleet.nodes()):
            known = ", ".join(sorted(n.id for n in self._fleet.nodes())) or "none"
            raise NotFound(f"node {excerpt(node_id)} is not known to the leader (known nodes: {known})")

    async def _relay(
        self,
        context: grpc.aio.ServicerContext,
        node_id: str,
        build: Callable[[str], agent_pb2.ControlMessage],
    ) -> agent_pb2.AgentReply:
        """Ask ``node_id``'s agent; the RPC ends with the matching status on any refusal."""
        try:
            await self._lead()
            self._known(node_id)
            return await self._ask(node_id, build)
        except LlmgwError as err:
            await abort_with(context, err)
            raise  # abort raises; this line only tells the type checker

    async def _ask(
        self,
        node_id: str,
        build: Callable[[str], agent_pb2.ControlMessage],
        seconds: float = REQUEST_TIMEOUT_SECONDS,
    ) -> agent_pb2.AgentReply:
        try:
            async with asyncio.timeout(seconds):
                reply = await self._sessions.request(node_id, build)
        except TimeoutError:
            raise Unavailable(f"node {node_id} did not answer within {seconds:g}s; try again") from None
        if reply.code != grpc.StatusCode.OK.value[0]:
            raise _AgentRefused(reply.code, f"node {node_id}: {reply.error}")
        return reply


class _AgentRefused(LlmgwError):
    """The agent's own status, passed through."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = next((c for c in grpc.StatusCode if c.value[0] == code), grpc.StatusCode.UNKNOWN)
