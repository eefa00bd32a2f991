"""aiohttp on a TCP port, refusing bytes it cannot parse in the service's own error shape.

aiohttp's parser runs before any handler or middleware. What it refuses (a
request line or a header over its limits, a header line without a colon,
bytes that are not HTTP) reaches its connection handler's ``handle_error``,
which answers in plain text and logs each one at ERROR with a traceback: bytes
anyone on the network can send would fill the log with tracebacks and break
the service's one error shape. :func:`listen` serves an app with connection
handlers that answer those refusals through the service's ``render`` (its
error shape, the status aiohttp chose), close the connection, and log one INFO
line. A 5xx (a handler's bug) stays aiohttp's: that one is worth a traceback.

Decision, and its cost: aiohttp's own handler (its limits, timers and
accounting) makes each connection, and its class is then switched to a
subclass that overrides ``handle_error`` alone (``RequestHandler`` has
``__slots__``; the subclass adds none, so the switch is allowed). That leans on
aiohttp's ``RequestHandler``, pinned in constraints.txt;
tests/unit/common/test_httpserve.py fails if an upgrade changes what it leans
on. A ``TCPSite`` cannot be used: it makes its connections with aiohttp's class.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler

# The error answer for (status, message): the service's error shape.
Render = Callable[[int, str], web.StreamResponse]
# Longest part of aiohttp's message kept (it may quote the offending bytes).
DETAIL_CHARS = 200


def refusing(render: Render) -> type[RequestHandler]:
    """aiohttp's connection handler, answering its parser's refusals with ``render``."""

    class Refusals(RequestHandler):
        __slots__ = ()

        def handle_error(
            self,
            request: web.BaseRequest,
            status: int = 500,
            exc: BaseException | None = None,
            message: str | None = None,
        ) -> web.StreamResponse:
            if status >= 500 or not isinstance(exc, HttpProcessingError):
                return super().handle_error(request, status, exc, message)
            detail = str(exc.message)[:DETAIL_CHARS]
            self.logger.info("refused a malformed HTTP request from %s: %s", request.remote, detail)
            response = render(status, f"malformed HTTP request ({type(exc).__name__}): {detail}")
            response.force_close()
            return response

    return Refusals


def plain(status: int, message: str) -> web.Response:
    """A render for a port with no error shape of its own (metrics): the message as text."""
    return web.Response(status=status, text=message + "\n")


async def listen(
    runner: web.AppRunner,
    host: str,
    port: int,
    render: Render,
    *,
    backlog: int = 128,
    reuse_port: bool | None = None,
) -> asyncio.Server:
    """Serve ``runner``'s app (set up already) on ``host:port``; close the server before
    ``runner.cleanup()``, which then drains the connections as for a site."""
    server = runner.server
    if server is None:
        raise RuntimeError("listen: the runner is not set up")
    handler_class = refusing(render)

    def connection() -> RequestHandler:
        handler = server()
        handler.__class__ = handler_class
        return handler

    loop = asyncio.get_running_loop()
    return await loop.create_server(connection, host, port, backlog=backlog, reuse_port=reuse_port)


def bound_port(listener: asyncio.Server) -> int:
    """The port ``listener`` is bound to (the one the kernel picked for port 0)."""
    return int(listener.sockets[0].getsockname()[1])
