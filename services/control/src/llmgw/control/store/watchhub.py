"""Watch hub: an etcd prefix mirrored in memory and served as snapshot-or-delta updates.

Every control plane, leader or standby, runs one hub per published prefix
(``endpoints/``, ``catalog/``), so a router can watch any of them and a
revision means the same thing everywhere: revisions are etcd's.

Two layers:

- :class:`MirrorCore` is pure: ``reset`` (a fresh read), ``apply`` (one
  watch batch) and ``update_since(known_revision)``. It keeps a bounded
  history of effective changes (revision -> key -> value or removal). A put
  that repeats the stored value is not a change: it advances the revision
  but is never sent. ``update_since(k)`` answers a delta (collapsed per key)
  when ``k`` lies within ``[floor, revision]`` -- everything after ``k`` is
  still in history -- and a snapshot otherwise: no revision, one older than
  the history, or one newer than the mirror (the store was reset).
- :class:`WatchHub` runs it: ``range`` then ``watch(revision + 1)`` in a
  loop; on Compacted or Unavailable it re-reads and the history restarts
  there. A re-read is a gap, so every open subscriber gets a snapshot next
  (the mirror's *epoch* changes), never a guessed delta.

Subscribers never queue messages: each remembers the last revision it sent
and, when woken, asks the core for what changed since. A slow client gets
one collapsed delta instead of a backlog, or a snapshot once it has fallen
out of the history.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import Compacted, Store

log = logging.getLogger("llmgw.control.store.watchhub")


@dataclass(frozen=True)
class Update:
    revision: int
    snapshot: bool
    # (key, value) sorted by key; the whole table when snapshot is true.
    upserts: tuple[tuple[str, bytes], ...] = ()
    removals: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.snapshot and not self.upserts and not self.removals


class MirrorCore:
    def __init__(self, history_limit: int = 1000):
        self._limit = history_limit
        self._items: dict[str, bytes] = {}
        self._history: deque[tuple[int, dict[str, bytes | None]]] = deque()
        self._revision = 0
        self._floor = 0
        self._epoch = 0

    @property
    def revision(self) -> int:
        return self._revision

    @property
    def epoch(self) -> int:
        """Changes on every reset; a subscriber that saw another epoch needs a snapshot."""
        return self._epoch

    @property
    def floor(self) -> int:
        """The oldest known revision a delta can still be computed from."""
        return self._floor

    @property
    def items(self) -> Mapping[str, bytes]:
        return MappingProxyType(self._items)

    def reset(self, items: Mapping[str, bytes], revision: int) -> None:
        self._items = dict(items)
        self._history.clear()
        self._revision = revision
        self._floor = revision
        self._epoch += 1

    def apply(self, changes: Sequence[tuple[str, bytes | None]], revision: int) -> bool:
        """Apply one batch (None = removal); returns whether anything really changed."""
        effective: dict[str, bytes | None] = {}
        for key, value in changes:
            if value is None:
                if key in self._items:
                    del self._items[key]
                    effective[key] = None
            elif self._items.get(key) != value:
                self._items[key] = value
                effective[key] = value
        self._revision = max(self._revision, revision)
        if not effective:
            return False
        self._history.append((self._revision, effective))
        while len(self._history) > self._limit:
            self._floor = self._history.popleft()[0]
        return True

    def snapshot(self) -> Update:
        return Update(self._revision, True, tuple(sorted(self._items.items())), ())

    def update_since(self, known_revision: int) -> Update:
        k = known_revision
        if k <= 0 or k < self._floor or k > self._revision:
            return self.snapshot()
        merged: dict[str, bytes | None] = {}
        for rev, changes in self._history:
            if rev > k:
                merged.update(changes)
        return Update(
            self._revision,
            False,
            tuple(sorted((key, v) for key, v in merged.items() if v is not None)),
            tuple(sorted(key for key, v in merged.items() if v is None)),
        )


class HubMetrics(Protocol):
    def resynced(self, stream: str) -> None: ...


class WatchHub:
    """Mirrors ``prefix`` of the store; ``updates()`` serves one watcher."""

    def __init__(
        self,
        store: Store,
        prefix: str,
        name: str,
        metrics: HubMetrics,
        history_limit: int = 1000,
        retry_seconds: float = 1.0,
    ):
        self._store = store
        self._prefix = prefix
        self.name = name
        self._metrics = metrics
        self._retry = retry_seconds
        self._core = MirrorCore(history_limit)
        self._loaded = False
        self._closed = False
        self._generation = 0
        self._changed = asyncio.Condition()

    @property
    def revision(self) -> int:
        return self._core.revision

    def set_history_limit(self, limit: int) -> None:
        """Keep another number of changes; only before :meth:`run` (fixed for the process)."""
        if self._loaded:
            raise RuntimeError("the watch history limit is fixed once the hub runs; restart to change it")
        self._core = MirrorCore(limit)

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def items(self) -> Mapping[str, bytes]:
        return self._core.items

    async def run(self) -> None:
        """Keep the mirror current until cancelled; never ends on an etcd failure."""
        delay = self._retry
        while True:
            try:
                result = await self._store.range(self._prefix)
                n = len(self._prefix)
                self._core.reset({e.key[n:]: e.value for e in result.entries}, result.revision)
                self._metrics.resynced(self.name)
                self._loaded = True
                await self._notify()
                delay = self._retry
                watch = self._store.watch(self._prefix, result.revision + 1)
                async with contextlib.aclosing(watch) as batches:
                    async for batch in batches:
                        changes = [
                            (e.key[n:], e.value if e.kind == "put" else None)
                            for e in batch.events
                            if e.key.startswith(self._prefix)
                        ]
                        if self._core.apply(changes, batch.revision):
                            await self._notify()
                log.warning("%s: the etcd watch ended; re-reading", self.name)
            except Compacted as err:
                log.warning("%s: %s; re-reading", self.name, err)
            except Unavailable as err:
                log.warning("%s: etcd unavailable, retrying in %.1fs: %s", self.name, delay, err)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10 * self._retry)
            except Exception:
                log.exception("%s: mirror loop failed; retrying in %.1fs", self.name, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10 * self._retry)

    async def close(self) -> None:
        """End every subscriber's stream (shutdown)."""
        self._closed = True
        await self._notify()

    async def _notify(self) -> None:
        async with self._changed:
            self._generation += 1
            self._changed.notify_all()

    def _moved_from(self, generation: int) -> Callable[[], bool]:
        return lambda: self._generation != generation or self._closed

    async def updates(self, known_revision: int) -> AsyncIterator[Update]:
        """The first message (snapshot or delta since ``known_revision``), then deltas."""
        async with self._changed:
            await self._changed.wait_for(lambda: self._loaded or self._closed)
        if self._closed:
            return
        epoch = self._core.epoch
        seen = self._generation
        first = self._core.update_since(known_revision)
        yield first
        last = first.revision
        while True:
            async with self._changed:
                await self._changed.wait_for(self._moved_from(seen))
                seen = self._generation
            if self._closed:
                return
            if self._core.epoch != epoch:
                epoch = self._core.epoch
                update = self._core.snapshot()
            else:
                update = self._core.update_since(last)
            if update.empty:
                continue
            yield update
            last = update.revision
