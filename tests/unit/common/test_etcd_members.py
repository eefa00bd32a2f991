"""The order Members asks members in, with scripted attempts (the failures themselves are real-etcd tests).

tests/unit/common/test_etcd_failover.py shows the failover against real
etcd members; what a real cluster cannot show on demand is a whole round
failing (it takes etcd's raft leader hanging while its followers hold lease
refreshes), so the order of rounds is checked here with attempts that fail
as a member would.
"""

from __future__ import annotations

import asyncio

import grpc

from llmgw.common.etcd.members import Members
from tests.support.procs import free_port


def _unavailable() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


async def test_a_round_of_failures_begins_the_next_one_member_further():
    members = Members(["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"], timeout=5, member_timeout=0.1)
    asked: list[int] = []

    async def attempt(channel, seconds: float) -> str:
        asked.append(members.current)
        if len(asked) <= 3:
            raise _unavailable()
        return "answered"

    try:
        assert await members.call("range", attempt, repeatable=True) == "answered"
    finally:
        await members.close()
    # Not member 0 again: the member that began a failed round may be the one that hangs.
    assert asked == [0, 1, 2, 1]


async def test_a_write_waits_for_a_member_that_is_not_listening_yet_until_the_deadline():
    # A write is sent only on a connected channel, so one that finds no member listening never
    # left: it goes round again until the call's deadline rather than failing after one
    # member_timeout (a first TLS handshake to a just-started etcd can take longer than that).
    port = free_port()
    members = Members([f"127.0.0.1:{port}"], timeout=10, member_timeout=0.2)
    server = grpc.aio.server()
    server.add_insecure_port(f"127.0.0.1:{port}")
    sent: list[float] = []

    async def attempt(channel, seconds: float) -> str:
        sent.append(seconds)
        return "written"

    async def listen_late() -> None:
        await asyncio.sleep(1.0)
        await server.start()

    late = asyncio.create_task(listen_late())
    try:
        assert await members.call("transaction", attempt, repeatable=False) == "written"
    finally:
        await late
        await members.close()
        await server.stop(None)
    assert len(sent) == 1
