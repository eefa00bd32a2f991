"""Ending a task of one's own without swallowing a cancellation meant for oneself.

The usual way to stop a helper task, ``task.cancel()`` and then ``await task`` inside
``contextlib.suppress(asyncio.CancelledError)``, cannot tell the CancelledError of the task it
cancelled from one delivered to the caller while it waits there, and swallows both. A caller
cancelled at that moment carries on as if nothing had happened, and whoever cancelled it and
awaits its end waits for ever. That is how the router's usage reporter, cancelled by the router's
shutdown while it waited for its urgent-report helper to end, went back to reporting, and the
shutdown waited on it until CI's time ran out. :func:`cancel_and_wait` lets the caller's own
cancellation through (``Task.cancelling()``, as ``asyncio.timeout`` and ``TaskGroup`` tell theirs
apart). tests/unit/common/test_tasks.py also keeps the old pattern out of the code.
"""

from __future__ import annotations

import asyncio
from typing import Any


async def cancel_and_wait(task: asyncio.Future[Any]) -> None:
    """Cancel ``task`` and wait until it has ended. Its CancelledError is absorbed; any other error
    it ended with is raised; a cancellation of the caller while it waits is raised too."""
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        current = asyncio.current_task()
        if current is not None and current.cancelling():
            raise
