"""One attempt: a request forwarded to one endpoint, and how it failed.

:meth:`Forwarder.attempt` sends the request to one endpoint and returns
either the client's response or a failure the proxy's loop judges
(:mod:`.proxy` holds the retry and resume policy and says why):
:class:`Retryable` when nothing reached the client and the engine did not
take the request or did not finish it, :class:`Broken` when a stream broke
after events reached the client. Before anything reached the client, what ends
the request outright is raised: a timeout waiting for the first byte or for
the rest of a whole answer (:class:`.errors.UpstreamTimeout`), or an HTTP
failure other than a lost connection (:class:`.errors.UpstreamFailed`);
after, the same failures are a :class:`Broken`.

**The request upstream**: the client's bytes are forwarded as sent when the
engine knows the model by the name the client used, else the client's
object re-encoded with only ``model`` rewritten (:mod:`.body`). Only chosen
request headers go upstream (Accept, trace context, x-request-id); the
client's Authorization never does: it is replaced by the endpoint's engine
key. An external provider's endpoint gets its key from its file through a
cache (:mod:`.external`); a replica's comes with the endpoint (HMAC of the
cluster secret). With tracing on, each attempt runs in a child span of the
request's and the engine receives that span's ``traceparent``
(:mod:`.tracing`); with it off no span is made.

**The answer**: a ``text/event-stream`` answer is relayed into the client's
stream (:mod:`.clientstream`); any other answer is read whole and copied
with its status and content type. A 5xx or 429 is read and discarded (a 429
kept, to be relayed if no attempt is left).

**Timeouts** are explicit deadlines (event-loop time) per stage, passed to
the upstream client's waits (:mod:`.upstream_wire`; a timer per
connection or answer, re-armed only when it fires, rather than an
``asyncio.timeout`` per wait): until the
response headers and then the first event (first byte), each gap between
events (idle), and the whole request (the proxy's deadline); the TCP
connect has its own (``limits.connect_timeout_seconds``).

**Cancellation**: when the client hangs up and its handler is cancelled,
the upstream response (or the request still waiting for one) is closed at
once (``close()``, not ``release()``), which closes the engine connection,
and the engine sees its client go away. A connection goes back to the pool
(``release()``) only after an answer was relayed and read to its end.

**Breaker**: each attempt's outcome is reported (the proxy admitted it,
which makes it the probe of a half-open endpoint): a failure
before or during the body, or success once the engine answered. A 429 does
not count against the endpoint, nor a stream the engine is not to blame for
(:attr:`.clientstream.StreamBreak.counts`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from multidict import CIMultiDict

from .apis import PATHS
from .body import exact, replace_form_field
from .breaker import Breaker
from .clientstream import ClientStream, Relayed
from .config import Limits
from .errors import UpstreamFailed, UpstreamTimeout
from .federation import HOPS_HEADER, ORIGIN_HEADER, incoming_hops
from .fields import Fields, pick
from .metrics import RouterMetrics
from .requestkeys import CLIENT_BODY, REQUEST_ID
from .responseids import IdRewriter, ResponseIds
from .seam import ProxyRequest, Reply
from .table import Route
from .tracing import AttemptSpan
from .upstream import Upstream, UpstreamResponse

FORWARDED_HEADERS = ("Accept", "traceparent", "tracestate", "baggage")
# Whether a head (lowered) has one of them: one search, where most requests have none.
_FORWARDED = re.compile(b"\r\n(?:" + b"|".join(n.lower().encode() for n in FORWARDED_HEADERS) + b"):")
# How long a stream whose last event went out waits for the engine's end of body (it follows at
# once from a sound engine), so that the connection is reused rather than closed.
END_OF_BODY_WAIT_SECONDS = 1.0


def _content_type(request: ProxyRequest) -> str:
    """What the body forwarded is: JSON, or the client's own form (its boundary with it)."""
    if PATHS[request.path].form:
        return request.headers.get("Content-Type", "")
    return "application/json"


class SessionSource(Protocol):
    """The app's upstream client (made when the app starts, so looked up per request)."""

    def __call__(self) -> Upstream: ...


class KeySource(Protocol):
    def key(self, path: str) -> str: ...


class AttemptTracer(Protocol):
    def attempt(self, route: Route) -> contextlib.AbstractContextManager[AttemptSpan]: ...
    def inject(self, headers: dict[str, str]) -> None: ...


@dataclass(frozen=True)
class Retryable:
    """An attempt that failed before any byte reached the client."""

    endpoint_id: str
    reason: str
    timeout: bool = False
    # Set when the engine answered 429: relayed if no attempt is left.
    status: int = 0
    body: bytes = b""
    headers: CIMultiDict[str] | None = None


@dataclass(frozen=True)
class Broken:
    """A stream that broke after events reached the client."""

    endpoint_id: str
    reason: str
    # False when another replica would only fail the same way.
    resumable: bool = True


# What the client gets: its server's whole answer, or the stream already under way.
Response = Reply
Outcome = Response | Retryable | Broken
# An attempt's failures (a tuple: isinstance with ``A | B`` builds the union on every call).
_FAILED = (Retryable, Broken)


class Forwarder:
    """Makes one attempt of a request on one endpoint; see the module docstring."""

    def __init__(
        self,
        breaker: Breaker,
        limits: Limits,
        metrics: RouterMetrics,
        session: SessionSource,
        *,
        keys: KeySource,
        ids: ResponseIds,
        tracer: AttemptTracer | None = None,
    ) -> None:
        self._ids = ids
        self._breaker = breaker
        self._limits = limits
        # Read per attempt: a plain attribute, not the settings' (see :class:`.proxy.Proxy`).
        self._first_byte_seconds = limits.first_byte_timeout_seconds
        self._metrics = metrics
        self._session = session
        self._keys = keys
        self._tracer = tracer
        # One attempt on one route: the client's response, or how the attempt failed. Without
        # tracing, no wrapper: this runs for every request.
        self.attempt = self._forward if tracer is None else self._traced
        self._running: asyncio.AbstractEventLoop | None = None

    def loop(self) -> asyncio.AbstractEventLoop:
        """The event loop, looked up once: ``asyncio.get_running_loop()`` makes a getpid
        system call (its fork check) every time, several per request."""
        if self._running is None:
            self._running = asyncio.get_running_loop()
        return self._running

    async def _traced(
        self,
        request: ProxyRequest,
        route: Route,
        body: dict[str, Any],
        deadline: float,
        stream: ClientStream,
    ) -> Outcome:
        """An attempt in a span of its own, which records how it failed."""
        assert self._tracer is not None
        with self._tracer.attempt(route) as span:
            outcome = await self._forward(request, route, body, deadline, stream)
            if isinstance(outcome, _FAILED):
                span.failed(outcome.reason)
            return outcome

    async def _forward(
        self,
        request: ProxyRequest,
        route: Route,
        body: dict[str, Any],
        deadline: float,
        stream: ClientStream,
    ) -> Outcome:
        endpoint, state = route.endpoint, route.state
        loop = self._running or self.loop()
        original, raw = request[CLIENT_BODY]
        api = PATHS[request.path]
        if api.form:
            # A file upload: the client's bytes, with the model's form field spliced when renamed.
            same = body["model"] == endpoint.upstream_model
            payload = (
                raw
                if same
                else replace_form_field(raw, _content_type(request), "model", endpoint.upstream_model)
            )
        elif body is original:
            if body["model"] == endpoint.upstream_model:
                # The engine knows the model by the name the client used: relay the
                # client's bytes rather than re-encode what was just decoded.
                payload = raw
            else:
                # Re-encoded from an exact decode, not the routing view (see :mod:`.body`).
                payload = json.dumps({**exact(raw), "model": endpoint.upstream_model}).encode()
        else:
            # A continuation, built from an exact decode by the proxy.
            payload = json.dumps({**body, "model": endpoint.upstream_model}).encode()
        first_byte = loop.time() + self._first_byte_seconds
        if first_byte > deadline:
            first_byte = deadline
        # The Responses API's ids are rewritten to name this replica (see :mod:`.responseids`).
        ids = IdRewriter(self._ids, endpoint.id) if api.stored else None
        try:
            upstream = await self._session().post(
                endpoint.url + request.path,
                query=request.query_string,
                data=payload,
                headers=self._upstream_headers(request, route),
                deadline=first_byte,
            )
        except aiohttp.ConnectionTimeoutError:
            self._breaker.failure(state, loop.time())
            return Retryable(endpoint.id, "connect timeout", timeout=True)
        except TimeoutError:
            # Ours (first byte or the whole request), or aiohttp's own read timeout.
            self._breaker.failure(state, loop.time())
            waited = "the request timeout" if first_byte >= deadline else "the first-byte timeout"
            if stream.started:
                return Broken(endpoint.id, f"sent no response to the continuation within {waited}")
            raise UpstreamTimeout(
                f"Replica {endpoint.id} sent no response within {waited}; retry, or raise "
                "limits.first_byte_timeout_seconds if the model is this slow."
            ) from None
        except aiohttp.ClientConnectionError as err:
            # Refused, reset, or closed before any answer: the engine did not take it.
            self._breaker.failure(state, loop.time())
            return Retryable(endpoint.id, f"{type(err).__name__}: {err}")
        except aiohttp.ClientError as err:
            self._breaker.failure(state, loop.time())
            if stream.started:
                return Broken(endpoint.id, f"failed ({err})")
            raise UpstreamFailed(f"Replica {endpoint.id} failed: {err}") from None

        status = upstream.status
        try:
            if status == 429 or status >= 500:
                answer, detail = await self._error_detail(upstream, deadline)
                if status != 429:
                    self._breaker.failure(state, loop.time())
                outcome: Outcome = Retryable(
                    endpoint.id,
                    f"engine answered {status}: {detail}",
                    status=status,
                    body=answer,
                    headers=CIMultiDict(upstream.headers),
                )
            elif status == 200 and upstream.content_type == "text/event-stream":
                outcome = await self._relay(request, route, upstream, first_byte, deadline, stream, ids)
            elif stream.started:
                # A resumed attempt answered, but not with a stream: it refused the continuation.
                _, detail = await self._error_detail(upstream, deadline)
                outcome = Broken(
                    endpoint.id, f"answered {status} to the continuation: {detail}", resumable=False
                )
            else:
                # A small answer usually arrives with its head: nothing left to wait for, and
                # nothing to release (its connection went back when its last byte came).
                whole = upstream.take_whole()
                if whole is not None:
                    return self._answer(request, route, upstream, whole, ids)
                outcome = await self._copy(request, route, upstream, deadline, ids)
        except BaseException:
            upstream.close()
            raise
        if not isinstance(outcome, _FAILED) and upstream.at_eof():
            upstream.release()
        else:
            upstream.close()
        return outcome

    async def _end_of_body(self, upstream: UpstreamResponse, deadline: float) -> None:
        """Wait briefly for the end of a stream whose last event went out, so that its connection
        goes back to the pool; bytes after the last event are not relayed (the connection is then
        closed: see :meth:`_forward`)."""
        if upstream.at_eof():
            return
        loop = self._running or self.loop()
        try:
            await upstream.readany(min(loop.time() + END_OF_BODY_WAIT_SECONDS, deadline))
        except (TimeoutError, aiohttp.ClientError):
            pass  # not at its end: closed, not reused

    async def _error_detail(self, upstream: UpstreamResponse, deadline: float) -> tuple[bytes, str]:
        loop = self.loop()
        try:
            answer = await upstream.read(
                min(loop.time() + self._limits.idle_stream_timeout_seconds, deadline)
            )
            return answer, answer[:200].decode(errors="replace")
        except (TimeoutError, aiohttp.ClientError) as err:
            return b"", f"(its error body was lost: {type(err).__name__})"

    def _upstream_headers(self, request: ProxyRequest, route: Route) -> dict[str, str]:
        content_type = (
            request.headers.get("Content-Type", "") if PATHS[request.path].form else "application/json"
        )
        headers = {"Content-Type": content_type, "x-request-id": request[REQUEST_ID]}
        client = request.headers
        if type(client) is not Fields or _FORWARDED.search(client.lowered) is not None:
            headers.update(pick(client, FORWARDED_HEADERS))
        if self._tracer is not None:
            # The engine's span is a child of this attempt's, not of the client's.
            self._tracer.inject(headers)
        endpoint = route.endpoint
        if endpoint.peer:
            # A peer cluster's router: how far the request has come, and from whom (:mod:`.federation`).
            headers[HOPS_HEADER] = str(incoming_hops(client) + 1)
            if endpoint.origin_cluster:
                headers[ORIGIN_HEADER] = endpoint.origin_cluster
        if endpoint.api_key_file:
            headers["Authorization"] = f"Bearer {self._keys.key(endpoint.api_key_file)}"
        elif endpoint.api_key:
            headers["Authorization"] = f"Bearer {endpoint.api_key}"
        return headers

    def _response_headers(
        self, request: ProxyRequest, route: Route, upstream: UpstreamResponse
    ) -> dict[str, str]:
        return {
            "Content-Type": upstream.content_type_field or "application/json",
            "x-llmgw-replica": route.endpoint.id,
            "x-llmgw-model": route.endpoint.model,
            "x-request-id": request[REQUEST_ID],
        }

    async def _copy(
        self,
        request: ProxyRequest,
        route: Route,
        upstream: UpstreamResponse,
        deadline: float,
        ids: IdRewriter | None,
    ) -> Response | Retryable:
        loop = self.loop()
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
            return Retryable(route.endpoint.id, f"broke off its response ({type(err).__name__}: {err})")
        return self._answer(request, route, upstream, body, ids)

    def _answer(
        self,
        request: ProxyRequest,
        route: Route,
        upstream: UpstreamResponse,
        body: bytes,
        ids: IdRewriter | None = None,
    ) -> Response:
        """The client's copy of an engine's whole answer."""
        self._breaker.success(route.state)
        if upstream.status == 200:
            self._metrics.answered(route.endpoint.model, body)
            if ids is not None:
                body = ids(body)
        headers = {
            "Content-Type": upstream.content_type_field or "application/json",
            "x-llmgw-replica": route.endpoint.id,
            "x-llmgw-model": route.endpoint.model,
            "x-request-id": request[REQUEST_ID],
        }  # _response_headers(), inline: this runs for every whole answer
        return request.responder.whole(upstream.status, headers, body)

    async def _relay(
        self,
        request: ProxyRequest,
        route: Route,
        upstream: UpstreamResponse,
        first_event_by: float,
        deadline: float,
        stream: ClientStream,
        ids: IdRewriter | None,
    ) -> Outcome:
        """Relay an event stream to the client, and judge how it ended.

        A break is a whole retry if nothing went out, else a resume's to
        decide; it counts against the endpoint in the breaker unless the
        engine is not to blame (the request's own deadline passed).
        """
        relayed = await stream.relay(
            upstream.content,
            self._response_headers(request, route, upstream),
            first_event_by=first_event_by,
            idle=self._limits.idle_stream_timeout_seconds,
            deadline=deadline,
            ids=ids,
        )
        if relayed is Relayed.DONE:
            self._breaker.success(route.state)
            reply = await stream.end()
            await self._end_of_body(upstream, deadline)
            return reply
        if relayed is Relayed.HUNG_UP:
            assert stream.response is not None
            return stream.response
        if relayed.counts:
            self._breaker.failure(route.state, self.loop().time())
        endpoint_id, reason = route.endpoint.id, relayed.reason
        if stream.started:
            return Broken(endpoint_id, reason)
        if relayed.timeout:
            raise UpstreamTimeout(
                f"Replica {endpoint_id} {reason} within the first-byte timeout; retry, or raise "
                "limits.first_byte_timeout_seconds if the model is this slow."
            )
        return Retryable(endpoint_id, reason)
