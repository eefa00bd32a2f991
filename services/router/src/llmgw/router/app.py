"""The router's aiohttp application, and an in-process server for tests.

:func:`build_app` is the composition root below the entry point: it builds
the routing table from the configuration (static backends), the watch
client when control planes are configured, the balancer, metrics and the
proxy, and wires them into one ``web.Application``. Background work is owned
by ``cleanup_ctx``: the upstream ``ClientSession`` (one per app, pooled), the
watch task and the engine-metrics poller, cancelled and awaited on shutdown.

:class:`RouterServer` runs that app on a real socket (port 0 allowed) with
``handler_cancellation=True`` set explicitly, so a client that hangs up
cancels its upstream request here exactly as in production.

Routes: the three proxied POST paths, ``GET /v1/models`` (and
``/v1/models/{name}``), ``/health`` (the process answers), ``/ready``
(the table has been loaded, or there is no control plane to wait for) and
``/metrics``. ``/v1/models`` lists each catalog model once under its
canonical name, with a non-standard ``aliases`` field that OpenAI clients
ignore: listing aliases as models of their own would show one model twice
in every picker.

Errors: one middleware maps every exception (ours, aiohttp's 404/405/413,
anything unexpected) through :func:`.errors.error_response`, so a handler
failure is a 500 JSON answer and a log line, never a dead worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.common.config import split_host_port
from llmgw.common.errors import LlmgwError
from llmgw.common.keys import engine_key, read_secret

from .balancer import Balancer
from .breaker import Breaker
from .config import Limits, RouterConfig
from .enginemetrics import EngineMetricsPoller
from .errors import ModelNotFound, error_response
from .metrics import RouterMetrics
from .proxy import MODEL_LABEL, PROXY_PATHS, REQUEST_ID, Proxy
from .table import Model, RoutingTable, static_layer
from .usage import UsageReporter
from .wake import WakeHold, WakeMetrics
from .watch import Backoff, WatchClient

log = logging.getLogger(__name__)

TABLE = web.AppKey("table", RoutingTable)
METRICS = web.AppKey("metrics", RouterMetrics)
SESSION = web.AppKey("client_session", aiohttp.ClientSession)
WATCH = web.AppKey("watch", WatchClient)
USAGE = web.AppKey("usage", UsageReporter)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
) -> web.Application:
    rng = rng or random.Random()
    models, endpoints = static_layer(config.backends, int(time.time()))
    table = RoutingTable(models, endpoints, cluster=bool(config.control))
    metrics = RouterMetrics(registry or CollectorRegistry(), table)
    table.subscribe(metrics.table_changed)
    limits = config.limits
    breaker = Breaker(limits.breaker_failures, limits.breaker_cooldown_seconds)
    balancer = Balancer(config.balancer, config.balancing, breaker, rng, time.monotonic)
    reporter = _reporter(config, table, rng) if config.control else None
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
    proxy = Proxy(
        table, balancer, breaker, limits, metrics, lambda request: request.app[SESSION], demand=demand
    )

    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[_middleware(metrics)])
    app[TABLE] = table
    app[METRICS] = metrics
    app.cleanup_ctx.append(_client_session(limits))
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
            backoff=Backoff(config.watch_backoff_initial_seconds, config.watch_backoff_max_seconds),
            rng=rng,
        )
        app[WATCH] = watch
        app.cleanup_ctx.append(_background(watch.run))
    if config.balancing.engine_metrics_interval_seconds > 0:
        poller = EngineMetricsPoller(
            table,
            interval=config.balancing.engine_metrics_interval_seconds,
            timeout=config.balancing.engine_metrics_timeout_seconds,
            clock=time.monotonic,
        )
        app.cleanup_ctx.append(_background(poller.run))

    for path in PROXY_PATHS:
        app.router.add_post(path, proxy.handle)
    handlers = _Handlers(table, metrics)
    app.router.add_get("/v1/models", handlers.models)
    app.router.add_get("/v1/models/{name:.+}", handlers.model)
    app.router.add_get("/health", handlers.health)
    app.router.add_get("/ready", handlers.ready)
    app.router.add_get("/metrics", handlers.metrics)
    return app


def _reporter(config: RouterConfig, table: RoutingTable, rng: random.Random) -> UsageReporter:
    return UsageReporter(
        config.control,
        table,
        router_id=config.router_id or f"router-{uuid.uuid4().hex[:8]}",
        interval=config.autoscaling.report_interval_seconds,
        sample_max_age=config.balancing.engine_metrics_max_age_seconds,
        backoff=Backoff(config.watch_backoff_initial_seconds, config.watch_backoff_max_seconds),
        rng=rng,
    )


def _client_session(
    limits: Limits,
) -> Callable[[web.Application], contextlib.AbstractAsyncContextManager[None]]:
    @contextlib.asynccontextmanager
    async def session(app: web.Application) -> AsyncIterator[None]:
        # No connection cap: each stream holds one connection for its whole
        # life, and aiohttp's default of 100 would queue the 101st request.
        connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=limits.connect_timeout_seconds)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, trust_env=False) as client:
            app[SESSION] = client
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


def _middleware(metrics: RouterMetrics) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request_id = request.headers.get("x-request-id") or uuid.uuid4().hex
        request[REQUEST_ID] = request_id
        request[MODEL_LABEL] = ""
        proxied = request.method == "POST" and request.path in PROXY_PATHS
        start = time.monotonic()
        try:
            response = await _answer(request, handler)
        except asyncio.CancelledError:
            if proxied:
                _record(metrics, request, 499, start)
            raise
        if not response.prepared:
            response.headers.setdefault("x-request-id", request_id)
        if proxied:
            _record(metrics, request, response.status, start)
        return response

    return middleware


async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Run the handler; turn any exception into the OpenAI error it means."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error_response(exc)
    except Exception as exc:
        if not isinstance(exc, LlmgwError):
            log.exception("request %s %s failed", request.method, request.path)
        return error_response(exc)


def _record(metrics: RouterMetrics, request: web.Request, status: int, start: float) -> None:
    model = request[MODEL_LABEL]
    metrics.requests.labels(model, str(status)).inc()
    metrics.duration.labels(model).observe(time.monotonic() - start)


class _Handlers:
    def __init__(self, catalog: Catalog, metrics: RouterMetrics) -> None:
        self._catalog = catalog
        self._metrics = metrics

    async def models(self, request: web.Request) -> web.Response:
        data = [_model_entry(m) for m in self._catalog.models()]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: web.Request) -> web.Response:
        model = self._catalog.resolve(request.match_info["name"])
        if model is None:
            raise ModelNotFound(request.match_info["name"])
        return web.json_response(_model_entry(model))

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def ready(self, request: web.Request) -> web.Response:
        if self._catalog.ready:
            return web.json_response({"status": "ready"})
        return web.json_response({"status": "waiting for the first table from the control plane"}, status=503)

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


def _model_entry(model: Model) -> dict[str, object]:
    return {
        "id": model.name,
        "object": "model",
        "created": model.created,
        "owned_by": model.owned_by,
        "aliases": list(model.aliases),
    }


class RouterServer:
    """The router app on a real socket, as an async context manager.

    ``listen`` overrides ``config.listen`` (``127.0.0.1:0`` picks a free
    port; read it from ``.port``). Leaving the context stops accepting, gives
    in-flight requests ``config.shutdown_grace_seconds``, then runs cleanup.
    """

    def __init__(
        self,
        config: RouterConfig,
        *,
        listen: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self._host, self._port = split_host_port(listen or config.listen)
        self._rng = rng
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self.port}"

    @property
    def table(self) -> RoutingTable:
        assert self.app is not None, "RouterServer is not started"
        return self.app[TABLE]

    async def __aenter__(self) -> RouterServer:
        self.app = build_app(self.config, rng=self._rng)
        self._runner = web.AppRunner(
            self.app,
            handler_cancellation=True,
            shutdown_timeout=self.config.shutdown_grace_seconds,
        )
        await self._runner.setup()
        try:
            site = web.TCPSite(self._runner, self._host, self._port)
            await site.start()
        except BaseException:
            await self._runner.cleanup()
            raise
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
