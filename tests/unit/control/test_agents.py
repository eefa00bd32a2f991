"""AgentService.Connect over real gRPC on loopback: a stream that ends marks the node at once.

The fleet and the leader directory are the servicer's declared seams
(agents.FleetEvents, agents.LeaderDirectory); everything else is real.
"""

from __future__ import annotations

import asyncio
import time

import grpc

from llmgw.common.grpcserver import GrpcServer
from llmgw.control.api.agents import AgentServicer, AgentSessions
from llmgw.v1 import agent_pb2, agent_pb2_grpc

from .helpers import until


class Gauge:
    def set(self, value: float) -> None:
        self.value = value


class Leader:
    is_leader = True

    async def leader_address(self) -> str:
        return ""


class Fleet:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, float]] = []

    async def wait_ready(self) -> bool:
        return True

    def register(self, reg: agent_pb2.Register) -> None:
        self.events.append(("register", reg.node_id, time.monotonic()))

    def heartbeat(self, node_id: str, hb: agent_pb2.Heartbeat) -> None:
        self.events.append(("heartbeat", node_id, time.monotonic()))

    def report(self, node_id: str, status: agent_pb2.ReplicaStatus) -> None:
        pass

    def disconnect(self, node_id: str) -> None:
        self.events.append(("disconnect", node_id, time.monotonic()))

    def kinds(self) -> list[str]:
        return [k for k, _, _ in self.events]


async def _serve(fleet: Fleet) -> GrpcServer:
    servicer = AgentServicer("control-1", Leader(), fleet, AgentSessions(Gauge()), 1.0)
    server = GrpcServer(
        "127.0.0.1:0",
        [(agent_pb2_grpc.add_AgentServiceServicer_to_server, servicer, "llmgw.v1.AgentService")],
    )
    await server.start()
    return server


async def test_an_agent_connection_that_goes_away_is_a_disconnect_within_a_second():
    fleet = Fleet()
    server = await _serve(fleet)
    outgoing: asyncio.Queue = asyncio.Queue()

    async def messages():
        while True:
            yield await outgoing.get()

    channel = grpc.aio.insecure_channel(f"127.0.0.1:{server.port}")
    try:
        call = agent_pb2_grpc.AgentServiceStub(channel).Connect(messages())
        await outgoing.put(agent_pb2.AgentMessage(register=agent_pb2.Register(node_id="node-a")))
        first = await asyncio.wait_for(call.read(), 5)
        assert first.registered.heartbeat_interval_seconds == 1.0
        await outgoing.put(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat()))
        await until(lambda: "heartbeat" in fleet.kinds(), 5)
        # The connection goes away without a goodbye: what a killed agent's
        # kernel does when it closes the socket.
        gone = time.monotonic()
        await channel.close(grace=None)
        await until(lambda: "disconnect" in fleet.kinds(), 5)
        at = next(t for k, _, t in fleet.events if k == "disconnect")
        assert at - gone < 1.0, f"noticed after {at - gone:.2f}s"
        assert fleet.kinds() == ["register", "heartbeat", "disconnect"]
    finally:
        await channel.close()
        await server.stop(0)


async def test_a_second_connection_of_the_same_node_replaces_the_first_without_a_disconnect():
    fleet = Fleet()
    server = await _serve(fleet)
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") for _ in range(2)]
    try:
        calls = []
        for ch in channels:
            call = agent_pb2_grpc.AgentServiceStub(ch).Connect()
            await call.write(agent_pb2.AgentMessage(register=agent_pb2.Register(node_id="node-a")))
            assert (await asyncio.wait_for(call.read(), 5)).HasField("registered")
            calls.append(call)
        # The first stream is closed by the server; only the current session's end is a disconnect.
        assert await asyncio.wait_for(calls[0].read(), 5) == grpc.aio.EOF
        await asyncio.sleep(0.2)
        assert fleet.kinds() == ["register", "register"]
        await channels[1].close(grace=None)
        await until(lambda: "disconnect" in fleet.kinds(), 5)
    finally:
        for ch in channels:
            await ch.close()
        await server.stop(0)


class Standby:
    """A control plane that does not lead and reads ``address`` as the leader from etcd."""

    is_leader = False

    def __init__(self, address: str) -> None:
        self.address = address

    async def leader_address(self) -> str:
        return self.address


async def _redirect_of(leader_address: str) -> str:
    servicer = AgentServicer("control-2", Standby(leader_address), Fleet(), AgentSessions(Gauge()), 1.0)
    server = GrpcServer(
        "127.0.0.1:0",
        [(agent_pb2_grpc.add_AgentServiceServicer_to_server, servicer, "llmgw.v1.AgentService")],
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            call = agent_pb2_grpc.AgentServiceStub(channel).Connect()
            await call.write(agent_pb2.AgentMessage(register=agent_pb2.Register(node_id="node-a")))
            answer = await call.read()
            assert answer.WhichOneof("msg") == "redirect"
            return answer.redirect.leader_address
    finally:
        await server.stop(0)


async def test_a_standby_names_a_leader_that_accepts_connections():
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    address = f"127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    try:
        assert await _redirect_of(address) == address
    finally:
        listener.close()
        await listener.wait_closed()


async def test_a_standby_says_no_leader_is_known_rather_than_name_a_dead_one():
    # The leader was killed: its key stays in etcd until the lease runs out.
    listener = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    address = f"127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    listener.close()
    await listener.wait_closed()
    assert await _redirect_of(address) == ""
