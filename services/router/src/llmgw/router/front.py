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

**WebSockets** (``/v1/realtime``): a GET with ``Upgrade`` on one of the
front's ``sockets`` paths runs its handler like any request; the handler
either refuses it (a JSON error, then the connection closes) or opens the
socket (:meth:`.frontconn.FrontConnection.upgrade`: the 101 goes out, and
the connection's bytes go to :mod:`.frontsocket` from then on). The
request timeout does not apply to an open socket, whose session keeps its
own (:mod:`.realtime`); the write deadline does.

**Connections**: at most ``limits.max_client_connections`` per worker; one
more is answered 503 and closed.

**Tasks**: a connection's requests are answered by one task, made for its
first request and kept while the connection lives (:meth:`.frontconn.
FrontConnection._serve`), rather than a task per request.

**Cancellation**: a client that hangs up cancels the task answering its
request, as aiohttp's ``handler_cancellation=True`` does.

**Shutdown**: :meth:`Front.close` stops accepting and closes idle
connections; :meth:`Front.drain` waits for answers in flight, up to the
grace period, then cancels them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from email.utils import formatdate
from ssl import SSLContext

from .config import Limits
from .frontconn import SWEEP_SECONDS, FrontConnection, Handler

__all__ = ["SWEEP_SECONDS", "Front", "FrontConnection", "Handler"]


class Front:
    """The protocol factory of the router's port, and what its connections share.

    ``handler`` answers the proxied paths; ``others(method, path)`` is the
    chain for any other request (it answers 404 or 405 itself when it has
    no route). ``sockets``: the paths whose GET with ``Upgrade`` keeps its
    connection for the WebSocket its handler may open (:mod:`.frontsocket`);
    any other upgrade is answered as a plain request, then closed.
    """

    def __init__(
        self,
        handler: Handler,
        others: Callable[[str, str], Handler],
        limits: Limits,
        sockets: frozenset[str] = frozenset(),
    ) -> None:
        self.handler = handler
        self.others = others
        self.limits = limits
        self.sockets = sockets
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
        # FrontConnection is an asyncio.Protocol by its methods: compiled (see frontconn), it cannot
        # subclass the Python class.
        self._server = await loop.create_server(
            self,  # type: ignore[arg-type]
            host,
            port,
            reuse_port=reuse_port,
            backlog=backlog,
            ssl=ssl,
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
        """Stop accepting; close connections with no request in flight; end WebSocket sessions."""
        if self._server is not None:
            self._server.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for conn in list(self.connections):
            conn.closing = True
            if not conn.busy:
                conn.close()
            elif conn.socket_open and conn.task is not None:
                # A realtime session does not end by itself: ended now (code 1001, going away),
                # so its client reconnects elsewhere rather than waiting out the grace period.
                conn.task.cancel()

    async def drain(self, grace: float) -> None:
        """Let answers in flight finish for up to ``grace`` seconds, then cancel the rest."""
        # Each ends once its answer is out: the connection is closing (see close).
        tasks = [c.task for c in self.connections if c.busy and c.task is not None]
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
