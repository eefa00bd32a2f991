"""A hung test fails by itself, saying where it hung, and the run goes on (tests/support/hangs.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

HANGING = """
import asyncio


async def wait_for_ever(event):
    await event.wait()


async def test_hangs():
    await wait_for_ever(asyncio.Event())


def test_after_it():
    pass
"""


def test_a_hung_async_test_fails_with_its_await_chain_and_the_next_test_still_runs(tmp_path):
    (tmp_path / "test_sample.py").write_text(HANGING)
    env = {**os.environ, "LLMGW_TEST_PHASE_SECONDS": "1", "PYTHONPATH": str(ROOT)}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "tests.support.hangs",
            "-o",
            "asyncio_mode=auto",
            str(tmp_path / "test_sample.py"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert "1 failed, 1 passed" in out, out
    assert "HungTest" in out and "call ran past 1s" in out, out
    # Where it waits, not only the event loop's select: the task's chain down to the awaited event.
    assert "in wait_for_ever" in out and "await event.wait()" in out, out
