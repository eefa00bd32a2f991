"""Replica records: what the leader decided to run where, kept in etcd.

``replicas/<id>`` holds one JSON :class:`ReplicaRecord`. It is the desired
state that survives a change of leader: a new leader reads every record,
adopts the replicas agents report under those ids and re-sends the start of
any they do not, instead of restarting the fleet. Observed state (starting,
ready, failed, the URL) is soft and comes from the agents.

Ordering guarantee relied on elsewhere: a record is written *before* its
StartReplica is sent, so any replica an agent runs has a record unless the
leader deleted it, which is what makes "no record" mean "orphan".

:class:`ReplicaBook` is the leader's in-memory copy, loaded at the start of a
term and written through with leader-guarded transactions. A record that
does not parse is skipped with a warning, never a reason to stop.
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from llmgw.common.etcd import Delete, Op, Put, Store

PREFIX = "replicas/"

log = logging.getLogger("llmgw.control.store.replicas")


@dataclass(frozen=True)
class ReplicaRecord:
    id: str
    model: str
    node: str
    gpu_indices: tuple[int, ...]
    engine: str
    served_name: str
    # Wall-clock seconds when the leader placed it.
    created: float
    # Which of the model's profiles it runs (index in priority order), and the
    # host memory and CPU cores that profile claimed on its node when placed:
    # recorded so a later catalog change cannot make the node's accounting lie.
    profile: int = 0
    memory_bytes: int = 0
    cpu_cores: float = 0.0
    # The model's version (ModelSpec.version) it was started with; "" (records
    # from before versions were kept) counts as the model's current version.
    version: str = ""

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "id": self.id,
                "model": self.model,
                "node": self.node,
                "gpu_indices": list(self.gpu_indices),
                "engine": self.engine,
                "served_name": self.served_name,
                "created": self.created,
                "profile": self.profile,
                "memory_bytes": self.memory_bytes,
                "cpu_cores": self.cpu_cores,
                "version": self.version,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, data: bytes) -> ReplicaRecord:
        try:
            d = json.loads(data)
            return cls(
                id=str(d["id"]),
                model=str(d["model"]),
                node=str(d["node"]),
                gpu_indices=tuple(int(i) for i in d.get("gpu_indices", ())),
                engine=str(d.get("engine", "")),
                served_name=str(d.get("served_name") or d["model"]),
                created=float(d.get("created", 0.0)),
                profile=int(d.get("profile", 0)),
                memory_bytes=int(d.get("memory_bytes", 0)),
                cpu_cores=float(d.get("cpu_cores", 0.0)),
                version=str(d.get("version", "")),
            )
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"not a replica record: {err}") from None


_UNSAFE = re.compile(r"[^a-z0-9-]+")


def new_replica_id(
    model: str, taken: Container[str], token: Callable[[], str] = lambda: secrets.token_hex(3)
) -> str:
    """``<model>-<random>``, reduced to [a-z0-9-] so it is safe as a key, a path and a label."""
    stem = _UNSAFE.sub("-", model.lower()).strip("-")[:40].strip("-") or "replica"
    while True:
        rid = f"{stem}-{token()}"
        if rid not in taken:
            return rid


class GuardedWriter(Protocol):
    """Writes only while this process leads (``Leadership.commit``)."""

    async def commit(self, ops: Sequence[Op]) -> int: ...


class ReplicaBook:
    def __init__(self, store: Store, writer: GuardedWriter):
        self._store = store
        self._writer = writer
        self._records: dict[str, ReplicaRecord] = {}

    @property
    def records(self) -> Mapping[str, ReplicaRecord]:
        return self._records

    async def load(self) -> None:
        result = await self._store.range(PREFIX)
        records: dict[str, ReplicaRecord] = {}
        for entry in result.entries:
            try:
                rec = ReplicaRecord.from_json(entry.value)
            except ValueError as err:
                log.warning("skipping %s: %s", entry.key, err)
                continue
            if PREFIX + rec.id != entry.key:
                log.warning("skipping %s: it holds the record of %r", entry.key, rec.id)
                continue
            records[rec.id] = rec
        self._records = records

    async def add(self, rec: ReplicaRecord) -> None:
        await self._writer.commit([Put(PREFIX + rec.id, rec.to_json())])
        self._records[rec.id] = rec

    async def remove(self, replica_id: str) -> None:
        if replica_id not in self._records:
            return
        await self._writer.commit([Delete(PREFIX + replica_id)])
        self._records.pop(replica_id, None)

    def clear(self) -> None:
        self._records = {}
