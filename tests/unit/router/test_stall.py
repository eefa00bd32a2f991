"""Hung engines (see llmgw.router.stall): accepted, never answered, routed around.

Real routers and real (scripted) engines on loopback. A frozen engine
accepts connections and answers nothing, ``/metrics`` included, the way a
SIGSTOPped or GPU-wedged one does. The router's defaults throughout (a
120 s first-byte timeout, a 60 s idle-stream timeout): what moves a request
is the stall watch, not a timeout.
"""

from __future__ import annotations

import asyncio
import sys
import time
from types import SimpleNamespace

import aiohttp

from llmgw.router.stall import StallWatch
from llmgw.router.table import Endpoint, EndpointState, Route

from .helpers import router
from .test_resume import CHAT, ScriptedEngine, chat_text, full_text, metric, read_events, standalone

HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


async def test_a_request_waiting_on_a_frozen_engine_is_retried_elsewhere_and_it_is_no_longer_chosen():
    async with ScriptedEngine("a", metrics=True) as a, ScriptedEngine("b", metrics=True) as b:
        a.thawed.clear()
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            started = time.monotonic()
            async with client.post(r.url + CHAT, json=HI) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-replica"] == "static:m:1"
                assert (await resp.json())["id"] == b.id
            assert time.monotonic() - started < 5
            assert await metric(client, r.url, 'llmgw_router_upstream_retries_total{model="m"} 1.0')
            # Known to be frozen now: the next ones go to b at once, streamed or not.
            for stream in (False, True):
                async with client.post(r.url + CHAT, json={**HI, "stream": stream}) as resp:
                    assert resp.headers["x-llmgw-replica"] == "static:m:1"
                    await resp.read()
            assert len(a.bodies) == 1
            assert await metric(client, r.url, 'llmgw_router_upstream_retries_total{model="m"} 1.0')
            # It answers again: it is chosen again (it is the first choice) within a poll or two.
            a.thawed.set()
            deadline = time.monotonic() + 5
            while True:
                async with client.post(r.url + CHAT, json=HI) as resp:
                    if resp.headers["x-llmgw-replica"] == "static:m:0":
                        break
                assert time.monotonic() < deadline, "the thawed engine was not chosen again"


async def test_a_stream_whose_engine_freezes_mid_answer_is_resumed_elsewhere():
    async with (
        ScriptedEngine("a", metrics=True, hang_after=3) as a,
        ScriptedEngine("b", metrics=True) as b,
    ):
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            started = time.monotonic()
            async with client.post(r.url + CHAT, json={**HI, "stream": True}) as resp:
                assert resp.headers["x-llmgw-replica"] == "static:m:0"
                events = await read_events(resp)
            assert time.monotonic() - started < 5
            assert await metric(client, r.url, 'llmgw_router_stream_resumes_total{model="m"} 1.0')
    assert chat_text(events) == full_text(8)
    assert len(b.bodies) == 1


async def test_a_slow_engine_that_answers_its_metrics_is_not_cut_off():
    # Two seconds to answer: slower than the stall watch's second, but alive.
    async with ScriptedEngine("a", metrics=True, delay=2.0) as a, ScriptedEngine("b", metrics=True) as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json=HI) as resp:
                assert resp.headers["x-llmgw-replica"] == "static:m:0"
                assert (await resp.json())["id"] == a.id
            assert await metric(client, r.url, 'llmgw_router_upstream_retries_total{model="m"} 0.0')
    assert b.bodies == []


async def test_a_watched_attempt_looks_up_no_event_loop(monkeypatch):
    # On Python 3.11 every asyncio.get_running_loop() and current_task() without a loop makes a
    # getpid system call (their fork check): an asyncio.timeout per attempt cost two of the six
    # system calls of a whole answer. The watch takes the task with the loop passed instead.
    async with ScriptedEngine("a", metrics=True) as a, ScriptedEngine("b", metrics=True) as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json=HI) as resp:
                assert resp.status == 200
            lookups: list[str] = []
            real = asyncio.events.get_running_loop

            def counted() -> asyncio.AbstractEventLoop:
                frame = sys._getframe(1)
                for _ in range(3):
                    if frame is None:
                        break
                    if "/llmgw/router/" in frame.f_code.co_filename:
                        lookups.append(f"{frame.f_code.co_filename}:{frame.f_lineno}")
                        break
                    frame = frame.f_back
                return real()

            monkeypatch.setattr(asyncio.events, "get_running_loop", counted)
            monkeypatch.setattr(asyncio, "get_running_loop", counted)
            for stream in (False, True, False):
                async with client.post(r.url + CHAT, json={**HI, "stream": stream}) as resp:
                    assert resp.status == 200
                    assert resp.headers["x-llmgw-replica"] == "static:m:0"
                    await resp.read()
            assert lookups == []


class _Attempt(SimpleNamespace):
    __hash__ = object.__hash__  # hashable as a ClientStream is (the watch keeps a set of them)


class _Task:
    def __init__(self) -> None:
        self.cancels = 0

    def cancel(self) -> None:
        self.cancels += 1


def test_an_attempt_is_cut_once_when_its_engine_is_silent_and_forgotten_when_it_leaves():
    now = [0.0]
    watch = StallWatch(lambda: now[0], stall_seconds=1.0)
    route = Route(Endpoint("e", "m", "http://127.0.0.1:1"), EndpointState())
    attempt = _Attempt(watched=None, watched_since=0.0, watched_task=None, cut=True, last_sent_at=0.0)
    task = _Task()
    watch.enter(attempt, route, task)  # type: ignore[arg-type]
    assert attempt.cut is False  # each attempt's record starts afresh
    now[0] = 5.0
    assert watch.check() == 0  # no progress for 5 s, but its engine answers /metrics
    route.state.unresponsive_since = 4.5
    attempt.last_sent_at = 4.5  # events went out half a second ago
    assert watch.check() == 0
    now[0] = 6.0
    assert watch.check() == 1
    assert (attempt.cut, task.cancels) == (True, 1)
    assert watch.check() == 0  # cut once
    watch.leave(attempt)  # type: ignore[arg-type]
    # Nothing of the attempt is held: the stream does not keep its task (a reference cycle).
    assert attempt.watched_task is None and attempt.watched is None
    attempt.cut = False
    assert watch.check() == 0
