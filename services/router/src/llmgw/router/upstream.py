"""The router's HTTP/1.1 client to engines: pooled keep-alive connections, bytes in and out.

Why not aiohttp's client: measured on the peer benchmark
(``bench/router_peers.py``), aiohttp's ``ClientSession.post`` and its
response machinery were about half of the router's CPU per request. This
client does only what the proxy needs, in one protocol object per
connection that parses the answer in place as it arrives: a request is one
``transport.write`` of a prebuilt head and the body; the answer's head is
split into lines once; a body framed by ``Content-Length`` is handed over
as received, a chunked one with its framing removed.

It speaks: requests with a body (the proxy only POSTs), over ``http`` or
``https``; answers framed by ``Content-Length``, chunked (trailers read
and dropped), or ended by the connection closing; ``1xx`` interim answers
skipped. No redirects, no proxies, no cookies, no content decoding (the
router sends no ``Accept-Encoding``, so engines answer in identity).

**Errors are aiohttp's own types**, so the proxy handles them exactly as
it did aiohttp's client: a connect failure is ``ClientOSError`` (a
``ClientConnectionError``), a connect timeout ``ConnectionTimeoutError``,
the engine closing before answering ``ServerDisconnectedError``, closing
mid-body ``ClientPayloadError``; an answer it cannot parse is
:class:`UnreadableAnswer`, a ``ClientError``.

**Keep-alive**: a connection goes back to its host's idle pool (newest
first) as soon as the answer's last byte arrived, whether or not the caller
has read it yet (the body is held by the response, not the connection). An
idle connection older than :data:`KEEPALIVE_SECONDS` is closed instead of
used, so the router never sends on one the engine is about to drop
(uvicorn, under vLLM, closes idle connections after 5 s). A request sent on
a reused connection that closes before any byte of the answer was written
on a connection the server had already given up on: it is sent once more
on a fresh connection.

**Cancellation**: cancelling :meth:`Upstream.post`, or closing a response
before its end, aborts the connection, so the engine sees its client go.

**Flow control**: a response holding more than :data:`.upstream_wire.HIGH_WATER` unread
bytes pauses reading from its connection until the caller drains it.

Not safe across event loops; one :class:`Upstream` per app.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Mapping
from urllib.parse import quote, urlsplit

import aiohttp
import cython

from .upstream_wire import BUSY, IDLE, Connection, Key, UnreadableAnswer, UpstreamResponse, WireLimits

# Whether this module runs compiled (services/router/setup.py): :class:`Upstream` is a ``cython.cclass``
# whose fields are declared (``cython.declare``); the same source runs uncompiled as ordinary Python.
COMPILED: bool = cython.compiled

__all__ = [
    "KEEPALIVE_SECONDS",
    "MAX_IDLE_PER_HOST",
    "UnreadableAnswer",
    "Upstream",
    "UpstreamResponse",
    "WireLimits",
]

# Idle connections are reused only when younger than this.
KEEPALIVE_SECONDS = 4.0
# Idle connections kept per host; more are closed when they come back.
MAX_IDLE_PER_HOST = 1024
# Request targets (scheme, host, port, path) whose request line is kept; the query is not part of
# the key, so what a client sends cannot grow this.
MAX_TARGETS = 1024
# What a query may carry as it is (RFC 3986's query characters); any other byte is percent-encoded.
_QUERY_SAFE = "/?:@!$&'()*+,;=-._~%"


@cython.cclass
class Upstream:
    """Keep-alive connection pools to engines, one per (scheme, host, port)."""

    _connect_timeout: float | None = cython.declare(object)
    _limits: WireLimits = cython.declare(object)
    _ssl: ssl.SSLContext | None = cython.declare(object)
    _idle: dict[Key, list[Connection]] = cython.declare(dict)
    # Readable for the test that its size stays bounded.
    _targets: dict[str, tuple[Key, bytes, bytes, bytes]] = cython.declare(dict, visibility="readonly")

    def __init__(
        self,
        *,
        connect_timeout: float | None,
        ssl_context: ssl.SSLContext | None = None,
        limits: WireLimits | None = None,
    ) -> None:
        self._connect_timeout = connect_timeout
        self._limits = limits or WireLimits()
        self._ssl = ssl_context
        self._idle = {}
        # URL (no query) -> (pool key, request line and Host field, path, host), so a request
        # splits no URL.
        self._targets = {}

    async def post(
        self,
        url: str,
        *,
        query: str = "",
        data: bytes,
        headers: Mapping[str, str],
        deadline: float | None = None,
    ) -> UpstreamResponse:
        """Send a POST to ``url`` (no query) with ``query`` (a client's, percent-encoded here where
        it is not a well-formed query); return once the answer's status and headers are in.

        Raises ``TimeoutError`` when they are not in by ``deadline`` (loop
        time, connecting included).
        """
        key, start, path, host = self._targets.get(url) or self._target(url)
        if query:
            query_bytes = quote(query, _QUERY_SAFE, errors="surrogateescape").encode("ascii")
            start = b"POST %s?%s HTTP/1.1\r\nHost: %s\r\n" % (path, query_bytes, host)
        # aiohttp decoded the client's header bytes this way; this gives the same bytes back.
        lines = ""
        for name, value in headers.items():
            lines += f"{name}: {value}\r\n"  # measured: faster than a join of a comprehension or of %
        fields = lines.encode("utf-8", "surrogateescape")
        request = b"%sContent-Length: %d\r\n%s\r\n%s" % (start, len(data), fields, data)
        conn = self._checkout(key)
        if conn is not None:
            try:
                return await conn.send(request, deadline)
            except aiohttp.ServerDisconnectedError:
                conn.abort()
                if not conn.answered_nothing:
                    raise
                # The engine had dropped this idle connection; a fresh one says what it does now.
            except BaseException:
                conn.abort()
                raise
        conn = await self._connect(key, deadline)
        try:
            return await conn.send(request, deadline)
        except BaseException:
            conn.abort()
            raise

    async def close(self) -> None:
        for conns in list(self._idle.values()):
            for conn in list(conns):
                conn.abort()
        self._idle.clear()

    def _target(self, url: str) -> tuple[Key, bytes, bytes, bytes]:
        """The pool key of ``url`` (no query), its request's first lines (request line and Host
        field), its path and its Host field's value."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise aiohttp.InvalidURL(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        path = quote(parts.path or "/", "/%:@!$&'()*+,;=-._~").encode("ascii")
        host = parts.netloc.rpartition("@")[2].encode("idna")
        start = b"POST %s HTTP/1.1\r\nHost: %s\r\n" % (path, host)
        found = ((parts.scheme, parts.hostname, port), start, path, host)
        if len(self._targets) >= MAX_TARGETS:
            self._targets.clear()
        self._targets[url] = found
        return found

    def _checkout(self, key: Key) -> Connection | None:
        conns = self._idle.get(key)
        oldest = time.monotonic() - KEEPALIVE_SECONDS
        while conns:
            conn = conns.pop()
            if conn.state is IDLE and conn.idle_since >= oldest:
                conn.state = BUSY
                return conn
            conn.abort()
        return None

    async def _connect(self, key: Key, deadline: float | None) -> Connection:
        scheme, host, port = key
        loop = asyncio.get_running_loop()
        ssl_arg: ssl.SSLContext | None = None
        if scheme == "https":
            ssl_arg = self._ssl or ssl.create_default_context()
        connect_by = None if self._connect_timeout is None else loop.time() + self._connect_timeout
        # When the caller's deadline comes first, its TimeoutError is the answer, not a connect timeout.
        callers = deadline is not None and (connect_by is None or deadline < connect_by)
        try:
            async with asyncio.timeout_at(deadline if callers else connect_by):
                # Connection is an asyncio.Protocol by its methods: compiled (see upstream_wire), it
                # cannot subclass the Python class.
                _, conn = await loop.create_connection(  # type: ignore[type-var]
                    functools.partial(Connection, self, key, self._limits), host, port, ssl=ssl_arg
                )
        except TimeoutError:
            if callers:
                raise
            raise aiohttp.ConnectionTimeoutError(
                f"connecting to {host}:{port} took over {self._connect_timeout} s"
            ) from None
        except OSError as err:
            reason = err.strerror or str(err)
            raise aiohttp.ClientOSError(err.errno, f"cannot connect to {host}:{port}: {reason}") from None
        return conn

    def give_back(self, conn: Connection) -> None:
        """A busy connection whose answer is whole becomes idle; once: anything else is ignored."""
        if conn.state is not BUSY:
            return
        conns = self._idle.setdefault(conn.key, [])
        if len(conns) >= MAX_IDLE_PER_HOST:
            conn.abort()
            return
        conn.state = IDLE
        conn.idle_since = time.monotonic()
        conns.append(conn)

    def forget(self, conn: Connection) -> None:
        conns = self._idle.get(conn.key)
        if conns and conn in conns:
            conns.remove(conn)
