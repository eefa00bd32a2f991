"""What the front's handler chain sees of a request, and what the front writes: heads, streams.

:class:`FrontRequest` is the front's :class:`.seam.ProxyRequest` and its own
:class:`.seam.Responder`: a whole answer is an :class:`.answer.Answer` the
front writes in one ``transport.write`` once the chain returns; a stream is
a :class:`FrontStream` whose chunks go straight to the client's transport.
:func:`answer_head` formats an answer's head; nothing else here writes one.
:class:`Chained` links the handler chain the front calls (:func:`.routes.chain`).

Compiled: services/router/setup.py builds this module with Cython (pure-Python
mode); :class:`FrontStream`, written to once per event of every stream, and
:class:`Chained`, called once per request, are compiled classes (``cython.cclass``) whose fields
are declared (``cython.declare``). The same
source runs uncompiled as ordinary Python.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import cython
from aiohttp import web

from .answer import Answer

if TYPE_CHECKING:
    from .envelope import Handler, Middleware
    from .fields import Fields
    from .frontsocket import FrontSocket
    from .seam import Reply, RequestView

T = TypeVar("T")

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled

# The last chunk of a chunked stream (no trailers).
LAST_CHUNK = b"0\r\n\r\n"


class StreamOwner(Protocol):
    """The connection a stream is written to (:class:`.front.FrontConnection`)."""

    @property
    def write_paused(self) -> bool: ...
    def writer(self) -> asyncio.Transport | None: ...  # None once the client is gone
    def start_stream(self, stream: FrontStream) -> bytes: ...
    async def drained(self) -> None: ...
    def upgrade(self, request: FrontRequest, headers: dict[str, str], max_size: int) -> FrontSocket: ...


class FrontRequest(dict[web.RequestKey[Any], Any]):
    """A request the front serves, as the handler chain reads it (:class:`.seam.ProxyRequest`).

    Its items are the per-request state the chain keeps under
    :mod:`.requestkeys`, as on aiohttp's request. ``path`` is
    percent-decoded, ``query_string`` as sent (both as aiohttp has them).
    """

    __slots__ = ("_conn", "body", "content_length", "headers", "http10", "method", "path", "query_string")

    def __init__(
        self,
        conn: StreamOwner,
        method: str,
        path: str,
        query_string: str,
        headers: Fields,
        content_length: int | None,
        http10: bool,
    ) -> None:
        # No dict.__init__: a new dict is empty already.
        self._conn = conn
        self.method = method
        self.path = path
        self.query_string = query_string
        self.headers = headers
        self.content_length = content_length
        self.http10 = http10
        # The whole body: the connection sets it once it has all arrived, before any handler runs.
        self.body: bytes = b""

    async def read(self) -> bytes:
        return self.body

    @property
    def responder(self) -> FrontRequest:
        return self

    # The responder.

    # whole(status, headers, body): the answer itself, made with no call in between.
    whole = staticmethod(Answer)

    async def stream(self, headers: dict[str, str]) -> FrontStream:
        """The request's streamed answer (status 200); see :class:`FrontStream`."""
        stream = FrontStream(self._conn, headers, chunked=not self.http10)
        stream.start()
        return stream

    async def websocket(self, headers: dict[str, str], max_size: int) -> FrontSocket:
        """Open the request's WebSocket (the 101 with ``headers``); see :mod:`.frontsocket`."""
        return self._conn.upgrade(self, headers, max_size)


@cython.cclass
class Chained:
    """A middleware bound to the handler it wraps, called with the request alone.

    The links of the chains :func:`.routes.chain` composes for the front. aiohttp binds a
    middleware's ``handler`` with ``functools.partial(mw, handler=...)``, whose keyword is
    unpacked from a dictionary on every call; here it is passed by position (the middlewares'
    parameters are ``(request, handler)`` in that order, as aiohttp's are).
    """

    _middleware: Middleware = cython.declare(object)
    _handler: Handler = cython.declare(object)

    def __init__(self, middleware: Middleware, handler: Handler) -> None:
        self._middleware = middleware
        self._handler = handler

    def __call__(self, request: RequestView) -> Awaitable[Reply]:
        return self._middleware(request, self._handler)


@cython.cclass
class FrontStream:
    """A streamed answer the front writes itself, chunk by chunk, straight to the client's transport.

    The head goes out with the first chunk (one write, not two). ``write``
    raises ``ConnectionResetError`` once the client is gone, and waits while
    the client is not reading (the connection's write deadline closes it if
    that lasts: :mod:`.front`). To an HTTP/1.0 client the stream is sent
    unframed, ended by closing the connection.
    """

    _conn: StreamOwner = cython.declare(object)
    _head: bytes = cython.declare(bytes)
    chunked: bool = cython.declare(cython.bint, visibility="public")
    ended: bool = cython.declare(cython.bint, visibility="public")
    headers: dict[str, str] = cython.declare(dict, visibility="public")
    prepared: bool = cython.declare(cython.bint, visibility="public")

    @property
    def status(self) -> int:
        return 200

    @property
    def reason(self) -> str:
        return "OK"

    def __init__(self, conn: StreamOwner, headers: dict[str, str], *, chunked: bool = True) -> None:
        self._conn = conn
        self.headers = headers
        self.chunked = chunked
        self.prepared = False
        self._head = b""
        self.ended = False

    def start(self) -> None:
        if not self.prepared:
            self.prepared = True
            self._head = self._conn.start_stream(self)

    async def write(self, data: bytes) -> None:
        if not data:
            return  # an empty chunk would end the stream
        conn = self._conn
        transport = conn.writer()
        if transport is None:
            raise ConnectionResetError("the client closed its connection")
        frame = b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data
        if self._head:
            frame, self._head = self._head + frame, b""
        transport.write(frame)
        if conn.write_paused:
            await conn.drained()

    async def write_eof(self, data: bytes = b"") -> None:
        if self.ended:
            return
        self.ended = True
        transport = self._conn.writer()
        if transport is None:
            raise ConnectionResetError("the client closed its connection")
        if not self.chunked:
            end = data
        elif data:
            end = b"%x\r\n%b\r\n%b" % (len(data), data, LAST_CHUNK)
        else:
            end = LAST_CHUNK
        transport.write(self._head + end)
        self._head = b""


def answer_head(
    status: int, reason: str, headers: Mapping[str, str], framing: str, date: str, close: bool
) -> bytes:
    """An answer's head, framed by ``framing`` (its length, chunked coding, or nothing); ValueError
    for a CR or LF in a header (it would split the answer).

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
    fields = ""
    for name, value in headers.items():
        fields += f"{name}: {value}\r\n"  # measured: faster than a join of a comprehension or of %
    if _line_breaks(fields) != 2 * len(headers):
        raise ValueError("a line break inside a header")
    if framing:
        fields += framing + "\r\n"
    tail = "Connection: close\r\n\r\n" if close else "\r\n"
    head = f"HTTP/1.1 {status} {reason}\r\n{fields}Date: {date}\r\n{tail}"
    return head.encode("latin-1")


_FRAMING = ("content-length", "transfer-encoding", "connection", "date")


@cython.cfunc
@cython.locals(text=str, ch=cython.Py_UCS4, found=cython.Py_ssize_t)
@cython.returns(cython.Py_ssize_t)
def _line_breaks(text: str) -> int:
    """The CRs and LFs in ``text`` (compiled, a loop in C: two ``str.count`` calls cost more)."""
    found = 0
    for ch in text:
        if ch == "\r" or ch == "\n":
            found += 1
    return found
