"""Forwarding an OpenAI request to an engine: retries, resumes, timeouts.

One request, in order: read the body (aiohttp refuses one over
``client_max_size`` with 413), check it (:mod:`.body`), resolve the model
by name or alias, plan which models may answer (the model, its canary, its
fallbacks: :mod:`.fallbacks`), then, model by model, attempt endpoints
chosen by the balancer, each at most once. The next model of the plan is
tried only when every attempt on the last failed before the first byte;
each model has its own retry budget. ``x-llmgw-model`` names the model that
answered.

An external provider's endpoint gets its key from its file through a cache
(:mod:`.external`); a replica's comes with the endpoint (HMAC of the
cluster secret). With tracing on, each attempt runs in a child span of the
request's and the engine receives that span's ``traceparent``
(:mod:`.tracing`); with it off no span is made.

**Retry before the first byte** (at most ``limits.retries`` per request): an
attempt is retried whole on another endpoint while nothing has been sent to
the client, for failures that say the engine did not take the request or
did not finish it: connect refused/reset, connect timeout, the engine
closing the connection before answering or mid-body, or an engine answer of
5xx or 429 (read and discarded). A stream counts as "nothing sent" until
its first whole event is relayed, so one that breaks before that is retried
whole too. A first-byte timeout is not retried: the engine may be working
on it, and doubling a slow request's load helps nobody.

**Resume mid-stream** (at most ``resumes`` per request, default
:data:`DEFAULT_RESUMES`): a streamed chat or text completion that breaks
after events reached the client (connection reset, incomplete chunked body,
silence past ``limits.idle_stream_timeout_seconds``, an end without
``[DONE]``) is re-issued on another endpoint with what was already
generated, and the resumed events are rewritten so the client sees one
stream (:mod:`.resume` says how and when it is refused). A resumed attempt
that fails before its first event may itself be retried (within the retry
budget) or resumed again. When nothing more can be done the stream ends
with an SSE ``data: {"error": ...}`` event, which OpenAI clients raise.

**Relay**: a ``text/event-stream`` answer is copied as it arrives, cut only
at the last whole event in hand (the rest waits for the next read), so a
break never leaves half an event with the client. On the hot path the
router keeps the bytes it forwarded and parses them only for a resume (or in
64 KiB batches); a resumed attempt's events are parsed and rewritten. Any
other answer is read whole and copied with its status and content type.
Only chosen request headers go upstream (Accept, trace context,
x-request-id); the client's Authorization never does: it is replaced by the
endpoint's engine key.

When attempts run out before anything was sent: a final 429 is relayed as
the engine sent it (with its Retry-After), a final 5xx or connection
failure is a 502, a timeout a 504.

**Timeouts** are explicit deadlines (event-loop time) per stage, passed to
the upstream client's waits (:mod:`.upstream`; a timer per wait that
actually blocks, cheaper than an ``asyncio.timeout`` per read): until the
response headers and then the first event (first byte), each gap between
events (idle), and the whole request; the TCP connect has its own
(``limits.connect_timeout_seconds``).

**Cancellation**: the server runs with ``handler_cancellation=True``, so a
client that hangs up cancels this handler wherever it is waiting; the
upstream response (or the request still waiting for one) is then closed at
once (``close()``, not ``release()``), which closes the engine connection,
and the engine sees its client go away.

**Breaker**: each attempt is admitted by the breaker (which makes it the
probe of a half-open endpoint), and its outcome is reported: a failure
before or during the body, or success once the engine answered.

**Gate** (optional, client keys on): once the model is resolved, the gate
may refuse the request (model not allowed, over a limit) before any replica
is chosen; see :mod:`.auth`.

**Demand** (optional, with a control plane): every request marks its model
used (the idle clock of scale-to-zero); when no model of the chain (the
model, its canary, its fallbacks) has a route and the model is on demand,
the request is held while it wakes (see :mod:`.wake`). An asleep on-demand
model with a fallback that can answer is answered there and not woken: the
fallback is the capacity the operator chose to keep warm.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from multidict import CIMultiDict

from llmgw.common.errors import LlmgwError

from . import sse
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
from .fallbacks import Target
from .metrics import ModelSeries, RouterMetrics
from .resume import Kind, NotResumable, Rewriter, Transcript, continuation, kind_for
from .table import Model, Route
from .tracing import AttemptSpan
from .upstream import Upstream, UpstreamResponse

log = logging.getLogger(__name__)

PROXY_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
FORWARDED_HEADERS = ("Accept", "traceparent", "tracestate", "baggage")
REQUEST_ID = web.RequestKey("request_id", str)
# The canonical model answering a request, for metrics ("" until known): the
# one asked for, or its canary or fallback (see :mod:`.fallbacks`).
MODEL_LABEL = web.RequestKey("model_label", str)
# The endpoint of the request's last attempt ("" until one is tried).
REPLICA_LABEL = web.RequestKey("replica_label", str)
# The client's body, decoded and as sent: forwarded as sent when it needs no change.
_CLIENT_BODY = web.RequestKey("client_body", tuple)
# What a streamed chat or text completion sent the client, for token accounting (:mod:`.auth`).
TRANSCRIPT = web.RequestKey("transcript", Transcript)
# Broken streams one request may be resumed from.
DEFAULT_RESUMES = 2
# An SSE event longer than this is no token stream; the router gives it up.
MAX_EVENT_BYTES = 1024 * 1024


class RouteSource(Protocol):
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class Picker(Protocol):
    def affinity(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None: ...
    def pick(self, routes: Sequence[Route], exclude: set[str], key: int | None = None) -> Route | None: ...


class Gate(Protocol):
    """Admits a request once its model is known (client keys and quotas); raises to refuse."""

    def admit(self, request: web.Request, requested: str, model: Model) -> None: ...


class Demand(Protocol):
    """Usage and on-demand wake (wake.WakeHold); absent in standalone mode."""

    def used(self, model: str) -> None: ...
    async def routes(self, model: Model) -> Sequence[Route]: ...


class SessionSource(Protocol):
    def __call__(self, request: web.Request) -> Upstream: ...


class TargetPlanner(Protocol):
    def plan(self, model: Model, key: int | None = None) -> list[Target]: ...


class KeySource(Protocol):
    def key(self, path: str) -> str: ...


class AttemptTracer(Protocol):
    def attempt(self, route: Route) -> contextlib.AbstractContextManager[AttemptSpan]: ...
    def inject(self, headers: dict[str, str]) -> None: ...


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


@dataclass(frozen=True)
class _Broken:
    """A stream that broke after events reached the client."""

    endpoint_id: str
    reason: str
    # False when another replica would only fail the same way.
    resumable: bool = True


Outcome = web.StreamResponse | _Retryable | _Broken


class _ClientStream:
    """The client's side of one streamed response, across the attempts that feed it.

    The response is prepared (headers sent) with the first events written, so
    until then an attempt may still fail into a whole retry or a JSON error.
    """

    def __init__(
        self, request: web.Request, kind: Kind | None, data: dict[str, Any], metrics: RouterMetrics
    ) -> None:
        self._request = request
        self.transcript = Transcript.for_request(kind, data) if kind is not None else None
        self.response: web.StreamResponse | None = None
        self._last = b""
        # The write before the last: a final usage chunk may precede a [DONE] written apart.
        self._prev = b""
        self._metrics = metrics
        self._series: ModelSeries | None = None
        self._clock = asyncio.get_running_loop().time
        self._last_at = self._clock()

    @property
    def started(self) -> bool:
        return self.response is not None

    @property
    def done(self) -> bool:
        """Whether ``[DONE]`` has gone out."""
        return sse.ends_with_done(self._last)

    async def write(self, events: bytes, headers: dict[str, str]) -> None:
        if self.response is None:
            self.response = web.StreamResponse(status=200, headers=headers)
            self.response.headers["Cache-Control"] = "no-cache"
            # Tell a buffering reverse proxy in front (nginx) to pass chunks on.
            self.response.headers["X-Accel-Buffering"] = "no"
            await self.response.prepare(self._request)
            self._series = self._metrics.series(self._request[MODEL_LABEL])
        await self.response.write(events)
        now = self._clock()
        # The first write's gap is time to first token (from the request's arrival).
        assert self._series is not None
        (self._series.inter_token if self._last else self._series.ttft).observe(now - self._last_at)
        self._last_at = now
        self._prev, self._last = self._last, events

    async def end(self, tail: bytes = b"") -> web.StreamResponse:
        assert self.response is not None
        self._metrics.answered(self._request[MODEL_LABEL], self._prev + self._last + tail)
        try:
            if tail:
                await self.response.write(tail)
            await self.response.write_eof()
        except ConnectionResetError:
            log.info("request %s: client hung up at the end of the stream", self._request[REQUEST_ID])
        return self.response

    async def fail(self, message: str) -> web.StreamResponse:
        event = error_body(message, "server_error", None, "upstream_error")
        return await self.end(b"data: " + json.dumps(event).encode() + b"\n\n")


class Proxy:
    def __init__(
        self,
        table: RouteSource,
        balancer: Picker,
        breaker: Breaker,
        limits: Limits,
        metrics: RouterMetrics,
        session: SessionSource,
        *,
        planner: TargetPlanner,
        keys: KeySource,
        tracer: AttemptTracer | None = None,
        resumes: int = DEFAULT_RESUMES,
        gate: Gate | None = None,
        demand: Demand | None = None,
    ) -> None:
        self._gate = gate
        self._table = table
        self._balancer = balancer
        self._breaker = breaker
        self._limits = limits
        self._metrics = metrics
        self._session = session
        self._planner = planner
        self._keys = keys
        self._tracer = tracer
        self._resumes = resumes
        self._demand = demand

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        data, parsed = parse_body(raw)
        request[_CLIENT_BODY] = (data, raw)
        model = self._table.resolve(parsed.model)
        if model is None:
            raise ModelNotFound(parsed.model)
        request[MODEL_LABEL] = model.name
        if self._gate is not None:
            self._gate.admit(request, parsed.model, model)
        key = self._balancer.affinity(request.path, request.headers, data)
        if self._demand is not None:
            self._demand.used(model.name)
        targets = self._planner.plan(model, key)
        if not targets and self._demand is not None and model.on_demand:
            # Nothing in the chain can answer: hold the request while the
            # model wakes (bounded; ModelWaking past the timeout), then plan
            # again with its new replica.
            await self._demand.routes(model)
            targets = self._planner.plan(model, key)
        if not targets:
            raise NoReadyReplica(model.name, self._limits.retry_after_seconds)
        kind = kind_for(request.path) if parsed.stream else None
        stream = _ClientStream(request, kind, data, self._metrics)
        if stream.transcript is not None:
            request[TRANSCRIPT] = stream.transcript
        # One deadline for the whole request, across the models it may try.
        deadline = asyncio.get_running_loop().time() + self._limits.request_timeout_seconds
        try:
            failures: list[_Retryable] = []
            for target in targets:
                if target.via:
                    self._divert(request, model, target)
                request[MODEL_LABEL] = target.model.name
                outcome = await self._attempts(
                    request, target.model, target.routes, data, stream, deadline, key
                )
                if isinstance(outcome, web.StreamResponse):
                    return outcome
                failures += outcome
            return self._exhausted(request, targets[-1].model, failures)
        except LlmgwError as err:
            # Once the stream has started, an error can only be an event in it.
            if not stream.started:
                raise
            return await stream.fail(str(err))

    def _divert(self, request: web.Request, model: Model, target: Target) -> None:
        """Count and log a request leaving the model it asked for."""
        canary = target.via == "canary"
        family = self._metrics.canary if canary else self._metrics.fallbacks
        family.labels(model.name, target.model.name).inc()
        # A canary's share is routine (debug); a fallback means a model ran out of capacity (info).
        log.log(
            logging.DEBUG if canary else logging.INFO,
            "request %s: model %s answers through %s %s",
            request[REQUEST_ID],
            model.name,
            target.via,
            target.model.name,
        )

    async def _attempts(
        self,
        request: web.Request,
        model: Model,
        routes: Sequence[Route],
        data: dict[str, Any],
        stream: _ClientStream,
        deadline: float,
        key: int | None,
    ) -> web.StreamResponse | list[_Retryable]:
        """One target model's attempts; the failures when none answered and nothing was sent."""
        loop = asyncio.get_running_loop()
        tried: set[str] = set()
        failures: list[_Retryable] = []
        retries, resumes = self._limits.retries, self._resumes
        body = data
        while True:
            route = self._balancer.pick(routes, tried, key)
            if route is None:
                break
            tried.add(route.endpoint.id)
            outcome = await self._attempt(request, model, route, body, deadline, stream)
            if isinstance(outcome, web.StreamResponse):
                return outcome
            if isinstance(outcome, _Retryable):
                log.warning(
                    "request %s: endpoint %s failed before the first byte: %s",
                    request[REQUEST_ID],
                    outcome.endpoint_id,
                    outcome.reason,
                )
                failures.append(outcome)
                if not retries:
                    break
                retries -= 1
                self._metrics.series(model.name).retries.inc()
                continue
            log.warning(
                "request %s: replica %s %s mid-stream",
                request[REQUEST_ID],
                outcome.endpoint_id,
                outcome.reason,
            )
            broke = f"Replica {outcome.endpoint_id} {outcome.reason} mid-stream"
            if not outcome.resumable or stream.transcript is None:
                return await stream.fail(f"{broke}; the response is incomplete.")
            try:
                plan = continuation(data, stream.transcript)
            except NotResumable as err:
                return await stream.fail(f"{broke} and this stream cannot be resumed ({err}).")
            if plan.body is None:
                return await stream.end(plan.tail)
            if not resumes or loop.time() >= deadline:
                return await stream.fail(f"{broke} and the request has no resume or time left.")
            resumes -= 1
            self._metrics.series(model.name).resumes.inc()
            body = plan.body
        if stream.started:
            return await stream.fail(
                f"The stream broke and no other replica of model {model.name!r} could continue it "
                f"({len(tried)} tried); the response is incomplete."
            )
        return failures

    def _exhausted(
        self, request: web.Request, model: Model, failures: list[_Retryable]
    ) -> web.StreamResponse:
        last = failures[-1]
        if last.status == 429:
            headers = {
                "Content-Type": "application/json",
                "x-llmgw-replica": last.endpoint_id,
                "x-llmgw-model": model.name,
            }
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
        body: dict[str, Any],
        deadline: float,
        stream: _ClientStream,
    ) -> Outcome:
        state = route.state
        self._breaker.admit(state, asyncio.get_running_loop().time())
        request[REPLICA_LABEL] = route.endpoint.id
        # The in-flight gauge is read from these counts at scrape time (see :mod:`.metrics`).
        state.in_flight += 1
        try:
            if self._tracer is None:
                return await self._forward(request, route, body, deadline, stream)
            with self._tracer.attempt(route) as span:
                outcome = await self._forward(request, route, body, deadline, stream)
                if not isinstance(outcome, web.StreamResponse):
                    span.failed(outcome.reason)
                return outcome
        finally:
            state.in_flight -= 1

    async def _forward(
        self,
        request: web.Request,
        route: Route,
        body: dict[str, Any],
        deadline: float,
        stream: _ClientStream,
    ) -> Outcome:
        endpoint, state = route.endpoint, route.state
        loop = asyncio.get_running_loop()
        original, raw = request[_CLIENT_BODY]
        if body is original and body["model"] == endpoint.upstream_model:
            # The engine knows the model by the name the client used: relay the
            # client's bytes rather than re-encode what was just decoded.
            payload = raw
        else:
            payload = json.dumps({**body, "model": endpoint.upstream_model}).encode()
        url = endpoint.url + request.path
        if request.query_string:
            url += "?" + request.query_string
        first_byte = min(loop.time() + self._limits.first_byte_timeout_seconds, deadline)
        try:
            upstream = await self._session(request).post(
                url, data=payload, headers=self._upstream_headers(request, route), deadline=first_byte
            )
        except aiohttp.ConnectionTimeoutError:
            self._breaker.failure(state, loop.time())
            return _Retryable(endpoint.id, "connect timeout", timeout=True)
        except TimeoutError:
            # Ours (first byte or the whole request), or aiohttp's own read timeout.
            self._breaker.failure(state, loop.time())
            waited = "the request timeout" if first_byte >= deadline else "the first-byte timeout"
            if stream.started:
                return _Broken(endpoint.id, f"sent no response to the continuation within {waited}")
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
            if stream.started:
                return _Broken(endpoint.id, f"failed ({err})")
            raise UpstreamFailed(f"Replica {endpoint.id} failed: {err}") from None

        try:
            if upstream.status == 429 or upstream.status >= 500:
                answer, detail = await self._error_detail(upstream, deadline)
                if upstream.status != 429:
                    self._breaker.failure(state, loop.time())
                outcome: Outcome = _Retryable(
                    endpoint.id,
                    f"engine answered {upstream.status}: {detail}",
                    status=upstream.status,
                    body=answer,
                    headers=CIMultiDict(upstream.headers),
                )
            elif upstream.status == 200 and upstream.content_type == "text/event-stream":
                outcome = await self._relay(request, route, upstream, first_byte, deadline, stream)
            elif stream.started:
                # A resumed attempt answered, but not with a stream: it refused the continuation.
                _, detail = await self._error_detail(upstream, deadline)
                outcome = _Broken(
                    endpoint.id, f"answered {upstream.status} to the continuation: {detail}", resumable=False
                )
            else:
                outcome = await self._copy(request, route, upstream, deadline)
        except BaseException:
            upstream.close()
            raise
        if isinstance(outcome, web.StreamResponse) and upstream.content.at_eof():
            upstream.release()
        else:
            upstream.close()
        return outcome

    async def _error_detail(self, upstream: UpstreamResponse, deadline: float) -> tuple[bytes, str]:
        loop = asyncio.get_running_loop()
        try:
            answer = await upstream.read(
                min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline)
            )
            return answer, answer[:200].decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError) as err:
            return b"", f"(its error body was lost: {type(err).__name__})"

    def _upstream_headers(self, request: web.Request, route: Route) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "x-request-id": request[REQUEST_ID]}
        for name in FORWARDED_HEADERS:
            if name in request.headers:
                headers[name] = request.headers[name]
        if self._tracer is not None:
            # The engine's span is a child of this attempt's, not of the client's.
            self._tracer.inject(headers)
        endpoint = route.endpoint
        if endpoint.api_key_file:
            headers["Authorization"] = f"Bearer {self._keys.key(endpoint.api_key_file)}"
        elif endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        return headers

    def _response_headers(
        self, request: web.Request, route: Route, upstream: UpstreamResponse
    ) -> dict[str, str]:
        return {
            "Content-Type": upstream.headers.get("Content-Type", "application/json"),
            "x-llmgw-replica": route.endpoint.id,
            "x-llmgw-model": route.endpoint.model,
            "x-request-id": request[REQUEST_ID],
        }

    async def _copy(
        self,
        request: web.Request,
        route: Route,
        upstream: UpstreamResponse,
        deadline: float,
    ) -> web.StreamResponse | _Retryable:
        loop = asyncio.get_running_loop()
        try:
            body = await upstream.read(min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline))
        except TimeoutError:
            self._breaker.failure(route.state, loop.time())
            raise UpstreamTimeout(
                f"Replica {route.endpoint.id} stopped sending its response; retry."
            ) from None
        except aiohttp.ClientError as err:
            # Nothing has reached the client yet: the whole request may go elsewhere.
            self._breaker.failure(route.state, loop.time())
            return _Retryable(route.endpoint.id, f"broke off its response ({type(err).__name__}: {err})")
        self._breaker.success(route.state)
        if upstream.status == 200:
            self._metrics.answered(route.endpoint.model, body)
        headers = self._response_headers(request, route, upstream)
        return web.Response(status=upstream.status, body=body, headers=headers)

    async def _relay(
        self,
        request: web.Request,
        route: Route,
        upstream: UpstreamResponse,
        first_event_by: float,
        deadline: float,
        stream: _ClientStream,
    ) -> Outcome:
        """Copy an event stream to the client until it ends or breaks."""
        loop = asyncio.get_running_loop()
        idle = self._limits.idle_stream_timeout_seconds
        transcript = stream.transcript
        rewrite = Rewriter(transcript) if stream.started and transcript is not None else None
        headers = self._response_headers(request, route, upstream)
        reader = upstream.content
        wait_until = first_event_by
        tail = b""
        while True:
            try:
                chunk = await reader.readany(min(wait_until, deadline))
            except TimeoutError:
                silent = "sent no event" if wait_until == first_event_by else "went silent"
                return self._broke(route, stream, silent, loop.time() < deadline, timeout=True)
            except aiohttp.ClientError as err:
                return self._broke(route, stream, f"broke off ({type(err).__name__}: {err})", True)
            if not chunk:
                # An unterminated event at the end is dropped, as SSE says, unless it is [DONE].
                events = tail.rstrip() + b"\n\n" if sse.ends_with_done(tail) else b""
            else:
                if tail:
                    chunk = tail + chunk
                cut = sse.complete_prefix(chunk)
                events, tail = (chunk, b"") if cut == len(chunk) else (chunk[:cut], chunk[cut:])
                if len(tail) > MAX_EVENT_BYTES:
                    return self._broke(route, stream, f"sent an event over {MAX_EVENT_BYTES} bytes", False)
                if events:
                    wait_until = loop.time() + idle
            if events and rewrite is not None:
                events = rewrite(events)
            elif events and transcript is not None:
                transcript.record(events)
            if events:
                try:
                    await stream.write(events, headers)
                except ConnectionResetError:
                    # The client went away between chunks; nothing is left to tell it.
                    log.info("request %s: client hung up mid-stream", request[REQUEST_ID])
                    assert stream.response is not None
                    return stream.response
            if not chunk:
                break
        if stream.done:
            self._breaker.success(route.state)
            return await stream.end()
        return self._broke(route, stream, "ended its stream without [DONE]", True)

    def _broke(
        self, route: Route, stream: _ClientStream, reason: str, counts: bool, *, timeout: bool = False
    ) -> _Retryable | _Broken:
        """An attempt's stream failed: a whole retry if nothing went out, else a break.

        ``counts`` is False when the engine is not to blame (the request's own
        deadline passed), so the breaker is left alone.
        """
        if counts:
            self._breaker.failure(route.state, asyncio.get_running_loop().time())
        if stream.started:
            return _Broken(route.endpoint.id, reason)
        if timeout:
            raise UpstreamTimeout(
                f"Replica {route.endpoint.id} {reason} within the first-byte timeout; retry, or raise "
                "limits.first_byte_timeout_seconds if the model is this slow."
            )
        return _Retryable(route.endpoint.id, reason)
