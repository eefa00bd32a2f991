"""The router's HTTP/1.1 front: the common request served on a protocol of its own, the rest by aiohttp.

Why: on the peer benchmark (``bench/router_peers.py``) aiohttp's server
machinery (its request and response objects, the handler task, routing,
its writer) was about a third of the router's CPU for a non-streamed
request. The front does what such a request needs in one protocol object
per connection: it splits the head once, waits for the body, runs the
app's own handler chain on a :class:`FrontRequest`, and writes the answer
in one ``transport.write``. The chain is the same one aiohttp runs for
that path (:mod:`.envelope`'s middleware, :mod:`.auth`'s when keys are on,
then :meth:`.proxy.Proxy.handle`), so request ids, metrics, spans, keys,
quotas, retries, fallbacks and errors behave the same on either server.

**What the front serves itself**: ``POST`` to one of
:data:`.proxy.PROXY_PATHS` over HTTP/1.1, the body framed by one
``Content-Length`` within ``limits.max_body_bytes``, no
``Transfer-Encoding`` or ``Upgrade``, no ``Expect`` but ``100-continue``
(which curl and others send before a large body: the front answers
``100 Continue`` when the body is not in yet): whole answers and streams
alike. A whole answer goes out with its ``Content-Length`` in one write;
a stream's chunks go straight to the transport as the relay hands them
over (:class:`FrontStream`, chunked transfer coding), and the relay
waits while the client's side of the transport is over its high-water mark,
so a client that reads slowly slows its engine rather than filling the
router's memory. A handler that fails after a stream's head went out
cannot answer any more: the connection is closed, which the client sees as
a stream cut short.

**Everything else is aiohttp's**, on the same connection: the front hands
the connection to a ``RequestHandler`` of the app's ``web.Server`` and
replays every byte it holds, so aiohttp sees the connection as if from its
start and keeps it (other paths and methods, chunked bodies,
oversized bodies, anything unusual in the head: aiohttp's strict parser
gives those their 400, 404, 405 or 413). The hand-off happens only between
requests, never with an answer of the front's in flight.

**Framing is strict, the rest lenient**: a head with a bare CR or LF, a
folded line, a malformed or repeated ``Content-Length`` (or one written
``Content-Length :``) or any ``Transfer-Encoding`` is handed off, never
guessed at. Other fields are found when asked for (:mod:`.fields`) and
not validated: the router forwards only chosen headers (:mod:`.forward`).

**Limits and timeouts**: a head is at most :data:`MAX_HEAD_BYTES`; a
request must arrive whole within ``limits.client_read_timeout_seconds`` of
its first byte, and an idle keep-alive connection is closed after
:data:`KEEPALIVE_SECONDS` (aiohttp's default), both by one sweep per
:data:`SWEEP_SECONDS` over the connections rather than a timer per request.
While a request is answered, or while the client does not read its
answers (the transport's write buffer is full), reading pauses once
:data:`PIPELINE_BYTES` of the next requests are waiting.

**Cancellation**: a client that hangs up cancels its request's task, as
aiohttp's ``handler_cancellation=True`` does.

**Shutdown**: :meth:`Front.close` stops accepting and closes idle
connections; :meth:`Front.drain` waits for answers in flight, up to the
grace period, then cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from email.utils import formatdate
from ssl import SSLContext
from typing import Any

from aiohttp import web

from .answer import Answer
from .errors import error_response
from .fields import Fields
from .proxy import PROXY_PATHS

log = logging.getLogger(__name__)

# A request's head larger than this is handed to aiohttp, which refuses it.
MAX_HEAD_BYTES = 64 * 1024
# Bytes of following requests held while one is answered before reading pauses.
PIPELINE_BYTES = 256 * 1024
# An idle keep-alive connection is closed after this long (aiohttp's default).
KEEPALIVE_SECONDS = 75.0
# How often idle and slow connections are looked for.
SWEEP_SECONDS = 1.0
# Bodies at most this long go out in one write with their head (one copy, one system call).
JOIN_BELOW = 64 * 1024

_PATHS = frozenset(PROXY_PATHS)
# The last chunk of a chunked stream (no trailers).
_LAST_CHUNK = b"0\r\n\r\n"
# The interim answer to a request head with "Expect: 100-continue".
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

Handler = Callable[[Any], Awaitable[Answer | web.StreamResponse]]


class FrontRequest(dict[Any, Any]):
    """What the handler chain reads of a request the front serves.

    The part of ``aiohttp.web.Request`` that :mod:`.envelope`, :mod:`.auth`,
    :mod:`.proxy` and :mod:`.forward` use for a non-streamed request; its
    items are the per-request state they keep under :mod:`.requestkeys`, as
    on aiohttp's request.
    """

    __slots__ = ("_body", "_conn", "app", "content_length", "headers", "path", "query_string")

    method = "POST"

    def __init__(
        self,
        conn: FrontConnection,
        path: str,
        query_string: str,
        headers: Fields,
        content_length: int,
    ) -> None:
        # No dict.__init__: a new dict is empty already.
        self._conn = conn
        self.app = conn.front.app
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.content_length = content_length
        self._body = b""  # set once it has all arrived

    async def read(self) -> bytes:
        return self._body

    def open_stream(self, headers: Mapping[str, str]) -> FrontStream:
        """The request's streamed answer (status 200), written by the front; see :class:`FrontStream`."""
        return FrontStream(self._conn, headers)


class FrontStream(web.StreamResponse):
    """A streamed answer the front writes itself, chunk by chunk, straight to the client's transport.

    An ``aiohttp.web.StreamResponse`` to the handler chain (the same
    ``prepare``, ``write``, ``write_eof`` and ``prepared``), so the relay
    (:mod:`.clientstream`) writes to either server's stream alike.
    ``write`` raises ``ConnectionResetError`` once the client is gone, as
    aiohttp's does, and waits while the client is not reading.
    """

    def __init__(self, conn: FrontConnection, headers: Mapping[str, str]) -> None:
        super().__init__(status=200, headers=headers)
        self._conn = conn
        self._started = False
        # The head, once prepared, until it goes out with the first chunk (one write, not two).
        self._head = b""
        self.ended = False

    @property
    def prepared(self) -> bool:
        return self._started

    async def prepare(self, request: Any) -> None:
        if not self._started:
            self._started = True
            self._head = self._conn.start_stream(self)

    async def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return  # an empty chunk would end the stream
        conn = self._conn
        transport = conn.transport
        if transport is None:
            raise ConnectionResetError("the client closed its connection")
        frame = b"%x\r\n%b\r\n" % (len(data), data)
        if self._head:
            frame, self._head = self._head + frame, b""
        transport.write(frame)
        if conn.write_paused:
            await conn.drained()

    async def write_eof(self, data: bytes = b"") -> None:
        if self.ended:
            return
        self.ended = True
        transport = self._conn.transport
        if transport is None:
            raise ConnectionResetError("the client closed its connection")
        end = b"%x\r\n%b\r\n%b" % (len(data), data, _LAST_CHUNK) if data else _LAST_CHUNK
        transport.write(self._head + end)


class Front:
    """The protocol factory of the router's port, and what its connections share."""

    def __init__(
        self,
        app: web.Application,
        aiohttp_server: Callable[[], asyncio.Protocol],
        handler: Handler,
        *,
        max_body_bytes: int,
        read_timeout: float,
        keepalive: float = KEEPALIVE_SECONDS,
    ) -> None:
        self.app = app
        self.aiohttp_server = aiohttp_server
        self.handler = handler
        self.max_body_bytes = max_body_bytes
        self.read_timeout = read_timeout
        self.keepalive = keepalive
        self.connections: set[FrontConnection] = set()
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._date = ""
        self._date_second = 0

    def __call__(self) -> FrontConnection:
        return FrontConnection(self)

    async def listen(
        self, host: str, port: int, *, reuse_port: bool | None, backlog: int, ssl: SSLContext | None = None
    ) -> int:
        """Accept connections on ``host:port`` (TLS with ``ssl``); the port bound."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            self, host, port, reuse_port=reuse_port, backlog=backlog, ssl=ssl
        )
        self._sweeper = loop.call_later(SWEEP_SECONDS, self._sweep)
        return int(self._server.sockets[0].getsockname()[1])

    def date(self) -> str:
        """The ``Date`` header's value, formatted once a second."""
        now = int(time.time())
        if now != self._date_second:
            self._date_second, self._date = now, formatdate(now, usegmt=True)
        return self._date

    def close(self) -> None:
        """Stop accepting; close connections with no request in flight."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.closing = True
            if conn.task is None:
                conn.close()

    async def drain(self, grace: float) -> None:
        """Let answers in flight finish for up to ``grace`` seconds, then cancel the rest."""
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=grace)
            for task in late:
                task.cancel()
            if late:
                await asyncio.wait(late)
        for conn in list(self.connections):
            conn.close()
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    def _sweep(self) -> None:
        now = asyncio.get_running_loop().time()
        for conn in list(self.connections):
            conn.check(now)
        self._sweeper = asyncio.get_running_loop().call_later(SWEEP_SECONDS, self._sweep)


class FrontConnection(asyncio.Protocol):
    """One client connection, while the front serves it."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self.task: asyncio.Task[None] | None = None
        # The streamed answer whose head went out, while its request is answered.
        self._stream: FrontStream | None = None
        # Resolved when the client reads again (or goes away), while a stream waits to write.
        self._drained: asyncio.Future[None] | None = None
        self.closing = False
        self._buf = bytearray()
        # The head in hand while its body arrives: the request, where its body starts, its length.
        self._pending: tuple[FrontRequest, int, int] | None = None
        self._close_after = False
        # The request in hand asked for 100 Continue, which has not been sent.
        self._expects_continue = False
        self._paused = False
        self.write_paused = False
        # Loop time of the first byte of a request still arriving, or of going idle.
        self._since = self._loop.time()
        self._idle = True

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        self.transport = None
        self._wake_writer()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._idle:
            self._idle = False
            self._since = self._loop.time()
        self._buf += data
        if self.task is not None or self.write_paused:
            # Busy answering, or the client is not reading its answers: hold what comes, up to a point.
            if len(self._buf) > PIPELINE_BYTES and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()
            return
        self._next()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()
        if self.task is None and self.transport is not None:
            if self._paused:
                self._paused = False
                self.transport.resume_reading()
            self._next()

    # The front's

    def check(self, now: float) -> None:
        """Close the connection when it idled past the keep-alive or a request is arriving too slowly."""
        if self.task is not None or self.transport is None:
            return
        limit = self.front.keepalive if self._idle else self.front.read_timeout
        if now - self._since > limit:
            self.close()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # Streams

    def start_stream(self, stream: FrontStream) -> bytes:
        """``stream``'s head, which :meth:`FrontStream.write` sends with the first chunk."""
        self._stream = stream
        close = self._close_after or self.closing
        return _head(200, "OK", stream.headers, "Transfer-Encoding: chunked", self.front.date(), close)

    async def drained(self) -> None:
        """Wait until the client reads again; ``ConnectionResetError`` when it went away instead."""
        if self.write_paused and self.transport is not None:
            self._drained = self._loop.create_future()
            try:
                await self._drained
            finally:
                self._drained = None
        if self.transport is None:
            raise ConnectionResetError("the client closed its connection")

    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # Requests

    def _next(self) -> None:
        """Start the request at the front of the buffer once it is whole, or hand the connection off."""
        if self.write_paused or self.transport is None:
            return
        buf = self._buf
        if self._pending is None:
            if not buf:
                return
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    self._hand_off()
                return
            pending = self._read_head(bytes(buf[:end]), end + 4)
            if pending is None:
                self._hand_off()
                return
            self._pending = pending
        request, start, length = self._pending
        if len(buf) < start + length:
            if self._expects_continue:
                # The client waits for this before it sends the body.
                self._expects_continue = False
                self.transport.write(_CONTINUE)
            return
        self._expects_continue = False
        body = bytes(buf[start : start + length])
        del buf[: start + length]
        self._pending = None
        request._body = body
        self.task = self._loop.create_task(self._serve(request))

    def _read_head(self, raw: bytes, start: int) -> tuple[FrontRequest, int, int] | None:
        """The request, where its body starts and its length; None when aiohttp should have it."""
        if raw.count(b"\n") != raw.count(b"\r\n") or raw.count(b"\r") != raw.count(b"\n"):
            return None  # a bare CR or LF
        line_end = raw.find(b"\r\n")
        if line_end < 0:
            return None  # no fields at all, so no Content-Length
        request_line = raw[:line_end].split(b" ")
        if len(request_line) != 3:
            return None
        method, target, version = request_line
        path, _, query = target.decode("utf-8", "surrogateescape").partition("?")
        if method != b"POST" or version != b"HTTP/1.1" or path not in _PATHS:
            return None
        fields = Fields(raw[line_end:])
        lowered = fields.lowered
        if (
            b"\r\n " in lowered  # a folded line
            or b"\r\n\t" in lowered
            or b"\r\ntransfer-encoding" in lowered
            or b"\r\nupgrade" in lowered
            or lowered.count(b"\r\ncontent-length") != 1  # none, repeated, or "Content-Length :"
        ):
            return None
        length = fields.get("content-length", "")
        if not (length.isascii() and length.isdigit()) or int(length) > self.front.max_body_bytes:
            return None
        if b"\r\nexpect" in lowered:
            # Only 100-continue, once (aiohttp refuses anything else with its 417).
            expect = fields.get("expect")
            if lowered.count(b"\r\nexpect") != 1 or expect is None or expect.lower() != "100-continue":
                return None
            self._expects_continue = True
        connection = fields.get("connection")
        if connection is not None and "close" in connection.lower():
            self._close_after = True
        size = int(length)
        return FrontRequest(self, path, query, fields, size), start, size

    def _hand_off(self) -> None:
        """Give this connection, and every byte of it in hand, to aiohttp for the rest of its life."""
        transport = self.transport
        assert transport is not None and self.task is None
        self.front.connections.discard(self)
        self.transport = None
        protocol = self.front.aiohttp_server()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        if self._paused:
            transport.resume_reading()
        if self._buf:
            protocol.data_received(bytes(self._buf))
        self._buf.clear()

    async def _serve(self, request: FrontRequest) -> None:
        try:
            try:
                response = await self.front.handler(request)
            except asyncio.CancelledError:
                # The client hung up (or shutdown ran out of grace): nobody to answer.
                return
            except Exception as exc:  # the envelope answers every error; this is its backstop
                log.exception("front: %s failed", request.path)
                response = error_response(exc)
            stream = self._stream
            if stream is None:
                written = self._write(response)
            else:
                # Nothing more can be said once a stream's head is out; one cut short is closed.
                written = response is stream and stream.ended
        finally:
            self.task = None
            self._stream = None
        transport = self.transport
        if transport is None:
            return
        if not written:
            transport.close()
            return
        if self._close_after or self.closing:
            transport.close()
            return
        self._idle, self._since = not self._buf, self._loop.time()
        if self._paused and not self.write_paused:
            self._paused = False
            transport.resume_reading()
        self._next()

    def _write(self, response: Answer | web.StreamResponse) -> bool:
        """Send ``response``; False when it cannot be (the connection is then closed, unanswered)."""
        transport = self.transport
        if transport is None:
            return False
        if type(response) is Answer:
            body = response.body
        else:
            # aiohttp's: the router's errors, a 429 relayed, whatever a handler made.
            body = response.body if isinstance(response, web.Response) else None
            if body is None:
                body = b""
        try:
            if not isinstance(body, bytes | bytearray):
                raise TypeError(f"a body of type {type(body).__name__}, not bytes")
            close = self._close_after or self.closing
            date = self.front.date()
            framing = f"Content-Length: {len(body)}"
            head = _head(response.status, response.reason, response.headers, framing, date, close)
        except (TypeError, ValueError) as err:
            log.error("front: cannot send a %d answer: %s", response.status, err)
            return False
        if len(body) < JOIN_BELOW:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        return True


def _head(
    status: int, reason: str, headers: Mapping[str, str], framing: str, date: str, close: bool
) -> bytes:
    """An answer's head, framed by ``framing`` (its length or chunked coding); ValueError for a CR
    or LF in a header (it would split the answer).

    The framing fields are the front's own: any in ``headers`` are dropped
    (looked up first: the answers the router makes never have them).
    """
    if (
        "content-length" in headers
        or "transfer-encoding" in headers
        or "connection" in headers
        or "date" in headers
    ):
        headers = {n: v for n, v in headers.items() if n.lower() not in _FRAMING}
    fields = "".join([f"{name}: {value}\r\n" for name, value in headers.items()])
    count = len(headers)
    if fields.count("\n") != count or fields.count("\r") != count:
        raise ValueError("a line break inside a header")
    tail = "Connection: close\r\n\r\n" if close else "\r\n"
    head = f"HTTP/1.1 {status} {reason}\r\n{fields}{framing}\r\nDate: {date}\r\n{tail}"
    return head.encode("latin-1")


_FRAMING = ("content-length", "transfer-encoding", "connection", "date")
