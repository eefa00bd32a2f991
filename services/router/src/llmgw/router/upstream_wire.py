"""The HTTP/1.1 wire of the router's client to engines: one connection, one answer at a time.

:class:`Connection` is the protocol object of one keep-alive connection;
it parses an answer in place as it arrives and feeds the body to the
:class:`UpstreamResponse` the caller reads. :mod:`.upstream` owns the
pools of connections and says what this client speaks and why it exists.

Guarantees: a connection carries one request at a time; it goes back to
its pool (``Pool.give_back``) as soon as its answer's last byte arrived,
and tells the pool when it closes (``Pool.forget``); an answer it cannot
parse fails the caller with :class:`UnreadableAnswer` and drops the
connection.
"""

from __future__ import annotations

import asyncio
import functools
import re
from itertools import repeat
from typing import Any, Protocol

import aiohttp

from .fields import Fields

# Unread body bytes a response holds before its connection stops reading.
HIGH_WATER = 256 * 1024
# An answer's head larger than this is no engine's.
MAX_HEAD_BYTES = 64 * 1024

Key = tuple[str, str, int]  # scheme, host, port

# A response's headers until its head is read (read-only, so one serves every response).
_NO_HEADERS = Fields(b"")


class Pool(Protocol):
    """Where a connection goes back to when its answer is in, and says it closed."""

    def give_back(self, conn: Connection) -> None: ...
    def forget(self, conn: Connection) -> None: ...


# An engine sends the same few status lines and Content-Type fields again and again: each is
# parsed once (functools' cache; a bounded one, since an engine chooses what it sends).
@functools.lru_cache(maxsize=256)
def _status_line(line: bytes) -> tuple[bool, int, str]:
    """(HTTP/1.0?, status, reason) of a status line; ValueError when it is none."""
    version, _, rest = line.decode("latin-1").partition(" ")
    code, _, reason = rest.partition(" ")
    status = int(code)
    if not version.startswith("HTTP/1.") or not 100 <= status <= 599:
        raise ValueError(f"status line {line!r}")
    return version == "HTTP/1.0", status, reason


@functools.lru_cache(maxsize=256)
def _media_type(field: str) -> str:
    """The lowered media type of a Content-Type field."""
    return field.partition(";")[0].strip().lower()


class Deadline:
    """Fails a wait's future with ``TimeoutError`` at its deadline, with one lazily re-armed timer.

    Waits come one after another (an answer's head per request on a
    connection, a body read per token on a stream) with deadlines that only
    move forward, so the timer is not replaced per wait: one armed at an
    earlier deadline is kept and, when it fires, re-arms itself at the
    current one. That is one timer per timeout period, not one per wait.
    """

    __slots__ = ("_at", "_future", "_loop", "_timer")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._future: asyncio.Future[Any] | None = None
        self._at: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def wait(self, future: asyncio.Future[Any], at: float | None) -> None:
        """Fail ``future`` at ``at`` (loop time) unless it is done by then; None: no deadline."""
        self._future, self._at = future, at
        if at is not None and (self._timer is None or self._timer.when() > at):
            if self._timer is not None:
                self._timer.cancel()
            self._timer = self._loop.call_at(at, self._fire)

    def over(self) -> None:
        """The wait ended; the timer stays armed for the next."""
        self._future = self._at = None

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


class UpstreamResponse:
    """One answer: status and headers once :meth:`Upstream.post` returns, the body as it comes.

    The subset of ``aiohttp.ClientResponse`` the proxy uses; ``content`` is
    the response itself (``readany``, ``at_eof``).
    """

    # Until the head is read, and for what an answer rarely changes: class defaults, so that
    # making one response (once per request) sets only what differs.
    status = 0
    reason = ""
    headers: Fields = _NO_HEADERS
    # The Content-Type field as sent ("" when absent), and its media type, lowered.
    content_type_field = ""
    content_type = "application/octet-stream"
    _buffered = 0
    _eof = False
    _error: BaseException | None = None
    _waiter: asyncio.Future[None] | None = None
    # The reads' deadline, made at the first read that waits (a small answer's never does).
    _deadline: Deadline | None = None

    def __init__(self, conn: Connection) -> None:
        self._conn: Connection | None = conn
        self._loop = conn.loop
        self._body: list[bytes] = []

    @property
    def content(self) -> UpstreamResponse:
        return self

    def at_eof(self) -> bool:
        return self._eof and not self._body

    @property
    def whole(self) -> bool:
        """Whether the whole body is in hand, unread (:meth:`take` it without waiting)."""
        return self._eof and self._error is None

    def take(self) -> bytes:
        """The rest of a :attr:`whole` body, at once."""
        assert self.whole
        data = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body.clear()
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
        self._cancel_deadline()
        conn, self._conn = self._conn, None
        if conn is not None and conn.response is self:
            conn.abort()

    # Called by the connection.

    def _feed(self, data: bytes) -> None:
        """Body bytes (never empty: a reader takes b"" for the end)."""
        self._body.append(data)
        self._buffered += len(data)
        if self._buffered >= HIGH_WATER and self._conn is not None:
            self._conn.pause()
        waiter = self._waiter  # _wake, inlined: this runs for every read of a stream
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _cancel_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()

    def _finish(self, error: BaseException | None = None) -> None:
        self._cancel_deadline()
        self._eof = True
        self._error = error
        self._conn = None
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)


class Connection(asyncio.Protocol):
    """One connection; at most one request on it at a time."""

    def __init__(self, pool: Pool, key: Key) -> None:
        # Looked up once per connection: asyncio.get_running_loop() costs a getpid system call.
        self.loop = asyncio.get_running_loop()
        self._pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.response: UpstreamResponse | None = None
        self._head: asyncio.Future[UpstreamResponse] | None = None
        self._buf = bytearray()  # a head that came in pieces, until it is whole
        self._seen_answer = False
        self._body_mode = ""  # "length", "chunked" or "close", once the head is read
        self._left = 0  # body bytes left ("length"), or of the current chunk and its CRLF
        self._trailers = False
        self._rest = b""  # the end of the last read that is not a whole chunk line yet
        self._keep_alive = True
        self._paused = False
        # When the head of the answer in wait must be in.
        self._head_by = Deadline(self.loop)

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._head_by.cancel()
        self._pool.forget(self)
        if self._head is not None and not self._head.done():
            self._head.set_exception(
                aiohttp.ServerDisconnectedError("the engine closed the connection before answering")
            )
        response, self.response = self.response, None
        if response is not None:
            if self._body_mode == "close":
                response._finish()
            else:
                response._finish(aiohttp.ClientPayloadError("Response payload is not completed"))

    def data_received(self, data: bytes) -> None:
        self._seen_answer = True
        try:
            if not self._body_mode:
                # The head, gathered in _buf when it comes in pieces; what follows it is body.
                if self._buf:
                    self._buf += data
                    data = bytes(self._buf)
                    self._buf.clear()
                start = self._read_head(data)
                if start < 0:
                    if len(data) > MAX_HEAD_BYTES:
                        raise ValueError(f"a head over {MAX_HEAD_BYTES} bytes")
                    self._buf += data
                    return
                data = data[start:]
            if self._body_mode == "chunked":
                self._body_chunked(data)
            elif not data:
                return
            elif self._body_mode == "length":
                self._body_length(data)
            elif self.response is not None:
                self.response._feed(data)
        except (ValueError, IndexError) as err:
            self._fail_head(f"unreadable answer from the engine ({err})")

    # The request.

    def send(self, request: bytes, head_by: float | None = None) -> asyncio.Future[UpstreamResponse]:
        """Write ``request``; the future has the answer once its head is in.

        It fails with ``TimeoutError`` when the head is not in by
        ``head_by`` (loop time); the connection keeps one timer for its
        requests' heads, not one per request (:class:`Deadline`).
        """
        assert self.transport is not None
        self._head = self.loop.create_future()
        self._seen_answer = False
        self._body_mode = ""
        self.response = UpstreamResponse(self)
        self._head_by.wait(self._head, head_by)
        self.transport.write(request)
        return self._head

    @property
    def answered_nothing(self) -> bool:
        return not self._seen_answer

    def abort(self) -> None:
        self.response = None
        self.closed = True
        self._head_by.cancel()
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if not self._paused and self.transport is not None and not self.closed:
            self._paused = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    # Parsing the answer.

    def _read_head(self, data: bytes) -> int:
        """Read the answer's head from ``data``: where its body starts, or -1 until the head is whole.

        Interim (1xx) heads before it are skipped.
        """
        start = 0
        while True:
            end = data.find(b"\r\n\r\n", start)
            if end < 0:
                return -1
            head = data[start:end]
            start = end + 4
            line_end = head.find(b"\r\n")
            status_line = head if line_end < 0 else head[:line_end]
            parsed = _status_line(status_line)
            if parsed[1] >= 200:
                break
        http10, status, reason = parsed
        # Only the framing is read here; other fields are found when asked for (see :mod:`.fields`).
        headers = Fields(head[line_end:] if line_end >= 0 else b"")
        response = self.response
        assert response is not None and self._head is not None
        response.status, response.reason = status, reason
        response.headers = headers
        content_type = headers.get("Content-Type")
        if content_type is not None:
            response.content_type_field = content_type
            response.content_type = _media_type(content_type)
        self._head_by.over()
        # Connection and Transfer-Encoding are rare in an engine's answer: looked for before asked for.
        lowered = headers.lowered
        connection = headers.get("Connection") if b"\r\nconnection:" in lowered else None
        self._keep_alive = not http10 and (connection is None or "close" not in connection.lower())
        encoding = headers.get("Transfer-Encoding") if b"\r\ntransfer-encoding:" in lowered else None
        length = headers.get("Content-Length")
        if status in (204, 304):
            # No body by definition, whatever the headers say.
            self._body_mode, self._left = "length", 0
        elif encoding is not None and "chunked" in encoding.lower():
            self._body_mode, self._left, self._trailers, self._rest = "chunked", 0, False, b""
        elif length is not None:
            self._body_mode, self._left = "length", int(length)
        else:
            self._body_mode, self._keep_alive = "close", False
        if not self._head.done():
            self._head.set_result(response)
        if self._body_mode == "length" and self._left == 0:
            self._done()
        return start

    def _body_length(self, data: bytes) -> None:
        response = self.response
        if response is None:
            return
        if len(data) >= self._left:
            data, extra = data[: self._left], data[self._left :]
            if extra:
                raise ValueError("bytes after the end of the answer")
            self._left = 0
            if data:
                response._feed(data)
            self._done()
        else:
            self._left -= len(data)
            response._feed(data)

    def _body_chunked(self, data: bytes) -> None:
        """Strip chunk framing from what arrived; the body bytes go to the response in one piece.

        One pass with an index over the bytes in hand (plus the unparsed end
        of the last read, usually nothing), in locals: an engine's stream
        arrives as one small chunk per token, so this loop runs for every
        token relayed and was a fifth of the router's CPU on a stream. A
        chunk wholly in hand is taken in one step; one split across reads
        is followed with ``_left`` (its bytes still due, CRLF included).
        """
        if self._rest:
            data, self._rest = self._rest + data, b""
        elif not self._left and not self._trailers:
            # The common read of a stream: whole chunks, the last one perhaps among them.
            last = data.endswith(_LAST_CHUNK)
            body = _whole_chunks(data[: -len(_LAST_CHUNK)] if last else data)
            if body is not None:
                if last:
                    self._finish_chunked([body], b"")
                elif body and self.response is not None:
                    # Never an empty feed: a reader takes b"" for the end of the body.
                    self.response._feed(body)
                return
        pos, end, left = 0, len(data), self._left
        pieces: list[bytes] = []
        find = data.find
        while pos < end:
            if left:
                # Inside a chunk that began in an earlier read.
                take = min(left, end - pos)
                keep = min(take, left - 2)
                if keep > 0:
                    pieces.append(data[pos : pos + keep])
                pos += take
                left -= take
                continue
            line_end = find(b"\r\n", pos)
            if line_end < 0:
                if end - pos > 1024:
                    raise ValueError("a chunk size line over 1 KiB")
                break
            if self._trailers:
                if line_end == pos:
                    self._left = 0
                    self._finish_chunked(pieces, data[pos + 2 :])
                    return
                pos = line_end + 2
                continue
            # A chunk extension (";name=value") carries nothing the router needs.
            digits = data[pos:line_end].split(b";", 1)[0].rstrip(b" \t")
            if not _HEX.fullmatch(digits):
                # int() would also take a sign, "0x", underscores or blanks, which HTTP does not.
                raise ValueError(f"chunk size {digits[:20]!r}")
            size = int(digits, 16)
            start = line_end + 2
            if not size:
                self._trailers = True
                pos = start
            elif start + size + 2 <= end:
                if data[start + size : start + size + 2] != b"\r\n":
                    raise ValueError("a chunk not followed by CRLF")
                pieces.append(data[start : start + size])
                pos = start + size + 2
            else:
                pos, left = start, size + 2
        self._left = left
        self._rest = data[pos:]
        if pieces and self.response is not None:
            self.response._feed(pieces[0] if len(pieces) == 1 else b"".join(pieces))

    def _finish_chunked(self, pieces: list[bytes], extra: bytes) -> None:
        if any(pieces) and self.response is not None:
            self.response._feed(b"".join(pieces))
        if extra:
            raise ValueError("bytes after the end of the answer")
        self._done()

    def _done(self) -> None:
        response, self.response = self.response, None
        if response is not None:
            response._finish()
        if self._keep_alive and not self.closed:
            self._pool.give_back(self)
        else:
            self.abort()

    def _fail_head(self, message: str) -> None:
        error = UnreadableAnswer(message)
        if self._head is not None and not self._head.done():
            self._head.set_exception(error)
        response, self.response = self.response, None
        if response is not None:
            response._finish(aiohttp.ClientPayloadError(message))
        self.abort()


# The last chunk of a chunked body, when it has no trailers.
_LAST_CHUNK = b"0\r\n\r\n"
# A chunk size line's size (RFC 9112: 1*HEXDIG).
_HEX = re.compile(rb"[0-9a-fA-F]+")


def _whole_chunks(data: bytes) -> bytes | None:
    """The payload of ``data`` when it is whole chunks of a chunked body, none of them the last
    (``b""`` for no bytes); None when it may be anything else (the caller's loop then reads it).

    The common read of an engine's stream: one or more events, each a chunk
    written whole. Split at every CRLF, such bytes alternate size line and
    payload and end with an empty piece; each payload's length is checked
    against its size, so a payload that holds a CRLF itself, a chunk cut
    across reads, an extension, the last chunk (size 0) or trailers are not
    taken for chunks. The work is a constant number of C-level calls per
    read, whatever the number of chunks; the loop would step through each.
    """
    parts = data.split(b"\r\n")
    if len(parts) % 2 == 0 or parts[-1]:
        return None
    lines, payloads = parts[0:-1:2], parts[1::2]
    # Hex digits only (int() takes a sign, "0x", underscores and blanks), and none empty.
    if b"" in lines or (lines and not _HEX.fullmatch(b"".join(lines))):
        return None
    sizes = list(map(int, lines, repeat(16)))
    if list(map(len, payloads)) != sizes or 0 in sizes:
        return None
    return payloads[0] if len(payloads) == 1 else b"".join(payloads)
