"""The realtime API (``/v1/realtime``, a WebSocket) through an in-process router.

The router runs on its own front (``RouterServer``) in front of a real
simulator speaking vLLM's realtime protocol, or a small aiohttp engine that
misbehaves on purpose (the engine seam of these tests). The client is the
official ``openai`` package's realtime client where it fits, aiohttp's
WebSocket client where a test needs the close code or the handshake's
status.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time

import aiohttp
import openai
import pytest
from aiohttp import WSMsgType, web

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.agent.simulator.realtime import transcription
from llmgw.router.app import AUTH, METRICS, build_app
from llmgw.router.config import Backend, Limits, RouterConfig, StaticModel

from .helpers import router, serve_app, wait_for
from .test_auth import SECRET, key, keys_of, setup  # noqa: F401 (setup: a fixture)

AUDIO = b"\x01\x00" * 1600  # 0.1 s of PCM16 at 16 kHz


def _config(url: str, **limits) -> RouterConfig:
    return RouterConfig(
        listen="127.0.0.1:0",
        backends=[Backend(model="m", url=url, served_name="sim")],
        models=[StaticModel(name="reranker", apis=["rerank", "score"])],
        limits=Limits(**limits),
    )


@pytest.fixture
async def sim():
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, served_model_names=("sim",), max_body_bytes=64 * 1024)
    async with SimulatorServer(settings) as s:
        yield s


def _requests(r, status: str) -> float:
    return r.app[METRICS].requests.labels("m", status, "static:m:0").value


async def _transcribe_with_the_openai_client(base_url: str) -> None:
    async with (
        openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0) as client,
        client.realtime.connect(model="m") as conn,
    ):
        created = json.loads(await conn.recv_bytes())
        assert created["type"] == "session.created"
        # The model by the router's name: the engine knows it as "sim" (rewritten on the way).
        await conn.send({"type": "session.update", "session": {"type": "transcription", "model": "m"}})
        await conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(AUDIO).decode()})
        await conn.send({"type": "input_audio_buffer.commit"})
        deltas = []
        while True:
            event = json.loads(await conn.recv_bytes())
            assert event["type"] != "error", event
            if event["type"] == "transcription.done":
                break
            deltas.append(event["delta"])
        assert event["text"] == "".join(deltas) == transcription(len(AUDIO))
        assert event["usage"]["total_tokens"] > 0


async def test_a_realtime_session_is_relayed_with_the_openai_client_and_counted(sim):
    async with router(_config(sim.url)) as r:
        await _transcribe_with_the_openai_client(r.url)
        # Counted once it ends, with the status of an opened WebSocket.
        await wait_for(lambda: _requests(r, "101") == 1)
        series = r.app[METRICS].series("m")
        assert series.completion_tokens.value == len(transcription(len(AUDIO)).split(" "))


async def test_the_same_session_where_aiohttp_serves_the_app(sim):
    # The seam's other side: build_app on aiohttp's server (the workers' metrics sockets, tests).
    runner, url = await serve_app(build_app(_config(sim.url)), handler_cancellation=True)
    try:
        await _transcribe_with_the_openai_client(url)
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ("?model=nope", 404, "model_not_found"),
        ("?model=reranker", 400, "api_not_supported"),
    ],
)
async def test_a_session_the_router_refuses_is_an_http_error_before_the_upgrade(sim, query, status, says):
    async with router(_config(sim.url)) as r, aiohttp.ClientSession() as client:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await client.ws_connect(r.url.replace("http", "ws") + "/v1/realtime" + query)
        assert refused.value.status == status
        # The same request without the upgrade gets the JSON error that says why.
        async with client.get(r.url + "/v1/realtime" + query, headers={"Upgrade": "websocket"}) as resp:
            assert resp.status == status
            assert says in await resp.text()
        async with client.get(r.url + "/v1/realtime?model=m") as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["message"].startswith("This path is a WebSocket")


async def test_a_session_naming_its_model_only_in_session_update_is_routed_by_it(sim):
    # vLLM's own protocol: no model in the URL; the client waits for session.created, then names it.
    async with router(_config(sim.url)) as r, aiohttp.ClientSession() as client:
        async with client.ws_connect(r.url + "/v1/realtime") as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            audio = base64.b64encode(AUDIO).decode()
            await ws.send_json({"type": "input_audio_buffer.append", "audio": audio})
            await ws.send_json({"type": "session.update", "model": "m"})
            await ws.send_json({"type": "input_audio_buffer.commit"})
            events = []
            while not events or events[-1]["type"] not in ("transcription.done", "error"):
                events.append(await ws.receive_json(timeout=10))
        # One greeting (the engine's is not relayed again); the audio sent before the model was
        # named reached the engine.
        assert [e["type"] for e in events if e["type"] == "session.created"] == []
        assert events[-1]["type"] == "transcription.done", events
        assert events[-1]["text"] == transcription(len(AUDIO))
        await wait_for(lambda: _requests(r, "101") == 1)


@pytest.mark.parametrize(
    ("model", "says"), [("nope", "does not exist"), ("reranker", "does not serve the realtime API")]
)
async def test_a_model_refused_in_session_update_is_an_error_event_and_close_1008(sim, model, says):
    async with router(_config(sim.url)) as r, aiohttp.ClientSession() as client:
        async with client.ws_connect(r.url + "/v1/realtime") as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_json({"type": "session.update", "session": {"model": model}})
            error = await ws.receive_json(timeout=10)
            assert error["type"] == "error" and says in error["error"]
            closing = await ws.receive(timeout=10)
            assert (closing.type, closing.data) == (WSMsgType.CLOSE, 1008)


async def test_a_message_over_the_limit_closes_the_session_with_1009(sim):
    config = _config(sim.url, realtime_max_message_bytes=2048)
    async with router(config) as r, aiohttp.ClientSession() as client:
        async with client.ws_connect(r.url + "/v1/realtime?model=m", max_msg_size=0) as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_str(json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 4096}))
            closing = await ws.receive()
            assert closing.type is WSMsgType.CLOSE
            assert closing.data == 1009
        await wait_for(lambda: _requests(r, "101") == 1)


@pytest.mark.parametrize("limit", ["realtime_idle_timeout_seconds", "realtime_session_timeout_seconds"])
async def test_an_idle_or_old_session_is_closed_with_1008_naming_the_limit(sim, limit):
    config = _config(sim.url, **{limit: 0.5})
    async with router(config) as r, aiohttp.ClientSession() as client:
        async with client.ws_connect(r.url + "/v1/realtime?model=m") as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            if limit == "realtime_session_timeout_seconds":
                # Busy, never idle: it is the session's age that ends it.
                for _ in range(4):
                    await ws.send_str("{}")
                    assert (await ws.receive_json())["type"] == "error"
            closing = await ws.receive(timeout=10)
            assert (closing.type, closing.data) == (WSMsgType.CLOSE, 1008)
            assert limit in closing.extra


@pytest.fixture
async def rude_engine():
    """An engine whose sessions end as the query's ``then`` says: a close with 4000, or a lost socket."""

    async def session(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        await ws.send_json({"type": "session.created"})
        await ws.receive()  # the client's first message
        if request.query["then"] == "close":
            await ws.close(code=4000, message=b"engine says bye")
        elif request.query["then"] == "big":
            await ws.send_str("x" * 4096)
        else:
            assert request.transport is not None
            request.transport.abort()
        return ws

    app = web.Application()
    app.router.add_get("/v1/realtime", session)
    runner, url = await serve_app(app)
    try:
        yield url
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("then", "code", "says"),
    [
        ("close", 4000, "engine says bye"),
        ("abort", 1011, "went away"),
        ("big", 1011, "over limits.realtime_max_message_bytes"),
    ],
)
async def test_an_engine_that_ends_a_session_closes_the_clients_with_a_code_that_says_so(
    rude_engine, then, code, says
):
    config = _config(rude_engine, realtime_max_message_bytes=2048)
    async with router(config) as r, aiohttp.ClientSession() as client:
        async with client.ws_connect(r.url + f"/v1/realtime?model=m&then={then}") as ws:
            assert (await ws.receive_json())["type"] == "session.created"
            await ws.send_str("{}")
            closing = await ws.receive(timeout=10)
            assert (closing.type, closing.data) == (WSMsgType.CLOSE, code)
            assert says in closing.extra


async def test_no_engine_to_open_a_session_is_a_502_before_the_upgrade():
    from tests.support.procs import free_port

    async with router(_config(f"http://127.0.0.1:{free_port()}", retries=0)) as r:
        async with aiohttp.ClientSession() as client:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await client.ws_connect(r.url + "/v1/realtime?model=m")
            assert refused.value.status == 502


async def test_a_session_needs_a_client_key_and_counts_against_its_request_rate(setup):  # noqa: F811
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(rpm=1, tpm=60)], removals=[])
    url = r.url + "/v1/realtime?model=tiny"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(url)
    assert refused.value.status == 401
    bearer = {"Authorization": f"Bearer {SECRET}"}
    started = time.monotonic()
    async with client.ws_connect(url, headers=bearer) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "session.update", "model": "tiny"})
        await ws.send_json({"type": "input_audio_buffer.append", "audio": base64.b64encode(AUDIO).decode()})
        await ws.send_json({"type": "input_audio_buffer.commit"})
        while (event := await ws.receive_json(timeout=10))["type"] != "transcription.done":
            assert event["type"] == "transcription.delta", event
    # The session's usage is charged to the key once it ends (a bucket refilled at 1 token a second).
    used = event["usage"]["total_tokens"]
    quotas = r.app[AUTH].quotas
    await wait_for(lambda: quotas.level("k-1", "tokens", time.monotonic()) < 60 - used / 2)
    assert quotas.level("k-1", "tokens", time.monotonic()) <= 60 - used + (time.monotonic() - started) + 1
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        await client.ws_connect(url, headers=bearer)
    assert refused.value.status == 429


UPGRADE = (
    b"GET /v1/realtime?model=m HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)


async def test_an_upgrade_pipelined_behind_a_request_opens_after_it_and_a_lost_client_ends_the_session(sim):
    async with router(_config(sim.url)) as r:
        host, port = r.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n" + UPGRADE)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        length = int(next(v for k, v in _fields(head) if k == b"content-length"))
        await reader.readexactly(length)
        switching = await reader.readuntil(b"\r\n\r\n")
        assert switching.startswith(b"HTTP/1.1 101 ")
        frame = await reader.readexactly(2)  # the engine's session.created, unmasked text
        assert frame[0] == 0x81
        (route,) = r.table.routes("m")
        assert route.state.in_flight == 1
        writer.transport.abort()
        # The session ends by itself: counted as the 101 it was, the engine's socket released.
        await wait_for(lambda: _requests(r, "101") == 1 and route.state.in_flight == 0)


def _fields(head: bytes) -> list[tuple[bytes, bytes]]:
    lines = head.split(b"\r\n")[1:]
    return [(k.strip().lower(), v.strip()) for k, _, v in (line.partition(b":") for line in lines if line)]


async def test_a_router_shutting_down_ends_its_sessions_with_1001_at_once(sim):
    config = _config(sim.url).model_copy(update={"shutdown_grace_seconds": 30.0})
    async with aiohttp.ClientSession() as client:
        r = router(config)
        await r.__aenter__()
        try:
            ws = await client.ws_connect(r.url + "/v1/realtime?model=m")
            assert (await ws.receive_json())["type"] == "session.created"
        finally:
            started = time.monotonic()
            await r.__aexit__(None, None, None)
        closing = await ws.receive(timeout=10)
        assert (closing.type, closing.data) == (WSMsgType.CLOSE, 1001)
        # Not after the 30 s grace: a session is told to go away when shutdown begins.
        elapsed = time.monotonic() - started
        assert elapsed < 10
