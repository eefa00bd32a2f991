"""One replica's life, in the one task that owns its engine process.

:class:`ReplicaRunner` is what that task runs: check the request, get the
weights, spawn the engine, probe it until it is ready (or exits, or runs out
of time), watch it while it serves, and stop it when asked. The
:class:`~.supervisor.Supervisor` keeps the set of replicas and answers the
control plane's commands; it reaches a running engine only through this task
(starting it, setting :attr:`Replica.stop_requested`), and touches a process
itself only to SIGKILL what is left of a FAILED replica's group, which no task
watches any more. The split is there because the two have different callers:
commands arrive on the event loop at any moment, while a live engine's process
is only ever touched here, so a probe, an exit and a stop never race each
other.

Every state change goes through the ``report`` callback the supervisor
passes in, which records it and tells the listener; this module never keeps
a state the supervisor has not been told.

Process groups: each engine runs in its own session and process group, and
stopping means the whole group: SIGTERM, ``grace`` seconds, SIGKILL, and
STOPPED only once ``killpg(pgid, 0)`` finds nobody left. A leader that dies
on its own has its leftover group killed too, so a dead engine's workers
free their GPUs.

Files: ``<state_dir>/replicas/<replica_id>/engine.log`` takes the engine's
stdout and stderr (appended, with a header line per start; the key is
masked), ``pid`` holds the engine's pid (= its process group) while it may
be running, so an operator can find engines the agent left, and
``replica.json`` (:mod:`.statefile`) holds what a restarted agent needs to
adopt the engine (see :mod:`.adoption`). The last two are written at spawn
and removed by :meth:`Replica.clear_engine_files` once it is STOPPED or
FAILED.

Ports: see :mod:`.processes` for the free-port race; when an engine exits
before it was ready and its port is now held by someone else, that is the
race, and the replica is started once more on a fresh port.

Serving: a READY engine's ``/health`` is probed every probe interval with
a short timeout. An engine that stops answering (a wedged GPU, a SIGSTOP:
the process lives, its port accepts, nothing answers) is reported STARTING
with the reason, so the control plane withdraws it from every router; if it
answers again it is READY again and nothing was restarted; if it is still
silent after ``hang_grace`` seconds it is killed (SIGKILL to the group: a
stopped process ignores SIGTERM) and reported FAILED, and the control plane
places a replacement.

LoRA adapters: a replica started with ``lora`` has its start adapters'
weights resolved like the base weights, and while it serves, a new wanted
set (:meth:`Replica.want_adapters`, from the supervisor) wakes this task,
which loads and unloads through the engine's API (:mod:`.adapters`) while
still watching for a stop or an exit; the engine is never restarted for
it. What the engine holds is read back from it when it becomes ready
(adopted ones too) and after each change, and reported with the status.

Adopted engines (:meth:`ReplicaRunner.run_adopted`) skip the spawn: they are
READY or STARTING already, and their exit is seen by polling ``/proc``,
since they are not the agent's children.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

import aiohttp

from llmgw.common.errors import InvalidArgument, LlmgwError

from . import statefile
from .adapters import APIS, AdapterClient, AdapterRef, resolve_all, sync
from .engines import EngineLauncher, LaunchPlan, build_key
from .probe import probe_engine
from .processes import (
    AdoptedProcess,
    boot_id,
    describe_exit,
    http_base,
    log_tail,
    pick_port,
    port_held,
    process_start_ticks,
    signal_group,
    terminate_group,
)
from .replicas import ReplicaSpec, ReplicaState
from .weights import WeightsResolver, weights_unless_stopped

log = logging.getLogger("llmgw.agent.lifecycle")

EXIT_POLL_SECONDS = 0.05
PROBE_TIMEOUT_SECONDS = 2.0
# A serving engine's /health must answer within this; a hung one does not (issue 15).
HEALTH_TIMEOUT_SECONDS = 1.0
# How long a serving engine may go unanswered before it is killed and replaced.
DEFAULT_HANG_GRACE_SECONDS = 30.0
# Start timeout for an adopted engine whose kind is no longer configured.
DEFAULT_START_TIMEOUT_SECONDS = 120.0


@dataclass
class Replica:
    """The agent's mutable record of one replica; touched only on the event loop."""

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
    # LoRA adapters the engine holds now, and the set the control plane last asked for.
    adapters: frozenset[str] = frozenset()
    adapters_wanted: tuple[AdapterRef, ...] = ()
    adapters_changed: asyncio.Event = field(default_factory=asyncio.Event)

    def want_adapters(self, adapters: tuple[AdapterRef, ...]) -> None:
        """The control plane's set for this replica; its runner task loads and unloads."""
        self.adapters_wanted = adapters
        self.adapters_changed.set()

    @property
    def log_path(self) -> Path:
        return self.dir / "engine.log"

    @property
    def pid_path(self) -> Path:
        return self.dir / "pid"

    def clear_engine_files(self) -> None:
        """Forget the engine on disk, once it is STOPPED or FAILED."""
        # The pid file names a live engine only; a stale one could name a reused pid.
        self.pid_path.unlink(missing_ok=True)
        statefile.remove(self.dir)


# How the runner tells the supervisor of a state change: (replica, new state, message).
Report = Callable[[Replica, ReplicaState, str], None]


class _Wake(enum.Enum):
    READY = "ready"
    EXITED = "exited"
    STOP = "stop"
    TIMEOUT = "timeout"
    HUNG = "hung"
    ADAPTERS = "adapters"


@dataclass(frozen=True)
class EngineHost:
    """How this node runs engines; the agent builds it from its config, once."""

    launchers: Mapping[str, EngineLauncher]
    bind_host: str
    advertise_host: str
    gpu_count: int
    probe_interval: float
    stop_grace: float
    base_env: Mapping[str, str]
    # Seconds a serving engine may leave its health probe unanswered before it is killed.
    hang_grace: float = DEFAULT_HANG_GRACE_SECONDS
    weights: WeightsResolver | None = None


class ReplicaRunner:
    """Runs one replica's engine from spawn to stop; one :meth:`run` task per replica.

    :meth:`open` before the first run and :meth:`close` after the last one:
    they hold the HTTP client the probes share.
    """

    def __init__(self, host: EngineHost, report: Report):
        self._host = host
        self._probe_host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(
            host.bind_host, host.bind_host
        )
        self._report = report
        self._http: aiohttp.ClientSession | None = None

    async def open(self) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_SECONDS))

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()

    async def run(self, r: Replica) -> None:
        """A replica started here: launch its engine, then serve until it exits or is stopped."""
        await self._guarded(r, self._launch_and_serve(r))

    async def run_adopted(self, r: Replica, started_at: float) -> None:
        """An adopted engine, READY or STARTING already: what is left of its start timeout, then serve."""
        await self._guarded(r, self._serve_adopted(r, started_at))

    async def probe(self, r: Replica) -> bool:
        """Whether the replica's engine is ready now (see :mod:`.probe`); notes why not."""
        assert self._http is not None
        base = http_base(self._probe_host, r.port)
        why = await probe_engine(self._http, base, r.spec.served_name, r.spec.engine_key)
        if why:
            r.last_probe = why
        return not why

    # -- one replica's life ---------------------------------------------------

    async def _guarded(self, r: Replica, live: Awaitable[None]) -> None:
        try:
            await live
        except Exception as err:  # the replica fails, never the agent
            log.exception("supervising replica %s failed", r.spec.replica_id)
            if r.popen is not None:
                signal_group(r.popen.pid, signal.SIGKILL)
            self._set(r, ReplicaState.FAILED, f"the agent failed supervising it: {err!r}")

    async def _launch_and_serve(self, r: Replica) -> None:
        spec = r.spec
        launcher = self._host.launchers.get(build_key(spec.engine, spec.build))
        if launcher is None:
            kinds = ", ".join(sorted(self._host.launchers)) or "none"
            what = f"engine {spec.engine!r}" + (f" build {spec.build!r}" if spec.build else "")
            self._set(r, ReplicaState.FAILED, f"{what} is not configured on this node (it runs: {kinds})")
            return
        outside = [i for i in spec.gpu_indices if not 0 <= i < self._host.gpu_count]
        if outside:
            self._set(
                r,
                ReplicaState.FAILED,
                f"gpu indices {outside} are not on this node, which has {self._host.gpu_count} GPU(s)",
            )
            return

        if not await self._resolve_weights(r):
            return
        if r.weights_arg is not None:
            spec = replace(spec, engine_args={**spec.engine_args, r.weights_arg[0]: r.weights_arg[1]})
        if spec.lora is not None and spec.lora.adapters:
            local = await resolve_all(self._host.weights, spec.lora.adapters, lambda m: self._problem(r, m))
            spec = replace(spec, lora=replace(spec.lora, adapters=tuple(local)))
        for attempt in (1, 2):
            try:
                port = pick_port(self._host.bind_host)
                plan = launcher.plan(spec, self._host.bind_host, port)
                self._spawn(r, plan, port)
            except (InvalidArgument, OSError) as err:
                self._set(r, ReplicaState.FAILED, f"cannot start the engine: {err}")
                return
            self._set(r, ReplicaState.STARTING)
            wake = await self._until_ready(r, launcher.start_timeout_seconds)
            if wake is _Wake.EXITED and attempt == 1 and port_held(self._host.bind_host, port):
                self._note(r, f"port {port} was taken before the engine bound it; new port")
                log.warning("replica %s lost port %d to another process; retrying", spec.replica_id, port)
                continue
            break
        await self._after_start(r, wake, launcher.start_timeout_seconds)

    async def _resolve_weights(self, r: Replica) -> bool:
        """Fetch the replica's weights when the cache must (a hub source); False when it ended."""
        args = r.spec.engine_args
        name = "weights" if "weights" in args else "model" if "model" in args else ""
        if not name or self._host.weights is None:
            return True
        source = args[name]
        try:
            path = await weights_unless_stopped(
                self._host.weights,
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

    async def _serve_adopted(self, r: Replica, started_at: float) -> None:
        if r.state is ReplicaState.READY:
            wake = _Wake.READY
            limit = 0.0
        else:
            launcher = self._host.launchers.get(build_key(r.spec.engine, r.spec.build))
            limit = launcher.start_timeout_seconds if launcher else DEFAULT_START_TIMEOUT_SECONDS
            wake = await self._until_ready(r, max(0.0, limit - (time.time() - started_at)))
        await self._after_start(r, wake, limit)

    async def _after_start(self, r: Replica, wake: _Wake, start_timeout: float) -> None:
        served = wake is _Wake.READY
        if served:
            client = self._adapter_client(r)
            if client is not None:
                told = await client.loaded()
                r.adapters = frozenset(told) if told is not None else r.adapters
            if r.state is not ReplicaState.READY or client is not None:
                self._set(r, ReplicaState.READY)
            wake = await self._serve(r)
        assert r.popen is not None
        if wake is _Wake.HUNG:
            # A stopped process ignores SIGTERM: the whole group is killed outright.
            signal_group(r.popen.pid, signal.SIGKILL)
            await self._terminate(r, 0)
            self._fail(
                r,
                f"stopped answering its health probe for over {self._host.hang_grace:g}s "
                f"(last: {r.last_probe}); killed it",
            )
        elif wake is _Wake.STOP:
            await self._terminate(r, self._host.stop_grace if r.stop_grace is None else r.stop_grace)
            self._set(r, ReplicaState.STOPPED, r.stop_reason)
        elif wake is _Wake.TIMEOUT:
            await self._terminate(r, self._host.stop_grace)
            self._fail(
                r,
                f"did not become ready within {start_timeout:g}s (last probe: {r.last_probe}); stopped it",
            )
        elif served:
            signal_group(r.popen.pid, signal.SIGKILL)
            self._fail(r, f"{_exited(r.popen)} while serving")
        else:
            signal_group(r.popen.pid, signal.SIGKILL)
            self._fail(r, f"{_exited(r.popen)} before it became ready")

    # -- the engine process ---------------------------------------------------

    def _spawn(self, r: Replica, plan: LaunchPlan, port: int) -> None:
        r.dir.mkdir(parents=True, exist_ok=True)
        shown = " ".join(plan.argv)
        env_shown = " ".join(f"{k}={'***' if v == r.spec.engine_key else v}" for k, v in plan.env.items())
        with open(r.log_path, "ab") as out:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
            out.write(f"--- llmgw-agent {stamp}: {env_shown} {shown}\n".encode())
            out.flush()
            r.popen = subprocess.Popen(
                plan.argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self._host.base_env, **plan.env},
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
                url=http_base(self._host.advertise_host, port),
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

    async def _until_ready(self, r: Replica, limit: float) -> _Wake:
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
            probe = asyncio.create_task(self.probe(r), name=f"probe-{r.spec.replica_id}")
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
            wake = await self._wait(r, min(self._host.probe_interval, deadline - loop.time()))
            if wake is not _Wake.TIMEOUT:
                return wake

    async def _serve(self, r: Replica) -> _Wake:
        """While it serves: probe ``/health`` every probe interval, each within
        :data:`HEALTH_TIMEOUT_SECONDS`. Unanswered: reported STARTING (not
        ready, so the control plane withdraws it from every router) until it
        answers again (READY, nothing restarted); still unanswered after
        ``hang_grace`` seconds: HUNG (the caller kills it and it is replaced).
        A new wanted adapter set is loaded in between (see the module docstring).
        """
        loop = asyncio.get_running_loop()
        silent_since: float | None = None
        while True:
            wake = await self._wait(r, self._host.probe_interval, adapters=True)
            if wake is _Wake.ADAPTERS:
                # A fresh client each time: an adopted replica gets its key with a later start.
                await self._sync_adapters(r, self._adapter_client(r))
                continue
            if wake is not _Wake.TIMEOUT:
                return wake
            started = loop.time()
            why = await self._health(r)
            if not why:
                if silent_since is not None:
                    log.warning(
                        "replica %s answers again after %.1fs", r.spec.replica_id, loop.time() - silent_since
                    )
                    self._set(r, ReplicaState.READY)
                    silent_since = None
                continue
            r.last_probe = why
            if silent_since is None:
                silent_since = started
                log.warning("replica %s does not answer its health probe: %s", r.spec.replica_id, why)
                self._set(r, ReplicaState.STARTING, f"not answering its health probe ({why})")
            elif loop.time() - silent_since >= self._host.hang_grace:
                return _Wake.HUNG

    async def _health(self, r: Replica) -> str:
        """ "" when ``GET /health`` answers 200 within the health timeout; else why not."""
        assert self._http is not None
        url = http_base(self._probe_host, r.port) + "/health"
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_SECONDS):
                async with self._http.get(url) as resp:
                    if resp.status != 200:
                        return f"GET /health answered {resp.status}"
        except TimeoutError:
            return f"GET /health unanswered within {HEALTH_TIMEOUT_SECONDS:g}s"
        except aiohttp.ClientError as err:
            return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
        return ""

    async def _wait(self, r: Replica, seconds: float, adapters: bool = False) -> _Wake:
        """Until a stop is asked, the process exits, ``seconds`` pass (TIMEOUT), or
        (with ``adapters``) another adapter set is wanted."""
        assert r.popen is not None
        loop = asyncio.get_running_loop()
        end = loop.time() + seconds
        while True:
            if r.stop_requested.is_set():
                return _Wake.STOP
            if r.popen.poll() is not None:
                return _Wake.EXITED
            if adapters and r.adapters_changed.is_set():
                return _Wake.ADAPTERS
            left = end - loop.time()
            if left <= 0:
                return _Wake.TIMEOUT
            try:
                async with asyncio.timeout(min(left, EXIT_POLL_SECONDS)):
                    await r.stop_requested.wait()
            except TimeoutError:
                pass  # time to look at the process again

    # -- LoRA adapters at runtime ---------------------------------------------

    def _adapter_client(self, r: Replica) -> AdapterClient | None:
        api = APIS.get(r.spec.engine)
        if r.spec.lora is None or api is None:
            return None
        assert self._http is not None
        return AdapterClient(self._http, http_base(self._probe_host, r.port), r.spec.engine_key, api)

    async def _sync_adapters(self, r: Replica, client: AdapterClient | None) -> None:
        """Load and unload toward ``r.adapters_wanted``, watching the process meanwhile."""
        r.adapters_changed.clear()
        if client is None:
            if r.adapters_wanted:
                self._problem(
                    r,
                    f"cannot load adapters {[a.name for a in r.adapters_wanted]}: the engine was "
                    "started without LoRA (declare lora: on the model; replicas started after that have it)",
                )
            return
        job = asyncio.create_task(
            sync(
                client,
                set(r.adapters),
                r.adapters_wanted,
                lambda wanted: resolve_all(self._host.weights, wanted, lambda m: self._problem(r, m)),
                lambda m: self._problem(r, m),
            ),
            name=f"adapters-{r.spec.replica_id}",
        )
        try:
            while not job.done():
                await asyncio.wait({job}, timeout=EXIT_POLL_SECONDS)
                if r.stop_requested.is_set() or r.popen is None or r.popen.poll() is not None:
                    return
        finally:
            if not job.done():
                job.cancel()
                await asyncio.wait({job})
        r.adapters = frozenset(job.result())
        log.info("replica %s: adapters now %s", r.spec.replica_id, sorted(r.adapters))
        self._set(r, r.state, r.message)

    def _problem(self, r: Replica, message: str) -> None:
        log.warning("replica %s: %s", r.spec.replica_id, message)
        self._note(r, message)

    async def _terminate(self, r: Replica, grace: float) -> None:
        assert r.popen is not None
        await terminate_group(r.popen, grace, f"replica {r.spec.replica_id}")

    # -- what the supervisor and the engine log are told --------------------

    def _set(self, r: Replica, state: ReplicaState, message: str = "") -> None:
        self._report(r, state, message)

    def _fail(self, r: Replica, reason: str) -> None:
        self._set(r, ReplicaState.FAILED, f"{reason}\n--- engine log tail ---\n{log_tail(r.log_path)}")
        log.warning("replica %s failed: %s", r.spec.replica_id, reason)

    def _note(self, r: Replica, line: str) -> None:
        with open(r.log_path, "ab") as out:
            out.write(f"--- llmgw-agent: {line}\n".encode())


def _exited(proc: subprocess.Popen[bytes] | AdoptedProcess) -> str:
    if isinstance(proc, AdoptedProcess):
        return "exited (its exit status is unknown: the agent adopted it after a restart)"
    assert proc.returncode is not None
    return describe_exit(proc.returncode)
