"""Leadership: at most one control plane places work, chosen through etcd.

Decisions, after etcd's ``client/v3/concurrency``:

- The election key is ``leader``, bound to a lease of ``ttl`` seconds. A
  campaign is one transaction: "``leader`` does not exist (mod_revision 0)
  -> put it with my lease". A candidate that loses observes the key (read,
  then watch from that revision + 1) and tries again when it changes, with a
  short poll as a backstop because a lease can lapse without any writer
  noticing (MemoryStore only expires leases when touched).
- Fencing is local and immediate. The term ends the moment a keep-alive
  fails, answers 0, or the deadline passes: the deadline is the *send* time
  of the last successful refresh plus the TTL, which is never later than the
  moment etcd itself lets the lease go. ``is_leader`` checks the deadline on
  every read, so even a starved event loop cannot act as leader past it.
- Every leader write goes through :meth:`Leadership.commit`, which guards it
  with ``ModRevisionIs("leader", <the revision that made us leader>)``: a
  deposed leader that has not yet noticed cannot overwrite its successor's
  state. A refused guard fences at once.
- Resign = revoke the lease: the key disappears with it, so a standby takes
  over within its retry interval instead of a TTL. A fenced leader also
  revokes its old lease (best effort) before campaigning again.

Concurrency: one asyncio loop; :meth:`run` is the only task that changes the
term. Anyone may read ``is_leader`` or await :meth:`wait_elected`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from llmgw.common.errors import Unavailable
from llmgw.common.etcd import Compacted, Entry, ModRevisionIs, Op, Put, Store

LEADER_KEY = "leader"

log = logging.getLogger("llmgw.control.leader.leadership")


class NotLeader(Unavailable):
    """This control plane does not lead (any more); the write was not made."""


@dataclass(frozen=True)
class LeaderInfo:
    id: str
    address: str
    since: float

    def to_json(self) -> bytes:
        return json.dumps({"id": self.id, "address": self.address, "since": self.since}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaderInfo:
        """Parse the leader key's value; ValueError when it is not ours."""
        try:
            doc = json.loads(data)
            return cls(str(doc["id"]), str(doc["address"]), float(doc.get("since", 0.0)))
        except (ValueError, KeyError, TypeError) as err:
            raise ValueError(f"leader key holds no leader record: {err}") from None


@dataclass(frozen=True)
class Term:
    """One uninterrupted period of leadership."""

    number: int
    lease: int
    # The mod_revision of the leader key we wrote; every guarded write compares it.
    key_revision: int
    # What the leader key says for this term.
    info: LeaderInfo
    lost: asyncio.Event = field(default_factory=asyncio.Event, compare=False)


class Leadership:
    def __init__(
        self,
        store: Store,
        candidate_id: str,
        ttl_seconds: int,
        *,
        retry_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self._store = store
        self._id = candidate_id
        self._ttl = ttl_seconds
        self._refresh = ttl_seconds / 3
        self._retry = retry_seconds if retry_seconds is not None else min(1.0, ttl_seconds / 4)
        self._clock = clock
        self._wall = wall
        self._address = ""
        self._term: Term | None = None
        self._terms = 0
        self._deadline = 0.0
        self._elected = asyncio.Event()
        self._resigned = False
        self._known: LeaderInfo | None = None

    def configure(self, ttl_seconds: int) -> None:
        """Use another lease TTL; only before :meth:`run` (the TTL is read once per process)."""
        if self._address:
            raise RuntimeError("the lease TTL is fixed once leadership runs; restart to change it")
        self._ttl = ttl_seconds
        self._refresh = ttl_seconds / 3
        self._retry = min(self._retry, 1.0, ttl_seconds / 4)

    @property
    def ttl_seconds(self) -> int:
        return self._ttl

    # -- what others read ------------------------------------------------------

    @property
    def candidate_id(self) -> str:
        return self._id

    @property
    def is_leader(self) -> bool:
        return self._term is not None and self._clock() < self._deadline

    @property
    def term(self) -> Term | None:
        return self._term if self.is_leader else None

    @property
    def known_leader(self) -> LeaderInfo | None:
        """The leader as last read from etcd (may be stale; None if none seen)."""
        return self._known

    async def leader(self) -> LeaderInfo | None:
        """Read who leads from etcd now. Raises Unavailable when etcd does not answer.

        While this process leads, its own term is the answer: a read that
        started before it won may come back empty after it has, and its
        writes are guarded on that key anyway.
        """
        entry = await self._store.get(LEADER_KEY)
        term = self.term
        self._known = term.info if term is not None else self._parse(entry)
        return self._known

    async def leader_address(self) -> str:
        """The leader's address: fresh from etcd when it answers, else the last known.

        "" when none is known, and when the key names this process while it
        does not lead: a term of its own that ended (fenced when etcd went
        away) and whose key outlives it until the lease runs out. Naming
        itself would send agents and routers round in circles.
        """
        try:
            info = await self.leader()
        except Unavailable as err:
            log.warning("cannot read the leader from etcd, answering the last known: %s", err)
            info = self._known
        if info is None or (info.id == self._id and not self.is_leader):
            return ""
        return info.address

    async def wait_elected(self) -> Term:
        while True:
            await self._elected.wait()
            term = self.term
            if term is not None:
                return term
            # The deadline passed before run() noticed; it will fence shortly.
            await asyncio.sleep(self._retry / 4)

    async def commit(self, ops: Sequence[Op]) -> int:
        """Write ``ops`` only if this term still holds the leader key; returns the revision."""
        term = self.term
        if term is None:
            raise NotLeader(f"{self._id} is not the leader; not writing")
        result = await self._store.commit([ModRevisionIs(LEADER_KEY, term.key_revision)], ops)
        if not result.succeeded:
            self._fence(term, "the leader key is no longer ours (a guarded write was refused)")
            raise NotLeader(f"{self._id} lost leadership; the write was not made")
        return result.revision

    # -- the loop ---------------------------------------------------------------

    async def run(self, address: str) -> None:
        """Campaign, hold, fence, campaign again, until cancelled or resigned.

        ``address`` is what the leader key tells agents to dial.
        """
        self._address = address
        try:
            while not self._resigned:
                term = await self._campaign()
                if term is None:
                    return
                await self._hold(term)
                if self._term is term:
                    self._fence(term, "keep-alive loop ended")
                if not self._resigned:
                    await self._revoke(term.lease)
        finally:
            term = self._term
            if term is not None:
                self._fence(term, "leadership loop stopped")
                await self._revoke(term.lease)

    async def resign(self) -> None:
        """Stop leading and stop campaigning; the key goes away with the lease."""
        self._resigned = True
        term = self._term
        if term is not None:
            self._fence(term, "resigning")
            await self._revoke(term.lease)

    async def _campaign(self) -> Term | None:
        while not self._resigned:
            after = 0
            try:
                entry = await self._store.get(LEADER_KEY)
                self._known = self._parse(entry)
                if entry is None:
                    term = await self._try_lead()
                    if term is not None:
                        return term
                else:
                    after = entry.mod_revision
            except Unavailable as err:
                log.warning("campaign for leadership failed, retrying: %s", err)
                await asyncio.sleep(self._retry)
                continue
            await self._observe(after)
        return None

    async def _try_lead(self) -> Term | None:
        started = self._clock()
        lease = await self._store.grant_lease(self._ttl)
        info = LeaderInfo(self._id, self._address, self._wall())
        try:
            result = await self._store.commit(
                [ModRevisionIs(LEADER_KEY, 0)], [Put(LEADER_KEY, info.to_json(), lease)]
            )
        except BaseException:
            await self._revoke(lease)
            raise
        if not result.succeeded:
            await self._revoke(lease)
            return None
        if self._resigned:
            await self._revoke(lease)
            return None
        self._terms += 1
        term = Term(self._terms, lease, result.revision, info)
        self._term = term
        self._deadline = started + self._ttl
        self._known = info
        self._elected.set()
        log.info("%s leads (term %d, lease %x)", self._id, term.number, lease)
        return term

    async def _observe(self, after_revision: int) -> None:
        """Return when the leader key changes after ``after_revision``, or after a poll interval."""
        try:
            async with asyncio.timeout(self._retry):
                watch = self._store.watch(LEADER_KEY, after_revision + 1 if after_revision else 0)
                async with contextlib.aclosing(watch) as changes:
                    async for _ in changes:
                        return
        except TimeoutError:
            return
        except Compacted:
            return
        except Unavailable as err:
            log.debug("watching the leader key failed: %s", err)
            await asyncio.sleep(self._retry)

    async def _hold(self, term: Term) -> None:
        """Keep the lease alive every ttl/3; return (fenced) on the first failure."""
        while self._term is term:
            await asyncio.sleep(self._refresh)
            if self._term is not term:
                return
            sent = self._clock()
            remaining = self._deadline - sent
            if remaining <= 0:
                self._fence(term, "the lease deadline passed before a refresh")
                return
            try:
                async with asyncio.timeout(remaining):
                    ttl = await self._store.keep_alive(term.lease)
                    entry = await self._store.get(LEADER_KEY) if ttl > 0 else None
            except TimeoutError:
                self._fence(term, "keep-alive did not answer before the lease deadline")
                return
            except Unavailable as err:
                self._fence(term, f"keep-alive failed: {err}")
                return
            if ttl <= 0:
                self._fence(term, "the lease expired")
                return
            if entry is None or entry.lease != term.lease:
                self._fence(term, "the leader key is no longer bound to our lease")
                return
            self._deadline = sent + min(ttl, self._ttl)

    def _fence(self, term: Term, reason: str) -> None:
        if self._term is not term:
            return
        self._term = None
        self._elected.clear()
        term.lost.set()
        if self._resigned:
            log.info("%s stopped leading (term %d): %s", self._id, term.number, reason)
        else:
            log.warning("%s fenced (term %d): %s", self._id, term.number, reason)

    async def _revoke(self, lease: int) -> None:
        try:
            async with asyncio.timeout(max(self._retry, 1.0)):
                await self._store.revoke_lease(lease)
        except (TimeoutError, Unavailable) as err:
            log.info("could not revoke lease %x (it will expire on its own): %s", lease, err)

    @staticmethod
    def _parse(entry: Entry | None) -> LeaderInfo | None:
        if entry is None:
            return None
        try:
            return LeaderInfo.from_json(entry.value)
        except ValueError as err:
            log.warning("%s", err)
            return None
