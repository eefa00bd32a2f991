"""SIGTERM and SIGINT: a service stops gracefully, within a deadline that holds whatever it is doing.

The first SIGTERM or SIGINT sets the service's ``stop`` event, and the service finishes what is in
flight within its grace setting (the router's and control plane's ``shutdown_grace_seconds``, the
agent's ``stop_grace_seconds`` for its engines). Should stopping run :data:`STOP_MARGIN_SECONDS`
past that grace (a shutdown step waiting on something that never comes: a task that ignores its
cancellation, a peer that never answers, gRPC core stuck in C code), the process writes every
thread's stack to stderr and exits with status 1. The timer is faulthandler's, a C thread that needs
neither the event loop nor the GIL, so it fires even when both are stuck. A supervisor (systemd,
Kubernetes, ``llmgw up``) then sees an exit instead of a process that never ends, and the operator
sees where it hung. Later signals change nothing: the deadline set by the first one stands (a
terminal's Ctrl-C reaches every process of ``llmgw up`` besides the SIGTERM it forwards).
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import signal

log = logging.getLogger(__name__)

# What stopping may take beyond the service's grace: closing clients and servers, background tasks.
STOP_MARGIN_SECONDS = 30.0


def stop_on_signals(stop: asyncio.Event, *, role: str, grace_seconds: float) -> None:
    """Set ``stop`` on SIGTERM or SIGINT, and end the process if stopping then runs past
    ``grace_seconds`` + :data:`STOP_MARGIN_SECONDS`. Call it from the running event loop."""
    loop = asyncio.get_running_loop()
    deadline = grace_seconds + STOP_MARGIN_SECONDS

    def stopping(sig: signal.Signals) -> None:
        if stop.is_set():
            return
        log.info("%s: %s received; stopping (it exits regardless after %.0fs)", role, sig.name, deadline)
        faulthandler.dump_traceback_later(deadline, exit=True)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping, sig)
