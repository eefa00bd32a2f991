"""Conformance of the front: bytes in, then the statuses answered and whether the connection is
still usable for another request.

Each case is a raw request (or several) written on a fresh connection to a
real router with a real engine behind it. Where RFC 9112 leaves the server
room, :func:`test_where_the_rfc_leaves_room_the_front_agrees_with_aiohttp`
holds the front to what aiohttp's own server does with the same bytes.
Every refusal is an OpenAI-shaped JSON error, the connection closes after
it, nothing reaches the engine, and nothing is logged at ERROR.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web

from llmgw.router.config import Limits

from .engines import FakeEngine
from .helpers import router, serve_app
from .test_app import config
from .test_front import read_answer

HI = json.dumps({"model": "local", "messages": [{"role": "user", "content": "hi"}]}).encode()
CHAT = b"/v1/chat/completions"


def req(
    *,
    method: bytes = b"POST",
    target: bytes = CHAT,
    version: bytes = b"HTTP/1.1",
    host: bytes = b"Host: x\r\n",
    extra: bytes = b"",
    body: bytes = HI,
    length: bool = True,
    sep: bytes = b"\r\n",
) -> bytes:
    head = method + b" " + target + b" " + version + sep + host + b"Content-Type: application/json" + sep
    head += extra
    if length:
        head += b"Content-Length: %d" % len(body) + sep
    return head + sep + body


def chunked(body: bytes, ext: bytes = b"", trailers: bytes = b"") -> bytes:
    return b"%x%s\r\n%s\r\n0\r\n%s\r\n" % (len(body), ext, body, trailers)


TE = b"Transfer-Encoding: chunked\r\n"

# name: (bytes, statuses answered, connection usable after)
CASES: dict[str, tuple[bytes, list[int], bool]] = {
    "valid": (req(), [200], True),
    "pipelined": (req() + req(), [200, 200], True),
    "leading_crlf": (b"\r\n" + req(), [200], True),
    "absolute_form": (req(target=b"http://x" + CHAT), [200], True),
    "query_percent_encoded": (req(target=CHAT + b"?q=%E2%82%AC&r=1"), [200], True),
    "obs_text_value": (req(extra=b"X-A: caf\xc3\xa9\r\n"), [200], True),
    "host_ipv6_port": (req(host=b"Host: [::1]:8080\r\n"), [200], True),
    "get_on_proxy_path": (req(method=b"GET", length=False, body=b""), [405], True),
    "unknown_path": (req(target=b"/nope"), [404], True),
    "health": (b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", [200], True),
    # Framing
    "cl_and_te": (req(extra=TE), [400], False),
    "two_lengths": (req(extra=b"Content-Length: 5\r\n"), [400], False),
    "two_same_lengths": (req(extra=b"Content-Length: %d\r\n" % len(HI)), [400], False),
    "length_list": (
        req(length=False, extra=b"Content-Length: %d, %d\r\n" % (len(HI), len(HI))),
        [400],
        False,
    ),
    "length_5000_digits": (
        req(length=False, extra=b"Content-Length: " + b"9" * 5000 + b"\r\n"),
        [400],
        False,
    ),
    "length_negative": (req(length=False, extra=b"Content-Length: -1\r\n"), [400], False),
    "length_plus": (req(length=False, extra=b"Content-Length: +%d\r\n" % len(HI)), [400], False),
    "chunked": (req(length=False, extra=TE, body=chunked(HI)), [200], True),
    "chunk_extension_and_trailers": (
        req(length=False, extra=TE, body=chunked(HI, b";a=b", b"X-T: 1\r\n")),
        [200],
        True,
    ),
    "chunk_size_signed": (req(length=False, extra=TE, body=b"+" + chunked(HI)), [400], False),
    "chunk_size_bare_lf": (
        req(length=False, extra=TE, body=chunked(HI).replace(b"\r\n", b"\n", 1)),
        [400],
        False,
    ),
    "chunked_twice": (req(length=False, extra=TE + TE, body=chunked(HI)), [400], False),
    "coding_gzip_chunked": (
        req(length=False, extra=b"Transfer-Encoding: gzip, chunked\r\n", body=chunked(HI)),
        [501],
        False,
    ),
    "coding_gzip": (req(length=False, extra=b"Transfer-Encoding: gzip\r\n"), [501], False),
    "body_over_limit": (req(body=b"x" * 5000), [413], False),
    "chunked_body_over_limit": (req(length=False, extra=TE, body=chunked(b"x" * 5000)), [413], False),
    # Line endings and folding
    "bare_lf": (req(sep=b"\n"), [400], False),
    "bare_lf_in_field": (req(extra=b"X-A: a\nX-B: b\r\n"), [400], False),
    "bare_cr_in_field": (req(extra=b"X-A: a\rX-B: b\r\n"), [400], False),
    "obs_fold": (req(extra=b"X-A: a\r\n b\r\n"), [400], False),
    # Fields
    "missing_host": (req(host=b""), [400], False),
    "duplicate_host": (req(host=b"Host: x\r\nHost: y\r\n"), [400], False),
    "host_with_space": (req(host=b"Host: a b\r\n"), [400], False),
    "host_with_slash": (req(host=b"Host: a/b\r\n"), [400], False),
    "line_without_colon": (req(extra=b"NoColonHere\r\n"), [400], False),
    "empty_field_name": (req(extra=b": value\r\n"), [400], False),
    "nul_in_field_name": (req(extra=b"X\x00A: v\r\n"), [400], False),
    "nul_in_field_value": (req(extra=b"X-A: a\x00b\r\n"), [400], False),
    "control_in_field_value": (req(extra=b"X-A: a\x01b\r\n"), [400], False),
    "blank_before_colon": (req(extra=b"Content-Length : 5\r\n"), [400], False),
    "keep_alive_and_close": (req(extra=b"Connection: keep-alive\r\nConnection: close\r\n"), [200], False),
    "close_in_a_list": (req(extra=b"Connection: keep-alive, close\r\n"), [200], False),
    # The target
    "query_utf8_raw": (req(target=CHAT + b"?q=\xe2\x82\xac"), [400], False),
    "query_0xff": (req(target=CHAT + b"?q=\xff"), [400], False),
    "query_nul": (req(target=CHAT + b"?q=\x00"), [400], False),
    "query_control": (req(target=CHAT + b"?q=\x01"), [400], False),
    "space_in_target": (req(target=b"/v1/chat completions"), [400], False),
    # Sizes
    "long_request_line": (req(target=CHAT + b"?q=" + b"a" * 100_000), [414], False),
    "long_header_line": (req(extra=b"X-A: " + b"a" * 60_000 + b"\r\n"), [431], False),
    "many_fields": (req(extra=b"".join(b"X-%d: v\r\n" % i for i in range(6000))), [431], False),
    "big_head_of_small_fields": (
        req(extra=b"".join(b"X-%d: %s\r\n" % (i, b"v" * 900) for i in range(90))),
        [431],
        False,
    ),
    # Versions, methods, expectations
    "http10": (req(version=b"HTTP/1.0", host=b""), [200], False),
    "http10_keep_alive": (
        req(version=b"HTTP/1.0", host=b"", extra=b"Connection: keep-alive\r\n"),
        [200],
        True,
    ),
    "http10_chunked": (req(version=b"HTTP/1.0", length=False, extra=TE, body=chunked(HI)), [400], False),
    "http20_line": (req(version=b"HTTP/2.0"), [505], False),
    "http09": (b"GET /health\r\n\r\n", [505], False),
    "unknown_method": (req(method=b"FOO"), [501], False),
    "lowercase_method": (req(method=b"post"), [501], False),
    "expect_other": (req(extra=b"Expect: something\r\n"), [417], False),
    "upgrade": (
        b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n",
        [200],
        False,
    ),
}


async def exchange(port: int, data: bytes, answers: int) -> tuple[list[int], list[bytes], bool]:
    """Write ``data``; the statuses of the first ``answers`` answers, their bodies, and whether
    another request on the same connection is answered 200."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        statuses, bodies = [], []
        for _ in range(answers):
            answer = await read_answer(reader)
            statuses.append(answer.status)
            bodies.append(answer.body)
        try:
            writer.write(req())
            await writer.drain()
            usable = (await read_answer(reader)).status == 200
        except (asyncio.IncompleteReadError, ConnectionError):
            usable = False
        return statuses, bodies, usable
    finally:
        writer.close()


@pytest.fixture
async def front_port():
    async with FakeEngine() as engine:
        cfg = config(engine.url)
        cfg = cfg.model_copy(update={"limits": Limits(max_body_bytes=4096)})
        async with router(cfg) as r:
            yield r.port, engine


@pytest.mark.parametrize("name", list(CASES))
async def test_bytes_in_give_a_status_and_say_whether_the_connection_stays_usable(name, front_port, caplog):
    data, expected, usable = CASES[name]
    port, engine = front_port
    statuses, bodies, still_usable = await exchange(port, data, len(expected))
    assert (statuses, still_usable) == (expected, usable)
    for status, body in zip(statuses, bodies, strict=True):
        if status >= 400:
            error = json.loads(body)["error"]
            assert error["message"] and error["type"] in ("invalid_request_error", "server_error")
    if statuses[0] >= 400 and not usable:
        assert engine.seen == []  # nothing of a refused request is forwarded
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_what_reaches_the_engine_is_only_well_formed(front_port):
    port, engine = front_port
    await exchange(port, req(target=CHAT + b"?q=%E2%82%AC&r=1", extra=b"traceparent: caf\xc3\xa9\r\n"), 1)
    assert engine.seen and engine.seen[0].path == "/v1/chat/completions"


async def test_expect_100_continue_gets_the_interim_answer_then_the_final_one(front_port):
    port, _ = front_port
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    whole = req(extra=b"Expect: 100-continue\r\n")
    head, body = whole.split(b"\r\n\r\n", 1)
    writer.write(head + b"\r\n\r\n")
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(body)
    assert (await read_answer(reader)).status == 200
    writer.close()


# Cases where RFC 9112 leaves the choice to the server: the front does what aiohttp does.
ROOM = [
    "two_same_lengths",  # MAY accept identical repeated lengths; both refuse
    "leading_crlf",  # SHOULD ignore at least one empty line before the request line
    "chunk_extension_and_trailers",  # MUST ignore unknown extensions; trailers MAY be dropped
    "obs_text_value",  # obs-text in a field value: kept, not refused
    "absolute_form",  # MUST accept the absolute form
    "http10",  # no Host needed in HTTP/1.0
    "http10_keep_alive",
    "keep_alive_and_close",
    "upgrade",  # MAY ignore Upgrade
    "line_without_colon",
    "blank_before_colon",
    "query_utf8_raw",
]


@pytest.mark.parametrize("name", ROOM)
async def test_where_the_rfc_leaves_room_the_front_agrees_with_aiohttp(name, front_port):
    async def handle(request: web.Request) -> web.Response:
        await request.read()
        return web.json_response({})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handle)
    app.router.add_get("/health", handle)
    runner, url = await serve_app(app, access_log=None)
    try:
        aiohttp_port = int(url.rsplit(":", 1)[1])
        data, expected, _ = CASES[name]
        ours, _, _ = await exchange(front_port[0], data, len(expected))
        theirs, _, _ = await exchange(aiohttp_port, data, len(expected))
        assert ours == theirs
    finally:
        await runner.cleanup()
