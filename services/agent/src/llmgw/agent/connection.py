"""The agent's one stream to the control plane (``AgentService.Connect``).

:class:`ControlLink` dials the configured control planes in turn, speaks
first with Register (node, GPUs, engines, and every replica it already runs,
so a control plane adopts them rather than starting them again), and on
Registered sends a Heartbeat at once and then every interval (the
control plane's if it names one, else the agent's). A Redirect names the
leader, which is dialled next, at once. Any failure (refused, dropped, no
answer to Register within :data:`REGISTER_TIMEOUT_SECONDS`), an empty
Redirect (no leader known yet) or a redirect to an address that just failed
ends the attempt, and the next configured control plane is dialled at once:
the agent waits only after it has tried every control plane it knows. How
long it then waits depends on what it heard: when some control plane
answered (alive, only no leader yet: an election is under way) it asks again
after :data:`LEADER_POLL`'s maximum, so it reaches a new leader within about
that of its election; when none answered, after an exponential, jittered
backoff capped at :data:`BACKOFF`'s maximum (both waits by
``llmgw.common.backoff``'s policy). The loop never ends on its own; its
owner cancels it.

Why (issue 15): a change of leader used to cost seconds of "no ready
replica" because agents, redirected to the dead leader and backing off
longer after each refusal, reached the new one 5-8 s after its election,
after it had given their endpoints up. Polling at a short interval
(0.25-0.5 s) only while a live control plane says "no leader" bounds that delay without
letting a dead cluster be hammered.

Guarantees:

- Engines keep running while no stream is up: a control plane outage stops
  nothing that serves. Status changes made meanwhile are not queued for
  later; the next Register carries the whole snapshot instead.
- Every command is handed to the :class:`Replicas` seam, which answers each
  one with a ReplicaStatus (the contract's idempotent commands), and status
  changes go out in the order they happen, through :class:`Outbox`.
- Operator requests (GetLogs, FetchWeights, RemoveWeights, UpgradeAgent) go to the
  :class:`Requests` seam, each in a task owned by the session, and each
  gets exactly one AgentReply; a reply for a stream that ended is dropped
  (the control plane answers its caller UNAVAILABLE).
- A dead peer is noticed by gRPC keepalive pings, not only by TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from llmgw.common.backoff import BackoffPolicy, Retries
from llmgw.common.tls import PLAINTEXT, TlsSettings, aio_channel
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1 import agent_pb2_grpc

from . import messages
from .adapters import AdapterRef
from .gpus import GpuSource
from .messages import NodeInfo
from .replicas import ReplicaSpec, ReplicaStatus
from .weights import WeightsEntry

log = logging.getLogger("llmgw.agent.connection")

REGISTER_TIMEOUT_SECONDS = 10.0
# Reconnect waits (llmgw.common.backoff's policy): 0.2 s, then up to 0.4, 0.8 ... 5 s.
BACKOFF = BackoffPolicy(initial=0.2, maximum=5.0)
# While a live control plane knows no leader (an election is under way): ask
# again after 0.25 s, then up to 0.5 s.
LEADER_POLL = BackoffPolicy(initial=0.25, maximum=0.5)
# A registered stream that lasted this long ends a round: the next one starts at once.
STABLE_SESSION_SECONDS = 1.0
# A redirect is followed at once, but two control planes pointing at each
# other must not make a busy loop: after this many hops in a row, back off.
MAX_REDIRECT_HOPS = 3

CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class Replicas(Protocol):
    """What the link needs of the supervisor."""

    def snapshot(self) -> list[ReplicaStatus]: ...

    def start(self, spec: ReplicaSpec) -> None: ...
    def set_adapters(self, replica_id: str, adapters: tuple[AdapterRef, ...]) -> None: ...

    def stop(self, replica_id: str, grace: float | None = None, reason: str = "") -> None: ...


class Requests(Protocol):
    """What the link needs to answer operator requests (requests.NodeRequests)."""

    def weights_snapshot(self) -> list[pb.WeightsStatus]: ...

    async def answer(self, msg: pb.ControlMessage) -> pb.AgentMessage: ...


REQUEST_KINDS = frozenset(
    {"get_logs", "fetch_weights", "remove_weights", "upgrade_agent", "fabric_listen", "fabric_probe"}
)


class ControlProtocolError(Exception):
    """The control plane answered something the contract does not allow."""


@dataclass(frozen=True)
class Redirected:
    leader: str  # host:port, or "" when the control plane knows no leader yet


class Outbox:
    """Where status changes go: the live stream's send queue, or nowhere.

    The supervisor is its listener. It is attached when a control plane
    accepts the agent and detached when that stream ends; changes while
    detached are dropped on purpose (the next Register is a full snapshot).
    """

    def __init__(self) -> None:
        # None in the queue means: half-close the stream once what precedes it is sent.
        self._queue: asyncio.Queue[pb.AgentMessage | None] | None = None

    def replica_changed(self, status: ReplicaStatus) -> None:
        if self._queue is not None:
            self._queue.put_nowait(messages.status(status))

    def weights_changed(self, entry: WeightsEntry) -> None:
        if self._queue is not None:
            self._queue.put_nowait(messages.weights(entry))

    def reply(self, message: pb.AgentMessage) -> None:
        if self._queue is not None:
            self._queue.put_nowait(message)

    def attach(self) -> asyncio.Queue[pb.AgentMessage | None]:
        self._queue = asyncio.Queue()
        return self._queue

    def detach(self) -> None:
        self._queue = None

    def end(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)


ConnectCall = grpc.aio.StreamStreamCall[pb.AgentMessage, pb.ControlMessage]


class ControlLink:
    def __init__(
        self,
        *,
        addresses: Sequence[str],
        node: NodeInfo,
        gpus: GpuSource,
        replicas: Replicas,
        outbox: Outbox,
        heartbeat_interval: float,
        requests: Requests | None = None,
        backoff: Retries | None = None,
        tls: TlsSettings = PLAINTEXT,
    ):
        if not addresses:
            raise ValueError("at least one control plane address is needed")
        self._addresses = list(addresses)
        self._node = node
        self._gpus = gpus
        self._replicas = replicas
        self._outbox = outbox
        self._requests = requests
        self._heartbeat_interval = heartbeat_interval
        self._backoff = backoff or Retries(BACKOFF)
        self._closing = asyncio.Event()
        self._polls = Retries(LEADER_POLL)
        # What the current attempt got to: an answer to Register, a Registered.
        self._answered = False
        self._registered = False
        # A new channel per session, so a rotated certificate is used at the next reconnect.
        self._tls = tls

    def close(self) -> None:
        """End the loop: send what is queued, half-close the stream, and return from run.

        The control plane ends the stream on the half-close; an owner that
        cannot wait cancels :meth:`run` instead.
        """
        self._closing.set()
        self._outbox.end()

    async def run(self) -> None:
        configured = itertools.cycle(self._addresses)
        leader = ""
        hops = 0
        tried = 0  # configured addresses dialled since the last wait or registration
        failed = ""  # the address whose attempt failed last, since the last registration
        heard = False  # some control plane answered since the last wait
        while not self._closing.is_set():
            address = leader or next(configured)
            if not leader:
                tried += 1
            leader = ""
            self._answered = self._registered = False
            outcome: Redirected | None = None
            began = asyncio.get_running_loop().time()
            try:
                outcome = await self._session(address)
            except* (grpc.aio.AioRpcError, TimeoutError, ControlProtocolError) as group:
                log.warning("control plane %s: %s", address, _describe(group))
                failed = address
            except* Exception as group:  # the loop outlives any one failure
                log.error("control plane %s: unexpected failure", address, exc_info=group)
                failed = address
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                # A cancel that a library turned into an error is still our owner's.
                raise asyncio.CancelledError
            heard = heard or self._answered
            if self._registered:
                failed = ""
                if asyncio.get_running_loop().time() - began > STABLE_SESSION_SECONDS:
                    # A stream that served a while ended: start a fresh round at
                    # once. One that ended at once counts as a try, so a control
                    # plane that keeps accepting and closing is not a busy loop.
                    tried = 0
            if isinstance(outcome, Redirected):
                log.info("control plane %s redirects to leader %r", address, outcome.leader)
                # A redirect to the address that just failed names a dead
                # leader (its lease has not run out yet): no leader is known.
                if outcome.leader and outcome.leader != failed and hops < MAX_REDIRECT_HOPS:
                    leader, hops = outcome.leader, hops + 1
                    continue
            hops = 0
            if tried < len(self._addresses):
                continue  # try every control plane before waiting
            tried = 0
            if heard:
                self._backoff.reset()
                delay = self._polls.next()
            else:
                delay = self._backoff.next()
            heard = False
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._closing.wait()  # a close cuts the wait short

    async def _session(self, address: str) -> Redirected | None:
        """One stream to one control plane: a Redirect, or None once the stream ends."""
        async with aio_channel(address, self._tls, CHANNEL_OPTIONS) as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            register = messages.register(
                self._node, self._gpus.gpus(), self._replicas.snapshot(), self._weights()
            )
            with contextlib.suppress(asyncio.InvalidStateError):
                await call.write(register)  # a call that already failed: read() raises why
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
            # cancellation that races with the read finishing.
            async with asyncio.timeout(REGISTER_TIMEOUT_SECONDS):
                first = await call.read()
            if first is grpc.aio.EOF:
                raise ControlProtocolError("closed the stream without answering Register")
            self._answered = True
            kind = first.WhichOneof("msg")
            if kind == "redirect":
                return Redirected(first.redirect.leader_address)
            if kind != "registered":
                raise ControlProtocolError(f"answered Register with {kind!r}, not Registered")

            interval = first.registered.heartbeat_interval_seconds or self._heartbeat_interval
            log.info(
                "registered with control plane %s (control_id=%r, heartbeat every %gs)",
                address,
                first.registered.control_id,
                interval,
            )
            self._backoff.reset()
            self._polls.reset()
            self._registered = True
            queue = self._outbox.attach()
            if self._closing.is_set():
                self._outbox.end()
            try:
                async with asyncio.TaskGroup() as tg:
                    sender = tg.create_task(self._send(call, queue))
                    beat = tg.create_task(self._beat(queue, interval))
                    try:
                        return await self._receive(call, tg)
                    finally:
                        sender.cancel()
                        beat.cancel()
            finally:
                self._outbox.detach()

    async def _send(self, call: ConnectCall, queue: asyncio.Queue) -> None:
        # The only writer of the call after Register: gRPC writes must not overlap.
        try:
            while (msg := await queue.get()) is not None:
                await call.write(msg)
            await call.done_writing()
        except asyncio.InvalidStateError:
            return  # the RPC is over; the reader reports why

    async def _beat(self, queue: asyncio.Queue, interval: float) -> None:
        while True:
            queue.put_nowait(
                messages.heartbeat(self._replicas.snapshot(), self._gpus.gpus(), self._weights())
            )
            await asyncio.sleep(interval)

    def _weights(self) -> list[pb.WeightsStatus]:
        return self._requests.weights_snapshot() if self._requests is not None else []

    async def _answer(self, msg: pb.ControlMessage) -> None:
        assert self._requests is not None
        try:
            self._outbox.reply(await self._requests.answer(msg))
        except Exception:  # one request fails, never the stream
            log.exception("answering %s failed", msg.WhichOneof("msg"))

    async def _receive(self, call: ConnectCall, tg: asyncio.TaskGroup) -> Redirected | None:
        while True:
            msg = await call.read()
            if not isinstance(msg, pb.ControlMessage):  # grpc.aio.EOF
                if not self._closing.is_set():
                    log.warning("control plane closed the stream")
                return None
            kind = msg.WhichOneof("msg")
            if kind == "start":
                if not msg.start.replica_id:
                    log.warning("ignoring StartReplica without a replica_id")
                    continue
                self._replicas.start(messages.spec_from_start(msg.start))
            elif kind == "set_adapters":
                self._replicas.set_adapters(
                    msg.set_adapters.replica_id, messages.adapters_from(msg.set_adapters.adapters)
                )
            elif kind == "stop":
                grace = msg.stop.grace_seconds if msg.stop.grace_seconds > 0 else None
                self._replicas.stop(msg.stop.replica_id, grace, msg.stop.reason)
            elif kind in REQUEST_KINDS and self._requests is not None:
                tg.create_task(self._answer(msg), name=f"request-{kind}")
            elif kind == "redirect":
                # Leadership moved while we were connected: go to the new leader.
                return Redirected(msg.redirect.leader_address)
            elif kind == "registered":
                log.debug("ignoring a repeated Registered")
            else:
                log.warning("ignoring a control message this agent does not know: %r", kind)


def _describe(group: BaseExceptionGroup) -> str:
    parts = []
    for err in group.exceptions:
        if isinstance(err, BaseExceptionGroup):
            parts.append(_describe(err))
        elif isinstance(err, grpc.aio.AioRpcError):
            parts.append(f"{err.code().name}: {err.details()}")
        elif isinstance(err, TimeoutError):
            parts.append(f"no answer to Register within {REGISTER_TIMEOUT_SECONDS:g}s")
        else:
            parts.append(str(err))
    return "; ".join(parts)
