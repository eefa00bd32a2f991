"""The router app on a real socket: :class:`RouterServer`, for ``llmgw-router`` and for tests.

It builds the app (:func:`.app.build_app`) and serves it behind the router's
own front (:mod:`.front`), which cancels a request's handler when its client
hangs up, as aiohttp does with ``handler_cancellation=True`` (set explicitly
where aiohttp serves the app: the workers' metrics sockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import random

from aiohttp import web
from opentelemetry import trace

from llmgw.common.config import split_host_port

from .apis import REALTIME_PATH
from .app import OTHER_ROUTES, PROXY_CHAIN, TABLE, build_app
from .config import RouterConfig
from .front import Front
from .https import ReloadingContext
from .table import RoutingTable
from .workermetrics import WorkerSpec

# Pending connections the listening socket queues (see RouterServer).
LISTEN_BACKLOG = 4096
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
