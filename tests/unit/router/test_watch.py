"""The control-plane watch against a real gRPC server that the test scripts.

The server is llmgw's own GrpcServer (health and reflection included) with
EndpointService and CatalogService servicers that record the
``known_revision`` of every Watch call and send what the test queues.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from llmgw.common.grpcserver import GrpcServer
from llmgw.common.keys import engine_key
from llmgw.router.app import WATCH
from llmgw.router.config import RouterConfig
from llmgw.v1 import endpoints_pb2 as pb
from llmgw.v1 import endpoints_pb2_grpc as pb_grpc
from tests.support.procs import free_port

from .engines import FakeEngine
from .helpers import router, wait_for

CHAT = "/v1/chat/completions"
SECRET = b"a-cluster-secret-of-enough-bytes"


class Scripted:
    """Watch that records each call's known_revision, then yields what is queued."""

    def __init__(self) -> None:
        self.calls: asyncio.Queue[int] = asyncio.Queue()
        self.outbox: asyncio.Queue[object] = asyncio.Queue()

    async def Watch(self, request: pb.WatchRequest, context: object) -> AsyncIterator[object]:  # noqa: N802
        self.calls.put_nowait(request.known_revision)
        while True:
            yield await self.outbox.get()


class ScriptedEndpoints(Scripted, pb_grpc.EndpointServiceServicer):
    pass


class ScriptedCatalog(Scripted, pb_grpc.CatalogServiceServicer):
    pass


class Control:
    def __init__(self, port: int = 0) -> None:
        self.endpoints = ScriptedEndpoints()
        self.catalog = ScriptedCatalog()
        self._server = GrpcServer(
            f"127.0.0.1:{port}",
            [
                (
                    pb_grpc.add_EndpointServiceServicer_to_server,
                    self.endpoints,
                    "llmgw.v1.EndpointService",
                ),
                (pb_grpc.add_CatalogServiceServicer_to_server, self.catalog, "llmgw.v1.CatalogService"),
            ],
        )
        self.address = f"127.0.0.1:{self._server.port}"

    async def __aenter__(self) -> Control:
        await self._server.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        await self._server.stop(0)

    def send_catalog(
        self,
        revision: int,
        models: list[pb.ModelInfo],
        *,
        snapshot: bool = True,
        removals: tuple[str, ...] = (),
    ) -> None:
        self.catalog.outbox.put_nowait(
            pb.CatalogUpdate(revision=revision, snapshot=snapshot, upserts=models, removals=removals)
        )

    def send_endpoints(
        self,
        revision: int,
        endpoints: list[pb.Endpoint],
        *,
        snapshot: bool = True,
        removals: tuple[str, ...] = (),
    ) -> None:
        self.endpoints.outbox.put_nowait(
            pb.EndpointUpdate(revision=revision, snapshot=snapshot, upserts=endpoints, removals=removals)
        )


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


def cluster(secret_file: str, *addresses: str) -> RouterConfig:
    return RouterConfig(
        listen="127.0.0.1:0",
        control=list(addresses),
        cluster_secret_file=secret_file,
        tls={"plaintext": True},
        watch_backoff_initial_seconds=0.05,
        watch_backoff_max_seconds=0.2,
    )


def endpoint(id_: str, engine: FakeEngine, **fields: object) -> pb.Endpoint:
    return pb.Endpoint(id=id_, model="m", url=engine.url, **fields)


async def chat(client: aiohttp.ClientSession, url: str, model: str = "m", **kw: object):
    async with client.post(url + CHAT, json={"model": model}, **kw) as resp:
        return resp.status, resp.headers.get("x-llmgw-replica"), await resp.read()


async def test_ready_after_both_snapshots_then_routes_by_alias_with_the_hmac_engine_key(
    secret_file,
):
    async with (
        FakeEngine() as engine,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        assert await asyncio.wait_for(control.catalog.calls.get(), 3) == 0
        assert await asyncio.wait_for(control.endpoints.calls.get(), 3) == 0
        assert (await client.get(r.url + "/ready")).status == 503

        control.send_catalog(5, [pb.ModelInfo(name="m", aliases=["mm"], owned_by="team")])
        await wait_for(lambda: r.app[WATCH].revision("catalog") == 5)
        assert (await client.get(r.url + "/ready")).status == 503  # endpoints still missing

        control.send_endpoints(9, [endpoint("e1", engine, served_name="m-served")])
        await wait_for(lambda: r.table.ready)
        assert (await client.get(r.url + "/ready")).status == 200

        status, replica, _ = await chat(client, r.url, "mm", headers={"Authorization": "Bearer client-key"})
        assert (status, replica) == (200, "e1")
        seen = engine.seen[-1]
        assert seen.headers["Authorization"] == f"Bearer {engine_key(SECRET, 'e1')}"
        assert "client-key" not in str(dict(seen.headers))
        assert seen.body["model"] == "m-served"

        metrics = await (await client.get(r.url + "/metrics")).text()
        assert 'llmgw_router_table_revision{stream="endpoints"} 9.0' in metrics
        assert 'llmgw_router_table_revision{stream="catalog"} 5.0' in metrics
        assert 'llmgw_router_watch_connected{stream="endpoints"} 1.0' in metrics
        assert 'llmgw_router_endpoints{model="m"} 1.0' in metrics


async def test_delta_applies_keeps_in_flight_state_and_stale_deltas_are_ignored(secret_file):
    async with (
        FakeEngine(mode="stream") as first,
        FakeEngine(mode="stream") as second,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        control.send_catalog(1, [pb.ModelInfo(name="m")])
        control.send_endpoints(10, [endpoint("e1", first)])
        await wait_for(lambda: r.table.ready)
        held = await client.post(r.url + CHAT, json={"model": "m", "stream": True})
        await held.content.readline()
        assert r.table.state("e1").in_flight == 1

        control.send_endpoints(11, [endpoint("e1", first, weight=1), endpoint("e2", second)], snapshot=False)
        await wait_for(lambda: len(r.table.routes("m")) == 2)
        assert r.table.state("e1").in_flight == 1  # survived the update
        other = await client.post(r.url + CHAT, json={"model": "m", "stream": True})
        assert other.headers["x-llmgw-replica"] == "e2"  # fewest in flight

        control.send_endpoints(11, [], snapshot=False, removals=("e2",))  # not newer: ignored
        control.send_endpoints(12, [], snapshot=False, removals=("e1",))
        await wait_for(lambda: r.app[WATCH].revision("endpoints") == 12)
        assert [x.endpoint.id for x in r.table.routes("m")] == ["e2"]

        first.release.set()
        second.release.set()
        for resp in (held, other):
            assert b"[DONE]" in await resp.content.read()
            resp.release()


async def test_table_is_kept_while_control_is_down_and_resume_sends_last_revision(secret_file):
    standby_port = free_port()
    async with (
        FakeEngine(name="one") as one,
        FakeEngine(name="two") as two,
        Control() as primary,
    ):
        config = cluster(secret_file, primary.address, f"127.0.0.1:{standby_port}")
        async with router(config) as r, aiohttp.ClientSession() as client:
            primary.send_catalog(3, [pb.ModelInfo(name="m")])
            primary.send_endpoints(4, [endpoint("e1", one)])
            await wait_for(lambda: r.table.ready)

            await primary.stop()
            assert r.app[WATCH].revision("endpoints") == 4
            page = ""
            for _ in range(5):  # across several failed reconnects to both addresses
                await asyncio.sleep(0.1)
                assert (await chat(client, r.url))[:2] == (200, "e1")
                assert (await client.get(r.url + "/ready")).status == 200
                page = await (await client.get(r.url + "/metrics")).text()
            assert 'llmgw_router_watch_connected{stream="endpoints"} 0.0' in page

            async with Control(standby_port) as standby:
                assert await asyncio.wait_for(standby.endpoints.calls.get(), 5) == 4
                assert await asyncio.wait_for(standby.catalog.calls.get(), 5) == 3
                standby.send_endpoints(6, [endpoint("e2", two)], snapshot=False, removals=("e1",))
                await wait_for(lambda: r.app[WATCH].revision("endpoints") == 6)
                assert (await chat(client, r.url))[:2] == (200, "e2")
                assert two.seen and len(one.seen) == 5


async def test_snapshot_replaces_the_table_so_gone_endpoints_mean_503_and_gone_models_404(
    secret_file,
):
    async with (
        FakeEngine() as engine,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        control.send_catalog(1, [pb.ModelInfo(name="m"), pb.ModelInfo(name="n")])
        control.send_endpoints(2, [endpoint("e1", engine)])
        await wait_for(lambda: r.table.ready)
        assert (await chat(client, r.url))[0] == 200

        control.send_endpoints(3, [])
        await wait_for(lambda: not r.table.routes("m"))
        async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
            assert resp.status == 503
            assert resp.headers["Retry-After"] == "2"

        control.send_catalog(4, [pb.ModelInfo(name="n")])
        await wait_for(lambda: r.table.resolve("m") is None)
        assert (await chat(client, r.url))[0] == 404
        listed = await (await client.get(r.url + "/v1/models")).json()
        assert [m["id"] for m in listed["data"]] == ["n"]
