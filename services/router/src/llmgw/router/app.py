"""The router's aiohttp application, and an in-process server for tests.

:func:`build_app` is the composition root below the entry point: it builds
the routing table from the configuration (static backends), the watch
client when control planes are configured, the balancer, metrics and the
proxy, and wires them into one ``web.Application``. Background work is owned
by ``cleanup_ctx``: the upstream ``ClientSession`` (one per app, pooled), the
watch task and the engine-metrics poller, cancelled and awaited on shutdown.

:class:`RouterServer` runs that app on a real socket (port 0 allowed)
behind the router's own front (:mod:`.front`), which cancels a request's
handler when its client hangs up, as aiohttp does with
``handler_cancellation=True`` (set explicitly where aiohttp serves the app:
the workers' metrics sockets).

Routes: the proxied POST paths (:data:`.apis.PATHS`), the stored
responses by id (:class:`.responseids.StoredResponses`), ``GET /v1/models`` (and
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
import functools
import logging
import os
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol, cast
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware as AiohttpMiddleware
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.config import split_host_port
from llmgw.common.keys import engine_key, read_secret

from .apis import REALTIME_PATH
from .auth import Auth, KeyMetrics, KeyTable
from .balancer import Balancer
from .breaker import Breaker
from .comfyui import ComfyClient
from .config import Limits, RouterConfig
from .enginemetrics import EngineMetricsPoller
from .envelope import Handler as ChainHandler
from .envelope import Middleware, middleware
from .errors import ModelNotFound
from .external import KeyFiles
from .fallbacks import Planner
from .front import Front, Handler
from .https import ReloadingContext
from .metrics import RouterMetrics
from .proxy import PROXY_PATHS, Proxy
from .quota import Quotas
from .quotasync import QuotaSync
from .realtime import Realtime
from .responseids import STORED_PREFIX, ResponseIds, StoredResponses
from .seam import AiohttpRequest, AiohttpSocket, RequestView
from .stall import StallWatch
from .table import Model, RoutingTable, static_layer
from .tracing import Tracing
from .upstream import Upstream, WireLimits
from .usage import UsageReporter
from .wake import WakeHold, WakeMetrics
from .watch import WatchClient
from .workermetrics import WorkerSpec, all_workers

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

# The path of one model's entry; the rest is its name (or alias).
MODEL_PREFIX = "/v1/models/"
# Pending connections the listening socket queues (see RouterServer).
LISTEN_BACKLOG = 4096


class Catalog(Protocol):
    """What the non-proxy handlers read of the table."""

    @property
    def ready(self) -> bool: ...
    def models(self) -> list[Model]: ...
    def resolve(self, name: str) -> Model | None: ...


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
    handlers = _Handlers(table, metrics, worker, auth)
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
    app[PROXY_CHAIN] = _chain(cast(ChainHandler, proxy.handle), middlewares)
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
    other_routes: Callable[[str, str], Handler] = _OtherRoutes(
        {p: _chain(h, middlewares) for p, h in gets.items()},
        middlewares,
        handlers,
        stored,
        _chain(cast(ChainHandler, realtime), middlewares),
    )
    app[OTHER_ROUTES] = other_routes
    return app


def _chain(handler: ChainHandler, middlewares: list[Middleware]) -> ChainHandler:
    chain = handler
    for mw in reversed(middlewares):
        chain = functools.partial(mw, handler=chain)
    return chain


class _OtherRoutes:
    """The app's GET routes as the front finds them: ``(method, path)`` to the chain that answers
    (404 or 405 from the chain itself when no route has it, as aiohttp would)."""

    def __init__(
        self,
        exact: dict[str, ChainHandler],
        middlewares: list[Middleware],
        handlers: _Handlers,
        stored: StoredResponses,
        realtime: ChainHandler,
    ) -> None:
        self._exact = exact
        self._realtime = realtime
        self._stored = stored
        self._stored_chain = _chain(stored, middlewares)
        self._model = _chain(handlers.model, middlewares)
        self._not_found = _chain(_not_found, middlewares)
        self._get_only = _chain(_method_not_allowed("GET"), middlewares)
        self._post_only = _chain(_method_not_allowed("POST"), middlewares)

    def __call__(self, method: str, path: str) -> Handler:
        if self._stored.handles(path):
            return self._stored_chain  # it checks the method itself
        if path == REALTIME_PATH:
            return self._realtime  # so does it
        handler = self._exact.get(path)
        if handler is None and path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
            handler = self._model
        if handler is None:
            return self._post_only if path in PROXY_PATHS else self._not_found
        return handler if method == "GET" else self._get_only


async def _not_found(request: RequestView) -> web.StreamResponse:
    raise web.HTTPNotFound()


def _method_not_allowed(allowed: str) -> Callable[[RequestView], Awaitable[web.StreamResponse]]:
    async def refuse(request: RequestView) -> web.StreamResponse:
        raise web.HTTPMethodNotAllowed(request.method, [allowed])

    return refuse


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
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    return owner


class KeyChecks(Protocol):
    """What the non-proxy handlers need of client keys (:mod:`.auth`)."""

    @property
    def ready(self) -> bool: ...
    def visible(self, request: RequestView, model: Model) -> bool: ...


class _Handlers:
    def __init__(
        self,
        catalog: Catalog,
        metrics: RouterMetrics,
        worker: WorkerSpec | None,
        keys: KeyChecks | None,
    ) -> None:
        self._catalog = catalog
        self._metrics = metrics
        self._worker = worker
        self._keys = keys

    def _visible(self, request: RequestView, model: Model) -> bool:
        return self._keys is None or self._keys.visible(request, model)

    async def models(self, request: RequestView) -> web.Response:
        data = [_model_entry(m) for m in self._catalog.models() if self._visible(request, m)]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: RequestView) -> web.Response:
        name = request.path[len(MODEL_PREFIX) :]
        model = self._catalog.resolve(name)
        if model is None or not self._visible(request, model):
            raise ModelNotFound(name)
        return web.json_response(_model_entry(model))

    async def health(self, request: RequestView) -> web.Response:
        # The pid tells which worker answered when several share the port.
        return web.json_response({"status": "ok", "pid": os.getpid()})

    async def ready(self, request: RequestView) -> web.Response:
        if not self._catalog.ready:
            return web.json_response(
                {"status": "waiting for the first table from the control plane"}, status=503
            )
        if self._keys is not None and not self._keys.ready:
            return web.json_response(
                {"status": "waiting for the first key table from the control plane"}, status=503
            )
        return web.json_response({"status": "ready"})

    async def metrics(self, request: RequestView) -> web.Response:
        body = generate_latest(self._metrics.registry)
        if self._worker is not None and parse_qs(request.query_string).get("scope") != ["worker"]:
            body = await all_workers(self._worker, body)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _model_entry(model: Model) -> dict[str, object]:
    entry: dict[str, object] = {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": model.owned_by,
        "aliases": list(model.aliases),
    }
    if model.parent:
        # As vLLM lists a LoRA adapter: its base model is its parent.
        entry["parent"] = model.parent
    if model.apis:
        # Non-standard, like aliases: the only APIs a request may use with it (see :mod:`.apis`).
        entry["apis"] = list(model.apis)
    return entry


# How long a new worker waits for its routing table before it listens anyway.
WORKER_READY_SECONDS = 30.0


class RouterServer:
    """The router app on a real socket, as an async context manager.

    ``listen`` overrides ``config.listen`` (``127.0.0.1:0`` picks a free
    port; read it from ``.port``). ``worker`` makes it one of several
    processes on one port: SO_REUSEPORT on the port, plus its own unix
    socket through which its siblings read its metrics (see :mod:`.workers`).
    Leaving the context stops accepting, gives in-flight requests
    ``config.shutdown_grace_seconds``, then runs cleanup. The port is the
    :mod:`.front`'s, which serves every request on it through the app's
    handler chains (:data:`PROXY_CHAIN`, :data:`OTHER_ROUTES`); aiohttp's
    server runs the same app on the workers' metrics sockets.
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        listen: str | None = None,
        rng: random.Random | None = None,
        tracer: trace.Tracer | None = None,
        worker: WorkerSpec | None = None,
    ) -> None:
        self.config = config
        self._host, self._port = split_host_port(listen or config.listen)
        self._rng = rng
        self._tracer = tracer
        self._worker = worker
        self._runner: web.AppRunner | None = None
        self._front: Front | None = None
        self.app: web.Application | None = None
        self.port = 0

    @property
    def url(self) -> str:
        scheme = "https" if self.config.https.cert_file else "http"
        return f"{scheme}://{self._host}:{self.port}"

    @property
    def table(self) -> RoutingTable:
        assert self.app is not None, "RouterServer is not started"
        return self.app[TABLE]

    async def __aenter__(self) -> RouterServer:
        self.app = build_app(self.config, rng=self._rng, tracer=self._tracer, worker=self._worker)
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            shutdown_timeout=self.config.shutdown_grace_seconds,
            # aiohttp's own access logger off: the middleware writes the
            # router's access line (the ``access_log`` setting), and formatting
            # a second one costs as much as relaying a small answer.
            access_log=None,
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        self._front = Front(
            self.app[PROXY_CHAIN], self.app[OTHER_ROUTES], self.config.limits, frozenset({REALTIME_PATH})
        )
        try:
            # A deep accept queue (the kernel caps it at net.core.somaxconn): at
            # aiohttp's default of 128 a burst of new connections overflows it
            # while the loop is busy, and with SYN cookies the client may even
            # believe it is connected and be reset later.
            reuse_port = True if self._worker is not None else None
            https = self.config.https
            tls = ReloadingContext(https.cert_file, https.key_file).context if https.cert_file else None
            if self._worker is not None:
                await self._until_table_ready()
            self.port = await self._front.listen(
                self._host, self._port, reuse_port=reuse_port, backlog=LISTEN_BACKLOG, ssl=tls
            )
            if self._worker is not None:
                await web.UnixSite(self._runner, self._worker.socket(self._worker.index)).start()
        except BaseException:
            self._front.close()
            await self._runner.cleanup()
            raise
        return self

    async def _until_table_ready(self) -> None:
        """A worker joins its siblings on the port only once it can route (issue 15).

        The kernel hands a listening worker its share of new connections at
        once; one that listened before its watch delivered the catalog would
        answer them 404 "model does not exist" while its siblings serve. A
        control plane that stays away longer than :data:`WORKER_READY_SECONDS`
        does not keep it off the port for ever: it then serves as any router
        whose control plane is away.
        """
        assert self.app is not None
        table = self.app[TABLE]
        ready = asyncio.Event()
        table.subscribe(lambda: ready.set() if table.ready else None)
        if not table.ready:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(WORKER_READY_SECONDS):
                    await ready.wait()

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is None:
            return
        # Stop accepting, then let both servers' requests finish within one grace period,
        # before the app's cleanup closes what they use (the upstream client).
        grace = self.config.shutdown_grace_seconds
        if self._front is not None:
            self._front.close()
        server = self._runner.server
        if server is not None:
            server.pre_shutdown()
            drains = [server.shutdown(grace)]
            if self._front is not None:
                drains.append(self._front.drain(grace))
            await asyncio.gather(*drains)
        await self._runner.cleanup()
        self._runner = self._front = None
