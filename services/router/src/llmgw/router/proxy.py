"""Forwarding an OpenAI request to an engine, retrying before the first byte.

One request, in order: read the body (aiohttp refuses one over
``client_max_size`` with 413), check it (:mod:`.body`), resolve the model
by name or alias, take the model's routes, then attempt endpoints chosen by
the balancer, each at most once, up to ``1 + limits.retries`` attempts.

Retry rule: an attempt may be retried on another endpoint only while nothing
has been sent to the client, and only for failures that say the engine did
not take the request: connect refused/reset, connect timeout, the engine
closing the connection before answering, or an engine answer of 5xx or 429
(read and discarded before any byte goes out). A first-byte timeout is not
retried: the engine may be working on it, and doubling a slow request's
load helps nobody. Once the response has been started, nothing is retried:
a failure mid-stream ends the stream with an SSE ``data: {"error": ...}``
event, which OpenAI clients raise as an error.

When attempts run out: a final 429 is relayed as the engine sent it (with
its Retry-After), a final 5xx or connection failure is a 502, a connect
timeout a 504.

Pass-through: a response with ``Content-Type: text/event-stream`` is copied
chunk by chunk as it arrives (no buffering); any other is read whole and
copied with its status and content type. Only chosen request headers go
upstream (Accept, trace context, x-request-id); the client's Authorization
never does: it is replaced by the endpoint's engine key.

Cancellation: the server runs with ``handler_cancellation=True``, so a
client that hangs up cancels this handler; the upstream response is then
closed at once (``close()``, not ``release()``), which closes the engine
connection, and the engine sees its client go away.

Timeouts are explicit ``asyncio`` deadlines per stage (first byte, each
stream gap, the whole request); only the TCP connect uses aiohttp's own
(``sock_connect`` on the session).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from .body import parse_body
from .breaker import Breaker
from .config import Limits
from .errors import (
    ModelNotFound,
    NoReadyReplica,
    UpstreamFailed,
    UpstreamTimeout,
    error_body,
)
from .metrics import RouterMetrics
from .table import Model, Route

log = logging.getLogger(__name__)

PROXY_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
FORWARDED_HEADERS = ("Accept", "traceparent", "tracestate", "baggage")
REQUEST_ID = web.RequestKey("request_id", str)
# The canonical model a request resolved to, for metrics ("" until known).
MODEL_LABEL = web.RequestKey("model_label", str)


class RouteSource(Protocol):
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class Picker(Protocol):
    def pick(self, routes: Sequence[Route], exclude: set[str]) -> Route | None: ...


class SessionSource(Protocol):
    def __call__(self, request: web.Request) -> aiohttp.ClientSession: ...


@dataclass(frozen=True)
class _Retryable:
    """An attempt that failed before any byte reached the client."""

    endpoint_id: str
    reason: str
    timeout: bool = False
    # Set when the engine answered 429: relayed if no attempt is left.
    status: int = 0
    body: bytes = b""
    headers: CIMultiDict[str] | None = None


class Proxy:
    def __init__(
        self,
        table: RouteSource,
        balancer: Picker,
        breaker: Breaker,
        limits: Limits,
        metrics: RouterMetrics,
        session: SessionSource,
    ) -> None:
        self._table = table
        self._balancer = balancer
        self._breaker = breaker
        self._limits = limits
        self._metrics = metrics
        self._session = session

    async def handle(self, request: web.Request) -> web.StreamResponse:
        data, parsed = parse_body(await request.read())
        model = self._table.resolve(parsed.model)
        if model is None:
            raise ModelNotFound(parsed.model)
        request[MODEL_LABEL] = model.name
        routes = self._table.routes(model.name)
        if not routes:
            raise NoReadyReplica(model.name, self._limits.retry_after_seconds)

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._limits.request_timeout_seconds
        tried: set[str] = set()
        failures: list[_Retryable] = []
        for attempt in range(self._limits.retries + 1):
            route = self._balancer.pick(routes, tried)
            if route is None:
                break
            if attempt:
                self._metrics.retries.labels(model.name).inc()
            tried.add(route.endpoint.id)
            outcome = await self._attempt(request, model, route, data, deadline)
            if isinstance(outcome, web.StreamResponse):
                return outcome
            log.warning(
                "request %s: endpoint %s failed before the first byte: %s",
                request[REQUEST_ID],
                outcome.endpoint_id,
                outcome.reason,
            )
            failures.append(outcome)
        return self._exhausted(request, model, failures)

    def _exhausted(
        self, request: web.Request, model: Model, failures: list[_Retryable]
    ) -> web.StreamResponse:
        last = failures[-1]
        if last.status == 429:
            headers = {"Content-Type": "application/json", "x-llmgw-replica": last.endpoint_id}
            if last.headers and "Retry-After" in last.headers:
                headers["Retry-After"] = last.headers["Retry-After"]
            return web.Response(status=429, body=last.body, headers=headers)
        tried = "; ".join(f"{f.endpoint_id}: {f.reason}" for f in failures)
        message = (
            f"No replica of model {model.name!r} answered ({len(failures)} tried: {tried}). "
            "The cluster may be replacing them; retry shortly."
        )
        if last.timeout:
            raise UpstreamTimeout(message)
        raise UpstreamFailed(message)

    async def _attempt(
        self,
        request: web.Request,
        model: Model,
        route: Route,
        data: dict[str, object],
        deadline: float,
    ) -> web.StreamResponse | _Retryable:
        state = route.state
        state.in_flight += 1
        in_flight = self._metrics.in_flight.labels(model.name)
        in_flight.inc()
        try:
            return await self._forward(request, route, data, deadline)
        finally:
            state.in_flight -= 1
            in_flight.dec()

    async def _forward(
        self, request: web.Request, route: Route, data: dict[str, object], deadline: float
    ) -> web.StreamResponse | _Retryable:
        endpoint, state = route.endpoint, route.state
        loop = asyncio.get_running_loop()
        body = json.dumps({**data, "model": endpoint.upstream_model}).encode()
        url = endpoint.url + request.path
        if request.query_string:
            url += "?" + request.query_string
        first_byte = loop.time() + self._limits.first_byte_timeout_seconds
        try:
            async with asyncio.timeout_at(min(first_byte, deadline)):
                upstream = await self._session(request).post(
                    url, data=body, headers=self._upstream_headers(request, route)
                )
        except aiohttp.ConnectionTimeoutError:
            self._breaker.failure(state, loop.time())
            return _Retryable(endpoint.id, "connect timeout", timeout=True)
        except TimeoutError:
            # Ours (first byte or the whole request), or aiohttp's own read timeout.
            self._breaker.failure(state, loop.time())
            waited = "the request timeout" if deadline <= first_byte else "the first-byte timeout"
            raise UpstreamTimeout(
                f"Replica {endpoint.id} sent no response within {waited}; retry, or raise "
                "limits.first_byte_timeout_seconds if the model is this slow."
            ) from None
        except aiohttp.ClientConnectionError as err:
            # Refused, reset, or closed before any answer: the engine did not take it.
            self._breaker.failure(state, loop.time())
            return _Retryable(endpoint.id, f"{type(err).__name__}: {err}")
        except aiohttp.ClientError as err:
            self._breaker.failure(state, loop.time())
            raise UpstreamFailed(f"Replica {endpoint.id} failed: {err}") from None

        try:
            if upstream.status == 429 or upstream.status >= 500:
                try:
                    async with asyncio.timeout_at(
                        min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline)
                    ):
                        answer = await upstream.read()
                    detail = answer[:200].decode(errors="replace")
                except (TimeoutError, aiohttp.ClientError) as err:
                    answer, detail = b"", f"(its error body was lost: {type(err).__name__})"
                if upstream.status != 429:
                    self._breaker.failure(state, loop.time())
                upstream.release()
                return _Retryable(
                    endpoint.id,
                    f"engine answered {upstream.status}: {detail}",
                    status=upstream.status,
                    body=answer,
                    headers=CIMultiDict(upstream.headers),
                )
            self._breaker.success(state)
            if upstream.content_type == "text/event-stream":
                response = await self._stream(request, route, upstream, deadline)
            else:
                response = await self._copy(request, route, upstream, deadline)
        except BaseException:
            upstream.close()
            raise
        upstream.release()
        return response

    def _upstream_headers(self, request: web.Request, route: Route) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "x-request-id": request[REQUEST_ID]}
        for name in FORWARDED_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        if route.endpoint.api_key:
            headers["Authorization"] = f"Bearer {route.endpoint.api_key}"
        return headers

    def _response_headers(
        self, request: web.Request, route: Route, upstream: aiohttp.ClientResponse
    ) -> dict[str, str]:
        return {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "x-llmgw-replica": route.endpoint.id,
            "x-request-id": request[REQUEST_ID],
        }

    async def _copy(
        self,
        request: web.Request,
        route: Route,
        upstream: aiohttp.ClientResponse,
        deadline: float,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout_at(
                min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline)
            ):
                body = await upstream.read()
        except TimeoutError:
            self._breaker.failure(route.state, loop.time())
            raise UpstreamTimeout(
                f"Replica {route.endpoint.id} stopped sending its response; retry."
            ) from None
        except aiohttp.ClientError as err:
            self._breaker.failure(route.state, loop.time())
            raise UpstreamFailed(
                f"Replica {route.endpoint.id} broke off its response ({err}); retry."
            ) from None
        headers = self._response_headers(request, route, upstream)
        return web.Response(status=upstream.status, body=body, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        route: Route,
        upstream: aiohttp.ClientResponse,
        deadline: float,
    ) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        response = web.StreamResponse(status=upstream.status)
        response.headers.update(self._response_headers(request, route, upstream))
        response.headers["Cache-Control"] = "no-cache"
        # Tell a buffering reverse proxy in front (nginx) to pass chunks on.
        response.headers["X-Accel-Buffering"] = "no"
        await response.prepare(request)
        try:
            while True:
                async with asyncio.timeout_at(
                    min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline)
                ):
                    chunk = await upstream.content.readany()
                if not chunk:
                    break
                await response.write(chunk)
        except ConnectionResetError:
            # The client went away between chunks; nothing is left to tell it.
            log.info("request %s: client hung up mid-stream", request[REQUEST_ID])
            return response
        except (TimeoutError, aiohttp.ClientError) as err:
            self._breaker.failure(route.state, loop.time())
            reason = "went silent" if isinstance(err, TimeoutError) else f"broke off ({err})"
            log.warning(
                "request %s: replica %s %s mid-stream",
                request[REQUEST_ID],
                route.endpoint.id,
                reason,
            )
            event = error_body(
                f"Replica {route.endpoint.id} {reason} mid-stream; the response is incomplete.",
                "server_error",
                None,
                "upstream_error",
            )
            try:
                await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            except ConnectionResetError:
                log.info("request %s: client hung up mid-stream", request[REQUEST_ID])
                return response
        try:
            await response.write_eof()
        except ConnectionResetError:
            log.info("request %s: client hung up at the end of the stream", request[REQUEST_ID])
        return response
