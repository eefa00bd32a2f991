"""Several router processes on one port: SO_REUSEPORT workers under a small supervisor.

One Python process uses one core; a router host has several. With
``workers: N`` (N > 1) the process started as ``llmgw-router`` becomes a
supervisor that serves nothing itself: it starts N worker processes, each a
whole router (its own event loop, upstream pool, watch of the control plane,
table, breakers and metrics) listening on the same address with
SO_REUSEPORT, so the kernel spreads new connections across them.

Decisions:

- **Each worker has its own watch**, not a table shared through the
  supervisor: a worker is then exactly a single-process router (same code,
  same tests), the supervisor holds no state worth losing, and N watches
  are N cheap streams for a control plane that already serves many routers.
  The cost: N breakers learn about a dead replica independently, so up to N
  times ``breaker_failures`` requests meet it before every worker skips it;
  each of those is retried before its first byte, so no client sees it.
- **A worker that cannot start stops the router**: a worker that exits 1
  or 2 (configuration, secret, address) makes the supervisor stop the
  others and exit 1, since every replacement would fail the same way.
- **A worker that dies otherwise is replaced**, after a delay that doubles while
  replacements keep dying young (from ``RESTART_MIN_SECONDS`` to
  ``RESTART_MAX_SECONDS``). The kernel stops handing connections to a
  closed socket at once, so the other workers serve alone meanwhile;
  connections already queued on the dead worker's socket are reset (a
  client retries them as a connection error).
- **Spawned, not forked**: a fork of a process that has imported gRPC and
  an event loop inherits their threads' locks; a fresh interpreter per
  worker costs half a second of start-up, once.
- **Stopping**: SIGTERM or SIGINT to the supervisor is passed to every
  worker, which stops as a single router does (stop accepting, let
  in-flight requests finish for ``shutdown_grace_seconds``); a worker still
  alive after that grace plus ``STOP_MARGIN_SECONDS`` is killed.
- **The port is checked before any worker starts**: a port held by a
  socket without SO_REUSEPORT would make every worker fail to bind and be
  restarted for ever; the supervisor tries the bind itself first and exits 1
  with the reason.
- **Metrics of every worker from any worker**: each worker also listens on
  a unix socket in a directory private to the supervisor, and the worker a
  scrape reaches gathers its siblings' series, labelled ``worker``
  (:mod:`.workermetrics`). A worker is ``<router_id>-w<n>`` in logs and in
  the control plane's view.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.process
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from llmgw.common.config import split_host_port

from .config import RouterConfig
from .workermetrics import WorkerSpec

log = logging.getLogger("llmgw.router.workers")

RESTART_MIN_SECONDS = 0.5
RESTART_MAX_SECONDS = 30.0
# A worker that lived this long was healthy: its replacement starts without delay growth.
HEALTHY_AFTER_SECONDS = 30.0
STOP_MARGIN_SECONDS = 5.0
POLL_SECONDS = 0.2
# A worker's exit statuses for "cannot start" (see main): a replacement would fail the same way.
CANNOT_START = (1, 2)

WorkerMain = Callable[[RouterConfig, WorkerSpec], None]


class PortUnavailable(OSError):
    pass


def check_port(listen: str) -> None:
    """Bind ``listen`` with SO_REUSEPORT and let go; raise PortUnavailable saying why not."""
    host, port = split_host_port(listen)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise PortUnavailable(err.errno, f"cannot listen on {listen}: {err.strerror}") from None


@dataclass
class _Slot:
    index: int
    process: multiprocessing.process.BaseProcess | None = None
    started_at: float = 0.0
    delay: float = RESTART_MIN_SECONDS
    restart_at: float = 0.0


class Supervisor:
    """Keeps ``config.workers`` worker processes running until told to stop.

    ``worker_main(config, spec)`` runs in each spawned process; it must be
    importable (a module-level function), as spawn pickles it by name.
    """

    def __init__(self, config: RouterConfig, worker_main: WorkerMain) -> None:
        self._config = config
        self._worker_main = worker_main
        self._context = multiprocessing.get_context("spawn")
        self._slots = [_Slot(i) for i in range(config.workers)]
        self._stop = threading.Event()
        self._socket_dir = ""

    def stop(self) -> None:
        """Ask ``run`` to stop the workers and return (safe from a signal handler)."""
        self._stop.set()

    def run(self) -> int:
        """Run the workers until :meth:`stop`; the exit status for the supervisor's process.

        1 when a worker could not start (it exited 1 or 2: the configuration,
        the secret, the address): every replacement would fail the same way.
        """
        check_port(self._config.listen)
        # Private to this user: the workers' unix sockets serve the whole API.
        self._socket_dir = tempfile.mkdtemp(prefix="llmgw-router-")
        log.info("starting %d router workers on %s", len(self._slots), self._config.listen)
        try:
            for slot in self._slots:
                self._start(slot)
            while not self._stop.wait(POLL_SECONDS):
                if not self._tend(time.monotonic()):
                    return 1
            return 0
        finally:
            self._stop_all()
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    def pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.pid is not None]

    def _start(self, slot: _Slot) -> None:
        name = f"{self._config.router_id}-w{slot.index}" if self._config.router_id else f"w{slot.index}"
        worker_config = self._config.model_copy(update={"router_id": name, "workers": 1})
        spec = WorkerSpec(slot.index, len(self._slots), self._socket_dir)
        with contextlib.suppress(FileNotFoundError):
            # A dead worker's socket file stays behind; its replacement binds a fresh one.
            os.unlink(spec.socket(slot.index))
        process = self._context.Process(
            target=self._worker_main, args=(worker_config, spec), name=name, daemon=False
        )
        process.start()
        slot.process, slot.started_at = process, time.monotonic()
        log.info("router worker %d started (pid %s)", slot.index, process.pid)

    def _tend(self, now: float) -> bool:
        """Replace dead workers; False when one could not start at all."""
        for slot in self._slots:
            process = slot.process
            if process is not None and process.is_alive():
                continue
            if process is not None and process.exitcode in CANNOT_START:
                log.error(
                    "router worker %d could not start (exit %s; its reason is logged above); "
                    "stopping the others",
                    slot.index,
                    process.exitcode,
                )
                return False
            if process is not None:
                lived = now - slot.started_at
                slot.delay = (
                    RESTART_MIN_SECONDS
                    if lived >= HEALTHY_AFTER_SECONDS
                    else min(RESTART_MAX_SECONDS, slot.delay * 2)
                )
                slot.restart_at = now + slot.delay
                log.warning(
                    "router worker %d (pid %s) exited with %s after %.1fs; restarting in %.1fs",
                    slot.index,
                    process.pid,
                    process.exitcode,
                    lived,
                    slot.delay,
                )
                process.close()
                slot.process = None
            if now >= slot.restart_at:
                self._start(slot)
        return True

    def _stop_all(self) -> None:
        running = [s.process for s in self._slots if s.process is not None and s.process.is_alive()]
        log.info("stopping %d router workers", len(running))
        for process in running:
            if process.pid is not None:
                # It may have exited between the check and the signal.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + self._config.shutdown_grace_seconds + STOP_MARGIN_SECONDS
        for process in running:
            process.join(max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                log.warning("router worker pid %s did not stop in time; killing it", process.pid)
                process.kill()
                process.join(5)
