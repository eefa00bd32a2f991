"""A fixed number of sequence slots with a FIFO waiting queue (vLLM's max-num-seqs).

Guarantees:

- Slots are granted strictly in arrival order; a newcomer never overtakes a
  waiter, even when a slot is free at the instant it arrives.
- A waiter cancelled while queued leaves the queue; one cancelled after its
  slot was granted but before it resumed hands the slot on, so a client that
  hangs up never leaks capacity.
- ``running`` counts granted slots, ``waiting`` the live waiters.

Single event loop only; not thread-safe. ``asyncio.Semaphore`` is not used
because its fairness has changed between Python versions and it does not
expose the queue length the metrics need.
"""

from __future__ import annotations

import asyncio
from collections import deque


class SequenceSlots:
    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._capacity = capacity
        self._free = capacity
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def running(self) -> int:
        return self._capacity - self._free

    @property
    def waiting(self) -> int:
        return sum(1 for w in self._waiters if not w.done())

    async def acquire(self) -> None:
        if self._free > 0 and self.waiting == 0:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # Granted, then cancelled before resuming: the slot is ours to pass on.
                self.release()
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def release(self) -> None:
        # A freed slot goes straight to the oldest live waiter, so ``_free``
        # only grows when nobody waits; that is what keeps the order FIFO.
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        if self._free >= self._capacity:
            raise RuntimeError("SequenceSlots.release called more times than acquire")
        self._free += 1
