"""Applying a pass's actions: records written, commands sent, failures noted.

``plan`` (reconcile) decides and performs no I/O; the controller decides
*when* a pass runs and puts the endpoint-table sync before any action. This
module is the part that then touches the world: each action becomes
replica-record writes (replicas), StartReplica, StopReplica and SetAdapters
commands to a node's agent, or a change to the per-model failure backoff that the next
``plan`` reads. It is apart from the controller so that the loop and the
term handling read as one thing and the rules for talking to agents sit in
one place.

Guarantees:

- A record is written before its start command is sent (see replicas), and
  a new replica is placed only on a node whose agent is connected:
  otherwise nothing is written and the next pass decides again.
- Commands are idempotent on the agent; re-sends of the same command for
  the same replica are spaced by ``command_resend_seconds``. A command
  counts as sent only once the node's session took it, so one that could
  not be queued goes out again on the next pass.
- One failing action is logged and does not keep the others from being
  applied; losing leadership (NotLeader) ends the batch at once.
- Failure backoff is :mod:`llmgw.common.backoff`'s ceiling, without the
  jitter: ``failure_backoff_seconds`` after the first failure, doubling with
  each failure in a row up to ``failure_backoff_max_seconds``, until ``plan``
  finds the model fully ready again (ClearBackoff). No jitter on purpose: it
  is one decision per model, shown to operators ("retrying in 20s"), not a
  crowd of clients to spread, and a crash loop must surely slow down.

Soft state only (the backoff, when each command was last sent): the
controller calls :meth:`Applier.clear` when its term ends. Single event
loop; the controller is the only caller.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.keys import engine_key
from llmgw.v1 import agent_pb2

from ..decide.reconcile import (
    Action,
    Backoff,
    CannotPlace,
    ClearBackoff,
    EnsureRunning,
    EvictReplica,
    ForgetReplica,
    NoteFailure,
    StartReplica,
    StopReplica,
)
from ..metrics import ControlMetrics
from ..spec.model import Adapter, Lora
from ..store.replicas import ReplicaBook, ReplicaRecord, new_replica_id
from .leadership import NotLeader

# The controller's logger: these lines were the controller's before the split, and
# operators filter on it.
log = logging.getLogger("llmgw.control.leader.controller")


class CommandSink(Protocol):
    """Where commands for a node's agent go (agents.AgentSessions)."""

    def connected(self, node_id: str) -> bool: ...
    def send(self, node_id: str, message: agent_pb2.ControlMessage) -> bool: ...


@dataclass(frozen=True)
class ApplySettings:
    """The controller's timings that applying actions needs (see controller.ControllerSettings)."""

    failure_backoff_seconds: float = 5.0
    failure_backoff_max_seconds: float = 300.0
    command_resend_seconds: float = 10.0


class Applier:
    def __init__(
        self,
        book: ReplicaBook,
        sessions: CommandSink,
        secret: bytes,
        metrics: ControlMetrics,
        settings: ApplySettings,
        wall: Callable[[], float],
    ):
        self._book = book
        self._sessions = sessions
        self._secret = secret
        self._metrics = metrics
        # Replaced by the controller when the cluster settings change; read at each use.
        self.settings = settings
        self._wall = wall
        self._backoff: dict[str, Backoff] = {}
        self._sent: dict[tuple[str, str], float] = {}

    @property
    def backoffs(self) -> Mapping[str, Backoff]:
        """Models whose replicas failed, with the last error, until they are fully ready again."""
        return self._backoff

    def clear(self) -> None:
        """The term ended: a later one starts with no backoff and no command held back."""
        self._backoff.clear()
        self._sent.clear()

    async def apply(self, actions: Iterable[Action], now: float) -> bool:
        """Apply every action in order; False when any failed (each failure is logged)."""
        failed = False
        for action in actions:
            try:
                await self._apply(action, now)
            except NotLeader:
                raise
            except Exception:
                log.exception("applying %s failed", action)
                failed = True
        # Only sends within the spacing can still hold a re-send back.
        resend = self.settings.command_resend_seconds
        self._sent = {k: t for k, t in self._sent.items() if now - t < resend}
        return not failed

    async def _apply(self, action: Action, now: float) -> None:
        match action:
            case StartReplica():
                if not self._sessions.connected(action.node):
                    return
                rid = new_replica_id(action.model, self._book.records)
                rec = ReplicaRecord(
                    rid,
                    action.model,
                    action.node,
                    action.gpu_indices,
                    action.engine,
                    action.served_name,
                    self._wall(),
                    action.profile,
                    action.memory_bytes,
                    action.cpu_cores,
                    action.version,
                )
                await self._book.add(rec)
                log.info("placing %s on %s GPUs %s", rid, rec.node, list(rec.gpu_indices))
                self._send_start(rec, action.args, action.lora, now)
            case EnsureRunning():
                if not self._recently("start", action.record.id, now):
                    log.info("re-sending the start of %s to %s", action.record.id, action.record.node)
                    self._send_start(action.record, action.args, action.lora, now)
            case StopReplica():
                self._stop(action.replica_id, action.node, action.reason, now)
                if action.forget:
                    await self._book.remove(action.replica_id)
            case EvictReplica():
                log.warning("evicting %s on %s: %s", action.replica_id, action.node, action.reason)
                self._metrics.evictions.inc()
                self._stop(action.replica_id, action.node, action.reason, now)
                await self._book.remove(action.replica_id)
            case ForgetReplica():
                log.info("forgetting %s: %s", action.replica_id, action.reason)
                await self._book.remove(action.replica_id)
            case NoteFailure():
                b = self._backoff.get(action.model)
                n = b.failures + 1 if b else 1
                s = self.settings
                policy = BackoffPolicy(
                    s.failure_backoff_seconds, max(s.failure_backoff_max_seconds, s.failure_backoff_seconds)
                )
                delay = policy.ceiling(n)
                self._backoff[action.model] = Backoff(
                    n, now + delay, action.message, action.replica_id, action.node, action.profile
                )
                log.warning(
                    "replica %s of %s failed (%d in a row); replacing in %.0fs: %s",
                    action.replica_id,
                    action.model,
                    n,
                    delay,
                    action.message,
                )
            case ClearBackoff():
                self._backoff.pop(action.model, None)
            case CannotPlace():
                pass

    def set_adapters(self, rec: ReplicaRecord, adapters: Sequence[Adapter], now: float) -> None:
        """Send ``rec``'s agent the adapters it should hold (see decide.adapters).

        Spaced like the other re-sends, per replica and wanted set: a new
        set goes out at once, the same one again only after
        ``command_resend_seconds`` (a load may take that long: a fetch).
        """
        names = ",".join(sorted(a.name for a in adapters))
        if self._recently(f"adapters:{names}", rec.id, now):
            return
        log.info("adapters of %s on %s: [%s]", rec.id, rec.node, names)
        msg = agent_pb2.ControlMessage(
            set_adapters=agent_pb2.SetAdapters(
                replica_id=rec.id,
                adapters=[agent_pb2.Adapter(name=a.name, source=a.source) for a in adapters],
            )
        )
        if self._sessions.send(rec.node, msg):
            self._sent[(f"adapters:{names}", rec.id)] = now
            self._metrics.commands.labels("set_adapters").inc()

    def _stop(self, replica_id: str, node: str, reason: str, now: float) -> None:
        if not self._recently("stop", replica_id, now):
            log.info("stopping %s on %s: %s", replica_id, node, reason)
            msg = agent_pb2.ControlMessage(stop=agent_pb2.StopReplica(replica_id=replica_id, reason=reason))
            if self._sessions.send(node, msg):
                self._sent[("stop", replica_id)] = now
                self._metrics.commands.labels("stop").inc()

    def _recently(self, kind: str, replica_id: str, now: float) -> bool:
        sent = self._sent.get((kind, replica_id))
        return sent is not None and now - sent < self.settings.command_resend_seconds

    def _send_start(self, rec: ReplicaRecord, args: Mapping[str, str], lora: Lora | None, now: float) -> None:
        msg = agent_pb2.ControlMessage(
            start=agent_pb2.StartReplica(
                replica_id=rec.id,
                model=rec.model,
                engine=rec.engine,
                served_name=rec.served_name,
                gpu_indices=list(rec.gpu_indices),
                engine_key=engine_key(self._secret, rec.id),
                engine_args=dict(args),
                # Adapters are loaded at runtime, once it is ready (see set_adapters).
                lora=agent_pb2.LoraSettings(max_loras=lora.max_loras, max_lora_rank=lora.max_rank)
                if lora is not None
                else None,
            )
        )
        if self._sessions.send(rec.node, msg):
            self._sent[("start", rec.id)] = now
            self._metrics.commands.labels("start").inc()
