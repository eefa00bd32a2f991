"""Server-sent events for the console: the fleet's state, pushed when it changes.

One stream per open console (``GET /api/v1/events``). Each ``state`` event
carries everything the tables show (cluster status, models, nodes,
replicas and failures, keys), read with the same in-process calls as the
REST API, so it is exactly what ``GET /api/v1/...`` would answer and goes
through the same authorization.

When to send: the stream follows the control plane's watch hubs
(endpoints, catalog, keys: a replica becoming ready, a model or key
changing) and wakes at once on any of their changes; the inventory and the
placement decisions live in the controller's memory, which offers no
change feed, so the stream also re-reads that state every
:data:`TICK_SECONDS` and sends only when it differs from what was sent
(nodes' "last seen" ages are left out of the comparison, else every tick
would differ). One read serves every open stream while it is fresh
(:meth:`EventFeed.read_state`), so many consoles cost about one read a
second, not one each. The browser never polls. A comment line every
:data:`KEEPALIVE_SECONDS` keeps proxies from closing an idle stream.
At most :data:`MAX_STREAMS` streams at once (429 beyond).

Routers' load, requests and errors come from ``AdminService.ListRouters``
(what the routers' usage reports tell the leader), read like the rest: a
standby, which gets no reports, sends that call's error (naming the
leader) in their place.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, Protocol

import grpc
from aiohttp import web

from llmgw.v1 import admin_pb2, keys_pb2

from .transcode import Aborted, Dispatcher, to_json

TICK_SECONDS = 1.0
# A read this young, with no watch-hub change since, is shared by every stream.
FRESH_SECONDS = 0.5
KEEPALIVE_SECONDS = 15.0
MAX_STREAMS = 32


class Hub(Protocol):
    def updates(self, known_revision: int) -> AsyncIterator[object]: ...


READS = (
    ("status", "/llmgw.v1.AdminService/GetClusterStatus", admin_pb2.GetClusterStatusRequest),
    ("models", "/llmgw.v1.AdminService/ListModels", admin_pb2.ListModelsRequest),
    ("nodes", "/llmgw.v1.AdminService/ListNodes", admin_pb2.ListNodesRequest),
    ("replicas", "/llmgw.v1.AdminService/ListReplicas", admin_pb2.ListReplicasRequest),
    ("keys", "/llmgw.v1.KeyService/ListKeys", keys_pb2.ListKeysRequest),
    ("routers", "/llmgw.v1.AdminService/ListRouters", admin_pb2.ListRoutersRequest),
)


def comparable(state: dict[str, Any]) -> str:
    """The state without what changes on its own (ages), as text to compare.

    A router's report age and rate window move with every report; its counts
    and rates are kept, so a console follows the traffic while there is some.
    """
    nodes = state.get("nodes", {}).get("nodes", [])
    routers = state.get("routers", {})
    trimmed = {
        **state,
        "nodes": [{k: v for k, v in n.items() if k != "last_seen_seconds_ago"} for n in nodes],
        "routers": {
            **routers,
            "routers": [
                {k: v for k, v in r.items() if k not in ("last_report_seconds_ago", "window_seconds")}
                for r in routers.get("routers", [])
            ],
        },
    }
    return json.dumps(trimmed, sort_keys=True)


class EventFeed:
    def __init__(
        self,
        dispatcher: Dispatcher,
        hubs: Sequence[Hub],
        stopping: asyncio.Event,
    ):
        self._dispatcher = dispatcher
        self._hubs = hubs
        self._stopping = stopping
        self._open = 0
        self._lock = asyncio.Lock()
        # Watch-hub changes seen by any stream, and the last read: (changes, when, state).
        self._changes = 0
        self._cached: tuple[int, float, dict[str, Any]] | None = None

    async def read_state(self, metadata, peer: str) -> dict[str, Any]:
        """The state for this caller: shared by every stream while fresh, after each one's authorization.

        One read serves every open console: a read younger than
        :data:`FRESH_SECONDS` with no watch-hub change since is reused, once
        the interceptors let this caller call each method it was read with.
        """
        async with self._lock:
            cached = self._cached
            if (
                cached is not None
                and cached[0] == self._changes
                and time.monotonic() - cached[1] < FRESH_SECONDS
            ):
                for _, method, _ in READS:
                    await self._dispatcher.authorize(method, metadata, peer)
                return cached[2]
            changes = self._changes
            state = await self._read(metadata, peer)
            self._cached = (changes, time.monotonic(), state)
            return state

    async def _read(self, metadata, peer: str) -> dict[str, Any]:
        state: dict[str, Any] = {}
        for key, method, request in READS:
            try:
                state[key] = to_json(await self._dispatcher.call(method, request(), metadata, peer))
            except Aborted as err:
                if key in ("status", "models") or err.code == grpc.StatusCode.UNAUTHENTICATED:
                    raise
                # A standby without the leader's view, say: the table shows why.
                state[key] = {"error": {"status": err.code.name, "message": err.message}}
        return state

    async def stream(
        self,
        request: web.Request,
        metadata: list[tuple[str, str]],
        refuse: Callable[[Aborted], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        peer = f"http:{request.remote}"
        try:
            first = await self.read_state(metadata, peer)
        except Aborted as err:
            return await refuse(err)
        if self._open >= MAX_STREAMS:
            return await refuse(Aborted(grpc.StatusCode.RESOURCE_EXHAUSTED, "too many open event streams"))
        self._open += 1
        try:
            return await self._serve(request, metadata, peer, first)
        finally:
            self._open -= 1

    async def _serve(
        self, request: web.Request, metadata, peer: str, state: dict[str, Any]
    ) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",
            }
        )
        await response.prepare(request)
        changed = asyncio.Event()

        async def follow(hub: Hub) -> None:
            async for _ in hub.updates(0):
                self._changes += 1
                changed.set()

        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(follow(h), name="sse-follow") for h in self._hubs]
            try:
                await self._loop(request, response, metadata, peer, state, changed)
            except ConnectionResetError:
                pass  # the browser went away
            finally:
                for t in tasks:
                    t.cancel()
        return response

    async def _loop(self, request, response, metadata, peer: str, state, changed: asyncio.Event) -> None:
        async def send(kind: str, payload: dict[str, Any]) -> None:
            await response.write(f"event: {kind}\ndata: {json.dumps(payload)}\n\n".encode())

        last = comparable(state)
        await send("state", state)
        quiet_since = time.monotonic()
        while not self._stopping.is_set():
            transport = request.transport
            if transport is None or transport.is_closing():
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_SECONDS):
                    await changed.wait()
            changed.clear()
            try:
                state = await self.read_state(metadata, peer)
            except Aborted as err:
                await send("error", {"error": {"status": err.code.name, "message": err.message}})
                return
            now = comparable(state)
            if now != last:
                await send("state", state)
                last, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since >= KEEPALIVE_SECONDS:
                await response.write(b": keepalive\n\n")
                quiet_since = time.monotonic()
