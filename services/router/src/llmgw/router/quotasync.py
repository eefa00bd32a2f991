"""The router's half of QuotaService.Sync: report usage, take a share back.

One loop, owned by the app: connect to a control plane, then every
``interval`` send what each key consumed here since the last report and
wait for the view that answers it (:mod:`.quota` says what a view means).
A standby answers with the leader's address; a failure or a slow answer
(``timeout``) ends the connection; what is dialled next, and when, is
:func:`.leader.follow_leader`'s policy, shared with the usage reports. While
no sync works the router keeps its shares (see :mod:`.quota`), so limits
still hold, approximately, with every control plane gone.

A report whose answer never came may or may not have been counted by the
leader; it is not re-sent (usage is soft state, and counting it twice would
refuse requests that are within the limit). A report a standby answered
was certainly not counted, and goes to the leader with the next one.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc

from llmgw.common.backoff import BackoffPolicy
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

    async def _sync_once(self, address: str) -> tuple[bool, str]:
        """One connection; returns (whether any view arrived, leader address to go to or "")."""
        synced = False
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            call = keys_pb2_grpc.QuotaServiceStub(channel).Sync()
            try:
                while True:
                    spent = self._quotas.report()
                    usage = [keys_pb2.KeyUsage(key_id=k, requests=r, tokens=t) for k, (r, t) in spent.items()]
                    await call.write(keys_pb2.QuotaReport(router_id=self._router_id, usage=usage))
                    async with asyncio.timeout(self._timeout):
                        view = await call.read()
                    if view is grpc.aio.EOF:
                        return synced, ""
                    if not view.leader:
                        # A standby counts nothing: the leader gets this report next.
                        self._quotas.unreport(spent)
                        return synced, view.leader_address
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
