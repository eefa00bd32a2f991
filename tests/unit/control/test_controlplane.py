"""End to end in one process: real gRPC servers, a scripted agent, MemoryStore underneath.

Two control planes share one store, as two processes share one etcd: one
leads, the other is a standby that serves watches and redirects agents.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.common.keys import engine_key
from llmgw.control.config import ControlConfig
from llmgw.control.controlplane import ControlPlane
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec, Profile
from llmgw.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
)

from .helpers import Reader, until
from .routers import reporting_router

RS = agent_pb2.ReplicaState
SECRET = b"0123456789abcdef0123456789abcdef"


def config(tmp_path, control_id: str, models=None, **kw) -> ControlConfig:
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    models = models or [
        ModelSpec(
            name="demo",
            aliases=["demo-chat"],
            min_replicas=1,
            profile=Profile(engine="simulator", gpus=1, args={"ttft-ms": "5"}),
        )
    ]
    settings = dict(
        cluster="t",
        control_id=control_id,
        listen="127.0.0.1:0",
        cluster_secret_file=str(secret),
        lease_ttl_seconds=2,
        reconcile_interval_seconds=0.2,
        node_timeout_seconds=3,
        failure_backoff_seconds=30,
        shutdown_grace_seconds=0.5,
        placement_settle_seconds=0,
        models=models,
        # In one process, plaintext: identities are tests/unit/control/test_auth.py's.
        tls={"plaintext": True},
    )
    settings.update(kw)
    return ControlConfig(**settings)


@contextlib.asynccontextmanager
async def running(plane: ControlPlane):
    stop = asyncio.Event()
    task = asyncio.create_task(plane.run(stop))
    try:
        yield plane
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


class ScriptedAgent:
    """A test agent: a real gRPC client that says what the test tells it to."""

    def __init__(self, address: str, node_id: str, gpus: int = 2):
        self.node_id = node_id
        self.gpus = gpus
        self.channel = grpc.aio.insecure_channel(address)
        self.call = agent_pb2_grpc.AgentServiceStub(self.channel).Connect()
        self.inbox = Reader(self.call)

    async def register(self, replicas=()) -> None:
        await self.call.write(
            agent_pb2.AgentMessage(
                register=agent_pb2.Register(
                    node_id=self.node_id,
                    address="127.0.0.1",
                    gpus=[agent_pb2.Gpu(index=i, name="Simulated GPU") for i in range(self.gpus)],
                    engines=[agent_pb2.EngineInfo(kind="simulator", version="test")],
                    version="test",
                    replicas=list(replicas),
                )
            )
        )

    async def status(self, **fields) -> None:
        await self.call.write(agent_pb2.AgentMessage(status=agent_pb2.ReplicaStatus(**fields)))

    async def close(self) -> None:
        await self.inbox.close()
        await self.channel.close()


async def register_with_leader(address: str, node_id: str, replicas=(), within: float = 5.0):
    """Connect until a control plane answers Registered (a standby redirects meanwhile)."""
    async with asyncio.timeout(within):
        while True:
            agent = ScriptedAgent(address, node_id)
            await agent.register(replicas)
            first = await agent.inbox.next()
            if first.HasField("registered"):
                return agent, first.registered
            await agent.close()
            await asyncio.sleep(0.1)


def watch(address: str) -> tuple[grpc.aio.Channel, Reader]:
    channel = grpc.aio.insecure_channel(address)
    stub = endpoints_pb2_grpc.EndpointServiceStub(channel)
    return channel, Reader(stub.Watch(endpoints_pb2.WatchRequest(client_id="test-router")))


def admin(address: str) -> tuple[grpc.aio.Channel, admin_pb2_grpc.AdminServiceStub]:
    channel = grpc.aio.insecure_channel(address)
    return channel, admin_pb2_grpc.AdminServiceStub(channel)


def ready_status(start: agent_pb2.StartReplica, url: str) -> dict:
    return dict(
        replica_id=start.replica_id,
        model=start.model,
        state=RS.REPLICA_STATE_READY,
        url=url,
        gpu_indices=list(start.gpu_indices),
        served_name=start.served_name,
        engine=start.engine,
    )


async def test_started_replica_is_published_when_ready_withdrawn_when_failed_and_standby_redirects(
    tmp_path,
):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        async with running(standby):
            await until(lambda: standby.endpoints.loaded)
            # The router watches the standby: every control plane serves the table.
            wchan, table = watch(standby.address)
            snap = await table.next()
            assert snap.snapshot and list(snap.upserts) == []

            agent = ScriptedAgent(leader.address, "node-a", gpus=2)
            await agent.register()
            registered = (await agent.inbox.next()).registered
            assert registered.control_id == "control-a"
            assert registered.heartbeat_interval_seconds > 0

            start = (await agent.inbox.next()).start
            assert (start.model, start.served_name, start.engine) == ("demo", "demo", "simulator")
            assert len(start.gpu_indices) == 1
            assert start.replica_id.startswith("demo-")
            assert start.engine_key == engine_key(SECRET, start.replica_id)
            assert dict(start.engine_args) == {"ttft-ms": "5"}
            assert await store.get(f"replicas/{start.replica_id}") is not None

            await agent.status(
                replica_id=start.replica_id,
                model="demo",
                state=RS.REPLICA_STATE_STARTING,
                gpu_indices=list(start.gpu_indices),
            )
            assert await table.quiet(0.5), "a starting replica must not be published"

            await agent.status(**ready_status(start, "http://127.0.0.1:39999/"))
            up = await table.next()
            assert not up.snapshot and up.revision > snap.revision
            assert [(e.id, e.model, e.url, e.node, e.served_name) for e in up.upserts] == [
                (start.replica_id, "demo", "http://127.0.0.1:39999", "node-a", "demo")
            ]

            await agent.status(
                replica_id=start.replica_id,
                model="demo",
                state=RS.REPLICA_STATE_FAILED,
                message="engine exited with status 1",
            )
            down = await table.next()
            assert list(down.removals) == [start.replica_id] and not down.upserts
            stop = await agent.inbox.next_matching(lambda m: m.HasField("stop"))
            assert stop.stop.replica_id == start.replica_id
            await until(lambda: not leader.controller.replicas())
            assert await store.get(f"replicas/{start.replica_id}") is None

            # A second agent that dials the standby is sent to the leader.
            other = ScriptedAgent(standby.address, "node-b")
            await other.register()
            redirect = await other.inbox.next()
            assert redirect.redirect.leader_address == leader.address
            await asyncio.wait_for(other.inbox.ended.wait(), 3)

            await other.close()
            await agent.close()
            await table.close()
            await wchan.close()


async def test_standby_takes_over_and_adopts_the_running_replica_without_restarting_it(tmp_path):
    store = MemoryStore()
    first = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    second = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    stop_first = asyncio.Event()
    first_task = asyncio.create_task(first.run(stop_first))
    try:
        await until(lambda: first.controller.accepting)
        async with running(second):
            wchan, table = watch(second.address)
            assert (await table.next()).snapshot
            agent, _ = await register_with_leader(first.address, "node-a")
            start = (await agent.inbox.next()).start
            await agent.status(**ready_status(start, "http://127.0.0.1:39998"))
            up = await table.next()
            assert [e.id for e in up.upserts] == [start.replica_id]

            # "control-a" stops gracefully: it resigns and closes the agent's stream.
            stop_first.set()
            await asyncio.wait_for(first_task, 10)
            await asyncio.wait_for(agent.inbox.ended.wait(), 5)
            await agent.close()
            await until(lambda: second.controller.accepting, within=5)
            running_now = agent_pb2.ReplicaStatus(**ready_status(start, "http://127.0.0.1:39998"))
            agent, registered = await register_with_leader(second.address, "node-a", [running_now])
            assert registered.control_id == "control-b"
            # Adopted: no start, no stop, and the routers saw nothing change.
            assert await agent.inbox.quiet(1.0)
            assert await table.quiet(0.1)
            achan, stub = admin(second.address)
            request = admin_pb2.ListReplicasRequest(model="demo-chat")
            replicas = (await stub.ListReplicas(request)).replicas
            assert [(r.replica_id, r.state, r.node_id) for r in replicas] == [
                (start.replica_id, RS.REPLICA_STATE_READY, "node-a")
            ]
            for closer in (achan.close, agent.close, table.close, wchan.close):
                await closer()
    finally:
        stop_first.set()
        await asyncio.wait_for(first_task, 10)


async def test_admin_explains_placement_lists_the_fleet_and_refuses_an_unknown_model(tmp_path):
    models = [
        ModelSpec(name="demo", profile=Profile(engine="simulator", gpus=1)),
        ModelSpec(name="big", profile=Profile(engine="simulator", gpus=4)),
    ]
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a", models), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b", models), store, SECRET)
    async with running(leader), running(standby):
        await until(lambda: leader.controller.accepting)
        agent, _ = await register_with_leader(leader.address, "node-a")
        start = (await agent.inbox.next()).start
        assert start.model == "demo"
        await agent.status(**ready_status(start, "http://127.0.0.1:39997"))
        chan, stub = admin(leader.address)

        async def big_message():
            listed = await stub.ListModels(admin_pb2.ListModelsRequest())
            return {m.name: m for m in listed.models}

        await until(lambda: "big" in leader.controller.placement_messages)
        models_now = await big_message()
        assert "node-a: 1 free GPU, profile needs 4" in models_now["big"].placement_message
        await until(lambda: any(r.ready for r in leader.controller.replicas()))
        models_now = await big_message()
        assert (models_now["demo"].replicas, models_now["demo"].ready_replicas) == (1, 1)
        assert models_now["demo"].placement_message == ""

        nodes = (await stub.ListNodes(admin_pb2.ListNodesRequest())).nodes
        assert [(n.node_id, n.state, len(n.gpus)) for n in nodes] == [("node-a", "ready", 2)]
        assert list(nodes[0].used_gpu_indices) == list(start.gpu_indices)

        status = await stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
        assert (status.leader, status.leader_id, status.nodes, status.models) == (
            True,
            "control-a",
            1,
            2,
        )
        schan, sstub = admin(standby.address)
        other = await sstub.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
        assert (other.leader, other.leader_id, other.leader_address) == (
            False,
            "control-a",
            leader.address,
        )
        await until(lambda: standby.endpoints.revision >= leader.endpoints.revision > 0)

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.ListReplicas(admin_pb2.ListReplicasRequest(model="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert "big, demo" in err.value.details()
        for closer in (chan.close, schan.close, agent.close):
            await closer()


async def test_catalog_is_published_to_etcd_and_keeps_its_created_time_across_leaders(tmp_path):
    store = MemoryStore()
    async with running(ControlPlane(config(tmp_path, "control-a"), store, SECRET)) as a:
        await until(lambda: a.controller.accepting)
        info = endpoints_pb2.ModelInfo.FromString((await store.get("catalog/demo")).value)
        assert (info.name, list(info.aliases)) == ("demo", ["demo-chat"])
    await store.put("catalog/retired", endpoints_pb2.ModelInfo(name="retired").SerializeToString())
    rev_before = (await store.get("catalog/demo")).mod_revision
    async with running(ControlPlane(config(tmp_path, "control-b"), store, SECRET)) as b:
        await until(lambda: b.controller.accepting)
        await until(lambda: "retired" not in b.catalog_hub.items)
        assert (await store.get("catalog/demo")).mod_revision == rev_before
        assert await store.get("catalog/retired") is None


@pytest.mark.parametrize("change", ["model removed", "scaled to zero"])
async def test_replica_leaves_the_endpoint_table_before_it_is_sent_stop(tmp_path, change):
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        start = (await agent.inbox.next()).start
        await agent.status(**ready_status(start, "http://127.0.0.1:39996"))
        await until(lambda: start.replica_id in plane.endpoints.items)

        router = None
        if change == "model removed":
            plane.controller.replace_catalog(Catalog([]))
        else:
            # On demand now, and idle: it goes to zero once a router says nothing uses it.
            # (The same profile: another one would be a new version, rolled in first.)
            router = await reporting_router(plane.address)
            spec = ModelSpec(
                name="demo",
                scaling={"min": 0, "idle_timeout_seconds": 0.2},
                profile=Profile(engine="simulator", gpus=1, args={"ttft-ms": "5"}),
            )
            plane.controller.replace_catalog(Catalog([Model.from_spec(spec)]))
        stop = await agent.inbox.next_matching(lambda m: m.HasField("stop"), within=10)
        assert stop.stop.replica_id == start.replica_id
        assert await store.get(f"endpoints/{start.replica_id}") is None, "stopped while published"
        assert await store.get(f"replicas/{start.replica_id}") is None
        if change == "model removed":
            await until(lambda: "demo" not in plane.catalog_hub.items)
        if router is not None:
            await router.close()
        await agent.close()


async def test_new_leader_waits_for_agents_before_placing_so_replicas_spread(tmp_path):
    models = [ModelSpec(name="demo", min_replicas=2, profile=Profile(engine="simulator", gpus=1))]
    cfg = config(tmp_path, "control-a", models, placement_settle_seconds=0.6)
    plane = ControlPlane(cfg, MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        first, _ = await register_with_leader(plane.address, "node-a")
        await asyncio.sleep(0.2)
        second, _ = await register_with_leader(plane.address, "node-b")
        a = (await first.inbox.next(within=3)).start
        b = (await second.inbox.next(within=3)).start
        assert (a.model, b.model) == ("demo", "demo")
        assert await first.inbox.quiet(0.3) and await second.inbox.quiet(0.0)
        await first.close()
        await second.close()


async def test_agent_streams_are_closed_when_the_leader_is_fenced(tmp_path):
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        lost = plane.leadership.term.lost
        await store.expire_lease(plane.leadership.term.lease)
        await asyncio.wait_for(lost.wait(), 3)
        # The server still runs; only the stream of the deposed leader's agent ends.
        await asyncio.wait_for(agent.inbox.ended.wait(), 3)
        await agent.close()


async def test_a_replica_recorded_before_versions_is_adopted_then_stamped_with_its_models_version(tmp_path):
    store = MemoryStore()
    legacy = {
        "id": "demo-legacy",
        "model": "demo",
        "node": "node-a",
        "gpu_indices": [0],
        "engine": "simulator",
    }
    await store.put("replicas/demo-legacy", json.dumps(legacy).encode())
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        running_now = agent_pb2.ReplicaStatus(
            replica_id="demo-legacy",
            model="demo",
            state=RS.REPLICA_STATE_READY,
            url="http://127.0.0.1:39995",
            gpu_indices=[0],
            served_name="demo",
            engine="simulator",
        )
        agent, _ = await register_with_leader(plane.address, "node-a", replicas=[running_now])
        version = plane.controller.catalog.get("demo").version

        # Written through: the leader's book changes only after etcd took the write.
        await until(lambda: [r.record.version for r in plane.controller.replicas()] == [version], 5)
        entry = await store.get("replicas/demo-legacy")
        assert entry is not None and json.loads(entry.value)["version"] == version
        # Adopted as the current version: nothing started beside it, nothing stopped.
        await until(lambda: "demo-legacy" in plane.endpoints.items)
        sent = []
        while not agent.inbox.queue.empty():
            sent.append(agent.inbox.queue.get_nowait())
        assert not [m for m in sent if m.HasField("start") or m.HasField("stop")], sent
        await agent.close()
