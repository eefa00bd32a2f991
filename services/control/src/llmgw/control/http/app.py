"""The control plane's aiohttp application and server: REST API, console, metrics.

Routes (deny by default: :data:`OPEN` lists what needs no credential, and
every other route either goes through the gRPC interceptors as a
transcoded call or is checked against them with :meth:`Dispatcher.authorize`):

- ``/api/v1/...``: the admin REST API (:mod:`.transcode`), every error in
  one JSON shape; ``/openapi.json``: its OpenAPI 3 document.
- ``/api/v1/session``: the console's login (POST with the admin token),
  session (GET) and logout (DELETE); ``/api/v1/events``: server-sent events.
- ``/``, ``/console/*``: the console's page, script and style (no data).
- ``/metrics``: this control plane's Prometheus metrics (needs the token,
  as the rest; Prometheus sends it with ``authorization.credentials_file``).
  The older ``metrics_listen`` port still serves them without one.
- ``/healthz``: 200 while serving.

Limits: bodies up to :data:`MAX_BODY_BYTES` (413), each call
:data:`~.transcode.CALL_TIMEOUT_SECONDS` (504). Pages carry a strict
Content-Security-Policy (scripts and styles from this origin only, no
inline script, no framing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from pathlib import Path

import grpc
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from llmgw.common.config import split_host_port
from llmgw.common.httpserve import bound_port, listen

from .events import EventFeed, Hub
from .openapi import document as openapi_document
from .session import COOKIE, Sessions
from .transcode import Aborted, Dispatcher, add_routes, error_response

log = logging.getLogger("llmgw.control.http")

CONSOLE = Path(__file__).parent / "console"
MAX_BODY_BYTES = 1024 * 1024
# Paths anyone may fetch (GET), and the login.
OPEN = frozenset({"/", "/healthz", "/openapi.json", "/api/v1/session"})
OPEN_WITHOUT_TOKEN = OPEN - {"/api/v1/session"}
CONSOLE_FILES = {"app.js": "text/javascript", "style.css": "text/css", "favicon.svg": "image/svg+xml"}
# What the console's own routes (events, metrics, session) are checked as.
READ_METHOD = "/llmgw.v1.AdminService/GetClusterStatus"
NO_TOKEN = (
    "this control plane has no admin_token_file: the HTTP API, console and metrics need one "
    "(docs/console.md); metrics without a token: metrics_listen"
)
SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
}


def _api_path(path: str) -> bool:
    return path.startswith("/api/") or path in ("/metrics", "/openapi.json")


@web.middleware
async def _errors_as_json(request: web.Request, handler):
    """aiohttp's own refusals (404, 405, 413) in the API's error shape; security headers on all."""
    try:
        response = await handler(request)
    except web.HTTPException as exc:
        if not _api_path(request.path) or exc.status < 400:
            raise
        code = {
            404: grpc.StatusCode.NOT_FOUND,
            405: grpc.StatusCode.UNIMPLEMENTED,
            413: grpc.StatusCode.RESOURCE_EXHAUSTED,
        }.get(exc.status, grpc.StatusCode.INVALID_ARGUMENT)
        message = {
            404: f"no route {request.method} {request.path} (see /openapi.json)",
            405: f"{request.path} does not take {request.method} (see /openapi.json)",
            413: f"the body is larger than {MAX_BODY_BYTES} bytes",
        }.get(exc.status, exc.reason)
        response = error_response(code, message, exc.status)
    for k, v in SECURITY_HEADERS.items():
        response.headers.setdefault(k, v)
    return response


class HttpApp:
    """The routes, given what they serve; :class:`HttpServer` runs it on a port."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        sessions: Sessions,
        registry: CollectorRegistry,
        hubs: Sequence[Hub],
    ):
        self.dispatcher = dispatcher
        self.sessions = sessions
        self.registry = registry
        self.stopping = asyncio.Event()
        self.events = EventFeed(dispatcher, hubs, self.stopping)
        self._openapi = json.dumps(openapi_document(), indent=2).encode()

    def build(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_errors_as_json, self._gate])
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/", self._index)
        app.router.add_get("/console/{name}", self._asset)
        app.router.add_get("/openapi.json", self._openapi_json)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/api/v1/session", self._login)
        app.router.add_get("/api/v1/session", self._session)
        app.router.add_delete("/api/v1/session", self._logout)
        app.router.add_get("/api/v1/events", self._events)
        add_routes(app, self.dispatcher, self._metadata)
        return app

    # -- who calls -------------------------------------------------------------

    @web.middleware
    async def _gate(self, request: web.Request, handler):
        """Without an admin token, nothing but the open paths is served."""
        if (
            not self.sessions.enabled
            and request.path not in OPEN_WITHOUT_TOKEN
            and not request.path.startswith("/console/")
        ):
            return error_response(grpc.StatusCode.PERMISSION_DENIED, NO_TOKEN)
        return await handler(request)

    async def _metadata(self, request: web.Request) -> list[tuple[str, str]]:
        return self.sessions.metadata(request)

    async def _authorized(self, request: web.Request) -> list[tuple[str, str]]:
        md = self.sessions.metadata(request)
        await self.dispatcher.authorize(READ_METHOD, md, f"http:{request.remote}")
        return md

    # -- open ------------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _index(self, request: web.Request) -> web.StreamResponse:
        return web.FileResponse(CONSOLE / "index.html", headers={"Cache-Control": "no-cache"})

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        if name not in CONSOLE_FILES:
            raise web.HTTPNotFound()
        return web.FileResponse(
            CONSOLE / name, headers={"Content-Type": CONSOLE_FILES[name], "Cache-Control": "no-cache"}
        )

    async def _openapi_json(self, request: web.Request) -> web.Response:
        return web.Response(body=self._openapi, content_type="application/json")

    # -- session ---------------------------------------------------------------

    async def _login(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except (ValueError, UnicodeDecodeError):
            body = None
        if not isinstance(body, dict) or not isinstance(body.get("token"), str) or set(body) != {"token"}:
            return error_response(
                grpc.StatusCode.INVALID_ARGUMENT, 'log in with a JSON body {"token": "<the admin token>"}'
            )
        md = [("authorization", f"Bearer {body['token'].strip()}")]
        try:
            await self.dispatcher.authorize(READ_METHOD, md, f"http:{request.remote}")
        except Aborted as err:
            return error_response(err.code, "that is not this cluster's admin token")
        cookie, csrf, expires = self.sessions.issue()
        response = web.json_response({"csrf_token": csrf, "expires": expires})
        self.sessions.set_cookie(request, response, cookie, expires)
        return response

    async def _session(self, request: web.Request) -> web.Response:
        session = self.sessions.check(request.cookies.get(COOKIE, ""))
        if session is None:
            return error_response(grpc.StatusCode.UNAUTHENTICATED, "not logged in")
        csrf, expires = session
        return web.json_response({"csrf_token": csrf, "expires": expires})

    async def _logout(self, request: web.Request) -> web.Response:
        try:
            await self._authorized(request)
        except Aborted as err:
            return error_response(err.code, err.message)
        response = web.json_response({})
        self.sessions.clear_cookie(response)
        return response

    # -- authorized ------------------------------------------------------------

    async def _metrics(self, request: web.Request) -> web.Response:
        try:
            await self._authorized(request)
        except Aborted as err:
            return error_response(err.code, err.message)
        return web.Response(
            body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    async def _events(self, request: web.Request) -> web.StreamResponse:
        async def refuse(err: Aborted) -> web.StreamResponse:
            return error_response(err.code, err.message)

        try:
            md = self.sessions.metadata(request)
        except Aborted as err:
            return await refuse(err)
        return await self.events.stream(request, md, refuse)


def _malformed(status: int, message: str) -> web.Response:
    """What aiohttp's parser refuses, in the API's error shape (see :mod:`llmgw.common.httpserve`)."""
    return error_response(grpc.StatusCode.INVALID_ARGUMENT, message, status)


class HttpServer:
    """Serves an :class:`HttpApp` on ``listen`` (host:port; port 0 picks one)."""

    def __init__(self, listen: str, app: HttpApp, shutdown_grace_seconds: float = 5.0):
        self._listen = listen
        self.app = app
        self._grace = shutdown_grace_seconds
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> None:
        host, port = split_host_port(self._listen)
        runner = web.AppRunner(self.app.build(), access_log=None, shutdown_timeout=self._grace)
        await runner.setup()
        try:
            self._listener = await listen(runner, host, port, _malformed)
        except OSError:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = bound_port(self._listener)

    async def stop(self) -> None:
        self.app.stopping.set()
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
