"""UsageService over real gRPC: the leader takes reports, a standby redirects, bad input is refused."""

from __future__ import annotations

import asyncio
import contextlib
import time

import grpc

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.spec.model import ModelSpec, Profile
from llmgw.router.table import RoutingTable
from llmgw.router.usage import UsageReporter
from llmgw.v1 import admin_pb2, admin_pb2_grpc, agent_pb2, usage_pb2

from .helpers import until
from .routers import ScriptedRouter, reporting_router
from .test_controlplane import SECRET, config, ready_status, register_with_leader, running


@contextlib.asynccontextmanager
async def leader_and_standby(tmp_path):
    """Two control planes on one store: the first leads, the second stands by."""
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        async with running(standby):
            yield leader, standby


async def test_the_leader_accepts_reports_and_a_standby_names_the_leader(tmp_path):
    async with leader_and_standby(tmp_path) as (leader, standby):
        router = ScriptedRouter(standby.address)
        await router.send()
        reply = await router.replies.next()
        assert not reply.accepted
        assert reply.leader_address == leader.address
        await router.replies.ended.wait()
        await router.close()

        router = await reporting_router(leader.address)
        await until(lambda: leader.scaler.routers(time.monotonic()) == 1)
        assert standby.scaler.routers(time.monotonic()) == 0
        await router.close()


async def test_a_report_without_a_router_id_is_refused(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        router = ScriptedRouter(plane.address, router_id="")
        await router.send()
        await router.replies.ended.wait()
        assert await router.call.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "router_id" in await router.call.details()
        assert plane.scaler.routers(time.monotonic()) == 0
        await router.close()


async def test_a_leader_whose_term_ended_redirects_the_next_report(tmp_path):
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        router = await reporting_router(plane.address)
        # Resigned, it does not campaign again: no leader is known.
        await plane.leadership.resign()
        reply = await router.replies.next_matching(lambda r: not r.accepted, within=5)
        assert reply.leader_address == ""
        await router.close()


async def test_a_router_configured_with_a_standby_reports_to_the_leader(tmp_path):
    async with leader_and_standby(tmp_path) as (leader, standby):
        reporter = UsageReporter([standby.address], RoutingTable(), router_id="r1", interval=0.1)
        task = asyncio.create_task(reporter.run())
        try:
            await until(lambda: reporter.connected_to == leader.address, within=5)
            await until(lambda: leader.scaler.routers(time.monotonic()) == 1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


async def test_list_models_shows_what_the_autoscaler_wants_and_why_on_the_leader_only(tmp_path):
    async with leader_and_standby(tmp_path) as (leader, standby):
        for plane, leads in ((leader, True), (standby, False)):
            async with grpc.aio.insecure_channel(plane.address) as channel:
                stub = admin_pb2_grpc.AdminServiceStub(channel)
                (demo,) = (await stub.ListModels(admin_pb2.ListModelsRequest())).models
            assert demo.HasField("desired_replicas") is leads
            if leads:
                assert demo.desired_replicas == 1
                assert demo.scaling_reason


async def test_a_load_spike_adds_a_replica_and_scale_down_unpublishes_then_stops_only_once_drained(tmp_path):
    spec = ModelSpec(
        name="demo",
        scaling={"min": 1, "max": 2, "target_load": 10, "scale_up_seconds": 0, "scale_down_seconds": 0},
        profile=Profile(engine="simulator", gpus=1),
    )
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a", [spec]), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        old = (await agent.inbox.next()).start
        await agent.status(**ready_status(old, "http://127.0.0.1:39001"))
        await until(lambda: old.replica_id in plane.endpoints.items)

        router = await reporting_router(plane.address)
        router.endpoints = [usage_pb2.EndpointLoad(endpoint_id=old.replica_id, model="demo", in_flight=25)]
        new = (await agent.inbox.next_matching(lambda m: m.HasField("start"), within=5)).start
        assert new.replica_id != old.replica_id
        await agent.status(**ready_status(new, "http://127.0.0.1:39002"))
        await until(lambda: new.replica_id in plane.endpoints.items)

        # Load falls to what one replica takes; the least loaded (old) drains, still busy here.
        router.endpoints = [
            usage_pb2.EndpointLoad(endpoint_id=old.replica_id, model="demo", in_flight=1),
            usage_pb2.EndpointLoad(endpoint_id=new.replica_id, model="demo", in_flight=2),
        ]
        await until(lambda: old.replica_id not in plane.endpoints.items, within=5)
        assert await store.get(f"endpoints/{old.replica_id}") is None
        assert await agent.inbox.quiet(1.5), "no stop while a router still has a request on it"

        router.endpoints = [usage_pb2.EndpointLoad(endpoint_id=new.replica_id, model="demo", in_flight=2)]
        stop = await agent.inbox.next_matching(lambda m: m.HasField("stop"), within=5)
        assert stop.stop.replica_id == old.replica_id
        assert "drained" in stop.stop.reason
        assert await store.get(f"replicas/{old.replica_id}") is None
        await router.close()
        await agent.close()


async def test_a_new_leader_keeps_a_scaled_up_model_at_its_count_without_restarting_anything(tmp_path):
    spec = ModelSpec(
        name="demo",
        scaling={"min": 1, "max": 3, "target_load": 10, "scale_up_seconds": 0, "scale_down_seconds": 60},
        profile=Profile(engine="simulator", gpus=1),
    )
    store = MemoryStore()
    first = ControlPlane(config(tmp_path, "control-a", [spec]), store, SECRET)
    second = ControlPlane(config(tmp_path, "control-b", [spec]), store, SECRET)
    stop_first = asyncio.Event()
    first_task = asyncio.create_task(first.run(stop_first))
    try:
        await until(lambda: first.controller.accepting)
        async with running(second):
            agent, _ = await register_with_leader(first.address, "node-a")
            one = (await agent.inbox.next()).start
            await agent.status(**ready_status(one, "http://127.0.0.1:39001"))
            router = await reporting_router(first.address)
            router.endpoints = [
                usage_pb2.EndpointLoad(endpoint_id=one.replica_id, model="demo", in_flight=15)
            ]
            two = (await agent.inbox.next_matching(lambda m: m.HasField("start"), within=5)).start
            await agent.status(**ready_status(two, "http://127.0.0.1:39002"))
            await router.close()

            stop_first.set()
            await asyncio.wait_for(first_task, 10)
            await agent.close()
            await until(lambda: second.controller.accepting, within=5)
            running_now = [
                agent_pb2.ReplicaStatus(**ready_status(s, f"http://127.0.0.1:3900{i}"))
                for i, s in enumerate((one, two), 1)
            ]
            agent, _ = await register_with_leader(second.address, "node-a", running_now)
            # Reports resume, lighter: still no change before scale_down_seconds.
            router = await reporting_router(second.address)
            router.endpoints = [usage_pb2.EndpointLoad(endpoint_id=one.replica_id, model="demo", in_flight=3)]
            assert await agent.inbox.quiet(1.5), "adopted both: nothing started, nothing stopped"
            assert second.controller.scaling("demo").desired == 2
            assert {one.replica_id, two.replica_id} <= set(second.endpoints.items)
            await router.close()
            await agent.close()
    finally:
        stop_first.set()
        await asyncio.wait_for(first_task, 10)
