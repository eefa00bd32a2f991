"""The router's own answers: every route but the proxied paths, as the front finds them.

:class:`OtherRoutes` maps a request's method and path to the chain that
answers it: the stored responses by id (:mod:`.responseids`), the realtime
socket (:mod:`.realtime`), ``GET /v1/models`` and ``/v1/models/{name}``,
``/health``, ``/ready`` and ``/metrics`` (:class:`Handlers`), and the 404
and 405 aiohttp would give for the rest. :func:`chain` composes a handler
with the app's middlewares the way aiohttp composes them, so a route answers
the same behind the front as behind aiohttp's own server (the workers'
metrics sockets). :mod:`.app` builds these and wires them in.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Protocol
from urllib.parse import parse_qs

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from .apis import REALTIME_PATH
from .envelope import Handler as ChainHandler
from .envelope import Middleware
from .errors import ModelNotFound
from .front import Handler
from .frontwire import Chained
from .metrics import RouterMetrics
from .proxy import PROXY_PATHS
from .responseids import StoredResponses
from .seam import RequestView
from .table import Model
from .workermetrics import WorkerSpec, all_workers

# The path of one model's entry; the rest is its name (or alias).
MODEL_PREFIX = "/v1/models/"


class Catalog(Protocol):
    """What the non-proxy handlers read of the table."""

    @property
    def ready(self) -> bool: ...
    def models(self) -> list[Model]: ...
    def resolve(self, name: str) -> Model | None: ...


def chain(handler: ChainHandler, middlewares: list[Middleware]) -> ChainHandler:
    """``handler`` behind ``middlewares``, the first one outermost (as aiohttp composes them)."""
    composed = handler
    for mw in reversed(middlewares):
        composed = Chained(mw, composed)
    return composed


class OtherRoutes:
    """The app's GET routes as the front finds them: ``(method, path)`` to the chain that answers
    (404 or 405 from the chain itself when no route has it, as aiohttp would)."""

    def __init__(
        self,
        exact: dict[str, ChainHandler],
        middlewares: list[Middleware],
        handlers: Handlers,
        stored: StoredResponses,
        realtime: ChainHandler,
    ) -> None:
        self._exact = exact
        self._realtime = realtime
        self._stored = stored
        self._stored_chain = chain(stored, middlewares)
        self._model = chain(handlers.model, middlewares)
        self._not_found = chain(_not_found, middlewares)
        self._get_only = chain(_method_not_allowed("GET"), middlewares)
        self._post_only = chain(_method_not_allowed("POST"), middlewares)

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


class KeyChecks(Protocol):
    """What the non-proxy handlers need of client keys (:mod:`.auth`)."""

    @property
    def ready(self) -> bool: ...
    def visible(self, request: RequestView, model: Model) -> bool: ...


class Handlers:
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
        data = [model_entry(m) for m in self._catalog.models() if self._visible(request, m)]
        return web.json_response({"object": "list", "data": data})

    async def model(self, request: RequestView) -> web.Response:
        name = request.path[len(MODEL_PREFIX) :]
        model = self._catalog.resolve(name)
        if model is None or not self._visible(request, model):
            raise ModelNotFound(name)
        return web.json_response(model_entry(model))

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


def model_entry(model: Model) -> dict[str, object]:
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
