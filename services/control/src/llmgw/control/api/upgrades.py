"""One node's agent handed over to another version, and the wait until it is back healthy.

:class:`AgentUpgrade` is what ``NodeAdminService.UpgradeAgent`` runs for one
node (``llmgw nodes upgrade`` calls it node by node and stops at the first
failure; the rollout's order and stop rule are the CLI's, so a rollout is
as resumable as re-running the command: a node already at the version
answers at once).

1. The node must be ready (its agent connected to this leader) and not at
   the version yet. The replicas it reports READY, with their engine PIDs,
   are noted.
2. ``UpgradeAgent`` goes to the agent over its stream; the agent checks the
   staged program (agent/upgrade.py) and answers before it hands over. A
   refusal is passed on unchanged (FAILED_PRECONDITION with its reason) and
   nothing changed on the node.
3. The node is then *back healthy* (:func:`not_back` says "") once it is
   ready again, its agent registered with the new version, and every noted
   replica is reported READY with the same engine PID: adopted, not
   restarted. Until then nothing is done to the node: the old agent's
   stream ending marks it unreachable, and its endpoints stay published for
   the node timeout (leader/publisher), so routers keep sending requests to
   the engines, which never stopped. Not back within the timeout:
   DEADLINE_EXCEEDED with what is missing, which stops the rollout.

The new agent is the same node to the control plane: it presents the same
node certificate and registers as the same node id, checked by
api/nodeguard.py like any registration, so a hand-over cannot change which
node a stream speaks for.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import grpc

from llmgw.common.errors import FailedPrecondition, InvalidArgument, LlmgwError, NotFound, excerpt
from llmgw.v1 import agent_pb2, nodeadmin_pb2

from ..state.inventory import Node

READY = agent_pb2.ReplicaState.REPLICA_STATE_READY
DEFAULT_TIMEOUT_SECONDS = 60.0
MAX_TIMEOUT_SECONDS = 600.0
# The agent runs `COMMAND --version` before it answers (its check_timeout_seconds, 20 s by default).
ANSWER_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.1


class NotBack(LlmgwError):
    """The new agent did not come back healthy in time."""

    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Nodes(Protocol):
    def nodes(self) -> list[Node]: ...


# Relays a message to a node's agent and returns its OK answer (raises its refusal): NodeAdminServicer's.
Ask = Callable[[str, Callable[[str], agent_pb2.ControlMessage]], Awaitable[agent_pb2.AgentReply]]


def not_back(node: Node | None, version: str, pids: Mapping[str, int]) -> str:
    """Why ``node`` is not back at ``version`` with the engines ``pids`` (replica -> PID); "" once it is."""
    if node is None:
        return "the node is no longer known to the leader"
    if not node.ready:
        return f"no agent has registered since the hand-over (node {node.status})"
    if node.version != version:
        return f"its agent registered as version {node.version or '(none)'!r}, not {version!r}"
    for rid, pid in sorted(pids.items()):
        rep = node.replicas.get(rid)
        if rep is None:
            return f"replica {rid} (engine pid {pid}) is not reported: the new agent did not adopt it"
        if rep.pid != pid:
            return f"replica {rid} runs engine pid {rep.pid}, not {pid}: its engine was restarted"
        if rep.state != READY:
            state = agent_pb2.ReplicaState.Name(rep.state).removeprefix("REPLICA_STATE_").lower()
            return f"replica {rid} is {state}, not ready"
    return ""


def check_request(request: nodeadmin_pb2.UpgradeAgentRequest) -> float:
    """The request's timeout in seconds, once the request is well formed."""
    if not request.version or len(request.version) > 64:
        raise InvalidArgument("version is required (1-64 characters): the version the new agent reports")
    if not request.command or not request.command[0].startswith("/"):
        raise InvalidArgument(
            "command is required, its first element the new agent's program as an absolute path on the node "
            "(such as /opt/llmgw/0.9.0/bin/llmgw-agent)"
        )
    timeout = request.timeout_seconds or DEFAULT_TIMEOUT_SECONDS
    if not 0 < timeout <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            f"timeout_seconds must be between 0 and {MAX_TIMEOUT_SECONDS:g}, not {timeout:g}"
        )
    return timeout


class AgentUpgrade:
    """Upgrade one node: see the module docstring. ``ask`` relays to the agent and raises its refusal."""

    def __init__(
        self,
        fleet: Nodes,
        ask: Ask,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._fleet = fleet
        self._ask = ask
        self._clock = clock

    def _node(self, node_id: str) -> Node | None:
        return next((n for n in self._fleet.nodes() if n.id == node_id), None)

    async def run(self, request: nodeadmin_pb2.UpgradeAgentRequest) -> nodeadmin_pb2.UpgradeAgentResponse:
        timeout = check_request(request)
        node_id, version = request.node_id, request.version
        node = self._node(node_id)
        if node is None:
            raise NotFound(f"node {excerpt(node_id)} is not known to the leader")
        previous = node.version
        if previous == version:
            return nodeadmin_pb2.UpgradeAgentResponse(
                node_id=node_id, previous_version=previous, version=version
            )
        if not node.ready:
            raise FailedPrecondition(
                f"node {node_id} is {node.status}: its agent must be connected to be upgraded"
            )
        pids = {r.id: r.pid for r in node.replicas.values() if r.state == READY}
        started = self._clock()
        await self._ask(
            node_id,
            lambda rid: agent_pb2.ControlMessage(
                upgrade_agent=agent_pb2.UpgradeAgent(
                    request_id=rid, version=version, command=list(request.command)
                )
            ),
        )
        deadline = started + timeout
        while why := not_back(self._node(node_id), version, pids):
            if self._clock() >= deadline:
                raise NotBack(
                    f"node {node_id}: the agent handed over to version {version}, which did not come back "
                    f"healthy within {timeout:g}s: {why}. The rollout stops here; its engines keep serving "
                    "(see docs/operations.md, Agent upgrades)"
                )
            await asyncio.sleep(POLL_SECONDS)
        return nodeadmin_pb2.UpgradeAgentResponse(
            node_id=node_id,
            previous_version=previous,
            version=version,
            adopted=sorted(pids),
            seconds=self._clock() - started,
        )
