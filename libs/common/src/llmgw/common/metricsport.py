"""The ``metrics_listen`` port of the control plane and the agent: Prometheus ``/metrics`` on aiohttp.

One path, ``GET /metrics``, with no credential (the control plane's HTTP API
serves the same series behind its admin token; this port is the operator's
choice to open, off by default in both roles). It runs on the service's own
event loop with aiohttp's bounds: request bodies of at most
:data:`MAX_BODY_BYTES`, request lines and headers of at most
:data:`MAX_FIELD_BYTES`, and a connection that sends no whole request within
:data:`IDLE_SECONDS` (a scraper's keep-alive, or a client that trickles a
head) is closed. Bytes that do not parse as HTTP get a plain-text 400 and one
INFO log line (:mod:`.httpserve`).

The control plane served this port with prometheus_client's own server until
2026-12-07: a thread per connection and no timeout on a socket, so idle
connections held a thread each, as many as anyone opened.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from . import httpserve
from .config import split_host_port

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1024
MAX_FIELD_BYTES = 8190
# A scrape interval is usually 15-60 s: a scraper past it reconnects.
IDLE_SECONDS = 75.0
# What a scrape in progress gets at shutdown.
SHUTDOWN_SECONDS = 1.0


def metrics_app(registry: CollectorRegistry) -> web.Application:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=MAX_BODY_BYTES, handler_args={"max_field_size": MAX_FIELD_BYTES})
    app.router.add_get("/metrics", metrics)
    return app


@contextlib.asynccontextmanager
async def serving(listen: str, registry: CollectorRegistry) -> AsyncIterator[int]:
    """Serve ``/metrics`` on ``listen`` (host:port) while the block runs, yielding the bound port;
    nothing (and 0) when ``listen`` is empty."""
    if not listen:
        yield 0
        return
    host, port = split_host_port(listen)
    runner = web.AppRunner(
        metrics_app(registry),
        handler_cancellation=True,
        shutdown_timeout=SHUTDOWN_SECONDS,
        keepalive_timeout=IDLE_SECONDS,
        access_log=None,
    )
    await runner.setup()
    listener = None
    try:
        listener = await httpserve.listen(runner, host, port, httpserve.plain)
        bound = httpserve.bound_port(listener)
        log.info("metrics on http://%s:%d/metrics", host, bound)
        yield bound
    finally:
        if listener is not None:
            listener.close()
        await runner.cleanup()
