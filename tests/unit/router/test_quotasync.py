"""The router's quota sync against real gRPC servers the test scripts: a standby's
redirect is followed to the leader, usage is reported, the leader's grants are taken,
and the shares are kept when the leader goes away."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator

import grpc

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.grpcserver import GrpcServer
from llmgw.router.quota import KeyLimits, Quotas
from llmgw.router.quotasync import QuotaSync
from llmgw.v1 import keys_pb2, keys_pb2_grpc

from .helpers import wait_for

LIMITS = KeyLimits(requests_per_minute=60)


class Standby(keys_pb2_grpc.QuotaServiceServicer):
    def __init__(self) -> None:
        self.leader = ""

    async def Sync(self, request_iterator, context) -> AsyncIterator[keys_pb2.QuotaView]:  # noqa: N802
        yield keys_pb2.QuotaView(leader_address=self.leader)


class Leader(keys_pb2_grpc.QuotaServiceServicer):
    def __init__(self) -> None:
        self.reports: list[keys_pb2.QuotaReport] = []

    async def Sync(self, request_iterator, context) -> AsyncIterator[keys_pb2.QuotaView]:  # noqa: N802
        async for report in request_iterator:
            self.reports.append(report)
            yield keys_pb2.QuotaView(
                budgets=[keys_pb2.KeyBudget(key_id="k", requests=3.0)], routers=2, leader=True
            )


def server(servicer) -> GrpcServer:
    return GrpcServer(
        "127.0.0.1:0", [(keys_pb2_grpc.add_QuotaServiceServicer_to_server, servicer, "llmgw.v1.QuotaService")]
    )


class Gauges:
    def __init__(self) -> None:
        self.synced: int | None = None

    def quota_synced(self, routers: int | None) -> None:
        self.synced = routers


async def test_a_standby_redirects_to_the_leader_which_gets_usage_and_grants_shares():
    standby, leader = Standby(), Leader()
    standby_server, leader_server = server(standby), server(leader)
    await standby_server.start()
    await leader_server.start()
    standby.leader = f"127.0.0.1:{leader_server.port}"
    quotas, gauges = Quotas(), Gauges()
    quotas.admit("k", LIMITS, 0, time.monotonic())
    sync = syncing([f"127.0.0.1:{standby_server.port}"], quotas, gauges)
    task = asyncio.create_task(sync.run())
    try:
        await wait_for(lambda: gauges.synced == 2)
        first = leader.reports[0]
        assert first.router_id == "r-1"
        assert [(u.key_id, u.requests) for u in first.usage] == [("k", 1)]
        assert quotas.routers == 2
        assert quotas.level("k", "requests", time.monotonic()) <= 3.1
        await leader_server.stop(0)
        await wait_for(lambda: gauges.synced is None)
        assert quotas.level("k", "requests", time.monotonic()) is not None, "the share is kept"
        assert quotas.routers == 2
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await standby_server.stop(0)
        await leader_server.stop(0)


class Failing(keys_pb2_grpc.QuotaServiceServicer):
    """Ends each stream at once, reading nothing: a control plane going away mid-sync."""

    async def Sync(self, request_iterator, context) -> AsyncIterator[keys_pb2.QuotaView]:  # noqa: N802
        await context.abort(grpc.StatusCode.INTERNAL, "going away")
        yield keys_pb2.QuotaView()  # pragma: no cover - makes this a stream handler


class LosesFirstAnswer(Leader):
    """Reads the first report of its first stream, then ends that stream without answering."""

    async def Sync(self, request_iterator, context) -> AsyncIterator[keys_pb2.QuotaView]:  # noqa: N802
        if not self.reports:
            self.reports.append(await anext(aiter(request_iterator)))
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the answer is lost")
        async for view in super().Sync(request_iterator, context):
            yield view


def syncing(addresses: list[str], quotas: Quotas, gauges: Gauges) -> QuotaSync:
    return QuotaSync(
        addresses,
        quotas,
        gauges,
        router_id="r-1",
        interval=0.05,
        timeout=2.0,
        backoff=BackoffPolicy(0.05, 0.2),
        clock=time.monotonic,
        rng=random.Random(1),
    )


async def test_usage_is_not_lost_when_a_sync_attempt_fails():
    failing, leader = server(Failing()), Leader()
    leader_server = server(leader)
    await failing.start()
    await leader_server.start()
    quotas, gauges = Quotas(), Gauges()
    quotas.admit("k", LIMITS, 0, time.monotonic())
    sync = syncing([f"127.0.0.1:{failing.port}", f"127.0.0.1:{leader_server.port}"], quotas, gauges)
    task = asyncio.create_task(sync.run())
    try:
        await wait_for(lambda: gauges.synced == 2)
        assert [(u.key_id, u.requests) for u in leader.reports[0].usage] == [("k", 1)]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await failing.stop(0)
        await leader_server.stop(0)


async def test_a_report_whose_answer_was_lost_is_sent_again_with_the_same_numbers():
    leader = LosesFirstAnswer()
    leader_server = server(leader)
    await leader_server.start()
    quotas, gauges = Quotas(), Gauges()
    quotas.admit("k", LIMITS, 0, time.monotonic())
    task = asyncio.create_task(syncing([f"127.0.0.1:{leader_server.port}"], quotas, gauges).run())
    try:
        await wait_for(lambda: len(leader.reports) >= 3)
        lost, again, nxt = leader.reports[:3]
        assert (again.incarnation, again.sequence) == (lost.incarnation, lost.sequence) != ("", 0)
        assert [(u.key_id, u.requests) for u in again.usage] == [("k", 1)]
        assert (nxt.incarnation, nxt.sequence) == (lost.incarnation, lost.sequence + 1)
        assert list(nxt.usage) == []
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await leader_server.stop(0)
