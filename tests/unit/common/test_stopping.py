"""A service that hangs while stopping exits anyway, with its stacks (llmgw/common/stopping.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

SERVICE = """
import asyncio, sys, time

from llmgw.common import stopping

stopping.STOP_MARGIN_SECONDS = 1.0  # the default is 30 s; the test does not wait that long


def stuck_in_shutdown():
    time.sleep(60)  # a stop step that never ends, blocking the event loop with it


async def main():
    stop = asyncio.Event()
    stopping.stop_on_signals(stop, role="test", grace_seconds=1.0)
    print("ready", flush=True)
    await stop.wait()
    if sys.argv[1] == "hang":
        stuck_in_shutdown()
    else:
        await asyncio.sleep(1.0)  # a shutdown that takes its time, within the deadline
    print("stopped", flush=True)


asyncio.run(main())
"""


def _stop(mode: str, *signals: signal.Signals) -> tuple[int, str, str, float]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVICE, mode], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        began = time.monotonic()
        for sig in signals:
            proc.send_signal(sig)
            time.sleep(0.2)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err, time.monotonic() - began
    finally:
        proc.kill()
        proc.wait()


def test_a_shutdown_that_hangs_ends_at_the_deadline_with_every_threads_stack():
    code, out, err, took = _stop("hang", signal.SIGTERM)
    assert code == 1 and "stopped" not in out
    assert 1.5 < took < 10, took  # grace 1 s + margin 1 s, not the 60 s the step would take
    assert "Timeout" in err and "in stuck_in_shutdown" in err, err


def test_a_shutdown_within_its_deadline_is_not_cut_and_a_second_signal_does_not_move_it():
    # SIGINT after SIGTERM, as a terminal's Ctrl-C reaches a service that `llmgw up` stops.
    code, out, err, took = _stop("finish", signal.SIGTERM, signal.SIGINT)
    assert (code, out.strip()) == (0, "stopped"), err
    assert "Timeout" not in err
