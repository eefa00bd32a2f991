"""Small helpers shared by the control plane's tests."""

from __future__ import annotations

import asyncio
import contextlib


class Reader:
    """Reads a gRPC server stream in its own task, so a test can wait for "nothing" safely.

    (Cancelling a pending read of a grpc.aio call cancels the call itself.)
    """

    def __init__(self, call):
        self.call = call
        self.queue: asyncio.Queue = asyncio.Queue()
        self.ended = asyncio.Event()
        self.task = asyncio.create_task(self._pump())

    async def _pump(self):
        try:
            async for msg in self.call:
                self.queue.put_nowait(msg)
        finally:
            self.ended.set()

    async def next(self, within: float = 3.0):
        return await asyncio.wait_for(self.queue.get(), within)

    async def next_matching(self, pred, within: float = 3.0):
        """The next message for which ``pred`` holds, skipping the others."""
        async with asyncio.timeout(within):
            while True:
                msg = await self.queue.get()
                if pred(msg):
                    return msg

    async def quiet(self, seconds: float = 0.3) -> bool:
        await asyncio.sleep(seconds)
        return self.queue.empty()

    async def close(self):
        self.call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.task


async def until(pred, within: float = 3.0, step: float = 0.01) -> None:
    """Wait for a condition on in-process state that offers no event to await."""
    async with asyncio.timeout(within):
        while not pred():  # noqa: ASYNC110 - polling state owned by the code under test
            await asyncio.sleep(step)
