#!/usr/bin/env python3
"""The floor of a Python proxy: what relaying a whole answer costs with nothing else to do.

Not a router: a measuring stick for ``bench/router_cpu_split.py``. One
uvloop protocol object per client connection and per engine connection,
llhttp (httptools) on both sides, orjson for the body's ``model``, engines
taken in turn, every step a callback (no task, no coroutine, no future on
the request path). No limits, no timeouts, no retries, no keys, no metrics:
it answers the benchmark's requests and nothing else. What llmgw's router
costs above this is the price of what it does per request, not of CPython
or of llhttp.

Usage: python bench/floor_proxy.py PORT ENGINE_URL [ENGINE_URL ...]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools

import httptools
import orjson
import uvloop

Engine = tuple[str, int]


class EngineConnection(asyncio.Protocol):
    def __init__(self, engine: Engine, idle: list[EngineConnection]) -> None:
        self.engine = engine
        self.idle = idle
        self.parser = httptools.HttpResponseParser(self)
        self.client: ClientConnection | None = None
        self.transport: asyncio.Transport | None = None
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)
        self.transport = None

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        client, self.client = self.client, None
        self.idle.append(self)
        if client is not None:
            client.answer(self.parser.get_status_code(), body)


class ClientConnection(asyncio.Protocol):
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.body: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        url, self.url = self.url, b""
        orjson.loads(body)["model"]  # what a router reads of every body
        head = b"POST %s HTTP/1.1\r\nHost: engine\r\nContent-Type: application/json\r\n" % url
        request = b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body)
        self.proxy.send(self, request)

    def answer(self, status: int, body: bytes) -> None:
        if self.transport is None:
            return  # the client left
        self.transport.write(
            b"HTTP/1.1 %d OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
            % (status, len(body), body)
        )


class Proxy:
    def __init__(self, engines: list[Engine]) -> None:
        self.turn = itertools.cycle(engines)
        self.idle: dict[Engine, list[EngineConnection]] = {e: [] for e in engines}

    def send(self, client: ClientConnection, request: bytes) -> None:
        engine = next(self.turn)
        idle = self.idle[engine]
        if idle:
            conn = idle.pop()
            conn.client = client
            assert conn.transport is not None
            conn.transport.write(request)
            return
        asyncio.get_running_loop().create_task(self._connect(engine, client, request))

    async def _connect(self, engine: Engine, client: ClientConnection, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, conn = await loop.create_connection(lambda: EngineConnection(engine, self.idle[engine]), *engine)
        conn.client = client
        assert conn.transport is not None
        conn.transport.write(request)


async def main(port: int, urls: list[str]) -> None:
    engines = []
    for url in urls:
        host, _, engine_port = url.removeprefix("http://").rpartition(":")
        engines.append((host, int(engine_port)))
    proxy = Proxy(engines)
    server = await asyncio.get_running_loop().create_server(
        lambda: ClientConnection(proxy), "127.0.0.1", port, backlog=4096
    )
    await server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("port", type=int, help="the port to listen on (127.0.0.1)")
    parser.add_argument("engines", nargs="+", help="engine URLs, http://HOST:PORT")
    args = parser.parse_args()
    uvloop.run(main(args.port, args.engines))
