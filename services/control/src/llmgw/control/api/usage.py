"""UsageService.Report: routers' load reports reach the leader.

Decision: routers report to the leader, and a standby redirects them there
(as it does agents) rather than relaying. A relay would add a hop, a queue
and a failure mode to every report for no gain: only the leader acts on
usage, and a router already reconnects by itself. So a control plane that
does not lead (or whose term is still loading) answers the first report
with ``UsageReply{accepted: false, leader_address}`` and ends the stream; a
leader answers ``accepted: true`` once and then takes every report, until
its term ends, when the next report is answered with the new leader's
address. A new leader is therefore blind for at most about one router tick,
which the autoscaler treats as "no data: hold" (see autoscale).

Bad input: a report without ``router_id`` ends the stream with
INVALID_ARGUMENT; nothing is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from typing import Protocol

import grpc

from llmgw.v1 import usage_pb2, usage_pb2_grpc

log = logging.getLogger("llmgw.control.api.usage")


class UsageSink(Protocol):
    def report(self, report: usage_pb2.UsageReport, now: float) -> None: ...


class LeaderDirectory(Protocol):
    async def leader_address(self) -> str: ...


class UsageServicer(usage_pb2_grpc.UsageServiceServicer):
    def __init__(
        self,
        leading: Callable[[], bool],
        leadership: LeaderDirectory,
        sink: UsageSink,
        clock: Callable[[], float],
    ):
        self._leading = leading
        self._leadership = leadership
        self._sink = sink
        self._clock = clock

    async def Report(  # noqa: N802 - gRPC method name
        self,
        request_iterator: AsyncIterator[usage_pb2.UsageReport],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[usage_pb2.UsageReply]:
        accepted = False
        async for report in request_iterator:
            if not report.router_id:
                await context.abort(
                    grpc.StatusCode.INVALID_ARGUMENT, "UsageReport.router_id is empty; name the router"
                )
            if not self._leading():
                address = await self._leadership.leader_address()
                log.info("redirecting router %s to the leader at %r", report.router_id, address)
                yield usage_pb2.UsageReply(accepted=False, leader_address=address)
                return
            self._sink.report(report, self._clock())
            if not accepted:
                accepted = True
                log.info("router %s reports usage here", report.router_id)
                yield usage_pb2.UsageReply(accepted=True)
