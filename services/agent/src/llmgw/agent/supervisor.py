"""Replica lifecycle: engine processes started, probed, reported and stopped.

A replica is one engine process serving one model on some GPUs behind one
key. Its life, as reported to the :class:`StatusListener`::

    STARTING ──probe passes──► READY ──process exits──► FAILED
       │  └─exits / start timeout──────────────────────► FAILED
       └──────── StopReplica (any time) ──► STOPPING ──► STOPPED

What this module guarantees:

- Every state change is told to the listener, in order, from the event loop
  thread; commands that change nothing report the current state, so a
  caller always hears back (the contract's idempotence).
- One task owns each replica's process (spawn, probe, stop), so there is no
  race between a probe, an exit and a stop; :meth:`Supervisor.start` and
  :meth:`Supervisor.stop` only ask it. ``start`` of a replica that is
  starting, ready or stopping is a no-op; ``start`` of a FAILED one starts
  it afresh (the control plane asked again); ``stop`` of an unknown one
  reports STOPPED.
- FAILED replicas stay listed (so every heartbeat repeats the failure until
  the control plane stops them); STOPPED ones are reported once and dropped.
- Each engine runs in its own session and process group, and stopping means
  the whole group: SIGTERM, ``grace`` seconds, SIGKILL, and STOPPED only once
  ``killpg(pgid, 0)`` finds nobody left. A leader that dies on its own has
  its leftover group killed too, so a dead engine's workers free their GPUs.
- Leaving the supervisor (``async with``) ends the supervision tasks but not
  the engines: they serve on while the agent is gone. :meth:`stop_all` is
  the graceful path that stops them.

Files: ``<state_dir>/replicas/<replica_id>/engine.log`` takes the engine's
stdout and stderr (appended, with a header line per start; the key is
masked), ``pid`` holds the engine's pid (= its process group) while it may
be running, so an operator can find engines the agent left, and
``replica.json`` (:mod:`.statefile`) holds what a restarted agent needs to
adopt the engine.

Adoption (:meth:`Supervisor.adopt`, called once before the first Register):
for each replica directory, an engine whose record names a process that is
still the one spawned (pid, start time, boot id) is taken over as the same
replica: READY at once when ``/health`` answers, else STARTING with what is
left of its start timeout. From then on it is supervised like any other
(stopped through its group; its exit, seen by polling ``/proc`` since it is
not our child, makes it FAILED). Every other directory is removed, after
SIGKILL to what is left of a group whose leader is gone. The control plane
decides the rest: a reported replica it has no record of is an orphan and
it sends StopReplica. An adopted replica's spec has no engine key (the
record keeps a fingerprint only), so until a StartReplica brings the key
back, its probes use ``/health`` alone, which vLLM, SGLang, llama.cpp and the
simulator all serve without the key.

Ports: see :mod:`.processes` for the free-port race; when an engine exits
before it was ready and its port is now held by someone else, that is the
race, and the replica is started once more on a fresh port.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import math
import shutil
import signal
import subprocess
import time
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

import aiohttp

from llmgw.common.errors import InvalidArgument, LlmgwError

from . import statefile
from .engines import EngineLauncher, LaunchPlan
from .probe import probe_engine
from .processes import (
    AdoptedProcess,
    boot_id,
    describe_exit,
    group_alive,
    http_base,
    log_tail,
    pick_port,
    port_held,
    process_start_ticks,
    same_process,
    signal_group,
    terminate_group,
)
from .replicas import ReplicaSpec, ReplicaState, ReplicaStatus
from .weights import WeightsResolver, weights_unless_stopped

log = logging.getLogger("llmgw.agent.supervisor")

EXIT_POLL_SECONDS = 0.05
PROBE_TIMEOUT_SECONDS = 2.0
# Start timeout for an adopted engine whose kind is no longer configured.
DEFAULT_START_TIMEOUT_SECONDS = 120.0


class StatusListener(Protocol):
    def replica_changed(self, status: ReplicaStatus) -> None:
        """Called on every state change; must not block."""
        ...


class _Wake(enum.Enum):
    READY = "ready"
    EXITED = "exited"
    STOP = "stop"
    TIMEOUT = "timeout"


@dataclass
class _Replica:
    """The supervisor's mutable record of one replica; touched only on the loop."""

    spec: ReplicaSpec
    dir: Path
    state: ReplicaState = ReplicaState.STARTING
    message: str = ""
    port: int = 0
    popen: subprocess.Popen[bytes] | AdoptedProcess | None = None
    task: asyncio.Task[None] | None = None
    stop_requested: asyncio.Event = field(default_factory=asyncio.Event)
    stop_grace: float | None = None
    stop_reason: str = ""
    last_probe: str = "no probe yet"
    # The weights arg as the engine gets it (a fetched source's local path), by arg name.
    weights_arg: tuple[str, str] | None = None

    @property
    def log_path(self) -> Path:
        return self.dir / "engine.log"

    @property
    def pid_path(self) -> Path:
        return self.dir / "pid"


class Supervisor:
    """Runs the replicas of one node. Use as ``async with Supervisor(...) as s``."""

    def __init__(
        self,
        *,
        launchers: Mapping[str, EngineLauncher],
        state_dir: Path,
        bind_host: str,
        advertise_host: str,
        gpu_count: int,
        probe_interval: float,
        stop_grace: float,
        base_env: Mapping[str, str],
        listener: StatusListener,
        weights: WeightsResolver | None = None,
    ):
        self._launchers = dict(launchers)
        self._replicas_dir = state_dir / "replicas"
        self._bind_host = bind_host
        self._probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(bind_host, bind_host)
        self._advertise_host = advertise_host
        self._gpu_count = gpu_count
        self._probe_interval = probe_interval
        self._stop_grace = stop_grace
        self._base_env = dict(base_env)
        self._listener = listener
        self._weights = weights
        self._replicas: dict[str, _Replica] = {}
        self._http: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Supervisor:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Supervision ends here; the engines do not (see stop_all for that).
        tasks = [r.task for r in self._replicas.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # each one reports its own failures
        if self._http is not None:
            await self._http.close()

    # -- what the connection calls ------------------------------------------

    def snapshot(self) -> list[ReplicaStatus]:
        return [self._status(r) for r in self._replicas.values()]

    def log_path(self, replica_id: str) -> Path | None:
        """The engine log of a replica this node runs or ran since the agent started."""
        if "/" in replica_id or replica_id in ("", ".", ".."):
            return None
        return self._replicas_dir / replica_id / "engine.log"

    def uses_weights(self, source: str) -> bool:
        ended = (ReplicaState.STOPPED, ReplicaState.FAILED)
        return any(
            source in (r.spec.engine_args.get("weights"), r.spec.engine_args.get("model"))
            for r in self._replicas.values()
            if r.state not in ended
        )

    def start(self, spec: ReplicaSpec) -> None:
        current = self._replicas.get(spec.replica_id)
        if current is not None and current.state is not ReplicaState.FAILED:
            if not current.spec.engine_key and spec.engine_key:
                # Adopted: the record kept a fingerprint, the control plane brings the key.
                fingerprint = statefile.read(current.dir)
                if fingerprint is None or fingerprint.key_fingerprint == statefile.key_fingerprint(
                    spec.engine_key
                ):
                    current.spec = replace(current.spec, engine_key=spec.engine_key)
                else:
                    log.warning("replica %s runs with another engine key than the one sent", spec.replica_id)
            if replace(current.spec, engine_key="") != replace(spec, engine_key=""):
                log.warning(
                    "replica %s is already %s with a different spec; keeping it as it runs",
                    spec.replica_id,
                    current.state.value,
                )
            self._listener.replica_changed(self._status(current))
            return
        replica = _Replica(spec, self._replicas_dir / spec.replica_id)
        self._replicas[spec.replica_id] = replica
        replica.task = asyncio.create_task(
            self._supervise(replica, self._live(replica)), name=f"replica-{spec.replica_id}"
        )

    async def adopt(self) -> list[str]:
        """Take over engines a previous agent left running (see the module docstring).

        Call once, before the first Register; returns the adopted replica ids.
        """
        if not self._replicas_dir.is_dir():
            return []
        this_boot = boot_id()
        adopted: list[str] = []
        for d in sorted(p for p in self._replicas_dir.iterdir() if p.is_dir()):
            if d.name in self._replicas:
                continue
            record = statefile.read(d)
            if record is None or record.boot_id != this_boot:
                log.info("replica dir %s: no engine from this boot to adopt; removing it", d)
                shutil.rmtree(d, ignore_errors=True)
                continue
            if not same_process(record.pid, record.start_ticks):
                if process_start_ticks(record.pid) is None and group_alive(record.pid):
                    # The leader is gone and nobody took its pid; the group's
                    # leftovers (an engine's workers) still hold its GPUs.
                    signal_group(record.pid, signal.SIGKILL)
                log.info("replica %s: engine pid %d is gone; removing its dir", record.replica_id, record.pid)
                shutil.rmtree(d, ignore_errors=True)
                continue
            r = _Replica(record.spec(), d, port=record.port)
            r.popen = AdoptedProcess(record.pid, record.start_ticks)
            r.state = ReplicaState.READY if await self._probe(r) else ReplicaState.STARTING
            self._replicas[r.spec.replica_id] = r
            r.task = asyncio.create_task(
                self._supervise(r, self._live_adopted(r, record.started_at)),
                name=f"replica-{r.spec.replica_id}",
            )
            adopted.append(r.spec.replica_id)
            log.info(
                "replica %s: adopted %s pid %d on port %d (%s)",
                r.spec.replica_id,
                r.spec.engine,
                record.pid,
                record.port,
                r.state.value,
            )
        return adopted

    def stop(self, replica_id: str, grace: float | None = None, reason: str = "") -> None:
        replica = self._replicas.get(replica_id)
        if replica is None:
            self._listener.replica_changed(
                ReplicaStatus(replica_id, "", ReplicaState.STOPPED, message="not on this node")
            )
            return
        if replica.task is not None and not replica.task.done():
            if not replica.stop_requested.is_set():
                replica.stop_grace, replica.stop_reason = grace, reason
                replica.stop_requested.set()
                self._set(replica, ReplicaState.STOPPING, reason)
            else:
                self._listener.replica_changed(self._status(replica))
            return
        # FAILED: nothing supervises it; clear what may be left of its group.
        if replica.popen is not None:
            signal_group(replica.popen.pid, signal.SIGKILL)
        self._set(replica, ReplicaState.STOPPED, reason)

    async def stop_all(self, reason: str = "agent shutting down") -> None:
        """Stop every replica and wait until each is STOPPED."""
        for replica_id in list(self._replicas):
            self.stop(replica_id, None, reason)
        tasks = [r.task for r in self._replicas.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks)

    # -- one replica's life, in its own task --------------------------------

    async def _supervise(self, r: _Replica, live: Coroutine[None, None, None]) -> None:
        try:
            await live
        except Exception as err:  # the replica fails, never the agent
            log.exception("supervising replica %s failed", r.spec.replica_id)
            if r.popen is not None:
                signal_group(r.popen.pid, signal.SIGKILL)
            self._set(r, ReplicaState.FAILED, f"the agent failed supervising it: {err!r}")
        finally:
            live.close()  # no-op once it ran; avoids a never-awaited warning when cancelled first

    async def _live(self, r: _Replica) -> None:
        spec = r.spec
        launcher = self._launchers.get(spec.engine)
        if launcher is None:
            kinds = ", ".join(sorted(self._launchers)) or "none"
            self._set(
                r,
                ReplicaState.FAILED,
                f"engine {spec.engine!r} is not configured on this node (it runs: {kinds})",
            )
            return
        outside = [i for i in spec.gpu_indices if not 0 <= i < self._gpu_count]
        if outside:
            self._set(
                r,
                ReplicaState.FAILED,
                f"gpu indices {outside} are not on this node, which has {self._gpu_count} GPU(s)",
            )
            return

        if not await self._resolve_weights(r):
            return
        if r.weights_arg is not None:
            spec = replace(spec, engine_args={**spec.engine_args, r.weights_arg[0]: r.weights_arg[1]})
        for attempt in (1, 2):
            try:
                port = pick_port(self._bind_host)
                plan = launcher.plan(spec, self._bind_host, port)
                self._spawn(r, plan, port)
            except (InvalidArgument, OSError) as err:
                self._set(r, ReplicaState.FAILED, f"cannot start the engine: {err}")
                return
            self._set(r, ReplicaState.STARTING)
            wake = await self._until_ready(r, launcher.start_timeout_seconds)
            if wake is _Wake.EXITED and attempt == 1 and port_held(self._bind_host, port):
                self._note(r, f"port {port} was taken before the engine bound it; new port")
                log.warning("replica %s lost port %d to another process; retrying", spec.replica_id, port)
                continue
            break
        await self._after_start(r, wake, launcher.start_timeout_seconds)

    async def _resolve_weights(self, r: _Replica) -> bool:
        """Fetch the replica's weights when the cache must (a hub source); False when it ended."""
        args = r.spec.engine_args
        name = "weights" if "weights" in args else "model" if "model" in args else ""
        if not name or self._weights is None:
            return True
        source = args[name]
        try:
            path = await weights_unless_stopped(
                self._weights,
                source,
                r.stop_requested,
                lambda: self._set(r, ReplicaState.STARTING, f"waiting for weights {source}"),
            )
        except LlmgwError as err:
            self._set(r, ReplicaState.FAILED, f"cannot get the engine its weights: {err}")
            return False
        if path is None:
            self._set(r, ReplicaState.STOPPED, r.stop_reason)
            return False
        r.weights_arg = (name, path)
        return True

    async def _live_adopted(self, r: _Replica, started_at: float) -> None:
        if r.state is ReplicaState.READY:
            wake = _Wake.READY
            limit = 0.0
        else:
            launcher = self._launchers.get(r.spec.engine)
            limit = launcher.start_timeout_seconds if launcher else DEFAULT_START_TIMEOUT_SECONDS
            wake = await self._until_ready(r, max(0.0, limit - (time.time() - started_at)))
        await self._after_start(r, wake, limit)

    async def _after_start(self, r: _Replica, wake: _Wake, start_timeout: float) -> None:
        if wake is _Wake.READY:
            if r.state is not ReplicaState.READY:
                self._set(r, ReplicaState.READY)
            wake = await self._wait(r, math.inf)
        assert r.popen is not None
        if wake is _Wake.STOP:
            await self._terminate(r, self._stop_grace if r.stop_grace is None else r.stop_grace)
            self._set(r, ReplicaState.STOPPED, r.stop_reason)
        elif wake is _Wake.TIMEOUT:
            await self._terminate(r, self._stop_grace)
            self._fail(
                r,
                f"did not become ready within {start_timeout:g}s (last probe: {r.last_probe}); stopped it",
            )
        elif r.state is ReplicaState.READY:
            signal_group(r.popen.pid, signal.SIGKILL)
            self._fail(r, f"{_exited(r.popen)} while serving")
        else:
            signal_group(r.popen.pid, signal.SIGKILL)
            self._fail(r, f"{_exited(r.popen)} before it became ready")

    def _spawn(self, r: _Replica, plan: LaunchPlan, port: int) -> None:
        r.dir.mkdir(parents=True, exist_ok=True)
        shown = " ".join("***" if a == r.spec.engine_key else a for a in plan.argv)
        env_shown = " ".join(f"{k}={v}" for k, v in plan.env.items())
        with open(r.log_path, "ab") as out:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            out.write(f"--- llmgw-agent {stamp}: {env_shown} {shown}\n".encode())
            out.flush()
            r.popen = subprocess.Popen(
                plan.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self._base_env, **plan.env},
                cwd=r.dir,
                start_new_session=True,  # its own process group: stop means all of it
            )
        r.pid_path.write_text(f"{r.popen.pid}\n")
        r.port = port
        statefile.write(
            r.dir,
            statefile.EngineRecord.of(
                r.spec,
                pid=r.popen.pid,
                start_ticks=process_start_ticks(r.popen.pid) or 0,
                boot_id=boot_id(),
                port=port,
                url=http_base(self._advertise_host, port),
                at=time.time(),
            ),
        )
        r.last_probe = "no probe yet"
        log.info(
            "replica %s: started %s pid %d on port %d",
            r.spec.replica_id,
            r.spec.engine,
            r.popen.pid,
            port,
        )

    async def _until_ready(self, r: _Replica, limit: float) -> _Wake:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        while True:
            wake = await self._wait(r, 0)
            if wake is not _Wake.TIMEOUT:
                return wake
            if loop.time() >= deadline:
                return _Wake.TIMEOUT
            # A probe can hang (a port that accepts and never answers): watch
            # the process while it runs, so an exit is seen at once.
            probe = asyncio.create_task(self._probe(r), name=f"probe-{r.spec.replica_id}")
            try:
                while not probe.done():
                    await asyncio.wait({probe}, timeout=EXIT_POLL_SECONDS)
                    wake = await self._wait(r, 0)
                    if wake is not _Wake.TIMEOUT:
                        return wake
            finally:
                probe.cancel()
                await asyncio.wait({probe})
            if probe.result():
                return _Wake.READY
            wake = await self._wait(r, min(self._probe_interval, deadline - loop.time()))
            if wake is not _Wake.TIMEOUT:
                return wake

    async def _wait(self, r: _Replica, seconds: float) -> _Wake:
        """Until a stop is asked, the process exits, or ``seconds`` pass (TIMEOUT)."""
        assert r.popen is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while True:
            if r.stop_requested.is_set():
                return _Wake.STOP
            if r.popen.poll() is not None:
                return _Wake.EXITED
            left = end - loop.time()
            if left <= 0:
                return _Wake.TIMEOUT
            try:
                async with asyncio.timeout(min(left, EXIT_POLL_SECONDS)):
                    await r.stop_requested.wait()
            except TimeoutError:
                pass  # time to look at the process again

    async def _probe(self, r: _Replica) -> bool:
        assert self._http is not None
        base = http_base(self._probe_host, r.port)
        why = await probe_engine(self._http, base, r.spec.served_name, r.spec.engine_key)
        if why:
            r.last_probe = why
        return not why

    async def _terminate(self, r: _Replica, grace: float) -> None:
        assert r.popen is not None
        await terminate_group(r.popen, grace, f"replica {r.spec.replica_id}")

    # -- state, told to the listener ----------------------------------------

    def _fail(self, r: _Replica, reason: str) -> None:
        self._set(r, ReplicaState.FAILED, f"{reason}\n--- engine log tail ---\n{log_tail(r.log_path)}")
        log.warning("replica %s failed: %s", r.spec.replica_id, reason)

    def _note(self, r: _Replica, line: str) -> None:
        with open(r.log_path, "ab") as out:
            out.write(f"--- llmgw-agent: {line}\n".encode())

    def _set(self, r: _Replica, state: ReplicaState, message: str = "") -> None:
        r.state, r.message = state, message
        if state in (ReplicaState.STOPPED, ReplicaState.FAILED):
            # The pid file names a live engine only; a stale one could name a reused pid.
            r.pid_path.unlink(missing_ok=True)
            statefile.remove(r.dir)
        if state is ReplicaState.STOPPED and self._replicas.get(r.spec.replica_id) is r:
            del self._replicas[r.spec.replica_id]
        self._listener.replica_changed(self._status(r))

    def _status(self, r: _Replica) -> ReplicaStatus:
        spec = r.spec
        return ReplicaStatus(
            replica_id=spec.replica_id,
            model=spec.model,
            state=r.state,
            url=http_base(self._advertise_host, r.port) if r.port else "",
            message=r.message,
            pid=r.popen.pid if r.popen is not None else 0,
            gpu_indices=spec.gpu_indices,
            served_name=spec.served_name,
            engine=spec.engine,
        )


def _exited(proc: subprocess.Popen[bytes] | AdoptedProcess) -> str:
    if isinstance(proc, AdoptedProcess):
        return "exited (its exit status is unknown: the agent adopted it after a restart)"
    assert proc.returncode is not None
    return describe_exit(proc.returncode)
