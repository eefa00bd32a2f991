"""The shared leader-following loop (:mod:`llmgw.router.leader`), against a scripted session:
redirects are followed at once but boundedly, a self-redirect or a failure waits the backoff,
and the loop outlives a session that raises."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

import pytest

from llmgw.common.backoff import BackoffPolicy
from llmgw.router.leader import MAX_REDIRECT_HOPS, follow_leader


@dataclass(frozen=True)
class CountingBackoff(BackoffPolicy):
    waits: list[int] = field(default_factory=list)

    def delay(self, failures: int, rng: random.Random) -> float:
        self.waits.append(failures)
        return 0.0


async def follow(sessions: int, answers: dict[str, tuple[bool, str]]) -> tuple[list[str], list[int], int]:
    """(addresses dialled, the failure count of each backoff wait, sessions ended) after ``sessions``."""
    dialled: list[str] = []
    ended: list[None] = []
    backoff = CountingBackoff()
    done = asyncio.Event()

    async def session(address: str) -> tuple[bool, str]:
        dialled.append(address)
        if len(dialled) > sessions:
            done.set()
            await asyncio.Event().wait()
        if address == "boom":
            raise RuntimeError("a bug in one session")
        return answers[address]

    task = asyncio.create_task(
        follow_leader(
            "test", ["a", "boom"], session, backoff, random.Random(1), ended=lambda: ended.append(None)
        )
    )
    await asyncio.wait_for(done.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return dialled[:sessions], backoff.waits, len(ended) - 1


async def test_standbys_naming_each_other_are_followed_at_once_but_only_a_few_hops_in_a_row():
    dialled, waits, ended = await follow(MAX_REDIRECT_HOPS + 1, {"a": (False, "b"), "b": (False, "a")})
    assert dialled == ["a", "b", "a", "b"][: MAX_REDIRECT_HOPS + 1]
    assert waits == [1], "no wait between hops; one backoff once the hops ran out"
    assert ended == MAX_REDIRECT_HOPS + 1


async def test_a_leader_naming_itself_waits_the_backoff_and_a_raising_session_does_not_end_the_loop():
    dialled, waits, _ = await follow(3, {"a": (False, "a")})
    assert dialled == ["a", "boom", "a"]
    assert waits == [1, 2, 3]


async def test_an_accepted_session_resets_the_backoff():
    _, waits, _ = await follow(3, {"a": (True, "")})
    assert waits == [0, 1, 0]
