"""The front's one set of timers and bounds, on every connection: slow heads and bodies (chunked,
HTTP/1.0, after another request), a client that stops reading its stream, the request deadline,
and the cap on connections.

Each of these went unbounded in issue 22 once a connection had been handed
to aiohttp, or while a write waited on a client that did not read.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from aiohttp import web

from llmgw.router.config import Backend, Limits, RouterConfig

from .engines import FakeEngine
from .helpers import router, serve_app, wait_for
from .test_app import config
from .test_front import HI, connect, post, read_answer

CHAT = "/v1/chat/completions"


def with_limits(url: str, **limits: float) -> RouterConfig:
    cfg = config(url)
    return cfg.model_copy(update={"limits": cfg.limits.model_copy(update=limits)})


async def closed_within(reader: asyncio.StreamReader, seconds: float) -> bytes:
    """What the front sent until it closed the connection, which it must within ``seconds``."""
    return await asyncio.wait_for(reader.read(), seconds)


async def trickle(writer: asyncio.StreamWriter, pieces: list[bytes], gap: float) -> None:
    for piece in pieces:
        try:
            writer.write(piece)
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(gap)


RAW = json.dumps(HI).encode()
SLOW = {
    # A chunked body, one chunk per 0.3 s: each gap under the body idle timeout, the whole over
    # the request's read timeout.
    "chunked_body": [
        f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode(),
        *[b"1\r\n%s\r\n" % RAW[i : i + 1] for i in range(len(RAW))],
    ],
    # HTTP/1.0 with its body a byte at a time.
    "http10_body": [
        f"POST {CHAT} HTTP/1.0\r\nContent-Length: {len(RAW)}\r\n\r\n".encode(),
        *[RAW[i : i + 1] for i in range(len(RAW))],
    ],
    # A second head, a byte at a time, after a request answered on the same connection.
    "second_head": [
        b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n",
        *[bytes([c]) for c in post(HI)],
    ],
}


@pytest.mark.parametrize("name", list(SLOW))
async def test_a_request_arriving_too_slowly_is_answered_408_and_closed_on_time(name):
    async with FakeEngine() as engine:
        cfg = with_limits(
            engine.url,
            client_read_timeout_seconds=1.0,
            head_timeout_seconds=1.0,
            body_idle_timeout_seconds=1.0,
        )
        async with router(cfg) as r:
            reader, writer = await connect(r)
            sender = asyncio.create_task(trickle(writer, SLOW[name], 0.3))
            started = time.monotonic()
            received = await closed_within(reader, 5)
            assert time.monotonic() - started < 3.5
            assert received.count(b"HTTP/1.1 408 Request Timeout\r\n") == 1
            assert engine.seen == []
            sender.cancel()
            writer.close()


async def test_a_silent_body_is_closed_at_the_body_idle_timeout():
    async with FakeEngine() as engine, router(with_limits(engine.url, body_idle_timeout_seconds=0.5)) as r:
        reader, writer = await connect(r)
        writer.write(post(HI)[:-5])
        started = time.monotonic()
        assert (await closed_within(reader, 5)).startswith(b"HTTP/1.1 408 ")
        assert 0.5 <= time.monotonic() - started < 2.5
        writer.close()


class FloodingEngine:
    """An engine whose streams never end: 64 KiB events as fast as the router takes them."""

    def __init__(self) -> None:
        self.cancelled = asyncio.Event()
        self.url = ""

    async def stream(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = b"data: " + json.dumps({"choices": [{"delta": {"content": "x" * 65536}}]}).encode() + b"\n\n"
        try:
            while True:
                await response.write(event)
        except (asyncio.CancelledError, ConnectionError):
            self.cancelled.set()
            raise

    async def __aenter__(self) -> FloodingEngine:
        app = web.Application()
        app.router.add_post(CHAT, self.stream)
        self._runner, self.url = await serve_app(app, handler_cancellation=True)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


@pytest.mark.parametrize(
    "limits",
    [
        {"client_write_timeout_seconds": 0.5},  # the writes' own bound
        {"request_timeout_seconds": 1.0},  # the request deadline covers a blocked write too
    ],
    ids=["write_timeout", "request_deadline"],
)
async def test_a_client_that_stops_reading_its_stream_is_closed_and_the_engine_released(limits):
    async with FloodingEngine() as engine:
        cfg = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="local", url=engine.url)],
            limits=Limits(**{"client_write_timeout_seconds": 60.0, **limits}),
        )
        async with router(cfg) as r:
            reader, writer = await connect(r)
            writer.transport.set_write_buffer_limits(0)
            writer.write(post({**HI, "stream": True}))
            await writer.drain()
            # Read nothing: the router's writes fill the socket, then wait.
            reader._transport.pause_reading()  # type: ignore[attr-defined]
            started = time.monotonic()
            await asyncio.wait_for(engine.cancelled.wait(), 8)
            assert time.monotonic() - started < 6
            await wait_for(lambda: not r._front.connections)  # type: ignore[union-attr]
            writer.close()


async def test_connections_past_the_cap_are_answered_503_and_closed():
    async with FakeEngine() as engine, router(with_limits(engine.url, max_client_connections=2)) as r:
        kept = [await connect(r) for _ in range(2)]
        await wait_for(lambda: len(r._front.connections) == 2)  # type: ignore[union-attr]
        reader, writer = await connect(r)
        answer = await read_answer(reader)
        assert answer.status == 503 and json.loads(answer.body)["error"]["code"] == "too_many_connections"
        assert await closed_within(reader, 5) == b""
        # The kept ones still work.
        kept_reader, kept_writer = kept[0]
        kept_writer.write(post(HI))
        assert (await read_answer(kept_reader)).status == 200
        for _, w in [*kept, (reader, writer)]:
            w.close()
