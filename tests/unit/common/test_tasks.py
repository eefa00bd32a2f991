"""cancel_and_wait, and the pattern it replaces kept out of the code (llmgw/common/tasks.py)."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import pytest

from llmgw.common.tasks import cancel_and_wait

ROOT = Path(__file__).resolve().parents[3]


async def _slow_to_stop(stopping: asyncio.Event) -> None:
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        stopping.set()
        await asyncio.sleep(0.05)  # a task that takes a moment to end, as one closing a stream does
        raise


async def test_the_task_is_cancelled_and_waited_for_and_its_cancellation_absorbed():
    stopping = asyncio.Event()
    helper = asyncio.create_task(_slow_to_stop(stopping))
    await asyncio.sleep(0)
    await cancel_and_wait(helper)
    assert helper.cancelled() and stopping.is_set()


async def test_a_caller_cancelled_while_it_waits_stays_cancelled():
    stopping = asyncio.Event()
    went_on = []

    async def caller() -> None:
        helper = asyncio.create_task(_slow_to_stop(stopping))
        await asyncio.sleep(0)
        await cancel_and_wait(helper)
        went_on.append(True)  # with suppress(CancelledError), it got here: the cancel was lost
        await asyncio.sleep(3600)

    task = asyncio.create_task(caller())
    await stopping.wait()
    task.cancel()  # while the caller waits for its helper to end
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
    assert not went_on


async def test_an_error_the_task_ended_with_is_raised():
    async def fails() -> None:
        raise ValueError("boom")

    helper = asyncio.create_task(fails())
    await asyncio.sleep(0)
    with pytest.raises(ValueError):
        await cancel_and_wait(helper)


def _suppressed_awaits(path: Path) -> list[int]:
    """Lines where an await runs under contextlib.suppress(asyncio.CancelledError)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, (ast.With, ast.AsyncWith)):
            continue
        for item in node.items:
            call = item.context_expr
            if (
                isinstance(call, ast.Call)
                and ast.unparse(call.func).endswith("suppress")
                and any(ast.unparse(arg).endswith("CancelledError") for arg in call.args)
                and any(isinstance(inner, ast.Await) for stmt in node.body for inner in ast.walk(stmt))
            ):
                found.append(node.lineno)
    return found


def test_no_code_awaits_under_a_suppressed_cancellation():
    sources = [*ROOT.glob("libs/*/src/**/*.py"), *ROOT.glob("services/*/src/**/*.py")]
    assert sources
    offenders = [f"{p.relative_to(ROOT)}:{line}" for p in sources for line in _suppressed_awaits(p)]
    assert not offenders, f"use llmgw.common.tasks.cancel_and_wait: {offenders}"
