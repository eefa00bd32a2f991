"""aiohttp on a port through llmgw.common.httpserve: what its parser refuses gets the service's shape."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from aiohttp import web

from llmgw.common import httpserve
from tests.support.rawhttp import exchange

# Bytes aiohttp's parser refuses before any handler runs (its limits: 8,190-byte lines and fields).
MALFORMED = [
    b"GET /x?q=" + b"%F0%9F%A7%95" * 800 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
]
MALFORMED_IDS = ["long request line", "long header", "header line without a colon", "two Content-Lengths"]


def _shaped(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


async def _app_on_a_port(app: web.Application, render: httpserve.Render = _shaped):
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    listener = await httpserve.listen(runner, "127.0.0.1", 0, render)
    return runner, listener


async def _stop(runner: web.AppRunner, listener: asyncio.Server) -> None:
    listener.close()
    await runner.cleanup()


def _app() -> web.Application:
    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def boom(_: web.Request) -> web.Response:
        raise RuntimeError("a handler's bug")

    app = web.Application()
    app.router.add_get("/x", ok)
    app.router.add_get("/boom", boom)
    return app


@pytest.mark.parametrize("data", MALFORMED, ids=MALFORMED_IDS)
async def test_bytes_the_parser_refuses_get_the_render_and_one_info_line(caplog, data):
    caplog.set_level(logging.INFO)
    runner, listener = await _app_on_a_port(_app())
    try:
        answer = await exchange(httpserve.bound_port(listener), data)  # read() ends: it closed
    finally:
        await _stop(runner, listener)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer[:300]  # HTTP/1.0 where aiohttp read no version
    assert b"application/json" in head
    error = json.loads(body)["error"]
    assert error["code"] == 400 and error["message"].startswith("malformed HTTP request"), error
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info], caplog.text
    refused = [r for r in caplog.records if "refused a malformed HTTP request" in r.getMessage()]
    assert len(refused) == 1 and refused[0].levelno == logging.INFO


async def test_well_formed_requests_are_served_on_one_connection():
    runner, listener = await _app_on_a_port(_app())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", httpserve.bound_port(listener))
        for _ in range(2):
            writer.write(b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            assert head.startswith(b"HTTP/1.1 200")
            assert await reader.readexactly(2) == b"ok"
        writer.close()
    finally:
        await _stop(runner, listener)


async def test_a_handlers_bug_stays_aiohttps_500_with_its_traceback(caplog):
    runner, listener = await _app_on_a_port(_app())
    try:
        answer = await exchange(
            httpserve.bound_port(listener), b"GET /boom HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    finally:
        await _stop(runner, listener)
    assert answer.startswith(b"HTTP/1.1 500")
    assert [r for r in caplog.records if r.levelno >= logging.ERROR and r.exc_info]


async def test_plain_answers_text_for_a_port_with_no_error_shape():
    runner, listener = await _app_on_a_port(_app(), httpserve.plain)
    try:
        answer = await exchange(httpserve.bound_port(listener), MALFORMED[2])
    finally:
        await _stop(runner, listener)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400" and b"text/plain" in head
    assert body.startswith(b"malformed HTTP request")


async def test_cleanup_lets_a_request_in_flight_finish():
    started, release = asyncio.Event(), asyncio.Event()

    async def slow(_: web.Request) -> web.Response:
        started.set()
        await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/slow", slow)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=10)
    await runner.setup()
    listener = await httpserve.listen(runner, "127.0.0.1", 0, _shaped)
    answer = asyncio.ensure_future(
        exchange(
            httpserve.bound_port(listener), b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
    )
    await asyncio.wait_for(started.wait(), 10)
    stopping = asyncio.ensure_future(_stop(runner, listener))
    await asyncio.sleep(0.1)
    assert not stopping.done()
    release.set()
    assert (await asyncio.wait_for(answer, 10)).endswith(b"done")
    await asyncio.wait_for(stopping, 10)


async def test_listen_needs_a_runner_set_up():
    with pytest.raises(RuntimeError, match="not set up"):
        await httpserve.listen(web.AppRunner(_app()), "127.0.0.1", 0, _shaped)


def test_no_service_serves_aiohttp_through_a_tcp_site():
    # A TCPSite makes its connections with aiohttp's own handler class: plain-text refusals and a
    # traceback per malformed request. Every TCP port goes through httpserve.listen.
    root = Path(__file__).resolve().parents[3]
    sources = [*root.glob("services/*/src/**/*.py"), *root.glob("libs/*/src/**/*.py")]
    assert len(sources) > 100
    offenders = [str(p.relative_to(root)) for p in sources if "TCPSite(" in p.read_text()]
    assert not offenders
