"""QuotaService.Sync checks what routers report: bounds, one stream per router, each report once.

An in-process control plane on mutual TLS, routers calling with their own
certificates (tests/support/certs.py), as in a cluster.
"""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.common.tls import aio_channel
from llmgw.control.controlplane import ControlPlane
from llmgw.v1 import keys_pb2, keys_pb2_grpc
from tests.support.certs import ClusterPki

from .helpers import until
from .test_controlplane import SECRET, config, running

RPM = 600


@pytest.fixture
async def plane(tmp_path):
    pki = ClusterPki.create(tmp_path / "tls")
    plane = ControlPlane(config(tmp_path, "control-a", tls=pki.control("control-a")), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        async with aio_channel(plane.address, pki.settings("admin", "test")) as admin:
            made = await keys_pb2_grpc.KeyServiceStub(admin).CreateKey(
                keys_pb2.CreateKeyRequest(name="k", requests_per_minute=RPM)
            )
        await until(lambda: made.key.id in plane.keys_hub.items)
        plane.pki, plane.key_id = pki, made.key.id
        yield plane


def _report(key_id: str, requests: int, tokens: int = 0, **kw) -> keys_pb2.QuotaReport:
    usage = [keys_pb2.KeyUsage(key_id=key_id, requests=requests, tokens=tokens)]
    return keys_pb2.QuotaReport(router_id="r", usage=usage, **kw)


async def _exchange(call, report: keys_pb2.QuotaReport) -> keys_pb2.QuotaView:
    await call.write(report)
    return await asyncio.wait_for(call.read(), 5)


def _granted(view: keys_pb2.QuotaView, key_id: str) -> float:
    return next((b.requests for b in view.budgets if b.key_id == key_id), float(RPM))


@pytest.mark.parametrize(
    "requests,tokens,says",
    [(-(10**15), 0, "requests"), (10**15, 0, "requests"), (0, -1, "tokens"), (1, 10**13, "tokens")],
)
async def test_a_negative_or_out_of_bounds_report_is_refused_and_counts_nothing(
    plane, requests, tokens, says
):
    router = plane.pki.settings("router", "r1")
    async with aio_channel(plane.address, router) as channel:
        forged = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _exchange(forged, _report(plane.key_id, requests, tokens))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert says in err.value.details() and "outside" in err.value.details()
        honest = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
        view = await _exchange(honest, _report(plane.key_id, 10))
        assert round(_granted(view, plane.key_id)) == RPM - 10, "only the honest report was counted"
        honest.cancel()


async def test_a_report_sent_again_is_counted_once(plane):
    router = plane.pki.settings("router", "r1")
    async with aio_channel(plane.address, router) as channel:
        report = _report(plane.key_id, 10, incarnation="i-1", sequence=1)
        first = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
        assert round(_granted(await _exchange(first, report), plane.key_id)) == RPM - 10
        first.cancel()
        # The answer was lost: the router sends the same report on a new stream.
        again = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
        assert round(_granted(await _exchange(again, report), plane.key_id)) == RPM - 10
        following = _report(plane.key_id, 5, incarnation="i-1", sequence=2)
        assert round(_granted(await _exchange(again, following), plane.key_id)) == RPM - 15
        # A restarted router (another incarnation) starts its numbers again: counted.
        restarted = _report(plane.key_id, 5, incarnation="i-2", sequence=1)
        assert round(_granted(await _exchange(again, restarted), plane.key_id)) == RPM - 20
        again.cancel()


async def test_one_stream_per_router_identity(plane):
    r1, r2 = plane.pki.settings("router", "r1"), plane.pki.settings("router", "r2")
    async with aio_channel(plane.address, r1) as c1, aio_channel(plane.address, r2) as c2:
        streams = []
        for _ in range(5):
            streams.append(keys_pb2_grpc.QuotaServiceStub(c1).Sync())
            view = await _exchange(streams[-1], _report(plane.key_id, 0))
        assert view.routers == 1, "five streams of one router count as one"
        for old in streams[:-1]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await asyncio.wait_for(old.read(), 5)
            assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
            assert "replaced" in err.value.details()
        other = keys_pb2_grpc.QuotaServiceStub(c2).Sync()
        assert (await _exchange(other, _report(plane.key_id, 0))).routers == 2
        for s in (streams[-1], other):
            s.cancel()


def _owned(owner: str, model: str, requests: int, tokens: int) -> keys_pb2.OwnerModelUsage:
    return keys_pb2.OwnerModelUsage(owner=owner, model=model, requests=requests, tokens=tokens)


async def test_owner_usage_in_a_report_is_counted_once_and_out_of_bounds_is_refused(plane):
    router = plane.pki.settings("router", "r1")
    book = plane.quota.owner_requests
    async with aio_channel(plane.address, router) as channel:
        report = _report(plane.key_id, 1, incarnation="i-1", sequence=1)
        report.owner_usage.extend([_owned("acme/search", "demo", 3, 120), _owned("acme", "demo", 1, 7)])
        first = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
        await _exchange(first, report)
        await _exchange(first, report)  # sent again: counted once
        assert book.totals() == {("acme/search", "demo"): (3, 120), ("acme", "demo"): (1, 7)}
        for bad, says in [
            (_owned("not a path!", "demo", 1, 1), "not an owner path"),
            (_owned("acme", "", 1, 1), "model name"),
            (_owned("acme", "demo", -1, 1), "out of bounds"),
            (_owned("acme", "demo", 1, 10**13), "out of bounds"),
        ]:
            forged = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
            r = _report(plane.key_id, 0, incarnation="i-1", sequence=9)
            r.owner_usage.append(bad)
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await _exchange(forged, r)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and says in err.value.details()
        assert book.totals() == {("acme/search", "demo"): (3, 120), ("acme", "demo"): (1, 7)}
        first.cancel()
