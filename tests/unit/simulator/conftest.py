"""Fixtures: real simulators on port 0 and an HTTP session."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack

import aiohttp
import pytest

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings

# Fast defaults so tests take milliseconds; a test that is about timing says so.
FAST = {"ttft_ms": 1.0, "itl_ms": 1.0, "output_tokens": 8}

StartSimulator = Callable[..., Awaitable[SimulatorServer]]


@pytest.fixture
async def start_simulator() -> AsyncIterator[StartSimulator]:
    """Start simulators with settings overrides; every one is stopped at teardown."""
    async with AsyncExitStack() as stack:

        async def start(**overrides: object) -> SimulatorServer:
            settings = SimulatorSettings(**{**FAST, **overrides})
            return await stack.enter_async_context(SimulatorServer(settings))

        yield start


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        yield session
