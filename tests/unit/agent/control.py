"""A scripted control plane for the agent's tests: a real gRPC server on port 0.

It implements ``llmgw.v1.AgentService`` (the declared seam between agent and
control plane) and does only what a test tells it: answer Register with
Registered or with a Redirect, send commands down the live stream, and
record everything the agent sends so a test can wait for it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import grpc

from llmgw.common.grpcserver import GrpcServer
from llmgw.v1 import agent_pb2 as pb
from llmgw.v1 import agent_pb2_grpc

_DROP = object()


class ScriptedControl(agent_pb2_grpc.AgentServiceServicer):
    def __init__(self, name: str, heartbeat_interval: float = 0.2, redirect: str | None = None):
        self.name = name
        self.heartbeat_interval = heartbeat_interval
        # When set, Register is answered with Redirect(leader_address=redirect).
        self.redirect = redirect
        self.received: list[pb.AgentMessage] = []
        self._streams: list[asyncio.Queue] = []
        self._server: GrpcServer | None = None
        self.address = ""

    # -- the servicer -------------------------------------------------------

    async def Connect(self, request_iterator, context: grpc.aio.ServicerContext):  # noqa: N802
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        self.received.append(first)
        if self.redirect is not None:
            await context.write(pb.ControlMessage(redirect=pb.Redirect(leader_address=self.redirect)))
            return
        await context.write(
            pb.ControlMessage(
                registered=pb.Registered(
                    control_id=self.name, heartbeat_interval_seconds=self.heartbeat_interval
                )
            )
        )
        outbound: asyncio.Queue = asyncio.Queue()
        self._streams.append(outbound)
        reader = asyncio.create_task(self._read(context, outbound))
        try:
            while True:
                msg = await outbound.get()
                if msg is _DROP:
                    return
                await context.write(msg)
        finally:
            self._streams.remove(outbound)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self, context: grpc.aio.ServicerContext, outbound: asyncio.Queue) -> None:
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                # The agent half-closed: end the stream, as a control plane must.
                outbound.put_nowait(_DROP)
                return
            self.received.append(msg)

    # -- what tests call ----------------------------------------------------

    async def start(self, port: int = 0) -> str:
        self._server = GrpcServer(
            f"127.0.0.1:{port}",
            [(agent_pb2_grpc.add_AgentServiceServicer_to_server, self, "llmgw.v1.AgentService")],
        )
        await self._server.start()
        self.address = f"127.0.0.1:{self._server.port}"
        return self.address

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    @property
    def connected(self) -> bool:
        return bool(self._streams)

    def send(self, msg: pb.ControlMessage) -> None:
        if not self._streams:
            raise AssertionError(f"{self.name}: no agent is connected")
        self._streams[-1].put_nowait(msg)

    def start_replica(self, **fields) -> None:
        self.send(pb.ControlMessage(start=pb.StartReplica(**fields)))

    def stop_replica(self, replica_id: str, grace_seconds: float = 0.0) -> None:
        self.send(pb.ControlMessage(stop=pb.StopReplica(replica_id=replica_id, grace_seconds=grace_seconds)))

    def drop(self) -> None:
        """End the live stream from the control plane's side."""
        for q in self._streams:
            q.put_nowait(_DROP)

    def registers(self) -> list[pb.Register]:
        return [m.register for m in self.received if m.WhichOneof("msg") == "register"]

    def heartbeats(self) -> list[pb.Heartbeat]:
        return [m.heartbeat for m in self.received if m.WhichOneof("msg") == "heartbeat"]

    def statuses(self, replica_id: str) -> list[pb.ReplicaStatus]:
        return [
            m.status
            for m in self.received
            if m.WhichOneof("msg") == "status" and m.status.replica_id == replica_id
        ]

    async def wait_for(self, what: str, found: Callable[[], object], within: float = 10.0):
        """Poll ``found`` until it returns something truthy; fail naming ``what``."""
        deadline = time.monotonic() + within
        while True:
            result = found()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.name}: timed out waiting for {what}")
            await asyncio.sleep(0.02)

    async def wait_register(self, count: int = 1, within: float = 10.0) -> pb.Register:
        regs = await self.wait_for(f"{count} Register(s)", lambda: self.registers()[count - 1 :], within)
        return regs[0]

    async def wait_state(self, replica_id: str, state: int, within: float = 10.0) -> pb.ReplicaStatus:
        name = pb.ReplicaState.Name(state)

        def seen():
            return [s for s in self.statuses(replica_id) if s.state == state]

        hits = await self.wait_for(f"{replica_id} {name}", seen, within)
        return hits[0]
