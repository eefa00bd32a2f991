"""What a reconcile pass decides: the actions :func:`.reconcile.plan` returns.

Plain frozen values, one class per kind of change; the leader's applier
carries them out (leader.applier) and the controller reads ``CannotPlace``
for messages and metrics. Kept apart from the decision so the decision's
module holds its rules and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..spec.model import Lora
from ..store.replicas import ReplicaRecord


@dataclass(frozen=True)
class StartReplica:
    """Place a new replica of ``model`` on ``node`` using ``gpu_indices``."""

    model: str
    node: str
    gpu_indices: tuple[int, ...]
    engine: str
    served_name: str
    args: Mapping[str, str]
    # Which profile, and what it claims of the node besides GPUs.
    profile: int = 0
    memory_bytes: int = 0
    cpu_cores: float = 0.0
    # The model's LoRA limits: its engine starts with LoRA enabled (None: without).
    lora: Lora | None = None
    # The model's version (ModelSpec.version), kept in the record.
    version: str = ""


@dataclass(frozen=True)
class EnsureRunning:
    """Re-send the start of a recorded replica its (ready) node does not report."""

    record: ReplicaRecord
    args: Mapping[str, str]
    lora: Lora | None = None


@dataclass(frozen=True)
class StopReplica:
    replica_id: str
    node: str
    reason: str
    # Also delete its record (it is not wanted any more).
    forget: bool


@dataclass(frozen=True)
class ForgetReplica:
    """Delete the record only: the node cannot be told (unreachable)."""

    replica_id: str
    reason: str


@dataclass(frozen=True)
class EvictReplica:
    """Stop and forget an opportunistic replica to make room for a critical model."""

    replica_id: str
    node: str
    model: str
    reason: str


@dataclass(frozen=True)
class NoteFailure:
    model: str
    replica_id: str
    message: str
    node: str = ""
    profile: int = -1


@dataclass(frozen=True)
class ClearBackoff:
    model: str


@dataclass(frozen=True)
class CannotPlace:
    model: str
    message: str
    # Every node's reason, "node: why" (the message may show only the first few).
    reasons: tuple[str, ...] = ()
    # One of UNPLACED_KINDS: the metrics' reason label.
    kind: str = "no_fit"


# Why replicas wait unplaced, in few words (a metric label): no node fits; a
# quota refuses; the model backs off after failures; a critical model waits
# for evicted or stopping replicas; a new leader waits for agents to register.
UNPLACED_KINDS = ("no_fit", "quota", "backoff", "preempting", "settling")


Action = (
    StartReplica
    | EnsureRunning
    | StopReplica
    | ForgetReplica
    | EvictReplica
    | NoteFailure
    | ClearBackoff
    | CannotPlace
)
