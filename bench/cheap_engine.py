#!/usr/bin/env python3
"""A stand-in engine far cheaper than any router: prebuilt answers from a raw uvloop protocol.

For ``bench/router_wrk.py``, where only the router may be the bottleneck.
``llmgw-simulator`` builds every answer (tokens, ids, JSON) through
aiohttp and serves about 7,000 requests/s per process under wrk on the
development machine, less than a router in front of two of them can pass;
this serves a few times that. What it answers:

- ``POST`` with ``"stream": true`` in the body: the simulator's 64-token
  chat stream (67 SSE events and ``[DONE]``, chunked), in
  ``router_hotpath.STREAM_PIECES`` writes on successive loop turns, as a
  real engine's arrive in a few reads.
- any other ``POST``: the simulator's 16-token chat completion.
- ``GET /v1/models``: model ``bench``; any other ``GET`` (``/health``,
  ``/metrics``): 200 with an empty body.

The answers are the bytes ``bench/router_hotpath.py`` feeds its fake
transports, so the two benchmarks see the same engine. Parsing is the
least that a router's well-formed requests need (a head ended by a blank
line, ``Content-Length``, keep-alive); anything else closes the connection.

Usage: python bench/cheap_engine.py --port PORT
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

import uvloop

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_hotpath import ANSWER, STREAM_ANSWER_PIECES  # noqa: E402

_MODELS = b'{"object":"list","data":[{"id":"bench","object":"model","owned_by":"llmgw"}]}'
MODELS = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_MODELS),
    _MODELS,
)
EMPTY = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 0\r\n\r\n"
MAX_HEAD = 64 * 1024


class Engine(asyncio.Protocol):
    def __init__(self) -> None:
        self.buf = b""
        self.transport: asyncio.Transport | None = None
        self.loop = asyncio.get_running_loop()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        buf = self.buf + data if self.buf else data
        while buf:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD:
                    self.transport.close()
                    return
                break
            head = buf[:end].lower()
            at = head.find(b"\r\ncontent-length:")
            length = 0
            if at >= 0:
                line_end = head.find(b"\r\n", at + 2)
                length = int(head[at + 17 : line_end if line_end >= 0 else len(head)])
            stop = end + 4 + length
            if len(buf) < stop:
                break
            body, buf = buf[end + 4 : stop], buf[stop:]
            self.answer(head, body)
        self.buf = buf

    def answer(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get "):
            self.transport.write(MODELS if head.startswith(b"get /v1/models ") else EMPTY)
        elif b'"stream": true' in body or b'"stream":true' in body:
            self.feed(0)
        else:
            self.transport.write(ANSWER)

    def feed(self, i: int) -> None:
        """One piece of a stream per loop turn."""
        if self.transport is None:
            return
        self.transport.write(STREAM_ANSWER_PIECES[i])
        if i + 1 < len(STREAM_ANSWER_PIECES):
            self.loop.call_soon(self.feed, i + 1)


async def serve(port: int) -> None:
    server = await asyncio.get_running_loop().create_server(Engine, "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    uvloop.run(serve(args.port))


if __name__ == "__main__":
    main()
