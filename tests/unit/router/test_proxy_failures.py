"""Failures before the first byte, client hang-ups and the breaker, against real (scripted) engines."""

from __future__ import annotations

import asyncio
import time

import aiohttp
from aiohttp import web

from llmgw.router.breaker import Breaker, BreakerState
from llmgw.router.table import EndpointState

from .helpers import router, wait_for
from .test_resume import (
    CHAT,
    COMPLETIONS,
    ScriptedEngine,
    chat_text,
    full_text,
    metric,
    read_events,
    standalone,
)

HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_stream_that_dies_before_its_first_event_is_retried_whole_on_another_replica():
    async with ScriptedEngine("a", die_before_first_event=True) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json={**HI, "stream": True}) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-replica"] == "static:m:1"
                events = await read_events(resp)
            assert await metric(client, r.url, 'llmgw_router_upstream_retries_total{model="m"} 1.0')
            assert await metric(client, r.url, 'llmgw_router_stream_resumes_total{model="m"} 0.0')
    assert chat_text(events) == full_text(8)
    assert {e["id"] for e in events[:-1]} == {b.id}
    # Retried whole: the original request, not a continuation.
    assert b.bodies == a.bodies


async def test_non_streamed_answer_cut_mid_body_is_retried_whole_on_another_replica():
    async def half_body(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json", "Content-Length": "400"})
        await response.prepare(request)
        await response.write(b'{"id": "half", "choices": [')
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError

    app = web.Application()
    app.router.add_post(CHAT, half_body)
    runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        async with ScriptedEngine("b") as b:
            half = ScriptedEngine("half")
            half.port = runner.addresses[0][1]
            async with router(standalone(half, b)) as r, aiohttp.ClientSession() as client:
                async with client.post(r.url + CHAT, json=HI) as resp:
                    assert resp.status == 200
                    assert (await resp.json())["choices"][0]["message"]["content"] == full_text(8)
                    assert resp.headers["x-llmgw-replica"] == "static:m:1"
    finally:
        await runner.cleanup()


async def test_engine_overloaded_429_is_retried_on_another_replica():
    async with ScriptedEngine("a", fail_status=429) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json=HI) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-replica"] == "static:m:1"
        assert len(a.bodies) == 1 and len(b.bodies) == 1
        # 429 is load, not ill health: the breaker did not count it.
        assert r.table.state("static:m:0").consecutive_failures == 0


async def test_stream_with_headers_but_no_event_within_first_byte_timeout_is_a_504_json():
    async with ScriptedEngine("a", hang_after=0) as a:
        config = standalone(a, first_byte_timeout_seconds=0.3)
        async with router(config) as r, aiohttp.ClientSession() as client:
            # Completions: no role chunk comes first, so the engine sends nothing at all.
            body = {"model": "m", "prompt": "hi", "stream": True}
            async with client.post(r.url + COMPLETIONS, json=body) as resp:
                assert resp.status == 504
                body = await resp.json()
                assert body["error"]["code"] == "upstream_timeout"
                assert "first-byte timeout" in body["error"]["message"]
            await asyncio.wait_for(a.cancelled.wait(), 3)


async def test_client_hanging_up_before_the_first_byte_cancels_the_upstream_request_at_once():
    async with ScriptedEngine("a", delay=30) as a:
        async with router(standalone(a)) as r:
            async with aiohttp.ClientSession() as client:
                pending = asyncio.create_task(client.post(r.url + CHAT, json={**HI, "stream": True}))
                await wait_for(lambda: len(a.bodies) == 1)
                assert r.table.state("static:m:0").in_flight == 1
                hung_up = time.monotonic()
                pending.cancel()
                try:
                    await pending
                except asyncio.CancelledError:
                    pass
            await asyncio.wait_for(a.cancelled.wait(), 3)
            assert time.monotonic() - hung_up < 2
            await wait_for(lambda: r.table.state("static:m:0").in_flight == 0)


async def test_client_hanging_up_during_a_resumed_stream_cancels_the_resumed_request():
    async with ScriptedEngine("a", die_after=2) as a, ScriptedEngine("b", hang_after=2) as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            resp = await client.post(r.url + CHAT, json={**HI, "stream": True})
            await wait_for(lambda: len(b.bodies) == 1)
            resp.close()
            await asyncio.wait_for(b.cancelled.wait(), 3)
            await wait_for(lambda: r.table.state("static:m:1").in_flight == 0)


async def test_breaker_opens_after_consecutive_failures_and_a_half_open_probe_closes_it():
    async with ScriptedEngine("a", fail_status=500) as a, ScriptedEngine("b") as b:
        config = standalone(a, b, breaker_failures=2, breaker_cooldown_seconds=0.4)
        async with router(config) as r, aiohttp.ClientSession() as client:

            async def ask() -> str:
                async with client.post(r.url + CHAT, json=HI) as resp:
                    assert resp.status == 200
                    return resp.headers["x-llmgw-replica"]

            # a is the first choice; two failures (each retried on b) open its breaker.
            assert [await ask(), await ask()] == ["static:m:1"] * 2
            assert len(a.bodies) == 2
            # Open: a is skipped, not tried and failed over.
            assert await ask() == "static:m:1"
            assert len(a.bodies) == 2
            # Half-open after the cooldown: one probe, which fails and reopens it at once.
            await asyncio.sleep(0.45)
            assert await ask() == "static:m:1"
            assert len(a.bodies) == 3
            assert await ask() == "static:m:1"
            assert len(a.bodies) == 3
            # Half-open again, a healthy now and slow: one probe goes to a, the
            # request that arrives while it runs goes to b.
            a.fail_status, a.delay = 0, 0.3
            await asyncio.sleep(0.45)
            probe = asyncio.create_task(ask())
            await wait_for(lambda: len(a.bodies) == 4)
            assert await ask() == "static:m:1"
            assert await probe == "static:m:0"
            assert len(a.bodies) == 4
            # The probe's success closed it: a is the first choice again.
            a.delay = 0
            assert await ask() == "static:m:0"


def test_breaker_states_from_closed_to_open_to_half_open_and_back():
    breaker, state = Breaker(failures=2, cooldown=1.0), EndpointState()
    breaker.failure(state, 10.0)
    assert breaker.state(state, 10.0) is BreakerState.CLOSED
    breaker.failure(state, 10.0)
    assert breaker.state(state, 10.5) is BreakerState.OPEN and not breaker.allows(state, 10.5)
    assert breaker.state(state, 11.0) is BreakerState.HALF_OPEN and breaker.allows(state, 11.0)
    breaker.admit(state, 11.0)
    # The probe is out: others see it open until it answers or a cooldown passes.
    assert not breaker.allows(state, 11.5)
    assert breaker.allows(state, 12.0)
    breaker.success(state)
    assert breaker.state(state, 12.0) is BreakerState.CLOSED
