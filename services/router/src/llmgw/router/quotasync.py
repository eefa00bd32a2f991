"""The router's half of QuotaService.Sync: report usage, take a share back.

One loop, owned by the app: connect to a control plane, then every
``interval`` send what each key consumed here since the last report and
wait for the view that answers it (:mod:`.quota` says what a view means).
A standby answers with the leader's address; a failure or a slow answer
(``timeout``) ends the connection; what is dialled next, and when, is
:func:`.leader.follow_leader`'s policy, shared with the usage reports. While
no sync works the router keeps its shares (see :mod:`.quota`), so limits
still hold, approximately, with every control plane gone.

Usage counted here is never lost when a sync fails: a report stays
unanswered until a leader's view answers it, and is sent again, the same
report with the same (incarnation, sequence), on the next connection,
before anything newer (which waits in :class:`.quota.Quotas`). Whether the
lost answer's report was counted or not, the leader counts it once: it
applies each (incarnation, sequence) of a router once (control's
api/quota.py). A standby counts nothing; the report goes on to the leader.
"""

from __future__ import annotations

import asyncio
import logging
import random
import uuid
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.tls import PLAINTEXT, TlsSettings, aio_channel
from llmgw.v1 import keys_pb2, keys_pb2_grpc

from .leader import follow_leader
from .quota import KeyLimits, Quotas
from .watch import CHANNEL_OPTIONS

log = logging.getLogger(__name__)


class SyncGauges(Protocol):
    def quota_synced(self, routers: int | None) -> None:
        """Called after each view (routers sharing) and on a lost sync (None)."""
        ...


class QuotaSync:
    def __init__(
        self,
        addresses: Sequence[str],
        quotas: Quotas,
        gauges: SyncGauges,
        *,
        router_id: str,
        interval: float,
        timeout: float,
        backoff: BackoffPolicy,
        clock: Callable[[], float],
        rng: random.Random | None = None,
        tls: TlsSettings = PLAINTEXT,
    ) -> None:
        self._addresses = tuple(addresses)
        self._quotas = quotas
        self._gauges = gauges
        self._router_id = router_id
        self._interval = interval
        self._timeout = timeout
        self._backoff = backoff
        self._clock = clock
        self._rng = rng or random.Random()
        self._tls = tls
        self._incarnation = uuid.uuid4().hex
        self._sequence = 0
        self._unanswered: keys_pb2.QuotaReport | None = None

    async def run(self) -> None:
        """Sync until cancelled."""
        await follow_leader(
            "quota sync",
            self._addresses,
            self._sync_once,
            self._backoff,
            self._rng,
            ended=lambda: self._gauges.quota_synced(None),
        )

    def _report(self) -> keys_pb2.QuotaReport:
        """The report not answered yet, else a new one of what was consumed since the last."""
        if self._unanswered is None:
            self._sequence += 1
            spent = self._quotas.report()
            owners = self._quotas.owner_report()
            self._unanswered = keys_pb2.QuotaReport(
                router_id=self._router_id,
                usage=[keys_pb2.KeyUsage(key_id=k, requests=r, tokens=t) for k, (r, t) in spent.items()],
                incarnation=self._incarnation,
                sequence=self._sequence,
                owner_usage=[
                    keys_pb2.OwnerModelUsage(owner=o, model=m, requests=r, tokens=t)
                    for (o, m), (r, t) in owners.items()
                ],
            )
        return self._unanswered

    async def _sync_once(self, address: str) -> tuple[bool, str]:
        """One connection; returns (whether any view arrived, leader address to go to or "")."""
        synced = False
        async with aio_channel(address, self._tls, CHANNEL_OPTIONS) as channel:
            call = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
            try:
                while True:
                    await call.write(self._report())
                    async with asyncio.timeout(self._timeout):
                        view = await call.read()
                    if view is grpc.aio.EOF:
                        return synced, ""
                    if not view.leader:
                        # A standby counts nothing: the leader gets this report next.
                        return synced, view.leader_address
                    self._unanswered = None
                    self._quotas.apply_view(
                        {b.key_id: (b.requests, b.tokens) for b in view.budgets},
                        view.routers,
                        self._clock(),
                        {o.owner: KeyLimits(o.requests_per_minute, o.tokens_per_minute) for o in view.owners},
                    )
                    if not synced:
                        log.info(
                            "quota sync with the leader at %s: %d router(s) share", address, view.routers
                        )
                    synced = True
                    self._gauges.quota_synced(view.routers)
                    await asyncio.sleep(self._interval)
            finally:
                call.cancel()
