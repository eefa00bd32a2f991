"""Hung engines: an endpoint that accepts connections and never answers is routed around.

The common way an engine dies on a GPU is not a refused connection (which
the breaker and the pre-first-byte retry handle) but a process that stops
answering: a wedged GPU, a SIGSTOP, a deadlock. Its TCP socket still
accepts, so every request sent there waits for its whole first-byte
timeout, and nothing the router saw so far said "do not choose it".

Evidence (issue 15): the engine-metrics poller (:mod:`.enginemetrics`)
asks every engine for ``/metrics`` about once a second with a short
timeout. A live engine answers that even while busy; one that does not
answer within the timeout is **unresponsive** (``EndpointState.
unresponsive_since``) until it answers a poll again. Then:

- **Not chosen.** The balancer skips an unresponsive endpoint as it skips
  an open breaker (and, like the breaker, still picks among them when every
  endpoint of the model is unresponsive: better to try than to refuse).
- **What waits there is moved.** :class:`StallWatch` checks the attempts in
  flight every :data:`CHECK_SECONDS`; an attempt on an unresponsive
  endpoint that has had no progress (no event relayed to the client, or,
  for a whole answer, no answer since it started) for
  :data:`STALL_SECONDS` is cut off: the proxy retries it whole elsewhere
  when nothing reached the client, and resumes it elsewhere when a stream
  had started (:mod:`.resume`). The cut counts as a breaker failure.

Why the engine's own silence and not a time-to-first-token estimate: a
legitimately slow first token (a long prompt, a full batch) on a live
engine must never be cut off and sent again, which would double a slow
request's load; a TTFT estimate cannot tell that from a hang, and the
engine's ``/metrics`` answer can. Both signals are required to cut an
attempt: the engine is silent *and* this attempt made no progress, so a
stream that still flows from an engine whose ``/metrics`` is slow goes on.
An engine that serves no ``/metrics`` (it answers 404) is never
unresponsive; external providers are neither polled nor watched.

Cost on the request path: the attempt's record written on the request's
stream, a set insertion and removal per attempt; the check runs in one
background task. A cut cancels the attempt's task, which
the proxy turns into the cut (:meth:`.Proxy._stalled`; as ``asyncio.timeout`` does,
``Task.uncancel``); no ``asyncio.timeout`` per attempt, whose
``current_task()`` and ``get_running_loop()`` each cost a getpid system
call on Python 3.11: two of a whole answer's six (a read and a write
on each side, and those two).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol

from .table import EndpointState, Route

log = logging.getLogger(__name__)

# How often attempts in flight are checked.
CHECK_SECONDS = 0.2
# No progress for this long on an unresponsive endpoint: the attempt is cut off.
STALL_SECONDS = 1.0


class Attempt(Protocol):
    """One attempt in flight, as the watch sees it: the request's :class:`.clientstream.ClientStream`,
    which holds the attempt's record (set by :meth:`StallWatch.enter`) and says when events last
    went to the client.

    The record lives on the stream, which every request has anyway, rather than in an object of
    its own per attempt: this runs for every attempt, and that object and a coroutine around the
    attempt were most of what the watch cost (docs/benchmarks.md).
    """

    # The route the attempt runs on, when it began, the task running it; ``cut`` once it is cut off.
    watched: Route | None
    watched_since: float
    watched_task: asyncio.Task[Any] | None
    cut: bool

    @property
    def last_sent_at(self) -> float: ...


def unresponsive(state: EndpointState) -> bool:
    return state.unresponsive_since is not None


class StallWatch:
    def __init__(self, clock: Callable[[], float], stall_seconds: float = STALL_SECONDS) -> None:
        self._clock = clock
        self._stall = stall_seconds
        self._attempts: set[Attempt] = set()

    def enter(self, attempt: Attempt, route: Route, task: asyncio.Task[Any] | None) -> None:
        """Watch ``attempt``, on ``route`` and running in ``task``, from now; a cut sets
        ``attempt.cut`` and cancels ``task`` once (the caller takes that ``CancelledError`` back
        with ``task.uncancel()``). The caller calls :meth:`leave` when the attempt ends, however it
        ends."""
        attempt.watched = route
        attempt.watched_since = self._clock()
        attempt.watched_task = task
        attempt.cut = False
        self._attempts.add(attempt)

    def leave(self, attempt: Attempt) -> None:
        self._attempts.discard(attempt)
        attempt.watched = attempt.watched_task = None

    def check(self) -> int:
        """Cut off every stalled attempt on an unresponsive endpoint; returns how many."""
        now = self._clock()
        cut = 0
        for a in list(self._attempts):
            route, task = a.watched, a.watched_task
            if a.cut or task is None or route is None or not unresponsive(route.state):
                continue
            idle = now - max(a.watched_since, a.last_sent_at)
            if idle >= self._stall:
                a.cut = True
                task.cancel()
                cut += 1
                log.warning(
                    "endpoint %s does not answer (its /metrics unanswered for %.1fs) and an attempt "
                    "there made no progress for %.1fs; moving it elsewhere",
                    route.endpoint.id,
                    now - (route.state.unresponsive_since or now),
                    idle,
                )
        return cut

    async def run(self) -> None:
        while True:
            await asyncio.sleep(CHECK_SECONDS)
            try:
                self.check()
            except Exception:  # one bad check must not end the watch
                log.exception("checking attempts for stalls failed")
