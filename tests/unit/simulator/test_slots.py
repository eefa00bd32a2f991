"""SequenceSlots: FIFO grants, and cancellation never leaks or skips a slot."""

from __future__ import annotations

import asyncio

import pytest

from llmgw.agent.simulator.slots import SequenceSlots


async def test_slots_are_granted_in_arrival_order():
    slots = SequenceSlots(1)
    await slots.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        await slots.acquire()
        order.append(i)

    async with asyncio.TaskGroup() as tg:
        for i in range(4):
            tg.create_task(wait(i))
            await asyncio.sleep(0)  # enqueue in order 0, 1, 2, 3
        assert (slots.running, slots.waiting) == (1, 4)
        for _ in range(4):
            slots.release()
            await asyncio.sleep(0)
    assert order == [0, 1, 2, 3]
    assert (slots.running, slots.waiting) == (1, 0)


async def test_newcomer_does_not_overtake_a_waiter_woken_but_not_yet_running():
    slots = SequenceSlots(1)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # handed to the waiter; the newcomer must queue behind it
    newcomer = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    assert waiter.done() and not newcomer.done()
    slots.release()
    await newcomer


async def test_cancelled_waiter_leaves_the_queue():
    slots = SequenceSlots(1)
    await slots.acquire()
    waiter = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    assert slots.waiting == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (slots.running, slots.waiting) == (1, 0)
    slots.release()
    assert slots.running == 0


async def test_waiter_cancelled_after_its_grant_passes_the_slot_on():
    slots = SequenceSlots(1)
    await slots.acquire()
    granted_then_cancelled = asyncio.create_task(slots.acquire())
    next_in_line = asyncio.create_task(slots.acquire())
    await asyncio.sleep(0)
    slots.release()  # grants the first waiter ...
    granted_then_cancelled.cancel()  # ... which is cancelled before it resumes
    with pytest.raises(asyncio.CancelledError):
        await granted_then_cancelled
    await asyncio.wait_for(next_in_line, 1)
    assert (slots.running, slots.waiting) == (1, 0)


async def test_release_without_acquire_is_an_error():
    with pytest.raises(RuntimeError):
        SequenceSlots(2).release()
