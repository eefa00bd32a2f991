"""The Store contract: the types every implementation speaks, and the Protocol itself."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar


@dataclass(frozen=True)
class Entry:
    key: str
    value: bytes
    mod_revision: int
    create_revision: int
    lease: int = 0


@dataclass(frozen=True)
class RangeResult:
    entries: list[Entry]
    # Store revision at which the range was read; watch from revision + 1.
    revision: int


@dataclass(frozen=True)
class Event:
    kind: Literal["put", "delete"]
    key: str
    value: bytes
    revision: int


@dataclass(frozen=True)
class WatchBatch:
    """Events of one or more whole revisions, in order."""

    events: list[Event]
    # The store revision this batch brings the watcher up to.
    revision: int


# Conditions and operations of a transaction.
@dataclass(frozen=True)
class ModRevisionIs:
    """The key's last modification is at ``revision`` (0: the key is absent)."""

    key: str
    revision: int


@dataclass(frozen=True)
class ValueIs:
    key: str
    value: bytes


@dataclass(frozen=True)
class Put:
    key: str
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Delete:
    key: str
    prefix: bool = False


Condition = ModRevisionIs | ValueIs
Op = Put | Delete

T = TypeVar("T")

# Operations in one transaction etcd refuses past (its default --max-txn-ops).
ETCD_MAX_TXN_OPS = 128
# Operations per transaction a writer sends at most (below etcd's limit, with room to spare).
MAX_TXN_OPS = 100


def batches(ops: Sequence[T]) -> Iterator[Sequence[T]]:
    """``ops`` (or whatever is written with each) in pieces of at most :data:`MAX_TXN_OPS`, each
    one transaction etcd accepts."""
    for i in range(0, len(ops), MAX_TXN_OPS):
        yield ops[i : i + MAX_TXN_OPS]


@dataclass(frozen=True)
class TxnResult:
    succeeded: bool
    revision: int


class Compacted(Exception):
    """The watch's start revision is older than what the store still holds."""

    def __init__(self, compact_revision: int):
        super().__init__(f"revision compacted; history starts at {compact_revision}")
        self.compact_revision = compact_revision


class Store(Protocol):
    async def get(self, key: str) -> Entry | None: ...
    async def range(self, prefix: str) -> RangeResult: ...
    async def put(self, key: str, value: bytes, lease: int = 0) -> int: ...
    async def delete(self, key: str, prefix: bool = False) -> int: ...
    async def commit(self, conditions: Sequence[Condition], ops: Sequence[Op]) -> TxnResult: ...
    async def grant_lease(self, ttl_seconds: int) -> int: ...
    async def keep_alive(self, lease: int) -> int:
        """Refresh a lease; returns its new TTL in seconds, 0 if it has expired."""
        ...

    async def revoke_lease(self, lease: int) -> None: ...
    def watch(self, prefix: str, start_revision: int) -> AsyncGenerator[WatchBatch, None]: ...
    async def close(self) -> None: ...
