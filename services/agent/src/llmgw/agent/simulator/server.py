"""Running the simulator app on a socket, in-process (tests, benchmarks) or from ``main``.

``SimulatorServer`` is an async context manager: on entry the socket is
bound and serving (``port`` is the bound one, so ``port=0`` works); on
exit the listener closes first, in-flight requests get
``shutdown_timeout_s`` to finish, and whatever is still running is then
cancelled, which frees its sequence slot and counts it as aborted.

``handler_cancellation=True`` is set here on purpose: aiohttp's default
(False since 3.8) would let a request whose client hung up keep its
sequence slot until it finished generating.

Bytes aiohttp's parser refuses (a request line or header over its limits, a
header line without a colon) are answered as vLLM's OpenAI server answers a bad
request, ``{"error": {...}}`` with a 400, and logged as one line
(:mod:`llmgw.common.httpserve`).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from aiohttp import web

from llmgw.common.httpserve import bound_port, listen

from .app import build_app
from .errors import error_body
from .settings import SimulatorSettings


class SimulatorServer:
    def __init__(self, settings: SimulatorSettings, app: web.Application | None = None) -> None:
        self._settings = settings
        self._app = app if app is not None else build_app(settings)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._port: int | None = None

    @property
    def app(self) -> web.Application:
        return self._app

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("SimulatorServer is not started; use `async with`")
        return self._port

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:8000`` (append ``/v1`` for OpenAI clients)."""
        return f"http://{_url_host(self._settings.host)}:{self.port}"

    async def start(self) -> None:
        runner = web.AppRunner(
            self._app,
            handler_cancellation=True,
            shutdown_timeout=self._settings.shutdown_timeout_s,
            access_log=None,
        )
        await runner.setup()
        try:
            # A deep accept queue (capped by net.core.somaxconn): a router opening
            # thousands of streams at once overflows aiohttp's default of 128.
            self._listener = await listen(
                runner, self._settings.host, self._settings.port, _malformed, backlog=4096
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self._port = bound_port(self._listener)

    async def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

    async def __aenter__(self) -> SimulatorServer:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()


def _malformed(status: int, message: str) -> web.Response:
    return web.json_response(error_body(message, "BadRequestError", status), status=status)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
