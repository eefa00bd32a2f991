"""Holds on a facility domain (a rack, a row, a power feed, a zone), kept in etcd.

``domain-holds/<label>=<value>`` holds one JSON :class:`HoldDocument`. A
domain is any node label, the agent's or an operator's (nodeoverrides):
every node whose labels carry that value is held, including one that
registers after the hold was taken. Decisions, beside those of
:mod:`.nodeoverrides` (etcd so a hold outlives the leader; any control
plane accepts a change; the follower hands every hold to the inventory):

- Holding and draining are apart: a held domain gets no new replicas; only
  with ``drain`` do the replicas it runs move out (a replacement first,
  then the old one stops, as for a node hold). Power work on a rack may
  need it empty; a rack about to be retired only needs it not to grow.
- The label and value are checked with the node label patterns, so a hold
  can only name a domain a node could be in.
- Holding a held domain replaces its reason and drain, keeping when it began.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Iterable

from pydantic import Field, ValidationError

from llmgw.common.config import Document
from llmgw.common.errors import Conflict, InvalidArgument
from llmgw.common.etcd import Compacted, Delete, ModRevisionIs, Put, Store

from ..state.inventory import DomainHold
from .nodeoverrides import MAX_REASON, check_labels

log = logging.getLogger("llmgw.control.store.domainholds")

PREFIX = "domain-holds/"
MAX_HOLDS = 1000


class HoldDocument(Document):
    label: str
    value: str
    reason: str = Field(default="", max_length=MAX_REASON)
    drain: bool = False
    # Wall-clock seconds when the hold began.
    held_since: float = 0.0

    def hold(self) -> DomainHold:
        return DomainHold(self.label, self.value, self.reason, self.drain)


def _key(label: str, value: str) -> str:
    if not value:
        raise InvalidArgument(f"a domain is a label and a value (rack=r1); {label}= has no value")
    check_labels({label: value})
    return f"{PREFIX}{label}={value}"


class DomainHolds:
    """Reads, changes and follows ``domain-holds/``."""

    def __init__(self, store: Store, wall: Callable[[], float] = time.time):
        self._store = store
        self._wall = wall

    async def load(self) -> tuple[list[HoldDocument], int]:
        """Every stored hold, and the store revision of the read."""
        result = await self._store.range(PREFIX)
        out = []
        for e in result.entries:
            try:
                out.append(HoldDocument.model_validate_json(e.value))
            except ValidationError as err:
                log.warning("skipping the stored domain hold %s: %s", e.key, err)
        return out, result.revision

    async def hold(self, label: str, value: str, reason: str, drain: bool) -> HoldDocument:
        if len(reason) > MAX_REASON:
            raise InvalidArgument(
                f"a hold reason is at most {MAX_REASON} characters; this one has {len(reason)}"
            )
        key = _key(label, value)
        entry = await self._store.get(key)
        if entry is None:
            held, _ = await self.load()
            if len(held) >= MAX_HOLDS:
                raise InvalidArgument(f"at most {MAX_HOLDS} domains can be held at once; release some")
        since = HoldDocument.model_validate_json(entry.value).held_since if entry else self._wall()
        doc = HoldDocument(label=label, value=value, reason=reason, drain=drain, held_since=since)
        put = Put(key, json.dumps(doc.model_dump(), sort_keys=True).encode())
        await self._commit(key, entry.mod_revision if entry else 0, put, label, value)
        return doc

    async def release(self, label: str, value: str) -> HoldDocument:
        key = _key(label, value)
        entry = await self._store.get(key)
        if entry is not None:
            await self._commit(key, entry.mod_revision, Delete(key), label, value)
        return HoldDocument(label=label, value=value)

    async def _commit(self, key: str, revision: int, op: Put | Delete, label: str, value: str) -> None:
        result = await self._store.commit([ModRevisionIs(key, revision)], [op])
        if not result.succeeded:
            raise Conflict(f"the hold on {label}={value} changed while this change was made; retry it")

    async def follow(self, apply: Callable[[Iterable[DomainHold]], None], retry_seconds: float = 1.0) -> None:
        """Call ``apply`` with every hold in force, at start and after each change (cancel to stop)."""
        while True:
            try:
                docs, revision = await self.load()
                apply([d.hold() for d in docs])
                async for _ in self._store.watch(PREFIX, revision + 1):
                    docs, _ = await self.load()
                    apply([d.hold() for d in docs])
            except asyncio.CancelledError:
                raise
            except Compacted:
                continue
            except Exception as err:  # etcd away: keep what is in force, try again
                log.warning("following domain holds failed (%s); retrying", err)
                await asyncio.sleep(retry_seconds)
