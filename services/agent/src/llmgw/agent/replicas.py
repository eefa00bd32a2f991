"""The agent's own words for a replica: what to run, and how it is doing.

These are the types inside the agent; :mod:`.messages` maps them to and
from the ``llmgw.v1`` messages at the stream's edge, so nothing below the
connection depends on protobuf.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from .adapters import LoraSpec


class ReplicaState(enum.Enum):
    STARTING = "starting"  # the process runs; its health probe has not passed yet
    READY = "ready"  # /health answers and /v1/models lists the served name
    FAILED = "failed"  # exited or never became healthy; the message says why
    STOPPING = "stopping"
    STOPPED = "stopped"


@dataclass(frozen=True)
class ReplicaSpec:
    """One StartReplica command: what to run, on which GPUs, behind which key."""

    replica_id: str
    model: str
    engine: str
    served_name: str
    gpu_indices: tuple[int, ...]
    engine_key: str = field(repr=False)  # never printed: it opens the engine
    engine_args: Mapping[str, str] = field(default_factory=dict)
    # None: the engine starts without LoRA (no adapter can be loaded later).
    lora: LoraSpec | None = None
    # Which of the node's builds of the engine ("": the kind's main build).
    build: str = ""


@dataclass(frozen=True)
class ReplicaStatus:
    replica_id: str
    model: str
    state: ReplicaState
    url: str = ""
    message: str = ""
    pid: int = 0
    gpu_indices: tuple[int, ...] = ()
    served_name: str = ""
    engine: str = ""
    # LoRA adapters the engine holds now.
    adapters: tuple[str, ...] = ()
