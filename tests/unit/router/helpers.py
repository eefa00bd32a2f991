"""Small helpers for router tests."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from llmgw.router.config import RouterConfig
from llmgw.router.server import RouterServer


def router(config: RouterConfig) -> RouterServer:
    """A real router on 127.0.0.1 and a free port, seeded for repeatable ties."""
    return RouterServer(config, listen="127.0.0.1:0", rng=random.Random(7))


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)


async def serve_app(app: web.Application, **runner_args: Any) -> tuple[web.AppRunner, str]:
    """``app`` on 127.0.0.1 and a free port: its runner (to clean up) and its base URL."""
    runner = web.AppRunner(app, **runner_args)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"
