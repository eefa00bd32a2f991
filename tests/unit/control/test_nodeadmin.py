"""NodeAdminService on a real control plane: requests relayed to a scripted agent and back.

The agent is the seam here (a gRPC client that answers what the test says);
tests/integration/test_node_requests.py runs the same path with a real agent.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.v1 import agent_pb2, nodeadmin_pb2, nodeadmin_pb2_grpc

from .helpers import until
from .test_controlplane import SECRET, config, register_with_leader, running


def node_admin(address: str):
    channel = grpc.aio.insecure_channel(address)
    return channel, nodeadmin_pb2_grpc.NodeAdminServiceStub(channel)


async def next_request(agent, kind: str):
    msg = await agent.inbox.next_matching(lambda m: m.WhichOneof("msg") == kind)
    return getattr(msg, kind)


async def test_logs_are_relayed_to_the_agent_and_its_answer_or_refusal_comes_back(tmp_path):
    leader = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        agent, _ = await register_with_leader(leader.address, "node-a")
        start = (await agent.inbox.next()).start
        chan, stub = node_admin(leader.address)

        call = asyncio.ensure_future(
            stub.GetReplicaLogs(nodeadmin_pb2.GetReplicaLogsRequest(replica_id=start.replica_id, lines=2))
        )
        asked = await next_request(agent, "get_logs")
        assert (asked.replica_id, asked.lines) == (start.replica_id, 2) and asked.request_id
        await agent.call.write(
            agent_pb2.AgentMessage(reply=agent_pb2.AgentReply(request_id=asked.request_id, lines=["a", "b"]))
        )
        got = await call
        assert (got.node_id, list(got.lines)) == ("node-a", ["a", "b"])

        call = asyncio.ensure_future(
            stub.GetReplicaLogs(nodeadmin_pb2.GetReplicaLogsRequest(replica_id=start.replica_id))
        )
        asked = await next_request(agent, "get_logs")
        refusal = agent_pb2.AgentReply(
            request_id=asked.request_id, code=grpc.StatusCode.NOT_FOUND.value[0], error="no engine log"
        )
        await agent.call.write(agent_pb2.AgentMessage(reply=refusal))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert err.value.details() == "node node-a: no engine log"

        # The stream ends while a request waits: UNAVAILABLE at once, not after the deadline.
        call = asyncio.ensure_future(
            stub.GetReplicaLogs(nodeadmin_pb2.GetReplicaLogsRequest(replica_id=start.replica_id))
        )
        await next_request(agent, "get_logs")
        await agent.close()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            async with asyncio.timeout(5):
                await call
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "node-a" in err.value.details()
        await chan.close()


async def test_weights_reports_feed_the_list_and_a_standby_names_the_leader(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader), running(standby):
        await until(lambda: leader.controller.accepting)
        agent, _ = await register_with_leader(leader.address, "node-a")
        weights = agent_pb2.WeightsStatus(
            name="org/m", source="hf://org/m", state=agent_pb2.WEIGHTS_STATE_FETCHING, fetched_bytes=10
        )
        await agent.call.write(agent_pb2.AgentMessage(weights=weights))
        chan, stub = node_admin(leader.address)

        async def listed():
            return (await stub.ListWeights(nodeadmin_pb2.ListWeightsRequest())).nodes

        await until(lambda: leader.controller.weights_table.of("node-a"))
        nodes = await listed()
        assert [(n.node_id, [w.fetched_bytes for w in n.weights]) for n in nodes] == [("node-a", [10])]
        done = agent_pb2.WeightsStatus(
            name="org/m", source="hf://org/m", state=agent_pb2.WEIGHTS_STATE_READY, size_bytes=99
        )
        await agent.call.write(agent_pb2.AgentMessage(heartbeat=agent_pb2.Heartbeat(weights=[done])))
        await until(
            lambda: leader.controller.weights_table.holders() == {"hf://org/m": frozenset({"node-a"})}
        )
        assert (await listed())[0].disk_bytes == 99

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.FetchWeights(nodeadmin_pb2.FetchWeightsRequest(node_id="node-zz", source="/x"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND and "node-a" in err.value.details()

        schan, sstub = node_admin(standby.address)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await sstub.ListWeights(nodeadmin_pb2.ListWeightsRequest())
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert leader.address in err.value.details()
        for closer in (chan.close, schan.close, agent.close):
            await closer()
