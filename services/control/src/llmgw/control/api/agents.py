"""AgentService.Connect: one long-lived stream per node's agent.

Protocol (proto/llmgw/v1/agent.proto): the agent speaks first with
Register. A control plane that does not lead (or is still loading its
term) answers Redirect with the leader's address from etcd -- empty when none
is known -- and ends the stream; the agent dials there. A leader killed
outright keeps its key in etcd until its lease runs out, so the address is
first checked (a TCP connect within :data:`LEADER_CHECK_TIMEOUT_SECONDS`,
its answer reused for :data:`LEADER_CHECK_TTL_SECONDS`): a standby that
cannot reach the named leader answers "no leader known" rather than send
agents to a dead one, and the agent asks again shortly (issue 15). The leader records
the node and what it already runs (the controller adopts what matches its
records), answers Registered, then reads Heartbeat and ReplicaStatus while a
per-session outbox carries commands the other way.

Guarantees:

- One session per node: a second Register for the same node replaces (and
  closes) the first, so a reconnecting agent never has two streams fed
  commands. Only the current session's end marks the node unreachable.
- The reader of the incoming half is a task owned by the handler: cancelled
  and awaited when the stream ends, whichever half ended it.
- A session whose outbox backs up (an agent that stopped reading) is closed
  rather than allowed to grow without bound; the agent reconnects.
- When leadership ends, the controller closes every session: agents
  reconnect, are redirected, and reach the new leader.
- Operator requests to a node (:meth:`AgentSessions.request`: a log tail,
  weights) are matched to their AgentReply by request id; a request whose
  session closes, or whose agent does not answer in time, fails with
  Unavailable at once, never hangs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from llmgw.common.errors import Unavailable
from llmgw.common.tasks import cancel_and_wait
from llmgw.v1 import agent_pb2, agent_pb2_grpc

from ..leader.leadership import NotLeader

log = logging.getLogger("llmgw.control.api.agents")

LEADER_CHECK_TIMEOUT_SECONDS = 0.5
LEADER_CHECK_TTL_SECONDS = 0.5


class LeaderCheck:
    """Whether the leader's address accepts connections, asked at most every TTL per address."""

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._seen: dict[str, tuple[float, bool]] = {}

    async def reachable(self, address: str) -> bool:
        now = self._clock()
        cached = self._seen.get(address)
        if cached is not None and now - cached[0] < LEADER_CHECK_TTL_SECONDS:
            return cached[1]
        ok = await _connects(address)
        self._seen = {a: v for a, v in self._seen.items() if now - v[0] < LEADER_CHECK_TTL_SECONDS}
        self._seen[address] = (now, ok)
        return ok


async def _connects(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(LEADER_CHECK_TIMEOUT_SECONDS):
            _, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    except (OSError, ValueError, TimeoutError):
        return False
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return True


class AgentSession:
    def __init__(self, node_id: str, limit: int):
        self.node_id = node_id
        self._limit = limit
        self._outbox: asyncio.Queue[agent_pb2.ControlMessage | None] = asyncio.Queue()
        self._closed = False
        self.close_reason = ""
        self._pending: dict[str, asyncio.Future[agent_pb2.AgentReply]] = {}

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, message: agent_pb2.ControlMessage) -> bool:
        if self._closed:
            return False
        if self._outbox.qsize() >= self._limit:
            self.close(f"{self._limit} commands unread")
            return False
        self._outbox.put_nowait(message)
        return True

    def close(self, reason: str) -> None:
        if not self._closed:
            self._closed = True
            self.close_reason = reason
            self._outbox.put_nowait(None)
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(
                        Unavailable(f"the stream of node {self.node_id} closed ({reason}); try again")
                    )

    async def request(self, build: Callable[[str], agent_pb2.ControlMessage]) -> agent_pb2.AgentReply:
        """Send the message ``build(request_id)`` makes and wait for its AgentReply.

        Unbounded: the caller bounds it (``asyncio.timeout``).
        """
        request_id = uuid.uuid4().hex
        fut: asyncio.Future[agent_pb2.AgentReply] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = fut
        try:
            if not self.send(build(request_id)):
                raise Unavailable(f"node {self.node_id} is not connected ({self.close_reason}); try again")
            return await fut
        finally:
            self._pending.pop(request_id, None)

    def answered(self, reply: agent_pb2.AgentReply) -> None:
        fut = self._pending.get(reply.request_id)
        if fut is not None and not fut.done():
            fut.set_result(reply)

    async def next(self) -> agent_pb2.ControlMessage | None:
        """The next command, or None once the session is closed."""
        if self._closed and self._outbox.empty():
            return None
        return await self._outbox.get()


class Gauge(Protocol):
    def set(self, value: float) -> None: ...


class AgentSessions:
    """The open agent streams by node id; the controller's AgentStreams (applier.CommandSink)."""

    def __init__(self, gauge: Gauge, outbox_limit: int = 1000):
        self._sessions: dict[str, AgentSession] = {}
        self._gauge = gauge
        self._limit = outbox_limit

    def open(self, node_id: str) -> AgentSession:
        old = self._sessions.get(node_id)
        if old is not None:
            old.close("replaced by a newer connection from the same node")
        session = AgentSession(node_id, self._limit)
        self._sessions[node_id] = session
        self._gauge.set(len(self._sessions))
        return session

    def release(self, session: AgentSession) -> bool:
        """Forget a session that ended; True when it was the node's current one."""
        session.close(session.close_reason or "stream ended")
        if self._sessions.get(session.node_id) is session:
            del self._sessions[session.node_id]
            self._gauge.set(len(self._sessions))
            return True
        return False

    def connected(self, node_id: str) -> bool:
        s = self._sessions.get(node_id)
        return s is not None and not s.closed

    def send(self, node_id: str, message: agent_pb2.ControlMessage) -> bool:
        s = self._sessions.get(node_id)
        return s is not None and s.send(message)

    def close_all(self, reason: str) -> None:
        for s in list(self._sessions.values()):
            s.close(reason)

    async def request(
        self, node_id: str, build: Callable[[str], agent_pb2.ControlMessage]
    ) -> agent_pb2.AgentReply:
        """Ask a node's agent something; Unavailable when it is not connected or does not answer."""
        s = self._sessions.get(node_id)
        if s is None or s.closed:
            raise Unavailable(f"node {node_id} is not connected to the leader; try again once it is")
        return await s.request(build)


class FleetEvents(Protocol):
    """What the servicer reports to (controller.Controller)."""

    async def wait_ready(self) -> bool: ...
    def register(self, reg: agent_pb2.Register) -> None: ...
    def heartbeat(self, node_id: str, hb: agent_pb2.Heartbeat) -> None: ...
    def report(self, node_id: str, status: agent_pb2.ReplicaStatus) -> None: ...
    def weights(self, node_id: str, status: agent_pb2.WeightsStatus) -> None: ...
    def disconnect(self, node_id: str) -> None: ...


class LeaderDirectory(Protocol):
    @property
    def is_leader(self) -> bool: ...
    async def leader_address(self) -> str: ...


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    def __init__(
        self,
        control_id: str,
        leadership: LeaderDirectory,
        fleet: FleetEvents,
        sessions: AgentSessions,
        heartbeat_interval_seconds: float,
        leader_check: LeaderCheck | None = None,
    ):
        self._id = control_id
        self._leader_check = leader_check or LeaderCheck()
        self._leadership = leadership
        self._fleet = fleet
        self._sessions = sessions
        # Live: the cluster settings may change it; agents get it when they (re)register.
        self.heartbeat_interval_seconds = heartbeat_interval_seconds

    async def Connect(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[agent_pb2.AgentMessage],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[agent_pb2.ControlMessage]:
        try:
            first = await anext(aiter(request_iterator))
        except StopAsyncIteration:
            return
        if first.WhichOneof("msg") != "register":
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                "the first message on AgentService.Connect must be Register",
            )
        reg = first.register
        if not reg.node_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "Register.node_id is empty")
        if not (self._leadership.is_leader and await self._fleet.wait_ready()):
            address = await self._leadership.leader_address()
            if address and not await self._leader_check.reachable(address):
                log.info("the leader at %r does not accept connections; no leader known", address)
                address = ""
            log.info("redirecting node %s to the leader at %r", reg.node_id, address)
            yield agent_pb2.ControlMessage(redirect=agent_pb2.Redirect(leader_address=address))
            return
        # No await between here and register(): the term cannot end in between.
        session = self._sessions.open(reg.node_id)
        self._fleet.register(reg)
        reader = asyncio.create_task(self._read(request_iterator, session), name="agent-reader")
        try:
            yield agent_pb2.ControlMessage(
                registered=agent_pb2.Registered(
                    control_id=self._id, heartbeat_interval_seconds=self.heartbeat_interval_seconds
                )
            )
            while (command := await session.next()) is not None:
                yield command
            log.info("closing the stream of node %s: %s", reg.node_id, session.close_reason)
        finally:
            try:
                await cancel_and_wait(reader)
            finally:
                if self._sessions.release(session):
                    self._fleet.disconnect(reg.node_id)

    async def _read(
        self, request_iterator: AsyncIterator[agent_pb2.AgentMessage], session: AgentSession
    ) -> None:
        node = session.node_id
        reason = "the agent closed its stream"
        try:
            async for msg in request_iterator:
                kind = msg.WhichOneof("msg")
                if kind == "heartbeat":
                    self._fleet.heartbeat(node, msg.heartbeat)
                elif kind == "status":
                    self._fleet.report(node, msg.status)
                elif kind == "reply":
                    session.answered(msg.reply)
                elif kind == "weights":
                    self._fleet.weights(node, msg.weights)
                elif kind == "register":
                    if msg.register.node_id != node:
                        reason = "a second Register named another node"
                        break
                    self._fleet.register(msg.register)
        except NotLeader:
            reason = "this control plane no longer leads"
        except grpc.aio.AioRpcError as err:
            reason = f"stream failed: {err.code().name}"
        except Exception:
            log.exception("handling a message from node %s failed", node)
            reason = "a message could not be handled"
        finally:
            session.close(reason)
