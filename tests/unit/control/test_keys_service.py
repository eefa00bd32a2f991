"""KeyService, KeyTableService and QuotaService on two in-process control planes sharing
one store: any control plane makes keys, every one serves the key table, and only the
leader shares quotas (a standby redirects)."""

from __future__ import annotations

import asyncio
import contextlib

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.common.keys import client_key_hash
from llmgw.control.controlplane import ControlPlane
from llmgw.v1 import endpoints_pb2, keys_pb2, keys_pb2_grpc

from .helpers import Reader, until
from .test_controlplane import SECRET, config, running


async def test_a_key_made_on_the_standby_is_served_by_every_control_plane_and_quotas_go_to_the_leader(
    tmp_path,
):
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        async with running(standby), grpc.aio.insecure_channel(standby.address) as sch:
            async with grpc.aio.insecure_channel(leader.address) as lch:
                made = await keys_pb2_grpc.KeyServiceStub(sch).CreateKey(
                    keys_pb2.CreateKeyRequest(
                        name="a", owner="a@example.com", models=["demo-chat"], requests_per_minute=60
                    )
                )
                assert made.key.hash == "", "the hash is not shown"
                table = Reader(
                    keys_pb2_grpc.KeyTableServiceStub(lch).Watch(endpoints_pb2.WatchRequest(client_id="t"))
                )
                first = await table.next()
                if not first.upserts:
                    first = await table.next()
                assert [k.hash for k in first.upserts] == [client_key_hash(made.secret)]
                assert first.upserts[0].owner == "" and made.key.owner == "a@example.com"
                team = await keys_pb2_grpc.KeyServiceStub(sch).CreateKey(
                    keys_pb2.CreateKeyRequest(name="t", owner="acme/search")
                )
                upserts = (await table.next()).upserts
                assert [(k.id, k.owner) for k in upserts] == [(team.key.id, "acme/search")], (
                    "an owner path reaches routers: the key spends that owner's budgets"
                )

                redirected = keys_pb2_grpc.QuotaServiceStub(sch).Sync()
                await redirected.write(keys_pb2.QuotaReport(router_id="r"))
                view = await redirected.read()
                assert not view.leader and view.leader_address == leader.address
                redirected.cancel()

                sync = keys_pb2_grpc.QuotaServiceStub(lch).Sync()
                usage = [keys_pb2.KeyUsage(key_id=made.key.id, requests=12)]
                await sync.write(keys_pb2.QuotaReport(router_id="r", usage=usage))
                view = await sync.read()
                assert view.leader and view.routers == 1
                assert [(b.key_id, round(b.requests)) for b in view.budgets] == [(made.key.id, 48)]
                sync.cancel()
                table.call.cancel()


async def test_a_standby_reads_the_report_before_it_redirects_however_late_the_router_writes(tmp_path):
    """A router writes its report, then reads the answer. A standby that redirected at once, without
    reading, ended the call under a router whose write came late (a busy host), and that write
    failed with INTERNAL instead of learning where the leader is."""
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        async with running(standby), grpc.aio.insecure_channel(standby.address) as channel:
            call = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
            # The router's write comes late: here, after the call would have ended (or a second).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1):
                    await call.code()
            await call.write(keys_pb2.QuotaReport(router_id="r"))
            view = await call.read()
            assert not view.leader and view.leader_address == leader.address
            assert await call.code() == grpc.StatusCode.OK


async def test_bad_input_is_invalid_argument_and_writes_nothing(tmp_path):
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(plane), grpc.aio.insecure_channel(plane.address) as channel:
        stub = keys_pb2_grpc.KeyServiceStub(channel)
        before = await store.range("key")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.CreateKey(keys_pb2.CreateKeyRequest(models=["nope"], tokens_per_minute=-1))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tokens_per_minute" in err.value.details()
        assert (await store.range("key")).entries == before.entries == []
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.RevokeKey(keys_pb2.RevokeKeyRequest(key="k-000000000000"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
