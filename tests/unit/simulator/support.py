"""Helpers for simulator tests: the OpenAI client, metric scrapes, SSE reading."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.simulator import SimulatorServer


def openai_client(sim: SimulatorServer, api_key: str = "unused") -> AsyncOpenAI:
    return AsyncOpenAI(base_url=sim.url + "/v1", api_key=api_key, max_retries=0, timeout=30)


async def scrape(http: aiohttp.ClientSession, sim: SimulatorServer) -> dict[tuple[str, str], float]:
    """Samples from /metrics keyed by (sample name, finished_reason or "")."""
    async with http.get(sim.url + "/metrics") as resp:
        assert resp.status == 200
        text = await resp.text()
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("finished_reason", ""))] = sample.value
    return out


async def wait_for_metrics(
    http: aiohttp.ClientSession,
    sim: SimulatorServer,
    condition: Callable[[dict[tuple[str, str], float]], bool],
    within_s: float = 5.0,
) -> dict[tuple[str, str], float]:
    deadline = time.monotonic() + within_s
    while True:
        samples = await scrape(http, sim)
        if condition(samples):
            return samples
        if time.monotonic() > deadline:
            raise AssertionError(f"metrics never matched within {within_s}s; last: {samples}")
        await asyncio.sleep(0.01)


async def read_sse(resp: aiohttp.ClientResponse) -> list[str]:
    """The ``data:`` payloads of an SSE response, in order, up to and including [DONE]."""
    events = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events
