"""A scripted router for control-plane tests: a real UsageService.Report client."""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from llmgw.v1 import usage_pb2, usage_pb2_grpc

from .helpers import Reader


class ScriptedRouter:
    """Reports what the test sets (``endpoints``, ``models``) every ``interval`` seconds."""

    def __init__(self, address: str, router_id: str = "router-1", interval: float = 0.1):
        self.router_id = router_id
        self.interval = interval
        self.endpoints: list[usage_pb2.EndpointLoad] = []
        self.models: list[usage_pb2.ModelDemand] = []
        self.traffic: list[usage_pb2.ModelTraffic] = []
        self.channel = grpc.aio.insecure_channel(address)
        self.call = usage_pb2_grpc.UsageServiceStub(self.channel).Report()
        self.replies = Reader(self.call)
        self._task: asyncio.Task | None = None

    def report(self, urgent: bool = False) -> usage_pb2.UsageReport:
        return usage_pb2.UsageReport(
            router_id=self.router_id,
            interval_seconds=self.interval,
            endpoints=self.endpoints,
            models=self.models,
            urgent=urgent,
            traffic=self.traffic,
        )

    async def send(self, urgent: bool = False) -> None:
        await self.call.write(self.report(urgent))

    def start(self) -> None:
        self._task = asyncio.create_task(self._tick())

    async def _tick(self) -> None:
        while True:
            await self.send()
            await asyncio.sleep(self.interval)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, grpc.aio.AioRpcError):
                await self._task
        with contextlib.suppress(grpc.aio.AioRpcError):
            await self.replies.close()
        await self.channel.close()


async def reporting_router(address: str, within: float = 5.0, **kw) -> ScriptedRouter:
    """A router whose reports the leader at ``address`` accepted, ticking in the background."""
    router = ScriptedRouter(address, **kw)
    await router.send()
    reply = await router.replies.next(within)
    assert reply.accepted, f"not accepted: {reply}"
    router.start()
    return router
