"""The order Members asks members in, with scripted attempts (the failures themselves are real-etcd tests).

tests/unit/common/test_etcd_failover.py shows the failover against real
etcd members; what a real cluster cannot show on demand is a whole round
failing (it takes etcd's raft leader hanging while its followers hold lease
refreshes), so the order of rounds is checked here with attempts that fail
as a member would.
"""

from __future__ import annotations

import grpc

from llmgw.common.etcd.members import Members


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
