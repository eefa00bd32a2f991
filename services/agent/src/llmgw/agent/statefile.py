"""What the agent remembers of each engine it runs, so a restarted agent finds them.

``<state_dir>/replicas/<replica_id>/replica.json`` is written (atomically:
a temporary file, then a rename) right after an engine is spawned, and
removed when the replica is STOPPED or FAILED, so it exists exactly while an
engine may be running. It holds what Register must report of the replica
and what proves that a live pid is still that engine:

- the replica's spec, except the engine key: only a fingerprint of it
  (sha256, 16 hex digits), so the file opens nothing. A later StartReplica
  for the same replica brings the key back (see :mod:`.adoption`);
- pid (= process group), its start time in clock ticks since boot, and the
  boot id: a pid reused by another process, or a file from before a
  reboot, does not match (see :mod:`.processes`);
- the port and engine URL the engine listens on.

A file that does not parse, or has another ``version``, is treated as
absent: the replica is not adopted and its directory is cleaned. Keys this
agent does not know (written by a newer agent) are ignored, so going back
to an older agent version keeps the engines; a field added later must
therefore have a default, and a change that older agents must not misread
bumps ``version``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from .adapters import LoraSpec
from .replicas import ReplicaSpec

FILENAME = "replica.json"
VERSION = 1


def key_fingerprint(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()[:16] if key else ""


@dataclass(frozen=True)
class EngineRecord:
    replica_id: str
    model: str
    engine: str
    served_name: str
    gpu_indices: tuple[int, ...]
    engine_args: dict[str, str]
    key_fingerprint: str
    pid: int
    start_ticks: int
    boot_id: str
    port: int
    url: str
    version: int = VERSION
    started_at: float = field(default=0.0)
    # The engine's LoRA limits (0: started without LoRA); its adapters are read back from it.
    lora_max_loras: int = 0
    lora_max_rank: int = 0
    # The engine build it runs ("": the kind's main build).
    build: str = ""

    @classmethod
    def of(
        cls, spec: ReplicaSpec, *, pid: int, start_ticks: int, boot_id: str, port: int, url: str, at: float
    ) -> EngineRecord:
        return cls(
            replica_id=spec.replica_id,
            model=spec.model,
            engine=spec.engine,
            served_name=spec.served_name,
            gpu_indices=tuple(spec.gpu_indices),
            engine_args=dict(spec.engine_args),
            key_fingerprint=key_fingerprint(spec.engine_key),
            pid=pid,
            start_ticks=start_ticks,
            boot_id=boot_id,
            port=port,
            url=url,
            started_at=at,
            lora_max_loras=spec.lora.max_loras if spec.lora else 0,
            lora_max_rank=spec.lora.max_rank if spec.lora else 0,
            build=spec.build,
        )

    def spec(self) -> ReplicaSpec:
        """The replica's spec without its key (the control plane sends it again)."""
        return ReplicaSpec(
            replica_id=self.replica_id,
            model=self.model,
            engine=self.engine,
            served_name=self.served_name,
            gpu_indices=self.gpu_indices,
            engine_key="",
            engine_args=dict(self.engine_args),
            lora=LoraSpec(self.lora_max_loras, self.lora_max_rank) if self.lora_max_loras > 0 else None,
            build=self.build,
        )


_FIELDS = frozenset(f.name for f in fields(EngineRecord))


def write(directory: Path, record: EngineRecord) -> None:
    tmp = directory / f".{FILENAME}.tmp"
    tmp.write_text(json.dumps(asdict(record), indent=1) + "\n")
    os.replace(tmp, directory / FILENAME)


def read(directory: Path) -> EngineRecord | None:
    """The record in ``directory``, or None when it is missing, unreadable or not one."""
    try:
        doc = json.loads((directory / FILENAME).read_text())
        if doc.get("version") != VERSION:
            return None
        doc["gpu_indices"] = tuple(int(i) for i in doc["gpu_indices"])
        # Fields another agent version added are left out, so an agent handed
        # back to an older version (llmgw nodes upgrade) still adopts.
        record = EngineRecord(**{k: v for k, v in doc.items() if k in _FIELDS})
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    if record.replica_id != directory.name or record.pid <= 1 or record.port <= 0:
        return None
    return record


def remove(directory: Path) -> None:
    (directory / FILENAME).unlink(missing_ok=True)
