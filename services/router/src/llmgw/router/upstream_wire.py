"""The HTTP/1.1 wire of the router's client to engines: one connection, one answer at a time.

:class:`Connection` is the protocol object of one keep-alive connection;
llhttp (through httptools, the parser under uvicorn) parses an answer in
place as it arrives, and the body goes to the :class:`UpstreamResponse` the
caller reads. :mod:`.upstream` owns the pools of connections and says what
this client speaks and why it exists.

Compiled: services/router/setup.py builds this module with Cython (pure-Python
mode), so its classes are declared with ``cython.cclass`` and their fields
with ``cython.declare`` (C struct fields; ``visibility="public"`` where code
outside reads them). A field not declared cannot be set, compiled; the same
source runs uncompiled as ordinary Python.

Guarantees: a connection carries one request at a time and has one of three
states (``BUSY``, ``IDLE``, ``CLOSED``); it goes back to its pool
(``Pool.give_back``) once, as soon as its answer's last byte arrived, and
tells the pool when it closes (``Pool.forget``); an answer it cannot parse,
or one past the limits (:class:`WireLimits`), fails the caller with
:class:`UnreadableAnswer` and drops the connection.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Final, Protocol

import aiohttp
import cython
import httptools

from .fields import Fields

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled

# Unread body bytes a response holds before its connection stops reading.
HIGH_WATER = 256 * 1024

Key = tuple[str, str, int]  # scheme, host, port


class _State:
    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


# A connection's states (compared by identity: this runs on every read).
BUSY: Final = _State("BUSY")
IDLE: Final = _State("IDLE")
CLOSED: Final = _State("CLOSED")

# A response's headers until its head is read (read-only, so one serves every response).
_NO_HEADERS = Fields(b"")
_REASONS = {status.value: status.phrase for status in HTTPStatus}


@dataclass(frozen=True)
class WireLimits:
    """What an engine's answer may be (``limits`` settings; see docs/configuration.md)."""

    # An answer's head (status line and fields) larger than this is no engine's.
    max_head_bytes: int = 64 * 1024
    # Header fields in one answer.
    max_headers: int = 100
    # A whole (not streamed) answer's body; streams are relayed under flow control instead.
    max_answer_bytes: int = 64 * 1024 * 1024


class Pool(Protocol):
    """Where a connection goes back to when its answer is in, and says it closed."""

    def give_back(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...


# An engine sends the same few Content-Type fields again and again: each is parsed once, and
# kept in a bounded table (an engine chooses what it sends).
_CONTENT_TYPES: dict[bytes, tuple[str, str]] = {}
MAX_CONTENT_TYPES = 256


def _content_type(value: bytes) -> tuple[str, str]:
    """A Content-Type field's value as sent (decoded, stripped), and its media type, lowered."""
    found = _CONTENT_TYPES.get(value)
    if found is None:
        field = value.decode("utf-8", "surrogateescape").strip(" \t")
        found = (field, field.partition(";")[0].strip().lower())
        if len(_CONTENT_TYPES) >= MAX_CONTENT_TYPES:
            _CONTENT_TYPES.clear()
        _CONTENT_TYPES[value] = found
    return found


@cython.cclass
class Deadline:
    """Fails a wait's future with ``TimeoutError`` at its deadline, with one lazily re-armed timer.

    Waits come one after another (an answer's head per request on a
    connection, a body read per token on a stream) with deadlines that only
    move forward, so the timer is not replaced per wait: one armed at an
    earlier deadline is kept and, when it fires, re-arms itself at the
    current one. That is one timer per timeout period, not one per wait.
    """

    _at: float | None = cython.declare(object)
    _future: asyncio.Future[Any] | None = cython.declare(object)
    _loop: asyncio.AbstractEventLoop = cython.declare(object)
    _timer: asyncio.TimerHandle | None = cython.declare(object)

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future = None
        self._at = None
        self._timer = None

    @cython.ccall
    def wait(self, future: asyncio.Future[Any], at: float | None) -> None:
        """Fail ``future`` at ``at`` (loop time) unless it is done by then; None: no deadline."""
        self._future, self._at = future, at
        if at is not None and (self._timer is None or self._timer.when() > at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(at, self._fire)

    @cython.ccall
    def over(self) -> None:
        """The wait ended; the timer stays armed for the next."""
        self._future = self._at = None

    @cython.ccall
    def cancel(self) -> None:
        self.over()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self) -> None:
        self._timer = None
        future, at = self._future, self._at
        if future is None or future.done() or at is None:
            return
        if self._loop.time() >= at:
            future.set_exception(TimeoutError())
        else:
            self._timer = self._loop.call_at(at, self._fire)


class UnreadableAnswer(aiohttp.ClientError):
    """The engine's answer is not HTTP/1.1 this client can read."""


@cython.cclass
class UpstreamResponse:
    """One answer: status and headers once :meth:`Upstream.post` returns, the body as it comes.

    The subset of ``aiohttp.ClientResponse`` the proxy uses; ``content`` is
    the response itself (``readany``, ``at_eof``).
    """

    # __init__ sets every field that does not start as None: compiled, a new object's fields are
    # None, 0 or False; uncompiled, cython.declare leaves None as the class attribute.
    status: int = cython.declare(cython.int, visibility="public")
    # The head's field lines as llhttp gave them (see :attr:`headers`), once the head is read.
    _lines: list[bytes] | None = cython.declare(object, visibility="public")
    _headers: Fields | None = cython.declare(object)
    # The Content-Type field as sent ("" when absent), and its media type, lowered.
    content_type_field: str = cython.declare(object, visibility="public")
    content_type: str = cython.declare(object, visibility="public")
    # Fed by the connection itself (see Connection.data_received): its body pieces, their size.
    _body: list[bytes] = cython.declare(list, visibility="public")
    _buffered: int = cython.declare(cython.Py_ssize_t, visibility="public")
    _eof: bool = cython.declare(cython.bint, visibility="public")
    _error: BaseException | None = cython.declare(object, visibility="public")
    _waiter: asyncio.Future[None] | None = cython.declare(object, visibility="public")
    # The reads' deadline, made at the first read that waits (a small answer's never does).
    _deadline: Deadline | None = cython.declare(Deadline)
    _conn: Connection | None = cython.declare(object, visibility="public")
    _loop: asyncio.AbstractEventLoop = cython.declare(object)

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._loop = conn.loop
        self._body = []
        self._buffered = 0
        self._eof = False
        self.status = 0
        self.content_type_field = ""
        self.content_type = "application/octet-stream"

    @property
    def headers(self) -> Fields:
        """The answer's header fields, made when first asked for: the proxy reads an answer's
        framing and Content-Type as they are parsed, and its other fields only when it fails."""
        if self._headers is None:
            self._headers = _NO_HEADERS if self._lines is None else Fields(b"".join(self._lines))
        return self._headers

    @property
    def reason(self) -> str:
        return _REASONS.get(self.status, "")

    @property
    def content(self) -> UpstreamResponse:
        return self

    def at_eof(self) -> bool:
        return self._eof and not self._body

    def take_whole(self) -> bytes | None:
        """The whole body when it is all in hand, unread (taken without waiting; the response is
        then at its end); None when it is not (yet), or the answer failed."""
        if not self._eof or self._error is not None:
            return None
        body = self._body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        return data

    async def readany(self, deadline: float | None = None) -> bytes:
        """The body bytes received since the last call; ``b""`` at the end.

        Raises ``TimeoutError`` when nothing came by ``deadline`` (loop time);
        a relay reads once per token, with one timer per idle period
        (:class:`Deadline`).
        """
        body = self._body
        if not body:
            if self._error is not None:
                raise self._error
            if self._eof:
                return b""
            waiter = self._waiter = self._loop.create_future()
            timer = self._deadline
            if timer is None:
                timer = self._deadline = Deadline(self._loop)
            timer.wait(waiter, deadline)
            try:
                await waiter
            finally:
                self._waiter = None
                timer.over()
            # Woken by bytes (never an empty piece), the end, or a failure.
            if not body:
                if self._error is not None:
                    raise self._error
                return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        if self._buffered >= HIGH_WATER and self._conn is not None:
            self._conn.resume()
        self._buffered = 0
        return data

    async def read(self, deadline: float | None = None) -> bytes:
        """The rest of the body; ``TimeoutError`` when it is not all in by ``deadline``."""
        parts = []
        while chunk := await self.readany(deadline):
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with it: an unfinished answer's connection is closed (it cannot be reused)."""
        self.close()

    def close(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        conn, self._conn = self._conn, None
        if conn is not None and conn.response is self:
            conn.abort()

    # Called by the connection (which also feeds it body bytes itself: see data_received).

    @cython.ccall
    def _finish(self, error: BaseException | None = None) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._eof = True
        self._error = error
        self._conn = None
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


@cython.cclass
class Connection:
    """One connection (an ``asyncio.Protocol``); at most one request on it at a time.

    Its :attr:`state` is explicit: ``BUSY`` from the moment it is made or
    taken from the pool until its answer's last byte arrived, ``IDLE`` in the
    pool, ``CLOSED`` for good. It goes back to the pool once (``BUSY`` to
    ``IDLE``; a second attempt finds it no longer busy and does nothing), and
    never with bytes after its answer: any byte that arrives while it is idle,
    or after the answer's end in the same read, closes it, since it can only
    be the start of an answer to nobody (or a stray that would be read as the
    next request's). The answer is parsed by llhttp (httptools), which refuses
    an answer framed both by ``Content-Length`` and ``Transfer-Encoding``, a
    malformed chunk, or a bare CR or LF: such an answer fails its request and
    closes the connection.
    """

    loop: asyncio.AbstractEventLoop = cython.declare(object, visibility="public")
    key: Key = cython.declare(object, visibility="public")
    transport: asyncio.Transport | None = cython.declare(object, visibility="public")
    state: _State = cython.declare(object, visibility="public")  # BUSY, IDLE or CLOSED
    idle_since: float = cython.declare(cython.double, visibility="public")
    response: UpstreamResponse | None = cython.declare(UpstreamResponse, visibility="public")
    _pool: Pool = cython.declare(object)
    _limits: WireLimits = cython.declare(object)
    _head: asyncio.Future[UpstreamResponse] | None = cython.declare(object)
    _parser: httptools.HttpResponseParser = cython.declare(object)
    _seen_answer: bool = cython.declare(cython.bint)
    _lines: list[bytes] = cython.declare(list)
    _max_entries: int = cython.declare(cython.Py_ssize_t)
    _content_type: bytes | None = cython.declare(object)
    _length: bytes | None = cython.declare(object)
    _chunked: bool = cython.declare(cython.bint)
    _head_bytes: int = cython.declare(cython.Py_ssize_t)
    _in_head: bool = cython.declare(cython.bint)
    _framed: bool = cython.declare(cython.bint)
    _keep_alive: bool = cython.declare(cython.bint)
    _body_bytes: int = cython.declare(cython.Py_ssize_t)
    _body_cap: int = cython.declare(cython.Py_ssize_t)
    _pieces: list[bytes] = cython.declare(list)
    _complete: bool = cython.declare(cython.bint)
    _extra: bool = cython.declare(cython.bint)
    _refusal: str = cython.declare(str)
    _paused: bool = cython.declare(cython.bint)
    _head_by: Deadline = cython.declare(Deadline)

    def __init__(self, pool: Pool, key: Key, limits: WireLimits) -> None:
        # Looked up once per connection: asyncio.get_running_loop() costs a getpid system call.
        self.loop = asyncio.get_running_loop()
        self._pool = pool
        self.key = key
        self._limits = limits
        self.transport = None
        # A connection is made for a request: busy from the start.
        self.state = BUSY
        self.idle_since = 0.0
        self.response = None
        self._head = None
        self._parser = httptools.HttpResponseParser(self)
        self._seen_answer = False
        # The answer in hand: its header lines (as Fields wants them), the head's size so far.
        self._lines = []
        self._max_entries = 4 * limits.max_headers  # four entries of _lines per field
        # Content-Type and Content-Length as sent, and whether the answer is chunked.
        self._content_type = None
        self._length = None
        self._chunked = False
        self._head_bytes = 0
        self._in_head = True
        # How the body ends: "length" (Content-Length or chunked, llhttp knows), or "close".
        self._framed = True
        self._keep_alive = True
        self._body_bytes = 0
        self._body_cap = 0
        # Body bytes parsed from the read in hand, handed to the response once it is parsed.
        self._pieces = []
        # Set by on_message_complete; acted on once the read that ended the answer is parsed.
        self._complete = False
        # Set when a read held bytes after the answer's end.
        self._extra = False
        # Why a callback stopped the parser.
        self._refusal = ""
        self._paused = False
        # When the head of the answer in wait must be in.
        self._head_by = Deadline(self.loop)

    @property
    def closed(self) -> bool:
        return self.state is CLOSED

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.state = CLOSED
        self._head_by.cancel()
        self._pool.forget(self)
        if self._head is not None and not self._head.done():
            self._head.set_exception(
                aiohttp.ServerDisconnectedError("the engine closed the connection before answering")
            )
        response, self.response = self.response, None
        if response is not None:
            if not self._framed and not self._in_head:
                response._finish()  # an answer ended by the connection closing
            else:
                response._finish(aiohttp.ClientPayloadError("Response payload is not completed"))

    # asyncio.Protocol's defaults, written out: a compiled class inherits nothing from it. Requests
    # are small and written whole, so a full write buffer needs no waiting.

    def eof_received(self) -> bool | None:
        return None  # the transport closes; connection_lost follows

    def pause_writing(self) -> None:
        pass

    def resume_writing(self) -> None:
        pass

    def data_received(self, data: bytes) -> None:
        if self.state is not BUSY or self.response is None:
            # Nobody's answer: an idle connection's, or after the end of one. Never reused.
            self.abort()
            return
        self._seen_answer = True
        if self._in_head:
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail("the engine switched protocols")
            return
        except httptools.HttpParserError as err:
            if self._complete:
                # The answer was whole; what followed it is nobody's.
                self._extra = True
            else:
                self._fail(self._refusal or f"unreadable answer from the engine ({err})")
                return
        pieces = self._pieces
        if pieces:
            # The read's body bytes in one piece: a stream's read holds a chunk per event.
            response = self.response
            if response is not None:
                data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
                # Fed here rather than by a method of the response: this runs for every read.
                response._body.append(data)
                buffered = response._buffered = response._buffered + len(data)
                if buffered >= HIGH_WATER and response._conn is not None:
                    self.pause()
                waiter = response._waiter
                if waiter is not None and not waiter.done():
                    waiter.set_result(None)
            pieces.clear()
        if self._complete:
            self._done()
        elif self._in_head and self._head_bytes > self._limits.max_head_bytes:
            self._fail(f"an answer head over {self._limits.max_head_bytes} bytes")

    # httptools' callbacks

    def on_message_begin(self) -> None:
        if self._complete:
            # A second answer to one request (stray bytes after the first): refused.
            self._extra = True
            raise _Stop
        self._in_head = True
        self._lines = []
        self._content_type = self._length = None
        self._chunked = False

    def on_header(self, name: bytes, value: bytes) -> None:
        # llhttp has checked both: a token and a value with no CR, LF or NUL. The field count is
        # checked once the head is whole; until then data_received bounds the head's bytes.
        self._lines += (b"\r\n", name, b":", value)
        # The fields this client reads itself, noted as they pass (a length test first).
        size = len(name)
        if size == 12 or size == 14 or size == 17:
            lowered = name.lower()
            if lowered == b"content-type":
                self._content_type = value
            elif lowered == b"content-length":
                self._length = value
            elif lowered == b"transfer-encoding":
                self._chunked = True

    def on_headers_complete(self) -> None:
        parser = self._parser
        status = parser.get_status_code()
        self._in_head = False
        if status < 200:
            return  # an interim answer: the real one follows
        response = self.response
        assert response is not None and self._head is not None
        if len(self._lines) > self._max_entries:
            self._refusal = f"an answer with over {self._limits.max_headers} header fields"
            raise _Stop
        response.status = status
        response._lines = self._lines  # a new list per answer (on_message_begin)
        if self._content_type is not None:
            found = _CONTENT_TYPES.get(self._content_type) or _content_type(self._content_type)
            response.content_type_field, response.content_type = found
        length = self._length
        self._framed = self._chunked or length is not None or status == 204 or status == 304
        self._keep_alive = self._framed and parser.should_keep_alive()
        # A stream is relayed under flow control; anything else is held whole, so it is capped.
        if response.content_type == "text/event-stream":
            self._body_cap = 0
        else:
            cap = self._body_cap = self._limits.max_answer_bytes
            if length is not None and int(length) > cap:
                self._refusal = f"an answer of {int(length)} bytes, over {cap}"
                raise _Stop
        self._body_bytes = 0
        self._head_by.over()
        if not self._head.done():
            self._head.set_result(response)

    def on_body(self, body: bytes) -> None:
        if self._body_cap:
            self._body_bytes += len(body)
            if self._body_bytes > self._body_cap:
                self._refusal = f"an answer over {self._body_cap} bytes"
                raise _Stop
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self._parser.get_status_code() >= 200:
            self._complete = True

    # The request.

    def send(self, request: bytes, head_by: float | None = None) -> asyncio.Future[UpstreamResponse]:
        """Write ``request``; the future has the answer once its head is in.

        It fails with ``TimeoutError`` when the head is not in by
        ``head_by`` (loop time); the connection keeps one timer for its
        requests' heads, not one per request (:class:`Deadline`).
        """
        assert self.transport is not None and self.state is BUSY
        self._head = self.loop.create_future()
        self._seen_answer = False
        self._complete = self._extra = False
        self._in_head = True
        self._head_bytes = 0
        self._refusal = ""
        self.response = UpstreamResponse(self)
        self._head_by.wait(self._head, head_by)
        self.transport.write(request)
        return self._head

    @property
    def answered_nothing(self) -> bool:
        return not self._seen_answer

    @cython.ccall
    def abort(self) -> None:
        """Close for good (idempotent); an answer still due fails (see :meth:`connection_lost`)."""
        self.state = CLOSED
        self._head_by.cancel()
        if self.transport is not None:
            self.transport.abort()

    @cython.ccall
    def pause(self) -> None:
        if not self._paused and self.transport is not None and self.state is BUSY:
            self._paused = True
            self.transport.pause_reading()

    @cython.ccall
    def resume(self) -> None:
        if self._paused and self.transport is not None and self.state is BUSY:
            self._paused = False
            self.transport.resume_reading()

    @cython.ccall
    def _done(self) -> None:
        """The answer is whole: the response ends, the connection goes back or is closed."""
        response, self.response = self.response, None
        self._complete = False
        if response is not None:
            response._finish()
        if self._keep_alive and not self._extra and self.state is BUSY:
            if self._paused and self.transport is not None:
                # Paused for the answer's unread bytes, which the response now holds: an idle
                # connection must read, so that the next answer (or a stray that closes it) arrives.
                self._paused = False
                self.transport.resume_reading()
            self._pool.give_back(self)
        else:
            self.abort()

    @cython.ccall
    def _fail(self, message: str) -> None:
        self._pieces.clear()
        error = UnreadableAnswer(message)
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        response, self.response = self.response, None
        if response is not None:
            response._finish(aiohttp.ClientPayloadError(message))
        self.abort()


class _Stop(Exception):
    """Raised in a parser callback to stop parsing an answer refused (see ``_refusal``)."""
