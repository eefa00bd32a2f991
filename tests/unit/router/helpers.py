"""Small helpers for router tests."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

from llmgw.router.app import RouterServer
from llmgw.router.config import RouterConfig


def router(config: RouterConfig) -> RouterServer:
    """A real router on 127.0.0.1 and a free port, seeded for repeatable ties."""
    return RouterServer(config, listen="127.0.0.1:0", rng=random.Random(7))


async def wait_for(predicate: Callable[[], bool], within: float = 5.0) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)
