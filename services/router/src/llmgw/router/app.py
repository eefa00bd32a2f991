"""The router's aiohttp application: what every request meets, built from the configuration.

:func:`build_app` is the composition root below the entry point: it builds
the routing table from the configuration (static backends), the watch
client when control planes are configured, the balancer, metrics and the
proxy, and wires them into one ``web.Application``. Background work is owned
by ``cleanup_ctx``: the upstream ``ClientSession`` (one per app, pooled), the
watch task and the engine-metrics poller, cancelled and awaited on shutdown.

:class:`.server.RouterServer` runs that app on a real socket (port 0
allowed) behind the router's own front (:mod:`.front`).

Routes: the proxied POST paths (:data:`.apis.PATHS`) and, answered by
:mod:`.routes`, the stored responses by id (:class:`.responseids.StoredResponses`), ``GET /v1/models`` (and
``/v1/models/{name}``), ``/health`` (the process answers), ``/ready``
(the table has been loaded, or there is no control plane to wait for; with
``auth: keys`` the key table too) and ``/metrics``. With ``auth: keys`` the
:mod:`.auth` middleware checks the client's key on every ``/v1/`` path and
the proxy's gate its models and limits; the quota sync runs beside the
watch. ``/v1/models`` lists each catalog model once under its
canonical name, with a non-standard ``aliases`` field that OpenAI clients
ignore: listing aliases as models of their own would show one model twice
in every picker.

Errors, request ids, metrics, the access line and spans: the one
middleware of :mod:`.envelope` maps every exception (ours, aiohttp's
404/405/413, anything unexpected) through :func:`.errors.error_response`,
so a handler failure is a 500 JSON answer and a log line, never a dead
worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, cast

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware as AiohttpMiddleware
from opentelemetry import trace
from prometheus_client import CollectorRegistry

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.keys import engine_key, read_secret
from llmgw.common.tasks import cancel_and_wait

from .apis import REALTIME_PATH
from .auth import Auth, KeyMetrics, KeyTable
from .balancer import Balancer
from .breaker import Breaker
from .comfyui import ComfyClient
from .config import Limits, RouterConfig
from .enginemetrics import EngineMetricsPoller
from .envelope import Handler as ChainHandler
from .envelope import Middleware, middleware
from .external import KeyFiles
from .fallbacks import Planner
from .front import Handler
from .metrics import RouterMetrics
from .proxy import PROXY_PATHS, Proxy
from .quota import Quotas
from .quotasync import QuotaSync
from .realtime import Realtime
from .responseids import STORED_PREFIX, ResponseIds, StoredResponses
from .routes import MODEL_PREFIX, Handlers, OtherRoutes, chain
from .seam import AiohttpRequest, AiohttpSocket
from .stall import StallWatch
from .table import RoutingTable, static_layer
from .tracing import Tracing
from .upstream import Upstream, WireLimits
from .usage import UsageReporter
from .wake import WakeHold, WakeMetrics
from .watch import WatchClient
from .workermetrics import WorkerSpec

log = logging.getLogger(__name__)


TABLE = web.AppKey("table", RoutingTable)
METRICS = web.AppKey("metrics", RouterMetrics)
SESSION = web.AppKey("client_session", Upstream)
COMFY_SESSION = web.AppKey("comfy_session", aiohttp.ClientSession)
WATCH = web.AppKey("watch", WatchClient)
AUTH = web.AppKey("auth", Auth)
USAGE = web.AppKey("usage", UsageReporter)
# The proxied paths' handler behind the app's middlewares, for the front (see :mod:`.front`).
PROXY_CHAIN: web.AppKey[Handler] = web.AppKey("proxy_chain")
# The app's other routes behind its middlewares, for the front.
OTHER_ROUTES: web.AppKey[Callable[[str, str], Handler]] = web.AppKey("other_routes")


def build_app(
    config: RouterConfig,
    *,
    rng: random.Random | None = None,
    registry: CollectorRegistry | None = None,
    tracer: trace.Tracer | None = None,
    worker: WorkerSpec | None = None,
) -> web.Application:
    """The router app; ``tracer`` given only when spans are exported (see :mod:`.tracing`),
    ``worker`` when this process is one of several sharing the port (see :mod:`.workers`)."""
    rng = rng or random.Random()
    if not config.router_id:
        # main names a router host-pid; one built in-process (tests) still needs
        # a name of its own in the control plane's usage and quota books.
        config = config.model_copy(update={"router_id": f"router-{uuid.uuid4().hex[:8]}"})
    registry = registry or CollectorRegistry()
    models, endpoints = static_layer(config.backends, int(time.time()), config.models)
    table = RoutingTable(models, endpoints, cluster=bool(config.control))
    limits = config.limits
    breaker = Breaker(limits.breaker_failures, limits.breaker_cooldown_seconds)
    metrics = RouterMetrics(
        registry,
        table,
        lambda route: breaker.state(route.state, time.monotonic()).value,
    )
    table.subscribe(metrics.table_changed)
    balancer = Balancer(config.balancer, config.balancing, breaker, rng, time.monotonic)
    tracing = Tracing(tracer) if tracer is not None else None
    auth = _auth(config, registry)
    # One reconnect backoff for every control-plane stream (watch, usage, quota).
    backoff = BackoffPolicy(config.watch_backoff_initial_seconds, config.watch_backoff_max_seconds)
    reporter = _reporter(config, table, rng, backoff, metrics) if config.control else None
    demand = (
        WakeHold(
            table,
            reporter,
            config.autoscaling.wake_timeout_seconds,
            limits.retry_after_seconds,
            WakeMetrics(metrics.registry),
        )
        if reporter is not None
        else None
    )
    # Hung engines are found by the metrics poll; without it there is nothing to watch.
    stalls = StallWatch(time.monotonic) if config.balancing.engine_metrics_interval_seconds > 0 else None
    # Keys are checked inside the metrics middleware: a refused request is
    # counted and carries its request id like any other.
    middlewares: list[Middleware] = [middleware(metrics, tracing, access_log=config.access_log)]
    if auth is not None:
        middlewares.append(auth.middleware)
    # aiohttp calls them with its web.Request (a RequestView) and handlers that
    # answer web.StreamResponse (a Reply): the same chain, typed by aiohttp's names.
    app = web.Application(
        client_max_size=limits.max_body_bytes, middlewares=cast(list[AiohttpMiddleware], middlewares)
    )
    # Signed with the cluster's secret, so every router of the cluster routes every one's ids home.
    ids = ResponseIds(read_secret(config.cluster_secret_file) if config.cluster_secret_file else None)
    keys = KeyFiles(time.monotonic, config.key_file_recheck_seconds)
    images = ComfyClient(config.images, breaker, keys, lambda: app[COMFY_SESSION], rng=rng)
    proxy = Proxy(
        table,
        balancer,
        breaker,
        limits,
        metrics,
        lambda: app[SESSION],  # read per request, once the cleanup context has opened it
        planner=Planner(table, balancer, rng),
        keys=keys,
        ids=ids,
        tracer=tracing,
        gate=auth,
        demand=demand,
        stalls=stalls,
        images=images,
    )

    app[TABLE] = table
    app[METRICS] = metrics
    if auth is not None:
        app[AUTH] = auth
    app.cleanup_ctx.append(_client_session(limits))
    app.cleanup_ctx.append(_comfy_session(limits))
    if reporter is not None:
        app[USAGE] = reporter
        app.cleanup_ctx.append(_background(reporter.run))
    if config.control:
        secret = read_secret(config.cluster_secret_file)
        watch = WatchClient(
            config.control,
            table,
            lambda endpoint_id: engine_key(secret, endpoint_id),
            metrics,
            client_id=config.router_id,
            backoff=backoff,
            rng=rng,
            keys=auth.table if auth is not None else None,
            tls=config.tls,
        )
        app[WATCH] = watch
        app.cleanup_ctx.append(_background(watch.run))
    if auth is not None:
        sync = QuotaSync(
            config.control,
            auth.quotas,
            auth.metrics,
            router_id=config.router_id,
            interval=config.quota.sync_interval_seconds,
            timeout=config.quota.sync_timeout_seconds,
            backoff=backoff,
            clock=time.monotonic,
            rng=rng,
            tls=config.tls,
        )
        app.cleanup_ctx.append(_background(sync.run))
    if config.balancing.engine_metrics_interval_seconds > 0:
        poller = EngineMetricsPoller(
            table,
            interval=config.balancing.engine_metrics_interval_seconds,
            timeout=config.balancing.engine_metrics_timeout_seconds,
            clock=time.monotonic,
        )
        app.cleanup_ctx.append(_background(poller.run))
    if stalls is not None:
        app.cleanup_ctx.append(_background(stalls.run))

    async def proxied(request: web.Request) -> web.StreamResponse:
        reply = await proxy.handle(AiohttpRequest(request))
        assert isinstance(reply, web.StreamResponse)  # an AiohttpResponder's
        return reply

    for path in PROXY_PATHS:
        app.router.add_post(path, proxied)
    handlers = Handlers(table, metrics, worker, auth)
    gets = {
        "/v1/models": handlers.models,
        "/health": handlers.health,
        "/ready": handlers.ready,
        "/metrics": handlers.metrics,
    }
    for path, get in gets.items():
        app.router.add_get(path, get)
    app.router.add_get(f"{MODEL_PREFIX}{{name:.+}}", handlers.model)
    # What aiohttp runs for each path, composed the way it composes it, for the front.
    # The proxy paths' servers hand the chain ProxyRequests, which the
    # middlewares pass on unchanged: the chain is proxy.handle's, typed as any
    # RequestView handler so the same _chain composes the GET routes.
    app[PROXY_CHAIN] = chain(cast(ChainHandler, proxy.handle), middlewares)
    stored = StoredResponses(ids, table, auth, limits.request_timeout_seconds)

    async def stored_route(request: web.Request) -> web.Response:
        return await stored(request)

    for method in ("GET", "DELETE", "POST"):
        app.router.add_route(method, STORED_PREFIX + "{rest:.+}", stored_route)
    realtime = Realtime(table, balancer, breaker, limits, metrics, keys, gate=auth, demand=demand)

    async def realtime_route(request: web.Request) -> web.StreamResponse:
        reply = await realtime(AiohttpRequest(request))
        return cast(web.StreamResponse, reply.response if isinstance(reply, AiohttpSocket) else reply)

    app.router.add_get(REALTIME_PATH, realtime_route)
    other_routes: Callable[[str, str], Handler] = OtherRoutes(
        {p: chain(h, middlewares) for p, h in gets.items()},
        middlewares,
        handlers,
        stored,
        chain(cast(ChainHandler, realtime), middlewares),
    )
    app[OTHER_ROUTES] = other_routes
    return app


def _auth(config: RouterConfig, registry: CollectorRegistry) -> Auth | None:
    """Client keys and quotas, when the configuration asks for them."""
    if config.auth != "keys":
        return None
    metrics = KeyMetrics(registry)
    return Auth(KeyTable(metrics), Quotas(), metrics)


def _reporter(
    config: RouterConfig,
    table: RoutingTable,
    rng: random.Random,
    backoff: BackoffPolicy,
    metrics: RouterMetrics,
) -> UsageReporter:
    return UsageReporter(
        config.control,
        table,
        router_id=config.router_id,
        interval=config.autoscaling.report_interval_seconds,
        sample_max_age=config.balancing.engine_metrics_max_age_seconds,
        backoff=backoff,
        rng=rng,
        tls=config.tls,
        traffic=metrics.traffic,
    )


def _client_session(
    limits: Limits,
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def session(app: web.Application) -> AsyncIterator[None]:
        # No connection cap: each stream holds one connection for its whole
        # life, so a cap would queue requests behind streams. Our own client,
        # not aiohttp's: see :mod:`.upstream` for why.
        wire = WireLimits(
            max_head_bytes=limits.max_head_bytes,
            max_headers=limits.max_headers,
            max_answer_bytes=limits.max_answer_bytes,
        )
        client = Upstream(connect_timeout=limits.connect_timeout_seconds, limits=wire)
        app[SESSION] = client
        try:
            yield
        finally:
            await client.close()

    return session


def _comfy_session(
    limits: Limits,
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    """aiohttp's client for ComfyUI's small API calls (:mod:`.comfyui`): GETs and JSON POSTs that
    the streaming pool was not built for; every call is bounded by the request's deadline."""

    @contextlib.asynccontextmanager
    async def session(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(connect=limits.connect_timeout_seconds)
        async with aiohttp.ClientSession(timeout=timeout) as client:
            app[COMFY_SESSION] = client
            yield

    return session


def _background(
    run: Callable[[], Coroutine[Any, Any, None]],
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def owner(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(run())
        try:
            yield
        finally:
            await cancel_and_wait(task)

    return owner
