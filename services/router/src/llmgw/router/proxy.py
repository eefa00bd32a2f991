"""Forwarding an OpenAI request: which models and endpoints, retries, resumes.

One request, in order: read the body (aiohttp refuses one over
``client_max_size`` with 413), check it (:mod:`.body`), resolve the model
by name or alias, refuse an API the model's catalog entry does not list
(400, :class:`.errors.ApiNotServed`; the path's API is data in
:mod:`.apis`), plan which models may answer (the model, its canary, its
fallbacks: :mod:`.fallbacks`), then, model by model, attempt endpoints
chosen by the balancer, each at most once. The next model of the plan is
tried only when every attempt on the last failed before the first byte;
each model has its own retry budget. ``x-llmgw-model`` names the model that
answered.

Three modules share the work, split where the knowledge divides: this one
holds the request-level policy (the plan, the retry and resume budgets, one
deadline for the whole request, what the client gets when attempts run
out); :mod:`.forward` makes one attempt on one endpoint (upstream headers
and keys, per-stage timeouts, cancellation, the breaker) and says how it
failed; :mod:`.clientstream` is the client's side of a streamed answer (SSE
framing, the transcript and rewriting of a resume, stream metrics).

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
:data:`DEFAULT_RESUMES`; only the APIs whose :class:`.apis.ApiPath` has a
``resume`` kind): a streamed chat or text completion that breaks
after events reached the client (connection reset, incomplete chunked body,
silence past ``limits.idle_stream_timeout_seconds``, an end without
``[DONE]``, or for other APIs without their last event) is re-issued on another endpoint with what was already
generated, and the resumed events are rewritten so the client sees one
stream (:mod:`.resume` says how and when it is refused). A resumed attempt
that fails before its first event may itself be retried (within the retry
budget) or resumed again. When nothing more can be done the stream ends
with an SSE ``data: {"error": ...}`` event, which OpenAI clients raise.

When attempts run out before anything was sent: a final 429 is relayed as
the engine sent it (with its Retry-After), a final 5xx or connection
failure is a 502, a timeout a 504.

**Timeouts**: the whole request has one deadline
(``limits.request_timeout_seconds``, event-loop time) across every model
and attempt it tries; each attempt's stages have their own within it (see
:mod:`.forward`).

**Cancellation**: the server runs with ``handler_cancellation=True``, so a
client that hangs up cancels this handler wherever it is waiting; the
attempt in flight then closes its engine connection at once, and the engine
sees its client go away (:mod:`.forward`).

**Breaker**: each attempt is admitted by the breaker here (which makes it
the probe of a half-open endpoint) and counted in its endpoint's requests
in flight while it runs; its outcome is reported by :mod:`.forward`.

**Stored responses** (the Responses API): a request with a
``previous_response_id`` goes only to the replica that id names, with the
engine's own id in its body, and no fallback or canary; when that replica
is gone it is a 404 (:mod:`.responseids`).

**Hung engines** (optional, with engine metrics polled): an attempt on an
endpoint whose ``/metrics`` goes unanswered and that made no progress for a
second is cut off and counted as a failure: retried elsewhere before the
first byte, resumed elsewhere after it (see :mod:`.stall`). Unlike a
first-byte timeout, this is retried: the engine's silence says it is not
working on the request.

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
import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from llmgw.common.errors import LlmgwError

from .apis import PATHS
from .body import decode, exact, parse_body, parse_form
from .breaker import Breaker
from .clientstream import ClientStream
from .config import Limits
from .errors import (
    ApiNotServed,
    ModelNotFound,
    NoReadyReplica,
    ResponseNotFound,
    UpstreamFailed,
    UpstreamTimeout,
)
from .fallbacks import Target
from .federation import HOPS_HEADER, HopLimitReached, incoming_hops
from .forward import (
    AttemptTracer,
    Broken,
    Forwarder,
    KeySource,
    Outcome,
    Response,
    Retryable,
    SessionSource,
)
from .metrics import RouterMetrics
from .requestkeys import CLIENT_BODY, MODEL_LABEL, REPLICA_LABEL, REQUEST_ID
from .responseids import ResponseIds
from .resume import NotResumable, continuation
from .seam import ProxyRequest
from .stall import StallWatch
from .table import Model, Route

log = logging.getLogger(__name__)

# Every path the proxy forwards: the API table's (see :mod:`.apis`).
PROXY_PATHS = tuple(PATHS)
# Broken streams one request may be resumed from.
DEFAULT_RESUMES = 2


class RouteSource(Protocol):
    def resolve(self, name: str) -> Model | None: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class Picker(Protocol):
    def affinity(self, path: str, headers: Mapping[str, str], body: Mapping[str, Any]) -> int | None: ...
    def pick(self, routes: Sequence[Route], exclude: set[str], key: int | None = None) -> Route | None: ...


class Gate(Protocol):
    """Admits a request once its model is known (client keys and quotas); raises to refuse."""

    def admit(self, request: ProxyRequest, requested: str, model: Model) -> None: ...


class Demand(Protocol):
    """Usage and on-demand wake (wake.WakeHold); absent in standalone mode."""

    def used(self, model: str) -> None: ...
    async def routes(self, model: Model) -> Sequence[Route]: ...


class ImageMaker(Protocol):
    """Answers an images request on one ComfyUI route (:class:`.comfyui.ComfyClient`)."""

    def check(self, model: Model, body: dict[str, Any]) -> None:
        """Raise a 4xx (or the model's workflow problem) before any replica is chosen or woken."""
        ...

    async def attempt(
        self, request: ProxyRequest, route: Route, model: Model, body: dict[str, Any], deadline: float
    ) -> Outcome: ...


class TargetPlanner(Protocol):
    def plan(self, model: Model, key: int | None = None) -> list[Target]: ...


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
        ids: ResponseIds,
        tracer: AttemptTracer | None = None,
        resumes: int = DEFAULT_RESUMES,
        gate: Gate | None = None,
        demand: Demand | None = None,
        stalls: StallWatch | None = None,
        images: ImageMaker | None = None,
    ) -> None:
        self._images = images
        self._gate = gate
        self._stalls = stalls
        self._table = table
        self._balancer = balancer
        self._limits = limits
        # Read per request, kept as plain attributes: an attribute of the settings (a pydantic
        # model, whose __getattr__ hook defeats the interpreter's attribute cache) costs several.
        self._request_seconds = limits.request_timeout_seconds
        self._retries = limits.retries
        self._metrics = metrics
        self._planner = planner
        self._resumes = resumes
        self._demand = demand
        self._breaker = breaker
        self._ids = ids
        self._forwarder = Forwarder(breaker, limits, metrics, session, keys=keys, ids=ids, tracer=tracer)
        # The event loop, once a request has looked it up (see :meth:`.Forwarder.loop`).
        self._loop: asyncio.AbstractEventLoop | None = None

    def _looked_up(self) -> asyncio.AbstractEventLoop:
        self._loop = self._forwarder.loop()
        return self._loop

    async def handle(self, request: ProxyRequest) -> Response:
        raw = request.body
        if raw is None:
            raw = await request.read()
        api = PATHS[request.path]
        if api.form:
            data, asked, streamed = parse_form(raw, request.headers.get("Content-Type", ""))
        else:
            data, asked, streamed = parse_body(raw)
        request[CLIENT_BODY] = (data, raw)
        model = self._table.resolve(asked)
        if model is None:
            raise ModelNotFound(asked)
        request[MODEL_LABEL] = model.name
        if model.apis and api.api not in model.apis:
            raise ApiNotServed(model.name, api.api, model.apis)
        if api.images and (model.comfy is None or self._images is None):
            raise ApiNotServed(model.name, api.api, model.apis or ("every API but images",))
        if model.comfy is not None and not api.images:
            raise ApiNotServed(model.name, api.api, ("images",))
        if self._gate is not None:
            self._gate.admit(request, asked, model)
        if api.images and self._images is not None:
            # Before a replica is chosen or woken: a bad field is a 400 at once.
            self._images.check(model, data)
        key = self._balancer.affinity(request.path, request.headers, data)
        if self._demand is not None:
            self._demand.used(model.name)
        previous = data.get("previous_response_id") if api.stored else None
        if isinstance(previous, str):
            # Continues a stored response: only its replica holds it (see :mod:`.responseids`).
            data = self._home(request, model, previous)
            targets = [Target(model, self._home_routes(model, previous))]
        else:
            targets = self._planner.plan(model, key)
        if not targets and self._demand is not None and model.on_demand:
            # Nothing in the chain can answer: hold the request while the
            # model wakes (bounded; ModelWaking past the timeout), then plan
            # again with its new replica.
            await self._demand.routes(model)
            targets = self._planner.plan(model, key)
        if targets and request.headers.get(HOPS_HEADER) is not None:
            hops = incoming_hops(request.headers)
            if hops:
                targets = self._within_hops(model, targets, hops)
        if not targets:
            raise NoReadyReplica(model.name, self._limits.retry_after_seconds)
        kind = api.resume if streamed else None
        loop = self._loop or self._looked_up()
        stream = ClientStream(request, kind, data, self._metrics, loop.time, api)
        # One deadline for the whole request, across the models it may try.
        deadline = loop.time() + self._request_seconds
        try:
            failures: list[Retryable] = []
            for target in targets:
                member, routes, via = target  # unpacked: a NamedTuple's fields are slow attributes
                if via:
                    self._divert(request, model, target)
                request[MODEL_LABEL] = member.name
                outcome = await self._attempts(request, member, routes, data, stream, deadline, key)
                if not isinstance(outcome, list):
                    return outcome
                failures += outcome
            return self._exhausted(request, targets[-1].model, failures)
        except LlmgwError as err:
            # Once the stream has started, an error can only be an event in it.
            if not stream.started:
                raise
            return await stream.fail(str(err))

    @staticmethod
    def _within_hops(model: Model, targets: list[Target], hops: int) -> list[Target]:
        """The plan without the peer routes a request that came this far may not take (:mod:`.federation`)."""
        kept: list[Target] = []
        limit = 0
        for target in targets:
            routes = [r for r in target.routes if not r.endpoint.peer or hops < r.endpoint.hop_limit]
            if len(routes) < len(target.routes):
                limit = max(limit, *(r.endpoint.hop_limit for r in target.routes if r.endpoint.peer))
            if routes:
                kept.append(target._replace(routes=routes))
        if not kept and limit:
            raise HopLimitReached(model.name, hops, limit)
        return kept

    def _home(self, request: ProxyRequest, model: Model, previous: str) -> dict[str, Any]:
        """The body with ``previous_response_id`` in the engine's own terms."""
        _, engine_id = self._ids.unwrap(previous)
        raw = json.dumps({**exact(request[CLIENT_BODY][1]), "previous_response_id": engine_id}).encode()
        data: dict[str, Any] = decode(raw)
        request[CLIENT_BODY] = (data, raw)
        return data

    def _home_routes(self, model: Model, previous: str) -> list[Route]:
        endpoint_id, _ = self._ids.unwrap(previous)
        routes = [r for r in self._table.routes(model.name) if r.endpoint.id == endpoint_id]
        if not routes:
            raise ResponseNotFound(
                previous, f"the replica that stored it ({endpoint_id}) no longer serves model {model.name!r}"
            )
        return routes

    def _divert(self, request: ProxyRequest, model: Model, target: Target) -> None:
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
        request: ProxyRequest,
        model: Model,
        routes: Sequence[Route],
        data: dict[str, Any],
        stream: ClientStream,
        deadline: float,
        key: int | None,
    ) -> Response | list[Retryable]:
        """One target model's attempts; the failures when none answered and nothing was sent."""
        loop = self._loop or self._looked_up()
        tried: set[str] = set()
        failures: list[Retryable] = []
        retries, resumes = self._retries, self._resumes
        body = data
        while True:
            route = self._balancer.pick(routes, tried, key)
            if route is None:
                break
            endpoint_id = route.endpoint.id
            tried.add(endpoint_id)
            state = route.state
            self._breaker.admit(state, loop.time())
            request[REPLICA_LABEL] = endpoint_id
            # The in-flight gauge is read from these counts at scrape time (see :mod:`.metrics`).
            state.in_flight += 1
            try:
                if self._images is not None and model.comfy is not None:
                    attempt = self._images.attempt(request, route, model, body, deadline)
                else:
                    attempt = self._forwarder.attempt(request, route, body, deadline, stream)
                stalls = self._stalls
                if stalls is None or not route.endpoint.polled:
                    outcome = await attempt
                else:
                    # Watched: cut off (then retried or resumed) if its engine hangs (see :mod:`.stall`).
                    # Inline, not a coroutine around the attempt: this runs for every attempt. With
                    # the loop passed, current_task makes no getpid system call.
                    task = asyncio.current_task(loop)
                    stalls.enter(stream, route, task)
                    try:
                        outcome = await attempt
                    except BaseException as err:
                        if not _taken_back(stream, task, err):
                            raise
                        outcome = self._stalled(route, stream, loop.time())
                    else:
                        if stream.cut and task is not None:
                            task.uncancel()  # the attempt ended as it was cut
                    finally:
                        stalls.leave(stream)
            finally:
                state.in_flight -= 1
            if isinstance(outcome, Retryable):
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
            if not isinstance(outcome, Broken):
                return outcome  # the client's answer
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
                # From an exact decode: the continuation is re-encoded (see :mod:`.body`).
                plan = continuation(exact(request[CLIENT_BODY][1]), stream.transcript)
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

    def _stalled(self, route: Route, stream: ClientStream, now: float) -> Outcome:
        """The outcome of an attempt the stall watch cut off (see :mod:`.stall`)."""
        self._breaker.failure(route.state, now)
        reason = "stopped answering (no progress, its /metrics unanswered)"
        if stream.started:
            return Broken(route.endpoint.id, reason)
        return Retryable(route.endpoint.id, reason, timeout=True)

    def _exhausted(self, request: ProxyRequest, model: Model, failures: list[Retryable]) -> Response:
        last = failures[-1]
        if last.status == 429:
            headers = {
                "Content-Type": "application/json",
                "x-llmgw-replica": last.endpoint_id,
                "x-llmgw-model": model.name,
            }
            if last.headers and "Retry-After" in last.headers:
                headers["Retry-After"] = last.headers["Retry-After"]
            return request.responder.whole(429, headers, last.body)
        tried = "; ".join(f"{f.endpoint_id}: {f.reason}" for f in failures)
        message = (
            f"No replica of model {model.name!r} answered ({len(failures)} tried: {tried}). "
            "The cluster may be replacing them; retry shortly."
        )
        if last.timeout:
            raise UpstreamTimeout(message)
        raise UpstreamFailed(message)


def _taken_back(stream: ClientStream, task: asyncio.Task[Any] | None, err: BaseException) -> bool:
    """Whether ``err``, which ended a watched attempt, is the stall watch's cut.

    As ``asyncio.timeout`` does: after a cut its cancellation request is
    taken back, and a CancelledError that no other request explains (the
    client left, shutdown) is the cut's.
    """
    cut = stream.cut and task is not None and task.uncancel() == 0
    return cut and isinstance(err, asyncio.CancelledError)
