"""Engines that misbehave on the wire, with two clients at once: no answer ever reaches the wrong
client, and no connection that carried a misbehaving answer is used again.

The engine is a raw socket server that answers each request with bytes the
test scripts, chosen by the request's ``user`` field: requests from client
``A`` get the misbehaving answer, those from ``B`` a correct one that names
``B``. Both clients send at once, round after round, so a connection the
router wrongly returned to its pool would carry B's request and hand B what
was meant for A (or a stray byte of it).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import aiohttp
import pytest

from llmgw.router.config import Backend, Limits, RouterConfig

from .helpers import router

Script = Callable[[bytes], list[bytes | float]]


def whole(user: bytes) -> bytes:
    body = b'{"user": "%s"}' % user
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )


def chunked_answer(user: bytes) -> bytes:
    body = b'{"user": "%s"}' % user
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    return head + b"%x\r\n%s\r\n" % (len(body), body)


class RawEngine:
    """An engine on port 0 that answers each request with what ``script(user)`` lists: bytes to
    write, or seconds to wait."""

    def __init__(self, script: Script) -> None:
        self._script = script
        self.connections = 0
        self.port = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def __aenter__(self) -> RawEngine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        for writer in self._writers:
            writer.close()
        self._server.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if not head.startswith(b"POST "):  # the router's poll of /metrics
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                    continue
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                user = json.loads(await reader.readexactly(length))["user"].encode()
                for step in self._script(user):
                    if isinstance(step, float):
                        await asyncio.sleep(step)
                    else:
                        writer.write(step)
                        await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            writer.close()


def only_a(bad: Callable[[bytes], list[bytes | float]]) -> Script:
    return lambda user: bad(user) if user == b"A" else [whole(user)]


SCRIPTS: dict[str, Script] = {
    # The last chunk, then another one in the same read: a second "answer" nobody asked for.
    "stray_last_chunk_same_read": only_a(lambda u: [chunked_answer(u) + b"0\r\n\r\n0\r\n\r\n"]),
    # The same stray, arriving once the connection is back in the pool.
    "stray_last_chunk_later": only_a(lambda u: [chunked_answer(u) + b"0\r\n\r\n", 0.02, b"0\r\n\r\n"]),
    # The last chunk in pieces, then a stray CRLF.
    "stray_crlf": only_a(lambda u: [chunked_answer(u) + b"0\r\n", 0.01, b"\r\n", 0.02, b"\r\n"]),
    # A whole second answer after the first.
    "two_answers": only_a(lambda u: [whole(u) + whole(b"A-again")]),
    # Framed both ways.
    "length_and_chunked": only_a(
        lambda u: [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + chunked_answer(u).split(b"\r\n\r\n", 1)[1] + b"0\r\n\r\n"
        ]
    ),
    # Longer than limits.max_answer_bytes.
    "huge": only_a(
        lambda u: [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 3000000\r\n\r\n",
            b"x" * 3_000_000,
        ]
    ),
    "huge_chunked": only_a(
        lambda u: [chunked_answer(u)] + [b"%x\r\n%s\r\n" % (100_000, b"x" * 100_000)] * 30 + [b"0\r\n\r\n"]
    ),
    # Past the first-byte timeout, then the answer anyway (on a connection the router gave up).
    "slow": only_a(lambda u: [0.6, whole(u)]),
    # A head, then silence past the idle timeout, then the rest.
    "stalls_mid_body": only_a(
        lambda u: [
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n{",
            0.6,
            b'"user": "A"}' + b" " * 7,
        ]
    ),
    # Not HTTP at all.
    "garbage": only_a(lambda u: [b"hello\r\n\r\n"]),
}


@pytest.mark.parametrize("name", list(SCRIPTS))
async def test_no_answer_reaches_the_wrong_client(name, caplog):
    limits = Limits(
        max_answer_bytes=1024 * 1024,
        first_byte_timeout_seconds=0.3,
        idle_stream_timeout_seconds=0.3,
        retries=0,
    )
    async with RawEngine(SCRIPTS[name]) as engine:
        cfg = RouterConfig(listen="127.0.0.1:0", backends=[Backend(model="m", url=engine.url)], limits=limits)
        async with router(cfg) as r, aiohttp.ClientSession() as client:

            async def ask(user: str) -> tuple[int, bytes]:
                body = {"model": "m", "messages": [], "user": user}
                async with client.post(r.url + "/v1/chat/completions", json=body) as resp:
                    return resp.status, await resp.read()

            for _ in range(6):
                (a_status, a_body), (b_status, b_body) = await asyncio.wait_for(
                    asyncio.gather(ask("A"), ask("B")), 10
                )
                # Each gets its own answer or an OpenAI error, never another's. (B may get an
                # error: a stray that arrives after B's request went out on the connection A's
                # answer left is read as the start of B's answer, and refused.)
                for user, status, body in (("A", a_status, a_body), ("B", b_status, b_body)):
                    if status == 200:
                        assert json.loads(body) == {"user": user}
                    else:
                        assert status in (502, 504) and "error" in json.loads(body)
                # Once any stray has arrived, the pool holds no connection that carried one.
                await asyncio.sleep(0.1)
                assert (await ask("B")) == (200, b'{"user": "B"}')
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
