"""The replicas of one node: the commands that start and stop them, and their status.

A replica is one engine process serving one model on some GPUs behind one
key. Its life, as reported to the :class:`StatusListener`::

    STARTING ──probe passes──► READY ──process exits──► FAILED
       │  └─exits / start timeout──────────────────────► FAILED
       └──────── StopReplica (any time) ──► STOPPING ──► STOPPED

The work is split three ways. :class:`Supervisor` (here) owns the set of
replicas: it answers the control plane's commands, records every state and
tells the listener. One task per replica, running :class:`.ReplicaRunner`
(:mod:`.lifecycle`), owns that replica's engine process: spawn, probes,
process-group stop, and the files on disk. :mod:`.adoption` decides, after
an agent restart, which engines left on disk are still running.

What this module guarantees:

- Every state change is told to the listener, in order, from the event loop
  thread; commands that change nothing report the current state, so a
  caller always hears back (the contract's idempotence).
- One task owns each replica's process, so there is no race between a
  probe, an exit and a stop; :meth:`Supervisor.start` and
  :meth:`Supervisor.stop` only ask it. ``start`` of a replica that is
  starting, ready or stopping is a no-op; ``start`` of a FAILED one starts
  it afresh (the control plane asked again); ``stop`` of an unknown one
  reports STOPPED.
- FAILED replicas stay listed (so every heartbeat repeats the failure until
  the control plane stops them); STOPPED ones are reported once and dropped.
- Leaving the supervisor (``async with``) ends the supervision tasks but not
  the engines: they serve on while the agent is gone. :meth:`stop_all` is
  the graceful path that stops them, each through its whole process group.
- :meth:`Supervisor.adopt`, called once before the first Register, takes
  over the engines a previous agent left running (see :mod:`.adoption`), so
  the first Register reports them.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import replace
from pathlib import Path
from typing import Protocol

from . import statefile
from .adapters import AdapterRef
from .adoption import engines_to_adopt
from .lifecycle import EngineHost, Replica, ReplicaRunner
from .processes import AdoptedProcess, http_base, signal_group
from .replicas import ReplicaSpec, ReplicaState, ReplicaStatus

log = logging.getLogger("llmgw.agent.supervisor")


class StatusListener(Protocol):
    def replica_changed(self, status: ReplicaStatus) -> None:
        """Called on every state change; must not block."""
        ...


class Supervisor:
    """Runs the replicas of one node. Use as ``async with Supervisor(...) as s``."""

    def __init__(self, *, host: EngineHost, state_dir: Path, listener: StatusListener):
        self._replicas_dir = state_dir / "replicas"
        self._advertise_host = host.advertise_host
        self._listener = listener
        self._replicas: dict[str, Replica] = {}
        self._runner = ReplicaRunner(host, report=self._set)

    async def __aenter__(self) -> Supervisor:
        await self._runner.open()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        # Supervision ends here; the engines do not (see stop_all for that).
        tasks = [r.task for r in self._replicas.values() if r.task is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # each one reports its own failures
        await self._runner.close()

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
            # A LoRA adapter's weights count too: the engine reads them at each load.
            or any(a.source == source for a in r.adapters_wanted)
            or (r.spec.lora is not None and any(a.source == source for a in r.spec.lora.adapters))
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
        replica = Replica(spec, self._replicas_dir / spec.replica_id)
        self._replicas[spec.replica_id] = replica
        replica.task = asyncio.create_task(self._runner.run(replica), name=f"replica-{spec.replica_id}")

    async def adopt(self) -> list[str]:
        """Take over engines a previous agent left running (see :mod:`.adoption`).

        Call once, before the first Register; returns the adopted replica ids.
        Each is READY at once when its probe passes, else STARTING with what
        is left of its start timeout.
        """
        adopted: list[str] = []
        for record in engines_to_adopt(self._replicas_dir, self._replicas):
            r = Replica(record.spec(), self._replicas_dir / record.replica_id, port=record.port)
            r.popen = AdoptedProcess(record.pid, record.start_ticks)
            r.state = ReplicaState.READY if await self._runner.probe(r) else ReplicaState.STARTING
            self._replicas[r.spec.replica_id] = r
            r.task = asyncio.create_task(
                self._runner.run_adopted(r, record.started_at),
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

    def set_adapters(self, replica_id: str, adapters: tuple[AdapterRef, ...]) -> None:
        """The adapters a replica should hold; its runner loads them once it serves."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            log.warning("adapters for replica %s, which is not on this node; ignored", replica_id)
            return
        replica.want_adapters(adapters)

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

    # -- state, told to the listener ----------------------------------------

    def _set(self, r: Replica, state: ReplicaState, message: str = "") -> None:
        """Every state change, from the commands here and from each replica's runner."""
        r.state, r.message = state, message
        if state in (ReplicaState.STOPPED, ReplicaState.FAILED):
            r.clear_engine_files()
        if state is ReplicaState.STOPPED and self._replicas.get(r.spec.replica_id) is r:
            del self._replicas[r.spec.replica_id]
        self._listener.replica_changed(self._status(r))

    def _status(self, r: Replica) -> ReplicaStatus:
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
            adapters=tuple(sorted(r.adapters)),
        )
