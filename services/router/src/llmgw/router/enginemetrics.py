"""Polling each engine's Prometheus ``/metrics`` for its queue, in the background.

The balancer's own in-flight count sees only this router's traffic; the
engine's ``vllm:num_requests_running`` and ``vllm:num_requests_waiting``
see everyone's. One :class:`EngineMetricsPoller` per router reads them.

Guarantees:

- **Never on a request's path.** Requests read the last sample from
  :class:`~.table.EndpointState` (``state.engine``); nothing a request does
  waits for a poll.
- **One task, bounded.** ``run`` is one loop, owned by the app's
  ``cleanup_ctx``; each round polls every due endpoint concurrently, each
  poll under ``timeout`` seconds and a body limit, then sleeps the rest of
  ``interval``. A round therefore lasts at most ``max(interval, timeout)``.
  It uses its own small ``ClientSession``, so polls never take connections
  from the request pool.
- **A failed poll keeps the last sample.** Connection errors, timeouts, a
  non-200, a body over the limit, or a body without either metric leave
  ``state.engine`` as it was (the balancer ages it out after
  ``engine_metrics_max_age_seconds``) and back off that endpoint's next
  poll by :mod:`llmgw.common.backoff`'s policy: ``2 * interval`` after the
  first failure, then jittered up to double each time, at most
  ``MAX_BACKOFF_SECONDS``. An
  engine that serves no ``/metrics`` is thus asked about once a minute, not
  every second. External providers are never polled.
- **A poll that times out marks the engine unresponsive** (``state.
  unresponsive_since``) until a poll is answered; it is polled again every
  interval, not backed off, so it is trusted again within a second of
  answering. The balancer skips it and :mod:`.stall` moves what waits there.
  A refused connection or an unreadable answer does not: the engine
  answered, or requests see the refusal at once.
- **One bad round is not fatal.** An unexpected error is logged and the
  loop goes on.

Parsing is a line scan for the two names (summed over label sets, so an
engine that serves several model names counts once per request): a full
exposition parser would read every histogram bucket to get two numbers.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
from collections.abc import Callable, Sequence
from typing import Protocol

import aiohttp

from llmgw.common.backoff import BackoffPolicy

from .table import EngineSample, Route

log = logging.getLogger(__name__)

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
MAX_BODY_BYTES = 4 * 1024 * 1024
MAX_BACKOFF_SECONDS = 60.0
# Concurrent polls at most; more endpoints than this wait their turn within the round.
MAX_CONNECTIONS = 32
# A sample line of either gauge: name, optional labels, value (a timestamp may follow).
_SAMPLE = re.compile(r"(vllm:num_requests_(?:running|waiting))(?:\{[^}]*\})?\s+(\S+)")


class MetricsUnreadable(Exception):
    """The engine answered, but not with metrics this module can read."""


class RouteList(Protocol):
    def all_routes(self) -> Sequence[Route]: ...


def parse_load(text: str) -> tuple[float, float]:
    """(running, waiting) from a Prometheus text exposition; raise MetricsUnreadable without either."""
    found = {RUNNING: 0.0, WAITING: 0.0}
    seen = False
    for line in text.splitlines():
        if not line.startswith("vllm:num_requests_"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            continue
        try:
            found[match[1]] += float(match[2])
        except ValueError:
            raise MetricsUnreadable(f"cannot read the value of {line[:120]!r}") from None
        seen = True
    if not seen:
        raise MetricsUnreadable(f"neither {RUNNING} nor {WAITING} is in the metrics")
    return found[RUNNING], found[WAITING]


async def _read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await response.content.readany():
        size += len(chunk)
        if size > limit:
            raise MetricsUnreadable(f"/metrics is over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


class EngineMetricsPoller:
    def __init__(
        self,
        table: RouteList,
        *,
        interval: float,
        timeout: float,
        clock: Callable[[], float],
        max_body_bytes: int = MAX_BODY_BYTES,
        rng: random.Random | None = None,
    ) -> None:
        self._table = table
        self._interval = interval
        self._backoff = BackoffPolicy(min(2 * interval, MAX_BACKOFF_SECONDS), MAX_BACKOFF_SECONDS)
        self._rng = rng or random.Random()
        self._timeout = timeout
        self._clock = clock
        self._max_body_bytes = max_body_bytes

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS)
        async with aiohttp.ClientSession(connector=connector, trust_env=False) as session:
            while True:
                started = self._clock()
                try:
                    await self.poll_due(session, started)
                except Exception:
                    log.exception("engine metrics round failed; next round in %.1fs", self._interval)
                await asyncio.sleep(max(0.0, self._interval - (self._clock() - started)))

    async def poll_due(self, session: aiohttp.ClientSession, now: float) -> None:
        # An external provider is nobody's engine: its /metrics (if any) is not vLLM's queue;
        # ComfyUI has no /metrics (its load is this router's in-flight count).
        due = [r for r in self._table.all_routes() if r.state.next_poll <= now and r.endpoint.polled]
        if due:
            async with asyncio.TaskGroup() as group:
                for route in due:
                    group.create_task(self.poll(session, route))

    async def poll(self, session: aiohttp.ClientSession, route: Route) -> None:
        """Read one engine's load into its state; on failure keep the last sample and back off."""
        state, url = route.state, route.endpoint.url
        try:
            async with asyncio.timeout(self._timeout):
                async with session.get(url + "/metrics") as response:
                    if response.status != 200:
                        raise MetricsUnreadable(f"GET /metrics answered {response.status}")
                    body = await _read_limited(response, self._max_body_bytes)
            running, waiting = parse_load(body.decode("utf-8", errors="replace"))
        except TimeoutError:
            # Accepted and not answered: a hung engine (see :mod:`.stall`). Not
            # backed off: it is trusted again as soon as it answers a poll.
            state.poll_failures += 1
            state.next_poll = self._clock() + self._interval
            if state.unresponsive_since is None:
                state.unresponsive_since = self._clock()
                log.warning(
                    "endpoint %s: /metrics unanswered within %.1fs; not choosing it until it answers",
                    route.endpoint.id,
                    self._timeout,
                )
            return
        except (aiohttp.ClientError, MetricsUnreadable) as err:
            # It answered (badly) or refused: alive, or dead in a way requests see at once.
            self._answered(route)
            state.poll_failures += 1
            backoff = self._backoff.delay(state.poll_failures, self._rng)
            state.next_poll = self._clock() + backoff
            level = logging.INFO if state.poll_failures == 1 else logging.DEBUG
            log.log(
                level,
                "endpoint %s: engine metrics unavailable (%s); keeping the last sample, next poll in %.1fs",
                route.endpoint.id,
                str(err) or type(err).__name__,
                backoff,
            )
            return
        self._answered(route)
        state.poll_failures = 0
        state.next_poll = 0.0
        state.engine = EngineSample(url, running, waiting, state.in_flight, self._clock())

    def _answered(self, route: Route) -> None:
        state = route.state
        if state.unresponsive_since is not None:
            log.warning(
                "endpoint %s answers again after %.1fs unresponsive",
                route.endpoint.id,
                self._clock() - state.unresponsive_since,
            )
            state.unresponsive_since = None
