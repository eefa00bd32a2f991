"""Metrics, request ids, access logs and traces of proxied requests."""

from __future__ import annotations

import logging
import random

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from llmgw.router.config import Backend, Limits, RouterConfig
from llmgw.router.envelope import request_id
from llmgw.router.server import RouterServer
from llmgw.router.table import Endpoint, EngineSample, Model

from .engines import FakeEngine
from .helpers import router

CHAT = "/v1/chat/completions"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"


def config(*urls: str, **limits: object) -> RouterConfig:
    return RouterConfig(
        listen="127.0.0.1:0",
        backends=[Backend(model="m", url=url) for url in urls],
        limits=Limits(**limits),
    )


def samples(text: str) -> dict[str, float]:
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            found[name] = float(value)
    return found


async def scrape(client: aiohttp.ClientSession, url: str) -> dict[str, float]:
    return samples(await (await client.get(url + "/metrics")).text())


async def test_stream_records_time_to_first_token_inter_token_gaps_and_usage_tokens():
    async with (
        FakeEngine() as engine,
        router(config(engine.url)) as r,
        aiohttp.ClientSession() as client,
    ):
        before = await scrape(client, r.url)
        assert before['llmgw_router_time_to_first_token_seconds_count{model="m"}'] == 0
        assert before['llmgw_router_completion_tokens_total{model="m"}'] == 0
        body = {"model": "m", "stream": True, "stream_options": {"include_usage": True}}
        async with client.post(r.url + CHAT, json=body) as resp:
            await resp.content.readline()
            engine.release.set()
            await resp.read()
        async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
            assert resp.status == 200
        after = await scrape(client, r.url)
        assert after['llmgw_router_time_to_first_token_seconds_count{model="m"}'] == 1
        assert after['llmgw_router_inter_token_seconds_count{model="m"}'] >= 1
        # 5 + 2 from the stream's usage chunk, 5 + 3 from the JSON answer.
        assert after['llmgw_router_prompt_tokens_total{model="m"}'] == 10
        assert after['llmgw_router_completion_tokens_total{model="m"}'] == 5
        assert after['llmgw_router_requests_total{model="m",replica="static:m:0",status="200"}'] == 2


async def test_breaker_state_and_retries_show_in_metrics():
    async with (
        FakeEngine(name="bad", fail_status=500) as bad,
        FakeEngine(name="good") as good,
        router(config(bad.url, good.url, breaker_failures=1, breaker_cooldown_seconds=60)) as r,
        aiohttp.ClientSession() as client,
    ):
        before = await scrape(client, r.url)
        assert before['llmgw_router_breaker_state{model="m",replica="static:m:0",state="closed"}'] == 1
        for _ in range(4):
            async with client.post(r.url + CHAT, json={"model": "m"}) as resp:
                assert resp.status == 200
        after = await scrape(client, r.url)
        assert after['llmgw_router_breaker_state{model="m",replica="static:m:0",state="open"}'] == 1
        assert after['llmgw_router_breaker_state{model="m",replica="static:m:0",state="closed"}'] == 0
        assert after['llmgw_router_breaker_state{model="m",replica="static:m:1",state="closed"}'] == 1
        assert after['llmgw_router_upstream_retries_total{model="m"}'] == len(bad.seen) == 1


async def test_engines_reported_queues_show_per_replica_and_a_stale_sample_does_not():
    async with FakeEngine() as a, FakeEngine() as b, router(config(a.url, b.url)) as r:
        first, second = r.table.routes("m")
        first.state.engine = EngineSample(first.endpoint.url, running=3, waiting=2, own_in_flight=0, at=0)
        # A sample read from the URL the endpoint had before: not this engine's.
        second.state.engine = EngineSample("http://gone:1", running=9, waiting=9, own_in_flight=0, at=0)
        async with aiohttp.ClientSession() as client:
            seen = await scrape(client, r.url)
        replica = f'model="m",replica="{first.endpoint.id}"'
        assert seen[f"llmgw_router_engine_requests_running{{{replica}}}"] == 3
        assert seen[f"llmgw_router_engine_requests_waiting{{{replica}}}"] == 2
        assert not [k for k in seen if second.endpoint.id in k and "engine_requests" in k]


async def test_departed_replicas_series_are_dropped():
    async with FakeEngine() as engine, router(config(engine.url)) as r, aiohttp.ClientSession() as client:
        r.table.apply_catalog(snapshot=True, upserts=[Model("c")], removals=[])
        r.table.apply_endpoints(snapshot=True, upserts=[Endpoint("rep-1", "c", engine.url)], removals=[])
        async with client.post(r.url + CHAT, json={"model": "c"}) as resp:
            assert resp.status == 200
        assert 'llmgw_router_requests_total{model="c",replica="rep-1",status="200"}' in await scrape(
            client, r.url
        )
        r.table.apply_endpoints(snapshot=True, upserts=[], removals=[])
        after = await scrape(client, r.url)
        assert not any('replica="rep-1"' in name for name in after)


async def test_client_request_id_is_honoured_when_sane_and_replaced_when_not(caplog):
    caplog.set_level(logging.INFO, logger="llmgw.router.access")
    async with FakeEngine() as engine, router(config(engine.url)) as r, aiohttp.ClientSession() as client:
        async with client.post(
            r.url + CHAT, json={"model": "m"}, headers={"x-request-id": "abc-123"}
        ) as resp:
            assert resp.headers["x-request-id"] == "abc-123"
        assert engine.seen[-1].headers["x-request-id"] == "abc-123"
        for bad in ("x" * 129, "two words", "inject\u00e9"):
            async with client.post(r.url + CHAT, json={"model": "m"}, headers={"x-request-id": bad}) as resp:
                replaced = resp.headers["x-request-id"]
            assert replaced != bad and len(replaced) == 32
        async with client.post(r.url + CHAT, json={"model": "nope"}) as resp:
            assert resp.status == 404
            missing = resp.headers["x-request-id"]
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "llmgw.router.access"]
    assert any(
        line.startswith(
            "request_id=abc-123 method=POST path=/v1/chat/completions model=m replica=static:m:0 "
            "status=200 duration_ms="
        )
        for line in lines
    ), lines
    assert any(f"request_id={missing} " in line and "status=404" in line for line in lines)


def test_request_id_rule():
    fresh = random.Random().getrandbits
    assert request_id("a.b:c/d@e+f=g_h-1", fresh) == "a.b:c/d@e+f=g_h-1"
    assert request_id(None, fresh) != request_id(None, fresh)
    generated = request_id("a\r\nb", fresh)
    assert generated != "a\r\nb"
    assert len(generated) == 32 and int(generated, 16) >= 0


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider.get_tracer("test")
    provider.shutdown()


async def test_trace_continues_the_clients_and_gives_each_attempt_a_span_the_engine_is_child_of(spans):
    exporter, tracer = spans
    async with (
        FakeEngine(name="bad", fail_status=503) as bad,
        FakeEngine(name="good") as good,
    ):
        cfg = config(bad.url, good.url, retries=1)
        server = RouterServer(cfg, listen="127.0.0.1:0", rng=random.Random(3), tracer=tracer)
        async with server as r, aiohttp.ClientSession() as client:
            # Pin the bad engine first: the request fails there and is retried on the good one.
            r.table.state("static:m:1").in_flight = 1
            async with client.post(
                r.url + CHAT, json={"model": "m"}, headers={"traceparent": TRACEPARENT}
            ) as resp:
                assert resp.status == 200
            r.table.state("static:m:1").in_flight = 0
    finished = exporter.get_finished_spans()
    (request,) = [s for s in finished if s.name == "POST /v1/chat/completions"]
    attempts = sorted((s for s in finished if s.name == "attempt"), key=lambda s: s.start_time)
    assert format(request.context.trace_id, "032x") == TRACE_ID
    assert format(request.parent.span_id, "016x") == CLIENT_SPAN
    assert request.attributes["http.response.status_code"] == 200
    assert request.attributes["llmgw.replica"] == "static:m:1"
    assert [a.attributes["llmgw.replica"] for a in attempts] == ["static:m:0", "static:m:1"]
    assert all(a.parent.span_id == request.context.span_id for a in attempts)
    assert attempts[0].status.status_code is StatusCode.ERROR
    # Each engine saw the trace, as a child of the attempt that reached it.
    for engine, attempt in ((bad, attempts[0]), (good, attempts[1])):
        version, trace_id, parent, _ = engine.seen[-1].headers["traceparent"].split("-")
        assert trace_id == TRACE_ID
        assert parent == format(attempt.context.span_id, "016x")


async def test_without_tracing_the_clients_traceparent_reaches_the_engine_unchanged():
    async with FakeEngine() as engine, router(config(engine.url)) as r, aiohttp.ClientSession() as client:
        headers = {"traceparent": TRACEPARENT, "tracestate": "k=v"}
        async with client.post(r.url + CHAT, json={"model": "m"}, headers=headers) as resp:
            assert resp.status == 200
        assert engine.seen[-1].headers["traceparent"] == TRACEPARENT
        assert engine.seen[-1].headers["tracestate"] == "k=v"


async def test_a_replica_that_departs_and_returns_is_counted_again():
    # request_done finds a request's series once per (model, status, replica); a table change
    # that drops the replica's series must not leave it counting into the dropped one.
    async with FakeEngine() as engine, router(config(engine.url)) as r, aiohttp.ClientSession() as client:
        r.table.apply_catalog(snapshot=True, upserts=[Model("c")], removals=[])
        endpoint = Endpoint("rep-1", "c", engine.url)
        r.table.apply_endpoints(snapshot=True, upserts=[endpoint], removals=[])
        series = 'llmgw_router_requests_total{model="c",replica="rep-1",status="200"}'
        for _ in range(2):
            async with client.post(r.url + CHAT, json={"model": "c"}) as resp:
                assert resp.status == 200
        assert (await scrape(client, r.url))[series] == 2
        r.table.apply_endpoints(snapshot=True, upserts=[], removals=[])
        r.table.apply_endpoints(snapshot=True, upserts=[endpoint], removals=[])
        async with client.post(r.url + CHAT, json={"model": "c"}) as resp:
            assert resp.status == 200
        assert (await scrape(client, r.url))[series] == 1
