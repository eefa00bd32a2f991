"""One client connection of the front: llhttp's callbacks, the request queue, the timers' checks.

See :mod:`.front` for what the front guarantees; this module is its
per-connection half (:class:`FrontConnection`), apart from the factory
(:class:`.front.Front`) that the connections share.

Compiled: services/router/setup.py builds this module with Cython (pure-Python
mode), so :class:`FrontConnection` is a ``cython.cclass`` whose fields are
declared (``cython.declare``: C struct fields; ``visibility="public"`` where
code outside reads them). A field not declared cannot be set, compiled; the
same source runs uncompiled as ordinary Python.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import cython
import httptools
from aiohttp import web

from .answer import Answer
from .config import Limits
from .errors import HttpRefusal, error_response
from .fields import Fields
from .frontrules import body_too_large, head_refusal, head_too_large, target
from .frontsocket import FrontSocket, handshake
from .frontwire import FrontRequest, FrontStream, answer_head
from .proxy import PROXY_PATHS
from .seam import NOT_A_WEBSOCKET, Reply

log = logging.getLogger(__name__)

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled

# How often idle and slow connections are looked for.
SWEEP_SECONDS = 1.0
# Bodies at most this long go out in one write with their head (one copy, one system call).
JOIN_BELOW = 64 * 1024

_PATHS = frozenset(PROXY_PATHS)
# The interim answer to a request head with "Expect: 100-continue".
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"

# Lengths of the field names the front acts on: host, expect, connection, content-length,
# transfer-encoding (a length test first: most fields are none of them).
_WATCHED_LENGTHS = frozenset((4, 6, 10, 14, 17))
# The methods' names as the handlers see them (others are decoded when they come).
_METHODS = {m.encode(): m for m in ("GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH")}
# A connection's phases (the sweep's view).
_IDLE, _HEAD, _BODY = 0, 1, 2

Handler = Callable[[FrontRequest], Awaitable[Reply]]


class FrontShared(Protocol):
    """What a connection reads of the front that made it (:class:`.front.Front`)."""

    connections: set[FrontConnection]
    limits: Limits
    handler: Handler
    others: Callable[[str, str], Handler]
    # The paths a WebSocket may be opened on (GET with an upgrade).
    sockets: frozenset[str]

    def date(self) -> str: ...


class _Refused(Exception):
    """Raised in a parser callback: the request is refused with this status."""

    def __init__(self, refusal: HttpRefusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


@cython.cclass
class FrontConnection:
    """One client connection (an ``asyncio.Protocol``)."""

    # Read by the front (:mod:`.front`), a stream (:mod:`.frontwire`) or a socket (:mod:`.frontsocket`).
    front: FrontShared = cython.declare(object, visibility="public")
    limits: Limits = cython.declare(object, visibility="public")
    transport: asyncio.Transport | None = cython.declare(object, visibility="public")
    # The connection's serving task (:meth:`_serve`), and whether it is answering a request now.
    task: asyncio.Task[None] | None = cython.declare(object, visibility="public")
    busy: bool = cython.declare(cython.bint, visibility="public")
    closing: bool = cython.declare(cython.bint, visibility="public")
    write_paused: bool = cython.declare(cython.bint, visibility="public")
    queue: deque[tuple[FrontRequest, bool] | HttpRefusal] = cython.declare(object, visibility="public")
    # Its own (see __init__); whether reading is paused is readable, for the tests of back-pressure.
    _max_line: int = cython.declare(cython.Py_ssize_t)
    _max_head: int = cython.declare(cython.Py_ssize_t)
    _max_headers: int = cython.declare(cython.Py_ssize_t)
    _max_body: int = cython.declare(cython.Py_ssize_t)
    _loop: asyncio.AbstractEventLoop = cython.declare(object)
    _parser: httptools.HttpRequestParser = cython.declare(object)
    _stream: FrontStream | None = cython.declare(object)
    _drained: asyncio.Future[None] | None = cython.declare(object)
    _waiter: asyncio.Future[FrontRequest | None] | None = cython.declare(object)
    _ended: bool = cython.declare(cython.bint)
    _close_after: bool = cython.declare(cython.bint)
    _paused: bool = cython.declare(cython.bint, visibility="readonly")
    _blocked_since: float = cython.declare(cython.double)
    _busy_since: float = cython.declare(cython.double)
    _phase: int = cython.declare(cython.int)
    _since: float = cython.declare(cython.double)
    _body_at: float = cython.declare(cython.double)
    _url: bytes = cython.declare(bytes)
    _lines: list[bytes] = cython.declare(list)
    _unparsed_head: int = cython.declare(cython.Py_ssize_t)
    _began: bool = cython.declare(cython.bint)
    _hosts: list[bytes] = cython.declare(list)
    _length: bytes | None = cython.declare(object)
    _coding: bytes | None = cython.declare(object)
    _expect: bytes | None = cython.declare(object)
    _close_token: bool = cython.declare(cython.bint)
    _upgrade: bool = cython.declare(cython.bint)
    _request: FrontRequest | None = cython.declare(object)
    _request_close: bool = cython.declare(cython.bint)
    _body: list[bytes] = cython.declare(list)
    _body_size: int = cython.declare(cython.Py_ssize_t)
    _expects_continue: bool = cython.declare(cython.bint)
    _upgrading: bool = cython.declare(cython.bint)
    _early: bytes = cython.declare(bytes)
    _upgrade_target: bytes = cython.declare(bytes)
    _upgrade_request: FrontRequest | None = cython.declare(object)
    _socket: FrontSocket | None = cython.declare(object)

    def __init__(self, front: FrontShared) -> None:
        self.front = front
        limits = self.limits = front.limits
        # The limits read per request, looked up once: on_header runs for every field of every
        # request, and an attribute of the settings (a pydantic model) costs several of a C field.
        self._max_line = limits.max_line_bytes
        self._max_head = limits.max_head_bytes
        self._max_headers = limits.max_headers
        self._max_body = limits.max_body_bytes
        self._loop = asyncio.get_running_loop()
        self.transport = None
        self._parser = httptools.HttpRequestParser(self)
        self.task = None
        self.busy = False
        # Resolved with the next request to answer (None: the connection is gone) while the
        # serving task waits for one.
        self._waiter = None
        # The streamed answer whose head went out, while its request is answered.
        self._stream = None
        # Resolved when the client reads again (or goes away), while a stream waits to write.
        self._drained = None
        self.closing = False
        # Parsed requests waiting for the one answered (with whether to close after each), or the
        # refusal that ends the connection.
        self.queue = deque()
        # No byte is parsed any more: a refusal or a last request is queued.
        self._ended = False
        self._close_after = False  # of the request answered
        self._paused = False
        self.write_paused = False
        self._blocked_since = 0.0
        self._busy_since = 0.0
        # The phase of the request arriving, and when it began (or the connection went idle).
        self._phase = _IDLE
        self._since = self._loop.time()
        self._body_at = 0.0
        # The request arriving: its target, header lines, framing and body so far.
        self._url = b""
        self._lines = []
        self._unparsed_head = 0
        self._began = False
        self._hosts = []
        self._length = None
        self._coding = None
        self._expect = None
        self._close_token = False
        self._upgrade = False
        self._request = None
        self._request_close = False
        self._body = []
        self._body_size = 0
        self._expects_continue = False
        # A WebSocket upgrade asked for (``_upgrading``: the bytes after its head kept in ``_early``
        # until the handler answers it), and the socket once it is opened (:mod:`.frontsocket`).
        self._upgrading = False
        self._early = b""
        self._upgrade_target = b""
        self._upgrade_request = None
        self._socket = None

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        connections = self.front.connections
        if len(connections) >= self.limits.max_client_connections:
            refusal = HttpRefusal(
                503,
                "too_many_connections",
                f"This router worker has {len(connections)} connections open, its limit "
                "(limits.max_client_connections); retry shortly or on another router.",
            )
            self._ended = True
            self._write(error_response(refusal), close=True)
            self.close()
            return
        connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.front.connections.discard(self)
        self.transport = None
        self._wake_writer()
        if self._socket is not None:
            # The session ends by itself (its receive raises) and is counted as the 101 it was.
            self._socket.lost()
        elif self.busy:
            if self.task is not None and not (self._stream and self._stream.ended):
                # Cancelled: the answer stops (an engine's stream with it). Not once a stream has
                # ended: the client has its whole answer, and the handler only finishes its accounts.
                self.task.cancel()
        elif self._waiter is not None:
            self._waiter.set_result(None)  # the serving task ends

    def data_received(self, data: bytes) -> None:
        if self._socket is not None:
            self._socket.feed(data)
            return
        if self._upgrading:
            # A client that sends before the 101: kept (bounded) for the socket.
            self._early += data
            if len(self._early) > self.limits.max_head_bytes + self.limits.realtime_max_message_bytes:
                self._upgrading = False
                self.close()
            return
        if self._ended:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as err:
            cause = err.__context__
            if not isinstance(cause, _Refused):
                raise  # a bug of ours in a callback: the envelope's backstop does not reach here
            self._refuse(cause.refusal)
        except httptools.HttpParserUpgrade as upgrade:
            # The request that asked is whole; what follows is another protocol: answered, then closed,
            # unless it is a WebSocket the handler opens (:meth:`upgrade`).
            self._end_after_last()
            last = self.queue[-1] if self.queue else None
            if isinstance(last, tuple) and last[0].method == "GET" and last[0].path in self.front.sockets:
                self._upgrading = True
                self._upgrade_target = self._url
                self._upgrade_request = last[0]
                offset = upgrade.args[0] if upgrade.args and isinstance(upgrade.args[0], int) else len(data)
                self._early = data[offset:]
        except httptools.HttpParserInvalidMethodError:
            self._refuse(HttpRefusal(501, "method_not_implemented", "Unknown HTTP method."))
        except httptools.HttpParserError as err:
            self._refuse(HttpRefusal(400, "bad_request", f"Malformed HTTP request: {err}."))
        else:
            if self._phase == _HEAD:
                # Bytes of a head still incomplete (httptools holds a field's value until its end):
                # reads after the one it began in, so at most one read more than the limit is held.
                if self._began:
                    self._began = False
                else:
                    self._unparsed_head += len(data)
                if self._unparsed_head > self.limits.max_head_bytes:
                    self._refuse(head_too_large(self.limits))
            elif self._phase == _BODY:
                self._body_at = self._loop.time()
        self._next()

    def eof_received(self) -> bool | None:
        # The client half-closed: what it sent is answered, then the transport closes (asyncio.Protocol's
        # default, written out: a compiled class inherits nothing from asyncio.Protocol).
        return None

    def pause_writing(self) -> None:
        self.write_paused = True
        self._blocked_since = self._loop.time()

    def resume_writing(self) -> None:
        self.write_paused = False
        self._wake_writer()
        self._next()

    # httptools' callbacks

    def on_message_begin(self) -> None:
        self._phase = _HEAD
        self._since = self._loop.time()
        self._url = b""
        self._lines = []
        self._unparsed_head = 0
        self._began = True
        self._hosts = []
        self._length = self._coding = self._expect = None
        self._close_token = self._upgrade = False

    def on_url(self, piece: bytes) -> None:
        self._url += piece
        if len(self._url) > self._max_line:
            raise _Refused(
                HttpRefusal(
                    414,
                    "uri_too_long",
                    f"The request target is over {self.limits.max_line_bytes} bytes (limits.max_line_bytes).",
                )
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp has checked both: a token, and a value with no CR, LF, NUL or other control byte.
        # The head's limits are checked once it is whole (:meth:`_check_head`); until then the
        # bytes held are bounded by data_received's count of an unfinished head's bytes.
        self._lines += (b"\r\n", name, b":", value)
        if len(name) in _WATCHED_LENGTHS:
            # The two every request has, here; the rarer ones in _watch.
            lowered = name.lower()
            if lowered == b"host":
                self._hosts.append(value)
            elif lowered == b"content-length":
                self._length = value
            else:
                self._watch(lowered, value)

    @cython.ccall
    def _check_head(self, raw: bytes) -> None:
        """Refuse a head over the limits: its longest field line, its field count, its size.

        ``raw`` is its field lines joined; each line of the head is a field's
        ``name: value`` and CRLF, one byte more than its ``\r\nname:value`` in ``raw``.
        """
        fields = len(self._lines) >> 2
        limits = self.limits
        # No line can be over the limit when all of them together are not.
        if len(raw) + 3 > self._max_line and max(map(len, raw.split(b"\r\n"))) + 3 > self._max_line:
            message = f"A header line is over {limits.max_line_bytes} bytes (limits.max_line_bytes)."
            raise _Refused(HttpRefusal(431, "headers_too_large", message))
        if fields > self._max_headers:
            message = f"The request has over {limits.max_headers} header fields (limits.max_headers)."
            raise _Refused(HttpRefusal(431, "headers_too_large", message))
        if len(self._url) + len(raw) + fields > self._max_head:
            raise _Refused(head_too_large(limits))

    @cython.ccall
    def _watch(self, lowered: bytes, value: bytes) -> None:
        """Note a field the front itself acts on (besides Host and Content-Length)."""
        if lowered == b"transfer-encoding":
            self._coding = value
        elif lowered == b"expect":
            self._expect = value
        elif lowered == b"connection":
            tokens = [t.strip() for t in value.lower().split(b",")]
            self._close_token |= b"close" in tokens
            self._upgrade |= b"upgrade" in tokens

    def on_headers_complete(self) -> None:
        parser = self._parser
        raw = b"".join(self._lines)
        self._check_head(raw)
        version = parser.get_http_version()
        refusal = head_refusal(version, self._hosts, self._coding, self._expect)
        if refusal is not None:
            raise _Refused(refusal)
        # llhttp has checked the digits (and that the number fits 64 bits).
        length = int(self._length) if self._length is not None else None
        if length is not None and length > self._max_body:
            raise _Refused(body_too_large(self.limits))
        path, query = target(self._url)
        method = parser.get_method()
        self._request = FrontRequest(
            self,
            _METHODS.get(method) or method.decode("ascii"),
            path,
            query,
            Fields(raw),
            length if self._coding is None else None,
            version == "1.0",
        )
        self._request_close = not parser.should_keep_alive() or self._close_token or self._upgrade
        self._expects_continue = self._expect is not None and (length != 0 or self._coding is not None)
        self._body = []
        self._body_size = 0
        self._phase = _BODY
        self._body_at = self._loop.time()

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self._max_body:
            raise _Refused(body_too_large(self.limits))
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        request.body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        if request.content_length is None and self._coding is not None:
            request.content_length = self._body_size
        self._request, self._body = None, []
        self._expects_continue = False
        self._phase = _IDLE
        self._since = self._loop.time()
        self.queue.append((request, self._request_close))
        if self._request_close:
            self._ended = True

    def check(self, now: float) -> None:
        """Close the connection when it idled, a request is arriving too slowly, or its answer is
        stuck (see the module docstring)."""
        if self.transport is None:
            return
        limits = self.limits
        # Aborted, not closed: a close waits for the write buffer to drain, which it will not.
        if self.write_paused and now - self._blocked_since > limits.client_write_timeout_seconds:
            log.info("front: closing a connection whose client stopped reading")
            self.transport.abort()
            return
        if self.busy:
            if self._socket is not None:
                return  # a WebSocket session keeps its own deadlines (:mod:`.realtime`)
            if now - self._busy_since > limits.request_timeout_seconds + SWEEP_SECONDS:
                log.info("front: closing a connection whose answer ran past the request timeout")
                self.transport.abort()
            return
        if self.queue or self._ended:
            return
        if self._phase == _IDLE:
            if now - self._since > limits.keepalive_timeout_seconds:
                self.close()
            return
        slow_head = self._phase == _HEAD and now - self._since > limits.head_timeout_seconds
        slow_body = self._phase == _BODY and now - self._body_at > limits.body_idle_timeout_seconds
        if slow_head or slow_body or now - self._since > limits.client_read_timeout_seconds:
            self._refuse(
                HttpRefusal(408, "request_timeout", "The request did not arrive in time; send it whole.")
            )
            self._next()

    @cython.ccall
    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    # Streams (the connection as :class:`.frontwire.StreamOwner`)

    def writer(self) -> asyncio.Transport | None:
        return self.transport

    def start_stream(self, stream: FrontStream) -> bytes:
        """``stream``'s head, which :meth:`FrontStream.write` sends with the first chunk."""
        self._stream = stream
        if not stream.chunked:
            self._close_after = True  # an unframed stream ends with the connection
        close = self._close_after or self.closing
        framing = "Transfer-Encoding: chunked" if stream.chunked else ""
        return answer_head(200, "OK", stream.headers, framing, self.front.date(), close)

    @property
    def socket_open(self) -> bool:
        """Whether this connection is a WebSocket now (:meth:`upgrade`)."""
        return self._socket is not None

    def upgrade(self, request: FrontRequest, headers: dict[str, str], max_size: int) -> FrontSocket:
        """Open ``request``'s WebSocket: the 101 goes out now; HttpRefusal when it cannot be."""
        if request is not self._upgrade_request or self.transport is None or self._socket is not None:
            raise HttpRefusal(400, "not_a_websocket", NOT_A_WEBSOCKET)
        head = b"GET %b HTTP/1.1%b\r\n\r\n" % (self._upgrade_target, request.headers.raw)
        protocol, response = handshake(head, max_size, headers)
        if response.status_code != 101:
            detail = response.body.decode(errors="replace").strip() if response.body else ""
            raise HttpRefusal(400, "not_a_websocket", f"{NOT_A_WEBSOCKET} {detail}".strip())
        socket = self._socket = FrontSocket(self, protocol, headers)
        if self._paused:
            # Paused while the request was queued behind another: the socket reads from now on.
            self._paused = False
            self.transport.resume_reading()
        early, self._early = self._early, b""
        if early:
            socket.feed(early)
        return socket

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

    @cython.ccall
    def _wake_writer(self) -> None:
        if self._drained is not None and not self._drained.done():
            self._drained.set_result(None)

    # Requests

    @cython.ccall
    def _refuse(self, refusal: HttpRefusal) -> None:
        """Answer ``refusal`` after the requests before it, then close; nothing more is read."""
        if self._ended and self.queue and isinstance(self.queue[-1], HttpRefusal):
            return
        self._ended = True
        self._phase = _IDLE
        self.queue.append(refusal)
        if self.transport is not None and not self._paused:
            self._paused = True
            self.transport.pause_reading()

    @cython.ccall
    def _end_after_last(self) -> None:
        self._ended = True
        if self.queue:
            last = self.queue[-1]
            if not isinstance(last, HttpRefusal):
                self.queue[-1] = (last[0], True)

    @cython.ccall
    def _next(self) -> None:
        """Start answering the next request parsed, when nothing is being answered."""
        transport = self.transport
        if transport is None:
            return
        if not self.busy and not self.write_paused and self.queue:
            item = self.queue.popleft()
            if isinstance(item, HttpRefusal):
                self._write(error_response(item), close=True)
                transport.close()
                return
            request, self._close_after = item
            self.busy = True
            self._busy_since = self._loop.time()
            waiter = self._waiter
            if waiter is not None:
                self._waiter = None
                waiter.set_result(request)
            else:
                self.task = self._loop.create_task(self._serve(request))
        if self.queue:
            # The next one waits: read no further until it is answered.
            if not self._paused:
                self._paused = True
                transport.pause_reading()
        elif self._paused and not self._ended:
            self._paused = False
            transport.resume_reading()
        if self._expects_continue and not self.busy and not self.queue:
            # The client waits for this before it sends the body.
            self._expects_continue = False
            transport.write(_CONTINUE)

    async def _serve(self, request: FrontRequest | None) -> None:
        """The connection's serving task: answers ``request``, then each one :meth:`_next` hands it
        (through ``_waiter``), until the connection closes.

        One task per connection, not per request: a task's creation, its first step scheduled and
        its end cost about twice a future's hand-over to a task that waits (docs/benchmarks.md).
        The requests of one connection therefore share the task's context (``contextvars``): the
        router sets context variables only in ``with`` blocks (the tracing spans), which reset them.
        """
        loop = self._loop
        task = self.task
        assert task is not None  # set by _next before this coroutine first runs
        response: Reply | None = None
        try:
            while request is not None:
                try:
                    try:
                        if request.method == "POST" and request.path in _PATHS:
                            response = await self.front.handler(request)
                        else:
                            response = await self.front.others(request.method, request.path)(request)
                    except asyncio.CancelledError:
                        # The client hung up (or shutdown ran out of grace): nobody to answer.
                        return
                    except Exception as exc:  # the envelope answers every error; this is its backstop
                        log.exception("front: %s failed", request.path)
                        response = error_response(exc)
                    written = self._sent(request, response)
                finally:
                    self.busy = False
                    self._stream = None
                # Dropped before the wait: an idle connection keeps nothing of its last request or
                # answer (a body may be megabytes) alive.
                request = response = None
                transport = self.transport
                if transport is None:
                    return
                if not written or self._close_after or self.closing:
                    transport.close()
                    return
                if self._phase == _IDLE:
                    self._since = loop.time()
                if task.cancelling():
                    # A cancellation asked of this task and not taken back (a handler that went on):
                    # the task is not reused, so the next request does not begin with it pending.
                    break
                waiter = self._waiter = loop.create_future()
                self._next()
                request = await waiter
        finally:
            self._waiter = None
            if self.task is task:
                self.task = None
                self.busy = False
        self._next()

    @cython.ccall
    def _sent(self, request: FrontRequest, response: Reply) -> bool:
        """Send ``request``'s answer, unless it went out already; whether the connection may go on."""
        stream = self._stream
        if request is self._upgrade_request:
            # A WebSocket's session has ended (its closing handshake done), or it never opened.
            return response is self._socket or self._write(response, close=True)
        if stream is None:
            return self._write(response, close=self._close_after or self.closing)
        # Nothing more can be said once a stream's head is out; one cut short is closed.
        return response is stream and stream.ended

    @cython.ccall
    def _write(self, response: Reply, *, close: bool) -> bool:
        """Send ``response``; False when it cannot be (the connection is then closed, unanswered)."""
        transport = self.transport
        if transport is None:
            return False
        if type(response) is Answer:
            body: object = response.body
            reason = response.reason
        elif isinstance(response, web.Response):
            # aiohttp's: the router's errors, whatever a non-proxy handler made.
            body = response.body if response.body is not None else b""
            reason = response.reason
        else:
            log.error("front: cannot send a %s as a whole answer", type(response).__name__)
            return False
        try:
            if not isinstance(body, bytes | bytearray):
                raise TypeError(f"a body of type {type(body).__name__}, not bytes")
            framing = f"Content-Length: {len(body)}"
            head = answer_head(response.status, reason, response.headers, framing, self.front.date(), close)
        except (TypeError, ValueError) as err:
            log.error("front: cannot send a %d answer: %s", response.status, err)
            return False
        if len(body) < JOIN_BELOW:
            transport.write(head + body)
        else:
            transport.writelines((head, body))
        return True
