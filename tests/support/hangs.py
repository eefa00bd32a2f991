"""A hung test fails alone, with the stacks that say where it hung, instead of eating CI's 90 minutes.

Each phase of a test (setup, call, teardown) gets :data:`PHASE_SECONDS`. When a phase runs past
it, SIGALRM's handler prints every asyncio task's await chain (a hung coroutine shows only the
event loop's ``select`` in a thread dump) and raises :class:`HungTest` in the main thread: that
phase fails and the run goes on. Should the handler never run (the main thread stuck in C code
that holds the GIL), faulthandler dumps every thread's stack :data:`GRACE_SECONDS` later and
ends the process, so the run ends with a cause rather than a timeout.

No test comes near the limit: the slowest phase (the real vLLM's setup) takes under a minute.
``LLMGW_TEST_PHASE_SECONDS`` changes it (0 turns the watchdog off, e.g. under a debugger).
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import signal
import sys
import traceback
from collections.abc import Generator, Iterator
from types import FrameType
from typing import Any

import pytest

PHASE_SECONDS = float(os.environ.get("LLMGW_TEST_PHASE_SECONDS", "300"))
GRACE_SECONDS = 120.0

_stderr_fd: int | None = None


class HungTest(BaseException):
    """A test phase ran past :data:`PHASE_SECONDS`: a BaseException, so that no ``except
    Exception`` in the code under test swallows it and hangs on."""


def pytest_configure(config: pytest.Config) -> None:
    global _stderr_fd
    # Captured output is swapped in per test; faulthandler writes from C to a file descriptor of
    # its own, so a dump reaches the terminal whatever pytest captures then.
    _stderr_fd = os.dup(2)


def _awaited(coro: Any) -> Iterator[FrameType]:
    """The frames of ``coro`` and of what it awaits, outermost first."""
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "ag_frame", None)
        frame = frame or getattr(coro, "gi_frame", None)
        if frame is not None:
            yield frame
        coro = getattr(coro, "cr_await", None) or getattr(coro, "ag_await", None)


def _dump_tasks(phase: str, nodeid: str) -> None:
    out = sys.stderr
    print(f"\n=== {nodeid}: {phase} ran past {PHASE_SECONDS:.0f}s; asyncio tasks ===", file=out)
    loop = asyncio._get_running_loop()
    if loop is None:
        print("(no event loop running)", file=out)
        return
    for task in asyncio.all_tasks(loop):
        print(f"--- {task!r}", file=out)
        for frame in _awaited(task.get_coro()):
            print("".join(traceback.format_stack(frame, limit=1)), end="", file=out)


def _guarded(phase: str, item: pytest.Item) -> Generator[None, Any, Any]:
    if PHASE_SECONDS <= 0 or not hasattr(signal, "SIGALRM"):
        return (yield)

    def expired(signum: int, frame: FrameType | None) -> None:
        _dump_tasks(phase, item.nodeid)
        raise HungTest(f"{item.nodeid}: {phase} ran past {PHASE_SECONDS:.0f}s (tests/support/hangs.py)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, PHASE_SECONDS)
    if _stderr_fd is not None:
        faulthandler.dump_traceback_later(PHASE_SECONDS + GRACE_SECONDS, exit=True, file=_stderr_fd)
    try:
        return (yield)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded("setup", item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded("call", item))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from _guarded("teardown", item))
