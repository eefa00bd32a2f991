"""gRPC's asyncio runtime starts once per process and stays (llmgw/common/grpcruntime.py).

Each case runs in a fresh interpreter, where nothing has started gRPC yet.
"""

from __future__ import annotations

import subprocess
import sys

CYCLE = """
import asyncio, gc, threading

import grpc

from llmgw.common.tls import TlsSettings, aio_channel


def pollers():
    # gRPC's poller thread, which feeds core's completions to the event loop: one per start of core.
    # Thread objects, not idents: the system reuses a thread's ident once the thread has ended.
    return [t for t in threading.enumerate() if "_poll_wrapper" in t.name]


seen = {}  # id -> thread, kept so that no id is reused


async def one_channel():
    if {through_llmgw}:
        channel = aio_channel("127.0.0.1:1", TlsSettings(plaintext=True))
    else:
        channel = grpc.aio.insecure_channel("127.0.0.1:1")
    seen.update((id(t), t) for t in pollers())
    await channel.close()


for _ in range(3):  # a watch that reconnects, or three tests in a row: the only channel closes each time
    asyncio.run(one_channel())
    gc.collect()
print(len(seen), len(pollers()))
"""


def _cycle(through_llmgw: bool) -> str:
    run = subprocess.run(
        [sys.executable, "-c", CYCLE.replace("{through_llmgw}", str(through_llmgw))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.split("\n")[-2]


def test_a_process_whose_only_channel_closes_keeps_grpc_core_running():
    assert _cycle(through_llmgw=True) == "1 1"  # one start of core, still running at the end


def test_without_the_hold_grpc_core_stops_and_starts_again_with_each_channel():
    # Why the hold exists: grpc.aio's own behaviour, which the case above must not show.
    assert _cycle(through_llmgw=False) == "3 0"
