"""``llmgw-router``: parse the command line, wire the router, serve until told to stop.

With ``workers`` above 1 this process supervises that many worker
processes sharing the port (:mod:`.workers`); each worker runs
:func:`run_worker`, which is what a single-process router runs too.

Exit status: 0 after a clean shutdown (SIGTERM or SIGINT: stop accepting,
let in-flight requests finish for ``shutdown_grace_seconds``, close), 2 for
a configuration error, 1 when the router cannot start (secret unreadable,
address in use).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import resource
import signal
import socket
import sys

import uvloop
from opentelemetry import trace

from llmgw.common.errors import LlmgwError
from llmgw.common.stopping import stop_on_signals
from llmgw.common.telemetry import setup_logging, setup_tracing

from . import affinity, frontconn, frontrules, frontwire, tokens, upstream, upstream_wire
from .config import RouterConfig
from .flags import build_parser, config_from_args
from .server import RouterServer
from .workermetrics import WorkerSpec
from .workers import PortUnavailable, Supervisor

log = logging.getLogger("llmgw.router")

# Linux's default fs.nr_open: the most descriptors one process may have.
NR_OPEN_DEFAULT = 1_048_576


# The modules services/router/setup.py compiles (its COMPILED; a test keeps the two the same).
COMPILED_MODULES = (upstream_wire, frontconn, frontwire, upstream, tokens, affinity, frontrules)


def request_path_build() -> str:
    """How the wire modules run: compiled by Cython (services/router/setup.py), or as pure Python
    (a build without a C compiler, or with ``LLMGW_PURE_PYTHON=1``)."""
    compiled = [module.COMPILED for module in COMPILED_MODULES]
    if all(compiled):
        return "request path compiled"
    if any(compiled):
        return "request path partly compiled"
    return "request path pure Python (slower: see docs/operations.md)"


# The cyclic collector's first-generation threshold while serving (CPython's default is 700).
GC_THRESHOLD = 10_000


def settle_heap() -> int:
    """Keep the cyclic garbage collector off the startup heap and out of the request path; return
    how many objects were set aside.

    Once the router is serving, what it made to start (modules, the app, the
    configuration: some 70,000 objects) is alive for good, yet each full
    collection walked all of it. Under load that was often: a request's
    objects live for milliseconds, so with a hundred in flight they outlast
    young collections and pile into the old generation, and CPython collects
    it whole once that pile passes a quarter of its size. At 128 concurrent
    requests under wrk the collector took about 11% of the router's CPU
    (a full collection every 0.3 s, 20 ms each). ``gc.freeze`` moves the
    startup heap to a generation the collector never visits (after a
    collection, so that no garbage is frozen with it), and a higher
    first-generation threshold keeps the requests in flight from
    triggering young collections at all (docs/benchmarks.md, "The
    collector out of the request path"). Reference counting still frees
    everything as before; only reference cycles wait longer (at most
    ``GC_THRESHOLD`` allocations).
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_THRESHOLD, middle, old)
    return gc.get_freeze_count()


def raise_open_files_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit; return the limit in force.

    Each stream holds two descriptors (the client's and the engine's), and
    many systems start processes with a soft limit of 1,024: about 500
    streams. The hard limit is what the administrator allows (see
    docs/operations.md); raising the soft one to it needs no privilege.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    # "Unlimited" is not a value the kernel takes for this one; Linux's own ceiling (fs.nr_open) is.
    wanted = NR_OPEN_DEFAULT if hard == resource.RLIM_INFINITY else hard
    if soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError) as err:
            log.warning("router cannot raise its open-file limit from %d to %d: %s", soft, wanted, err)
    return soft


async def serve(
    config: RouterConfig, *, tracer: trace.Tracer | None = None, worker: WorkerSpec | None = None
) -> None:
    stop = asyncio.Event()
    stop_on_signals(stop, role="router", grace_seconds=config.shutdown_grace_seconds)
    async with RouterServer(config, tracer=tracer, worker=worker) as server:
        frozen = settle_heap()
        log.info(
            "router listening on %s (%s, pid %d; %s; %d startup objects out of the collector's way)",
            server.url,
            config.router_id,
            os.getpid(),
            request_path_build(),
            frozen,
        )
        await stop.wait()
        log.info("router stopping: no new connections, in-flight requests finishing")
    log.info("router stopped")


def run_worker(config: RouterConfig, worker: WorkerSpec | None = None) -> int:
    """One router process: logging, tracing, serve. ``worker`` marks one of several sharing the port."""
    setup_logging("llmgw.router", config.log_level)
    provider = setup_tracing("router", config.router_id)
    tracer = provider.get_tracer("llmgw.router") if provider is not None else None
    files = raise_open_files_limit()
    log.info("open-file limit %d: about %d concurrent streams", files, files // 2)
    try:
        # uvloop: the event loop's own work is a large part of relaying a
        # request; libuv's loop does it for about half the CPU of asyncio's.
        uvloop.run(serve(config, tracer=tracer, worker=worker))
    except LlmgwError as err:
        log.error("router cannot start: %s", err)
        return 1
    except OSError as err:
        log.error("router cannot listen on %s: %s", config.listen, err)
        return 1
    finally:
        if provider is not None:
            provider.shutdown()
    return 0


def worker_main(config: RouterConfig, worker: WorkerSpec) -> None:
    """Entry of a spawned worker process (see :class:`.workers.Supervisor`)."""
    sys.exit(run_worker(config, worker))


def supervise(config: RouterConfig) -> int:
    setup_logging("llmgw.router", config.log_level)
    supervisor = Supervisor(config, worker_main)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: supervisor.stop())
    try:
        status = supervisor.run()
    except PortUnavailable as err:
        log.error("router cannot start: %s", err.strerror)
        return 1
    log.info("router workers stopped")
    return status


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        config = config_from_args(args)
    except LlmgwError as err:
        print(f"llmgw-router: {err}", file=sys.stderr)
        return 2
    if not config.router_id:
        config = config.model_copy(update={"router_id": f"{socket.gethostname()}-{os.getpid()}"})
    if config.workers > 1:
        return supervise(config)
    return run_worker(config)


if __name__ == "__main__":
    sys.exit(main())
