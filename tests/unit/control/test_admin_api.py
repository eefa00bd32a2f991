"""The admin API in one process over real gRPC: the admin token, and settings applied live.

MemoryStore underneath; the same behaviour over a real etcd and real
processes is in tests/integration/test_control_plane.py.
"""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.v1 import (
    admin_pb2,
    admin_pb2_grpc,
    endpoints_pb2,
    endpoints_pb2_grpc,
    settings_pb2,
    settings_pb2_grpc,
)

from .helpers import until
from .test_controlplane import RS, SECRET, ScriptedAgent, config, ready_status, running

TOKEN = "test-admin-token-0123456789"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


async def test_admin_methods_need_the_token_and_say_how_to_pass_it(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET, admin_token=TOKEN)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        async with grpc.aio.insecure_channel(plane.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            settings = settings_pb2_grpc.SettingsServiceStub(channel)
            for call in (
                admin.ListModels(admin_pb2.ListModelsRequest()),
                settings.GetSettings(settings_pb2.GetSettingsRequest()),
            ):
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await call
                assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
                assert "authorization: Bearer TOKEN" in err.value.details()
                assert "LLMGW_ADMIN_TOKEN" in err.value.details()
            wrong = (("authorization", "Bearer not-the-token-at-all"),)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.ListModels(admin_pb2.ListModelsRequest(), metadata=wrong)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "not this cluster's" in err.value.details()

            models = await admin.ListModels(admin_pb2.ListModelsRequest(), metadata=AUTH)
            assert [m.name for m in models.models] == ["demo"]


async def test_router_agent_and_health_services_stay_open_without_the_token(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET, admin_token=TOKEN)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        async with grpc.aio.insecure_channel(plane.address) as channel:
            health = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
            assert health.status == health_pb2.HealthCheckResponse.SERVING
            watch = endpoints_pb2_grpc.CatalogServiceStub(channel).Watch(endpoints_pb2.WatchRequest())
            first = await asyncio.wait_for(watch.read(), 5)
            assert first.snapshot
            watch.cancel()


def _put(document: dict, **kw) -> settings_pb2.PutSettingsRequest:
    return settings_pb2.PutSettingsRequest(document=json.dumps(document), **kw)


async def test_settings_change_the_declared_models_live_and_rollback_restores_them(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        async with grpc.aio.insecure_channel(plane.address) as channel:
            settings = settings_pb2_grpc.SettingsServiceStub(channel)
            v1 = await settings.GetSettings(settings_pb2.GetSettingsRequest())
            assert v1.version == 1 and v1.in_force
            document = json.loads(v1.document)
            document["models"].append({"name": "second", "profile": {"engine": "simulator"}})
            v2 = await settings.PutSettings(
                _put(document, if_version=1, author="ann", reason="a second model")
            )
            assert (v2.version, list(v2.changed), v2.author) == (2, ["models"], "ann")
            await until(lambda: "second" in plane.controller.catalog)
            assert plane.controller.catalog.get("second").origin == "declared"

            # A declared model cannot be removed through the runtime-model API.
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.RemoveModel(admin_pb2.RemoveModelRequest(name="second"))
            assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "llmgw settings edit" in err.value.details()

            # Invalid: refused, nothing written.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await settings.PutSettings(_put({"node_lost_seconds": "soon"}))
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "node_lost_seconds" in err.value.details()
            # Stale: aborted.
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await settings.PutSettings(_put({}, if_version=1))
            assert err.value.code() == grpc.StatusCode.ABORTED

            v3 = await settings.RollbackSettings(
                settings_pb2.RollbackSettingsRequest(version=1, reason="undo")
            )
            assert v3.version == 3 and v3.document == v1.document
            await until(lambda: "second" not in plane.controller.catalog)
            history = await settings.ListSettingsVersions(settings_pb2.ListSettingsVersionsRequest())
            assert [v.version for v in history.versions] == [3, 2, 1]
            assert history.versions[0].reason == "rollback to version 1: undo"
            assert history.versions[0].in_force and not history.versions[1].in_force
            status = await admin.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
            assert (status.settings_version, list(status.restart_pending)) == (3, [])


async def test_a_setting_read_only_at_start_restarts_the_standby_at_once(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        stop = asyncio.Event()
        standby_run = asyncio.create_task(standby.run(stop))
        await until(lambda: standby.settings.in_force.version == 1)
        await leader.settings.put({"lease_ttl_seconds": 3}, if_version=1, author="t", reason="")
        await asyncio.wait_for(standby_run, 10)
        assert standby.restart_requested and standby.restart_pending == ["lease_ttl_seconds"]
        await until(lambda: leader.restart_pending == ["lease_ttl_seconds"])
        assert leader.leadership.is_leader, "the leader waits for the standbys before restarting"
        # Live settings need no restart.
        await leader.settings.put({"node_lost_seconds": 4}, if_version=2, author="t", reason="")
        await until(lambda: leader.settings.in_force.version == 3)
        assert leader.controller.settings.node_lost_seconds == 4


async def test_a_standby_lists_replicas_from_etcd_and_sends_node_queries_to_the_leader(tmp_path):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader), running(standby):
        await until(lambda: leader.controller.accepting)
        agent = ScriptedAgent(leader.address, "node-a", gpus=2)
        await agent.register()
        start = (await agent.inbox.next_matching(lambda m: m.HasField("start"))).start
        await agent.status(**ready_status(start, "http://127.0.0.1:39999/"))
        await until(lambda: start.replica_id in standby.endpoints.items)
        async with grpc.aio.insecure_channel(standby.address) as channel:
            admin = admin_pb2_grpc.AdminServiceStub(channel)
            replicas = (await admin.ListReplicas(admin_pb2.ListReplicasRequest())).replicas
            assert [(r.replica_id, r.node_id, r.url) for r in replicas] == [
                (start.replica_id, "node-a", "http://127.0.0.1:39999")
            ]
            assert replicas[0].state == RS.REPLICA_STATE_READY
            assert f"the leader is control-a at {leader.address}" in replicas[0].message
            status = await admin.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
            assert (status.leader, status.leader_id, status.ready_replicas) == (False, "control-a", 1)
            models = (await admin.ListModels(admin_pb2.ListModelsRequest())).models
            assert (models[0].name, models[0].ready_replicas) == ("demo", 1)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await admin.ListNodes(admin_pb2.ListNodesRequest())
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            assert f"--control {leader.address}" in err.value.details()
        await agent.close()
