"""What every request gets around its handler: an id, metrics, the access line, a span, OpenAI errors.

:func:`middleware` is the router's one aiohttp middleware (the client-key
check of :mod:`.auth` runs inside it, so a refused request is counted and
carries its id like any other). It lives apart from :mod:`.app`, which
wires the application, because it runs on every request and is written for
that: one coroutine layer less when tracing is off, request ids drawn
without a system call, the access line formatted only when it is on.

Guarantees: every response not yet sent carries ``x-request-id``; every
proxied request (POST to a :data:`.proxy.PROXY_PATHS` path, a stored
response's route by id, a realtime session) is counted in
``llmgw_router_requests_total`` with the status the client got (499 when it
hung up first, 101 for a realtime session that opened, counted when it
ends) and, when tracing is on, has a span that records the same;
any exception a handler raises becomes the OpenAI error it means
(:func:`.errors.error_response`), never a dead worker.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from aiohttp import web

from llmgw.common.errors import LlmgwError

from .apis import REALTIME_PATH
from .errors import error_response
from .federation import ORIGIN_HEADER
from .metrics import RouterMetrics
from .proxy import PROXY_PATHS
from .requestkeys import MODEL_LABEL, REPLICA_LABEL, REQUEST_ID
from .responseids import STORED_PREFIX
from .seam import Reply, RequestView
from .tracing import Tracing

log = logging.getLogger(__name__)
access = logging.getLogger("llmgw.router.access")

# What a client-supplied x-request-id may be: a token, not free text.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")

Handler = Callable[[RequestView], Awaitable[Reply]]


class Middleware(Protocol):
    """A middleware as the chain composes it: (request, next handler) -> reply.

    The parameters are ``request`` then ``handler``, in that order and so named:
    aiohttp passes ``handler`` by keyword, the front's chain
    (:class:`.frontwire.Chained`) by position.
    """

    def __call__(self, request: RequestView, handler: Handler) -> Awaitable[Reply]: ...


def request_id(supplied: str | None, fresh: Callable[[int], int]) -> str:
    """The client's x-request-id when it is a sane token, else a fresh one.

    Bounded and charset-limited because it is echoed in headers, logged and
    sent to engines: a client must not be able to inject a log line or a
    header, nor make every log line a kilobyte. A fresh one is 128 random
    bits as hex from ``fresh`` (``getrandbits``): an id must be unique, not
    secret, and a pseudo-random draw costs a fraction of ``os.urandom``'s
    system call on every request.
    """
    if supplied and _REQUEST_ID.fullmatch(supplied):
        return supplied
    return fresh(128).to_bytes(16, "big").hex()  # 32 hex digits; a third of a format's cost


def middleware(metrics: RouterMetrics, tracing: Tracing | None, *, access_log: bool) -> Middleware:
    # Seeded from the OS (random.Random() is), so workers draw different ids.
    fresh = random.Random().getrandbits

    @web.middleware
    async def middleware(request: RequestView, handler: Handler) -> Reply:
        rid = request_id(request.headers.get("x-request-id"), fresh)
        request[REQUEST_ID] = rid
        request[MODEL_LABEL] = ""
        request[REPLICA_LABEL] = ""
        path = request.path
        if not (
            (request.method == "POST" and path in PROXY_PATHS)
            or path == REALTIME_PATH
            or path.startswith(STORED_PREFIX)
        ):
            response = await _answer(request, handler)
            if not response.prepared:
                response.headers.setdefault("x-request-id", rid)
            return response
        start = time.monotonic()
        status = 499
        try:
            if tracing is None:
                # _answer's work inline: one coroutine less on every proxied request.
                try:
                    response = await handler(request)
                except Exception as exc:
                    response = _error(request, exc)
                status = response.status
            else:
                response, status = await _traced(tracing, request, handler, rid)
        finally:
            _record(metrics, request, status, start, access_log)
        if not response.prepared:
            response.headers.setdefault("x-request-id", rid)
        return response

    return middleware


async def _traced(tracing: Tracing, request: RequestView, handler: Handler, rid: str) -> tuple[Reply, int]:
    """Answer inside the request's span, which records the status and labels however it ends."""
    status = 499
    with tracing.request(request.method, request.path, request.headers, rid) as span:
        try:
            response = await _answer(request, handler)
            status = response.status
        finally:
            span.finish(status=status, model=request[MODEL_LABEL], replica=request[REPLICA_LABEL])
    return response, status


async def _answer(request: RequestView, handler: Handler) -> Reply:
    """Run the handler; turn any exception into the OpenAI error it means."""
    try:
        return await handler(request)
    except Exception as exc:
        return _error(request, exc)


def _error(request: RequestView, exc: Exception) -> Reply:
    """The OpenAI error ``exc`` means; an unexpected one is logged. A redirect is re-raised."""
    if isinstance(exc, web.HTTPException):
        if exc.status < 400:
            raise exc
        return error_response(exc)
    if not isinstance(exc, LlmgwError):
        log.exception("request %s: %s %s failed", request[REQUEST_ID], request.method, request.path)
    return error_response(exc)


def _record(
    metrics: RouterMetrics, request: RequestView, status: int, start: float, access_log: bool
) -> None:
    model, replica = request[MODEL_LABEL], request[REPLICA_LABEL]
    seconds = time.monotonic() - start
    metrics.request_done(model, status, replica, seconds)
    if access_log and access.isEnabledFor(logging.INFO):
        # One key=value line per proxied request; the request id joins it to the client and the engine.
        origin = request.headers.get(ORIGIN_HEADER)
        access.info(
            "request_id=%s method=%s path=%s model=%s replica=%s status=%d duration_ms=%.1f%s",
            request[REQUEST_ID],
            request.method,
            request.path,
            model or "-",
            replica or "-",
            status,
            seconds * 1000,
            # A peer cluster's request says which cluster sent it (:mod:`.federation`).
            f" origin={origin[:64]!r}" if origin else "",
        )
