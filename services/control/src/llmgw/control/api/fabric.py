"""FabricService: node-to-node bandwidth and latency, measured by the agents, kept per pair.

For each pair the leader makes a one-time token (32 random bytes), asks
node A to listen for it (FabricListen, answered with a port at once), then
node B to connect to A's advertised host on that port and measure
(FabricProbe, answered when done); both travel over the agents' mutually
authenticated streams (agents.AgentSessions.request). The agents' side,
its wire protocol and its bounds are in the agent's ``fabric.py``.

Decisions:

- Pairs run one after another, never at once: concurrent tests would
  share the links and each figure would be a fraction of the truth.
- A pair that fails (a node not connected, a refused or timed-out
  connection) is stored with its error and the others still run, so a
  whole-fleet test says which links are broken rather than stopping.
- Bounds: at most :data:`MAX_NODES` nodes per test (a full mesh of 2,016
  pairs), :data:`MAX_BYTES` and :data:`MAX_PINGS` per pair; each pair's
  probe ends at :data:`PROBE_TIMEOUT_SECONDS`, and its listener at that
  plus the listen's own answer time.
- Results are judged (:mod:`..decide.fabric`) when read, against the
  pairs stored now, so a warning reflects the latest figures of every pair.
- After a test the oldest results past the store's bound are deleted
  (:meth:`..store.fabric.FabricResults.prune`): pairs of nodes long gone
  make room for the ones measured now.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

import grpc

from llmgw.common.errors import (
    FailedPrecondition,
    InvalidArgument,
    LlmgwError,
    NotFound,
    Unavailable,
    abort_with,
)
from llmgw.v1 import agent_pb2, fabric_pb2, fabric_pb2_grpc

from ..decide.fabric import judge
from ..state.inventory import Node, NodeState
from ..store.fabric import FabricResults
from .nodes import LeaderReader

log = logging.getLogger("llmgw.control.api.fabric")

MAX_NODES = 64
DEFAULT_BYTES = 64 << 20
MAX_BYTES = 4 << 30
DEFAULT_PINGS = 20
MAX_PINGS = 1000
LISTEN_TIMEOUT_SECONDS = 10.0
PROBE_TIMEOUT_SECONDS = 120.0
TOKEN_BYTES = 32


class FabricNodes(Protocol):
    def nodes(self) -> list[Node]: ...


class NodeRequests(Protocol):
    async def request(
        self, node_id: str, build: Callable[[str], agent_pb2.ControlMessage]
    ) -> agent_pb2.AgentReply: ...


class FabricServicer(fabric_pb2_grpc.FabricServiceServicer):
    def __init__(
        self,
        fleet: FabricNodes,
        sessions: NodeRequests,
        leadership: LeaderReader,
        results: FabricResults,
        wall: Callable[[], float],
    ):
        self._fleet = fleet
        self._sessions = sessions
        self._leadership = leadership
        self._results = results
        self._wall = wall
        # One test at a time per control plane: two at once would share the links.
        self._one = asyncio.Lock()

    async def RunFabricTest(  # noqa: N802 - gRPC method name
        self, request: fabric_pb2.RunFabricTestRequest, context: grpc.aio.ServicerContext
    ) -> fabric_pb2.RunFabricTestResponse:
        try:
            size = request.bytes or DEFAULT_BYTES
            pings = request.pings or DEFAULT_PINGS
            if not 0 < size <= MAX_BYTES:
                raise InvalidArgument(f"bytes must be 1 to {MAX_BYTES} (4 GiB), not {request.bytes}")
            if not 0 < pings <= MAX_PINGS:
                raise InvalidArgument(f"pings must be 1 to {MAX_PINGS}, not {request.pings}")
            nodes = await self._chosen(request)
        except LlmgwError as err:
            await abort_with(context, err)
            raise
        if self._one.locked():
            await abort_with(context, Unavailable("a fabric test is running already; try again when it ends"))
        async with self._one:
            done = []
            for a, b in itertools.combinations(nodes, 2):
                result = await self._pair(a, b, size, pings)
                await self._results.put(result)
                done.append(result)
            await self._results.prune()
        stored = judge(await self._results.list())
        mine = {(r.node_a, r.node_b) for r in done}
        return fabric_pb2.RunFabricTestResponse(results=[r for r in stored if (r.node_a, r.node_b) in mine])

    async def ListFabricResults(  # noqa: N802 - gRPC method name
        self, request: fabric_pb2.ListFabricResultsRequest, context: grpc.aio.ServicerContext
    ) -> fabric_pb2.ListFabricResultsResponse:
        results = judge(await self._results.list())
        if request.node_id:
            results = [r for r in results if request.node_id in (r.node_a, r.node_b)]
        return fabric_pb2.ListFabricResultsResponse(results=results)

    async def _chosen(self, request: fabric_pb2.RunFabricTestRequest) -> list[Node]:
        if not self._leadership.is_leader:
            leader = await self._leadership.leader()
            where = f"the leader {leader.id} at {leader.address}" if leader else "the leader (none known yet)"
            raise Unavailable(f"only the leader reaches the agents; ask {where}")
        known = {n.id: n for n in self._fleet.nodes()}
        if request.nodes:
            names = list(dict.fromkeys(request.nodes))
            missing = [n for n in names if n not in known]
            if missing:
                raise NotFound(
                    f"node(s) {', '.join(missing)} not known to the leader "
                    f"(known: {', '.join(sorted(known)) or 'none'})"
                )
            if len(names) < 2:
                raise InvalidArgument("a fabric test needs two nodes (or none, for every connected node)")
            chosen = [known[n] for n in names]
        else:
            chosen = [n for _, n in sorted(known.items()) if n.state == NodeState.READY]
            if len(chosen) < 2:
                raise FailedPrecondition(f"{len(chosen)} node(s) are connected; a fabric test needs two")
        if len(chosen) > MAX_NODES:
            raise InvalidArgument(f"at most {MAX_NODES} nodes per fabric test, not {len(chosen)}; name fewer")
        return chosen

    async def _pair(self, a: Node, b: Node, size: int, pings: int) -> fabric_pb2.FabricResult:
        """Measure one pair: A listens, B probes. Never raises: a failure is the result's error."""
        result = fabric_pb2.FabricResult(node_a=a.id, node_b=b.id, bytes=size, pings=pings, method="tcp")
        token = secrets.token_bytes(TOKEN_BYTES)
        try:
            listening = await self._ask(
                a.id,
                lambda rid: agent_pb2.ControlMessage(
                    fabric_listen=agent_pb2.FabricListen(
                        request_id=rid,
                        token=token,
                        max_bytes=size,
                        max_pings=pings,
                        timeout_seconds=PROBE_TIMEOUT_SECONDS + LISTEN_TIMEOUT_SECONDS,
                    )
                ),
                LISTEN_TIMEOUT_SECONDS,
            )
            measured = await self._ask(
                b.id,
                lambda rid: agent_pb2.ControlMessage(
                    fabric_probe=agent_pb2.FabricProbe(
                        request_id=rid,
                        host=a.address,
                        port=listening.fabric.port,
                        token=token,
                        bytes=size,
                        pings=pings,
                        timeout_seconds=PROBE_TIMEOUT_SECONDS,
                    )
                ),
                PROBE_TIMEOUT_SECONDS + LISTEN_TIMEOUT_SECONDS,
            )
        except LlmgwError as err:
            result.error = str(err)
            log.warning("fabric test %s-%s failed: %s", a.id, b.id, err)
        else:
            m = measured.fabric
            result.bandwidth_bytes_per_second = m.bandwidth_bytes_per_second
            result.latency_seconds = m.latency_seconds
            result.method = m.method or "tcp"
            result.nccl = m.nccl
            log.info(
                "fabric test %s-%s: %.1f MB/s, %.3f ms",
                a.id,
                b.id,
                m.bandwidth_bytes_per_second / 1e6,
                m.latency_seconds * 1e3,
            )
        result.measured_at = self._wall()
        return result

    async def _ask(
        self, node_id: str, build: Callable[[str], agent_pb2.ControlMessage], seconds: float
    ) -> agent_pb2.AgentReply:
        try:
            async with asyncio.timeout(seconds):
                reply = await self._sessions.request(node_id, build)
        except TimeoutError:
            raise Unavailable(f"node {node_id} did not answer within {seconds:g}s") from None
        if reply.code != grpc.StatusCode.OK.value[0]:
            raise Unavailable(f"node {node_id}: {reply.error}")
        return reply
