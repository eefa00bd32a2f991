"""The non-proxy routes: model list, health, readiness, metrics."""

from __future__ import annotations

import asyncio
import os

import aiohttp
import pytest

from llmgw.router.config import Backend, RouterConfig
from llmgw.router.table import Model

from .engines import FakeEngine
from .helpers import router

SERIES = (
    "llmgw_router_requests_total",
    "llmgw_router_request_duration_seconds_bucket",
    "llmgw_router_in_flight",
    "llmgw_router_upstream_retries_total",
    "llmgw_router_stream_resumes_total",
    "llmgw_router_time_to_first_token_seconds_bucket",
    "llmgw_router_inter_token_seconds_bucket",
    "llmgw_router_prompt_tokens_total",
    "llmgw_router_completion_tokens_total",
    "llmgw_router_breaker_state",
    "llmgw_router_endpoints",
    "llmgw_router_table_revision",
    "llmgw_router_watch_connected",
)


def config(url: str) -> RouterConfig:
    return RouterConfig(listen="127.0.0.1:0", backends=[Backend(model="local", url=url, aliases=["l"])])


async def test_models_lists_static_and_catalog_models_once_each_with_aliases():
    async with (
        FakeEngine() as engine,
        router(config(engine.url)) as r,
        aiohttp.ClientSession() as client,
    ):
        r.table.apply_catalog(
            snapshot=True,
            upserts=[
                Model("big", ("b", "large"), "team-a", 1_700_000_000),
                Model("org/slashed"),
            ],
            removals=[],
        )
        async with client.get(r.url + "/v1/models") as resp:
            assert resp.status == 200
            listed = await resp.json()
        assert listed["object"] == "list"
        by_id = {m["id"]: m for m in listed["data"]}
        assert set(by_id) == {"big", "local", "org/slashed"}
        assert by_id["big"] == {
            "id": "big",
            "object": "model",
            "created": 1_700_000_000,
            "owned_by": "team-a",
            "aliases": ["b", "large"],
        }
        async with client.get(r.url + "/v1/models/large") as resp:
            assert (await resp.json())["id"] == "big"
        async with client.get(r.url + "/v1/models/org/slashed") as resp:
            assert (await resp.json())["id"] == "org/slashed"
        async with client.get(r.url + "/v1/models/nope") as resp:
            assert resp.status == 404
            assert (await resp.json())["error"]["code"] == "model_not_found"


async def test_health_and_standalone_readiness_answer_ok():
    async with (
        FakeEngine() as engine,
        router(config(engine.url)) as r,
        aiohttp.ClientSession() as client,
    ):
        async with client.get(r.url + "/health") as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "ok", "pid": os.getpid()})
        async with client.get(r.url + "/ready") as resp:
            assert resp.status == 200


async def test_metrics_expose_every_named_series_initialised_and_counting():
    async with (
        FakeEngine() as engine,
        router(config(engine.url)) as r,
        aiohttp.ClientSession() as client,
    ):
        before = await (await client.get(r.url + "/metrics")).text()
        for name in SERIES:
            assert name in before, name
        assert 'llmgw_router_in_flight{model="local"} 0.0' in before
        assert 'llmgw_router_endpoints{model="local"} 1.0' in before
        async with client.post(r.url + "/v1/chat/completions", json={"model": "l"}) as resp:
            assert resp.status == 200
        async with client.post(r.url + "/v1/chat/completions", json={"model": "zz"}) as resp:
            assert resp.status == 404
        after = await (await client.get(r.url + "/metrics")).text()
        assert 'llmgw_router_requests_total{model="local",replica="static:local:0",status="200"} 1.0' in after
        assert 'llmgw_router_requests_total{model="",replica="",status="404"} 1.0' in after
        assert 'llmgw_router_request_duration_seconds_count{model="local"} 1.0' in after


async def test_shutdown_stops_accepting_and_lets_an_in_flight_stream_finish():
    async with FakeEngine(mode="stream") as engine:
        cfg = config(engine.url).model_copy(update={"shutdown_grace_seconds": 5.0})
        r = router(cfg)
        await r.__aenter__()
        async with aiohttp.ClientSession() as client:
            resp = await client.post(r.url + "/v1/chat/completions", json={"model": "local", "stream": True})
            await resp.content.readline()
            closing = asyncio.create_task(r.__aexit__(None, None, None))
            await asyncio.sleep(0.2)
            assert not closing.done()  # waiting for the stream
            async with aiohttp.ClientSession() as fresh:
                with pytest.raises(aiohttp.ClientConnectionError):
                    await fresh.get(r.url + "/health")
            engine.release.set()
            assert b"[DONE]" in await resp.content.read()
            await asyncio.wait_for(closing, 5)
