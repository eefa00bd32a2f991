"""The router's HTTP/1.1 front: one protocol object per client connection, bytes parsed by llhttp.

Why its own: on the peer benchmark (``bench/router_peers.py``) aiohttp's
server machinery (its request and response objects, the handler task,
routing, its writer) was about a third of the router's CPU for a
non-streamed request. The front does what a request needs in one protocol
object per connection: llhttp (through httptools, the C parser under
uvicorn) parses the head and the body as they arrive, the app's own
handler chain runs on a :class:`.frontwire.FrontRequest`, and a whole
answer goes out in one ``transport.write``; a stream's chunks go straight
to the transport (:class:`.frontwire.FrontStream`). The chain is the one
aiohttp runs for the same path (:mod:`.envelope`'s middleware, :mod:`.auth`'s
when keys are on, then the handler), so request ids, metrics, spans, keys,
quotas, retries, fallbacks and errors behave the same on either server.

**Every request on the port is the front's**: the proxied paths (POST),
and the app's other routes through the same chain (``others``: models,
health, readiness, metrics; an unknown path is a 404, a wrong method a
405). There is no hand-off to another server mid-connection, so one set of
limits and timers governs every connection.

**Bytes the front will not serve** get an OpenAI-shaped JSON error
(:class:`.errors.HttpRefusal`) and the connection is closed after it, once
the answers to the requests before it are out: a request llhttp refuses
(bare CR or LF, obs-fold, a malformed or repeated ``Content-Length``, both
``Content-Length`` and ``Transfer-Encoding``, a bad chunk, a field name
that is no token, a control byte in a field or the target) is a 400; a
missing, repeated or malformed ``Host`` on HTTP/1.1 a 400 (RFC 9112
§3.2); an unknown method or a transfer coding other than ``chunked`` a
501; an HTTP version other than 1.0 and 1.1 a 505; an ``Expect`` other
than ``100-continue`` a 417; a request line over ``limits.max_line_bytes``
a 414; a header line over it, a head over ``limits.max_head_bytes`` or
with more than ``limits.max_headers`` fields a 431; a body over
``limits.max_body_bytes`` a 413 (before it is read, when its length says
so); a request too slow to arrive a 408. A
``Connection`` field with a ``close`` token closes the connection after the
answer, whatever else it says.

**Timers**: one sweep per :data:`SWEEP_SECONDS` over the connections,
rather than a timer per request, enforces the connection's phase:
idle (``limits.keepalive_timeout_seconds``), a head arriving
(``limits.head_timeout_seconds`` from its first byte), a body arriving
(``limits.body_idle_timeout_seconds`` of silence; head and body together
within ``limits.client_read_timeout_seconds``), and an answer under way: a
connection whose request has run past ``limits.request_timeout_seconds``
(the proxy's own deadline, which cannot see a write blocked on a client
that does not read) or whose writes have been blocked for
``limits.client_write_timeout_seconds`` is closed, which cancels its
handler and with it the engine's request.

**Flow control**: requests are answered one at a time, in order; while one
is answered (or the client does not read its answers) and the next is
already parsed, reading pauses. A stream's writes wait while the client's
side of the transport is over its high-water mark, so a client that reads
slowly slows its engine rather than filling the router's memory.

**Connections**: at most ``limits.max_client_connections`` per worker; one
more is answered 503 and closed.

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
import re
import time
from collections import deque
from collections.abc import Awaitable, Callable
from email.utils import formatdate
from ssl import SSLContext
from typing import NoReturn
from urllib.parse import unquote

import httptools
from aiohttp import web

from .answer import Answer
from .config import Limits
from .errors import HttpRefusal, error_response
from .fields import Fields
from .frontwire import FrontRequest, FrontStream, answer_head
from .proxy import PROXY_PATHS
from .seam import Reply

log = logging.getLogger(__name__)

# How often idle and slow connections are looked for.
SWEEP_SECONDS = 1.0
# Bodies at most this long go out in one write with their head (one copy, one system call).
JOIN_BELOW = 64 * 1024

_PATHS = frozenset(PROXY_PATHS)
# The interim answer to a request head with "Expect: 100-continue".
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
# A Host field's value (RFC 9110 §7.2: uri-host [":" port]); an IPv6 literal in brackets.
_HOST = re.compile(rb"(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._~!$&'()*+,;=%-]*)(?::[0-9]*)?")

# Lengths of the field names the front acts on: host, expect, connection, content-length,
# transfer-encoding (a length test first: most fields are none of them).
_WATCHED_LENGTHS = frozenset((4, 6, 10, 14, 17))
# A connection's phases (the sweep's view).
_IDLE, _HEAD, _BODY = 0, 1, 2

Handler = Callable[[FrontRequest], Awaitable[Reply]]


class _Refused(Exception):
    """Raised in a parser callback: the request is refused with this status."""

    def __init__(self, refusal: HttpRefusal) -> None:
        super().__init__(str(refusal))
        self.refusal = refusal


class Front:
    """The protocol factory of the router's port, and what its connections share.

    ``handler`` answers the proxied paths; ``others(method, path)`` is the
    chain for any other request (it answers 404 or 405 itself when it has
    no route).
    """

    def __init__(self, handler: Handler, others: Callable[[str, str], Handler], limits: Limits) -> None:
        self.handler = handler
        self.others = others
        self.limits = limits
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
            if conn.write_paused and conn.transport is not None:
                conn.transport.abort()  # a close would wait for a client that does not read
            else:
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
    """One client connection."""

    def __init__(self, front: Front) -> None:
        self.front = front
        limits = self.limits = front.limits
        # The head's limits, looked up once: on_header runs for every field of every request.
        self._max_line = limits.max_line_bytes
        self._max_head = limits.max_head_bytes
        self._max_entries = 4 * limits.max_headers  # four entries of _lines per field
        self._loop = asyncio.get_running_loop()
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self.task: asyncio.Task[None] | None = None
        # The streamed answer whose head went out, while its request is answered.
        self._stream: FrontStream | None = None
        # Resolved when the client reads again (or goes away), while a stream waits to write.
        self._drained: asyncio.Future[None] | None = None
        self.closing = False
        # Parsed requests waiting for the one answered (with whether to close after each), or the
        # refusal that ends the connection.
        self.queue: deque[tuple[FrontRequest, bool] | HttpRefusal] = deque()
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
        # The request arriving: its target, header lines, head size, framing and body so far.
        self._url = b""
        self._lines: list[bytes] = []
        self._head_size = 0
        self._unparsed_head = 0
        self._began = False
        self._hosts: list[bytes] = []
        self._length: bytes | None = None
        self._coding: bytes | None = None
        self._expect: bytes | None = None
        self._close_token = False
        self._upgrade = False
        self._request: FrontRequest | None = None
        self._request_close = False
        self._body: list[bytes] = []
        self._body_size = 0
        self._expects_continue = False

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
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def data_received(self, data: bytes) -> None:
        if self._ended:
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as err:
            cause = err.__context__
            if not isinstance(cause, _Refused):
                raise  # a bug of ours in a callback: the envelope's backstop does not reach here
            self._refuse(cause.refusal)
        except httptools.HttpParserUpgrade:
            # The request that asked is whole; what follows is another protocol: answered, then closed.
            self._end_after_last()
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
                    self._refuse(_head_too_large(self.limits))
            elif self._phase == _BODY:
                self._body_at = self._loop.time()
        self._next()

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
        self._head_size = self._unparsed_head = 0
        self._began = True
        self._hosts = []
        self._length = self._coding = self._expect = None
        self._close_token = self._upgrade = False

    def on_url(self, piece: bytes) -> None:
        self._url += piece
        self._head_size = len(self._url)
        if len(self._url) > self._max_line:
            raise _Refused(
                HttpRefusal(
                    414,
                    "uri_too_long",
                    f"The request target is over {self.limits.max_line_bytes} bytes (limits.max_line_bytes).",
                )
            )

    def on_header(self, name: bytes, value: bytes) -> None:
        lines = self._lines
        size = len(name) + len(value) + 4
        self._head_size += size
        if size > self._max_line or len(lines) >= self._max_entries or self._head_size > self._max_head:
            self._head_refused(size)
        # llhttp has checked both: a token, and a value with no CR, LF, NUL or other control byte.
        lines += (b"\r\n", name, b":", value)
        if len(name) in _WATCHED_LENGTHS:
            self._watch(name.lower(), value)

    def _head_refused(self, size: int) -> NoReturn:
        limits = self.limits
        if size > limits.max_line_bytes:
            message = f"A header line is over {limits.max_line_bytes} bytes (limits.max_line_bytes)."
        elif len(self._lines) >= self._max_entries:
            message = f"The request has over {limits.max_headers} header fields (limits.max_headers)."
        else:
            raise _Refused(_head_too_large(limits))
        raise _Refused(HttpRefusal(431, "headers_too_large", message))

    def _watch(self, lowered: bytes, value: bytes) -> None:
        """Note a field the front itself acts on."""
        if lowered == b"host":
            self._hosts.append(value)
        elif lowered == b"content-length":
            self._length = value
        elif lowered == b"transfer-encoding":
            self._coding = value
        elif lowered == b"expect":
            self._expect = value
        elif lowered == b"connection":
            tokens = [t.strip() for t in value.lower().split(b",")]
            self._close_token |= b"close" in tokens
            self._upgrade |= b"upgrade" in tokens

    def on_headers_complete(self) -> None:
        parser = self._parser
        refusal = self._refusal(parser.get_http_version())
        if refusal is not None:
            raise _Refused(refusal)
        http10 = parser.get_http_version() == "1.0"
        path, query = _target(self._url)
        length = int(self._length) if self._length is not None else None
        self._request = FrontRequest(
            self,
            parser.get_method().decode("ascii"),
            path,
            query,
            Fields(b"".join(self._lines)),
            length if self._coding is None else None,
            http10,
        )
        self._request_close = not parser.should_keep_alive() or self._close_token or self._upgrade
        self._expects_continue = self._expect is not None and (length != 0 or self._coding is not None)
        self._body = []
        self._body_size = 0
        self._phase = _BODY
        self._body_at = self._loop.time()

    def on_body(self, body: bytes) -> None:
        self._body_size += len(body)
        if self._body_size > self.limits.max_body_bytes:
            raise _Refused(_body_too_large(self.limits))
        self._body.append(body)

    def on_message_complete(self) -> None:
        request = self._request
        assert request is not None
        request._body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        if request.content_length is None and self._coding is not None:
            request.content_length = self._body_size
        self._request, self._body = None, []
        self._expects_continue = False
        self._phase = _IDLE
        self._since = self._loop.time()
        self.queue.append((request, self._request_close))
        if self._request_close:
            self._ended = True

    # Checks

    def _refusal(self, version: str) -> HttpRefusal | None:
        """Why the head just parsed is refused, if it is (llhttp has checked its syntax)."""
        if version not in ("1.1", "1.0"):
            return HttpRefusal(505, "http_version_not_supported", "This router speaks HTTP/1.1 and 1.0.")
        hosts = self._hosts
        if (version == "1.1" and len(hosts) != 1) or len(hosts) > 1:
            return HttpRefusal(400, "bad_request", "An HTTP/1.1 request needs exactly one Host field.")
        if hosts and not _HOST.fullmatch(hosts[0].strip()):
            return HttpRefusal(400, "bad_request", "The Host field is not a host name and port.")
        if self._coding is not None:
            if version == "1.0":
                return HttpRefusal(400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request.")
            if self._coding.strip().lower() != b"chunked":
                return HttpRefusal(
                    501, "not_implemented", "Only the chunked transfer coding is accepted in a request."
                )
        if self._length is not None and int(self._length) > self.limits.max_body_bytes:
            return _body_too_large(self.limits)
        if self._expect is not None and self._expect.strip().lower() != b"100-continue":
            return HttpRefusal(417, "expectation_failed", "Only Expect: 100-continue is supported.")
        return None

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
        if self.task is not None:
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

    def _end_after_last(self) -> None:
        self._ended = True
        if self.queue:
            last = self.queue[-1]
            if not isinstance(last, HttpRefusal):
                self.queue[-1] = (last[0], True)

    def _next(self) -> None:
        """Start answering the next request parsed, when nothing is being answered."""
        transport = self.transport
        if transport is None:
            return
        if self.task is None and not self.write_paused and self.queue:
            item = self.queue.popleft()
            if isinstance(item, HttpRefusal):
                self._write(error_response(item), close=True)
                transport.close()
                return
            request, self._close_after = item
            self._busy_since = self._loop.time()
            self.task = self._loop.create_task(self._serve(request))
        if self.queue:
            # The next one waits: read no further until it is answered.
            if not self._paused:
                self._paused = True
                transport.pause_reading()
        elif self._paused and not self._ended:
            self._paused = False
            transport.resume_reading()
        if self._expects_continue and self.task is None and not self.queue:
            # The client waits for this before it sends the body.
            self._expects_continue = False
            transport.write(_CONTINUE)

    async def _serve(self, request: FrontRequest) -> None:
        try:
            try:
                if request.method == "POST" and request.path in _PATHS:
                    handler = self.front.handler
                else:
                    handler = self.front.others(request.method, request.path)
                response = await handler(request)
            except asyncio.CancelledError:
                # The client hung up (or shutdown ran out of grace): nobody to answer.
                return
            except Exception as exc:  # the envelope answers every error; this is its backstop
                log.exception("front: %s failed", request.path)
                response = error_response(exc)
            stream = self._stream
            if stream is None:
                written = self._write(response, close=self._close_after or self.closing)
            else:
                # Nothing more can be said once a stream's head is out; one cut short is closed.
                written = response is stream and stream.ended
        finally:
            self.task = None
            self._stream = None
        transport = self.transport
        if transport is None:
            return
        if not written or self._close_after or self.closing:
            transport.close()
            return
        if self._phase == _IDLE:
            self._since = self._loop.time()
        self._next()

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


def _target(url: bytes) -> tuple[str, str]:
    """The path (percent-decoded) and query of a request target, as aiohttp has them.

    llhttp has checked the target's characters (no control byte, no byte
    over 0x7F). An absolute-form target (``http://host/path``) is read for
    its path and query.
    """
    if not url.startswith(b"/"):
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            return "", ""  # no route has it: a 404
        raw_path, raw_query = parsed.path or b"/", parsed.query or b""
    else:
        raw_path, _, raw_query = url.partition(b"?")
        raw_query = raw_query.partition(b"#")[0]
    path = raw_path.decode("ascii")
    if "%" in path:
        path = unquote(path, errors="surrogateescape")
    return path, raw_query.decode("ascii")


def _head_too_large(limits: Limits) -> HttpRefusal:
    return HttpRefusal(
        431,
        "headers_too_large",
        f"The request head is over {limits.max_head_bytes} bytes (limits.max_head_bytes).",
    )


def _body_too_large(limits: Limits) -> HttpRefusal:
    return HttpRefusal(
        413,
        "request_too_large",
        f"The request body is over {limits.max_body_bytes} bytes (limits.max_body_bytes). "
        "Send a smaller request body.",
    )
