"""On-demand wake and usage reports, through a real router and a scripted control plane.

The control plane is llmgw's GrpcServer with scripted Watch servicers (as in
test_watch) and a UsageService that records every report and accepts the
stream, so a test sees exactly what the router reports and when.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import aiohttp
import pytest

from llmgw.common.grpcserver import GrpcServer
from llmgw.router.config import Autoscaling, Backend
from llmgw.router.table import Endpoint, Model, RoutingTable, static_layer
from llmgw.router.usage import UsageReporter
from llmgw.v1 import endpoints_pb2 as pb
from llmgw.v1 import endpoints_pb2_grpc as pb_grpc
from llmgw.v1 import usage_pb2, usage_pb2_grpc

from .engines import FakeEngine
from .helpers import router, wait_for
from .test_watch import SECRET, ScriptedCatalog, ScriptedEndpoints, chat, cluster, endpoint


@pytest.fixture
def secret_file(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


class ScriptedUsage(usage_pb2_grpc.UsageServiceServicer):
    def __init__(self) -> None:
        self.reports: asyncio.Queue[usage_pb2.UsageReport] = asyncio.Queue()

    async def Report(self, request_iterator, context) -> AsyncIterator[usage_pb2.UsageReply]:  # noqa: N802
        first = True
        async for report in request_iterator:
            self.reports.put_nowait(report)
            if first:
                first = False
                yield usage_pb2.UsageReply(accepted=True)

    async def next_matching(self, pred, within: float = 5.0) -> usage_pb2.UsageReport:
        async with asyncio.timeout(within):
            while True:
                report = await self.reports.get()
                if pred(report):
                    return report


class Control:
    def __init__(self) -> None:
        self.endpoints = ScriptedEndpoints()
        self.catalog = ScriptedCatalog()
        self.usage = ScriptedUsage()
        self._server = GrpcServer(
            "127.0.0.1:0",
            [
                (pb_grpc.add_EndpointServiceServicer_to_server, self.endpoints, "llmgw.v1.EndpointService"),
                (pb_grpc.add_CatalogServiceServicer_to_server, self.catalog, "llmgw.v1.CatalogService"),
                (usage_pb2_grpc.add_UsageServiceServicer_to_server, self.usage, "llmgw.v1.UsageService"),
            ],
        )
        self.address = f"127.0.0.1:{self._server.port}"

    async def __aenter__(self) -> Control:
        await self._server.start()
        self.catalog.outbox.put_nowait(
            pb.CatalogUpdate(
                revision=1,
                snapshot=True,
                upserts=[
                    pb.ModelInfo(name="lazy", aliases=["lazy-chat"], on_demand=True),
                    pb.ModelInfo(name="m"),
                ],
            )
        )
        self.endpoints.outbox.put_nowait(pb.EndpointUpdate(revision=1, snapshot=True))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._server.stop(0)


def config(secret: str, address: str, wake_timeout: float = 10.0, interval: float = 30.0):
    # A report interval far longer than any test: a report that arrives soon was sent out of tick.
    return cluster(secret, address).model_copy(
        update={
            "autoscaling": Autoscaling(report_interval_seconds=interval, wake_timeout_seconds=wake_timeout)
        }
    )


async def stream(client: aiohttp.ClientSession, url: str) -> bytes:
    async with client.post(url + "/v1/chat/completions", json={"model": "m", "stream": True}) as resp:
        return await resp.read()


def pending(report: usage_pb2.UsageReport, model: str) -> int:
    return sum(m.pending for m in report.models if m.model == model)


async def test_a_request_for_an_on_demand_model_waits_reports_at_once_and_is_answered_once_woken(secret_file):
    async with (
        Control() as control,
        FakeEngine("lazy-1") as engine,
        router(config(secret_file, control.address)) as r,
    ):
        await wait_for(lambda: r.table.ready)
        async with aiohttp.ClientSession() as client:
            held = asyncio.create_task(chat(client, r.url, "lazy-chat"))
            report = await control.usage.next_matching(lambda rep: pending(rep, "lazy") == 1)
            assert report.urgent, "the wake goes up at once, not at the next tick"
            assert not held.done()
            control.endpoints.outbox.put_nowait(
                pb.EndpointUpdate(
                    revision=2, upserts=[pb.Endpoint(id="lazy-1", model="lazy", url=engine.url)]
                )
            )
            status, replica, _ = await asyncio.wait_for(held, 5)
            metrics = await (await client.get(r.url + "/metrics")).text()
    assert (status, replica) == (200, "lazy-1")
    assert 'llmgw_router_wakes_total{model="lazy",outcome="woken"} 1.0' in metrics
    assert 'llmgw_router_wake_waiting{model="lazy"} 0.0' in metrics


async def test_a_model_that_does_not_wake_in_time_is_a_503_with_retry_after(secret_file):
    async with Control() as control, router(config(secret_file, control.address, wake_timeout=0.3)) as r:
        await wait_for(lambda: r.table.ready)
        async with aiohttp.ClientSession() as client:
            async with client.post(r.url + "/v1/chat/completions", json={"model": "lazy"}) as resp:
                status, headers, body = resp.status, resp.headers, json.loads(await resp.read())
            metrics = await (await client.get(r.url + "/metrics")).text()
    assert 'llmgw_router_wakes_total{model="lazy",outcome="timeout"} 1.0' in metrics
    assert status == 503
    assert headers["Retry-After"] == "2"
    assert body["error"]["code"] == "model_waking"
    assert body["error"]["type"] == "server_error"
    assert "on demand" in body["error"]["message"]


async def test_a_model_that_is_not_on_demand_gets_its_503_at_once_and_nothing_waits(secret_file):
    async with Control() as control, router(config(secret_file, control.address, wake_timeout=30)) as r:
        await wait_for(lambda: r.table.ready)
        async with aiohttp.ClientSession() as client:
            status, _, body = await asyncio.wait_for(chat(client, r.url, "m"), 5)
    assert status == 503
    assert json.loads(body)["error"]["code"] == "no_ready_replica"


async def test_reports_carry_in_flight_per_endpoint_and_when_each_model_was_last_used(secret_file):
    async with (
        Control() as control,
        FakeEngine("m-1", mode="stream") as engine,
        router(config(secret_file, control.address, interval=0.1)) as r,
    ):
        control.endpoints.outbox.put_nowait(pb.EndpointUpdate(revision=2, upserts=[endpoint("m-1", engine)]))
        await wait_for(lambda: len(r.table.routes("m")) == 1)
        async with aiohttp.ClientSession() as client:
            streaming = asyncio.create_task(stream(client, r.url))
            await engine.first_chunk_sent.wait()
            busy = await control.usage.next_matching(lambda rep: any(e.in_flight for e in rep.endpoints))
            # The endpoint leaves the table while its stream runs: still reported until it ends.
            control.endpoints.outbox.put_nowait(pb.EndpointUpdate(revision=3, removals=["m-1"]))
            await wait_for(lambda: not r.table.routes("m"))
            draining = await control.usage.next_matching(lambda rep: True)
            engine.release.set()
            await streaming
            done = await control.usage.next_matching(lambda rep: not rep.endpoints)
    (e,) = busy.endpoints
    assert (e.endpoint_id, e.model, e.in_flight) == ("m-1", "m", 1)
    assert [(e.endpoint_id, e.in_flight) for e in draining.endpoints] == [("m-1", 1)]
    (used,) = [m for m in done.models if m.model == "m"]
    assert used.HasField("idle_seconds") and used.idle_seconds < 5


async def test_reports_carry_what_the_router_answered_and_its_errors_per_model(secret_file):
    # Interval 0.1: reports tick; each carries the counts since start, so the last one says it all.
    async with (
        Control() as control,
        FakeEngine("m-1") as engine,
        router(config(secret_file, control.address, interval=0.1)) as r,
    ):
        await wait_for(lambda: r.table.ready)
        async with aiohttp.ClientSession() as client:
            # "m" has no replica yet: 503; a model nobody declared: 404, counted under "".
            assert (await chat(client, r.url, "m"))[0] == 503
            assert (await chat(client, r.url, "no-such-model"))[0] == 404
            control.endpoints.outbox.put_nowait(
                pb.EndpointUpdate(revision=2, upserts=[endpoint("m-1", engine)])
            )
            await wait_for(lambda: len(r.table.routes("m")) == 1)
            assert (await chat(client, r.url, "m"))[0] == 200
            assert (await chat(client, r.url, "m"))[0] == 200
        last = await control.usage.next_matching(lambda rep: sum(t.requests for t in rep.traffic) == 4)
    by_model = {t.model: (t.requests, t.client_errors, t.server_errors) for t in last.traffic}
    assert by_model == {"m": (3, 0, 1), "": (1, 1, 0)}


def test_a_model_never_asked_for_is_not_reported_and_static_backends_are_not_replicas():
    table = RoutingTable(*static_layer([Backend(model="m", url="http://127.0.0.1:9")], 0))
    reporter = UsageReporter(["127.0.0.1:1"], table, router_id="r")
    first = reporter.snapshot()
    assert list(first.models) == [] and list(first.endpoints) == []
    reporter.used("m")
    (m,) = reporter.snapshot().models
    assert m.model == "m" and m.idle_seconds >= 0 and m.pending == 0


def test_a_model_unused_for_over_a_week_leaves_the_reports():
    now = [0.0]
    reporter = UsageReporter(["127.0.0.1:1"], RoutingTable(), router_id="r", clock=lambda: now[0])
    reporter.used("m")
    assert [m.model for m in reporter.snapshot().models] == ["m"]
    now[0] = 7 * 86400.0
    assert [m.model for m in reporter.snapshot().models] == ["m"], "a week is still a valid idle timeout"
    now[0] = 9 * 86400.0
    assert list(reporter.snapshot().models) == []


async def test_a_held_request_for_a_model_that_leaves_the_catalog_is_a_404(secret_file):
    async with Control() as control, router(config(secret_file, control.address)) as r:
        await wait_for(lambda: r.table.ready)
        async with aiohttp.ClientSession() as client:
            held = asyncio.create_task(chat(client, r.url, "lazy"))
            await control.usage.next_matching(lambda rep: pending(rep, "lazy") == 1)
            control.catalog.outbox.put_nowait(pb.CatalogUpdate(revision=2, removals=["lazy"]))
            status, _, body = await asyncio.wait_for(held, 5)
    assert status == 404
    assert json.loads(body)["error"]["code"] == "model_not_found"


def test_an_idle_endpoint_is_left_out_of_the_report_and_a_busy_one_is_in():
    table = RoutingTable(cluster=True)
    table.apply_catalog(snapshot=True, upserts=[Model("m")], removals=[])
    table.apply_endpoints(snapshot=True, upserts=[Endpoint("m-1", "m", "http://127.0.0.1:9")], removals=[])
    reporter = UsageReporter(["127.0.0.1:1"], table, router_id="r")
    assert list(reporter.snapshot().endpoints) == []
    table.state("m-1").in_flight = 2
    (e,) = reporter.snapshot().endpoints
    assert (e.endpoint_id, e.in_flight, e.engine_sampled) == ("m-1", 2, False)
