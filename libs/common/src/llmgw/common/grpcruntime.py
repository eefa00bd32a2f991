"""gRPC's asyncio runtime, started once per process and kept until the process ends.

grpc.aio counts the channels, servers and server calls alive; when the count falls to zero it shuts
gRPC core down (its completion queue, the poller thread that feeds the event loop, then
``grpc_shutdown``), and the next channel starts it all again. A process whose channels all close
together goes round that cycle each time: a router or agent whose control plane is away (each
watch reconnect opens and drops a channel), a control plane between etcd reconnects, each test of
the suite. The shutdown half runs on the event loop's thread, from whichever deallocation drops
the count (a garbage collection in the middle of unrelated code), holding the GIL while it joins
the poller thread and while core waits for its own objects to go: a stall in the best case, and a
process that hangs with no timer able to fire when core waits for something that needs the GIL.

So llmgw holds one count for the life of the process, taken by the first channel or server made
through libs/common (:func:`hold`): core starts once and ends with the process, like the
synchronous gRPC stack. Nothing of it is process-specific but the one poller thread, which stays.
"""

from __future__ import annotations

import threading

import grpc

_lock = threading.Lock()
_held = False


def hold() -> None:
    """Keep gRPC's asyncio runtime for the rest of the process (idempotent, cheap after the first).

    Call it before making a ``grpc.aio`` channel or server; the helpers in libs/common do.
    """
    global _held
    if _held:
        return
    with _lock:
        if not _held:
            grpc.aio.init_grpc_aio()
            _held = True
