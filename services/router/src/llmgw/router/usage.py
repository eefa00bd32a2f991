"""The usage reporter: this router's load, sent to the leading control plane as snapshots.

Every ``interval`` seconds (and at once when a request starts waiting for
an on-demand model) one ``UsageReport`` goes up a ``UsageService.Report``
stream: per endpoint, the requests this router has in flight and the
engine's own running/waiting as last polled; per model, how long ago a
request for it was last seen and how many requests are held waiting for it
to wake; per model, the requests answered and the errors among them since
the router started (cumulative, so the control plane takes rates from two
reports). The control plane sums the reports of every router and scales on
them (see control's usage and autoscale modules), and shows them to
operators (AdminService.ListRouters, the console's overview).

Guarantees:

- **Small.** An endpoint with nothing in flight here and an idle engine is
  left out (the control plane reads its absence as zero), so a report's
  size follows the load, not the fleet.
- **Off the request path.** A request costs one set insertion
  (:meth:`UsageReporter.used`); everything else happens at the tick, from
  state the proxy already keeps (``EndpointState.in_flight``).
- **Snapshots only.** A report is the whole truth of this router now; a
  lost one costs nothing, the next replaces it.
- **Drains are visible.** An endpoint that left the table is still reported
  while requests run on it, so the control plane stops a replica being
  scaled down only after its last request here has finished.
- **Reaches the leader.** Addresses are tried in turn; a standby answers
  with the leader's address and the next attempt goes there directly (no
  backoff). A failed or ended stream is retried after a jittered backoff
  (:mod:`.leader`, the policy the quota sync shares).
- **Never dies on one failure**, and never touches the routing table.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import grpc

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.tasks import cancel_and_wait
from llmgw.common.tls import PLAINTEXT, TlsSettings, aio_channel
from llmgw.v1 import usage_pb2, usage_pb2_grpc

from .leader import follow_leader
from .table import EndpointState, Route
from .watch import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

# A model unused this long is left out of reports (the longest idle timeout is a
# week), so names that left the catalog do not stay in them forever.
FORGET_AFTER_SECONDS = 8 * 86400.0


class RouteList(Protocol):
    def all_routes(self) -> Sequence[Route]: ...


class TrafficCounts(Protocol):
    requests: int
    client_errors: int
    server_errors: int


class UsageReporter:
    def __init__(
        self,
        addresses: Sequence[str],
        routes: RouteList,
        *,
        router_id: str,
        interval: float = 1.0,
        sample_max_age: float = 10.0,
        backoff: BackoffPolicy | None = None,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
        tls: TlsSettings = PLAINTEXT,
        traffic: Mapping[str, TrafficCounts] | None = None,
    ) -> None:
        if not addresses:
            raise ValueError("UsageReporter needs at least one control-plane address")
        self._addresses = tuple(addresses)
        self._routes = routes
        self._tls = tls
        self._router_id = router_id
        self._interval = interval
        self._sample_max_age = sample_max_age
        self._backoff = backoff or BackoffPolicy()
        self._rng = rng or random.Random()
        self._clock = clock
        # Per model, answered since start (RouterMetrics.traffic), read at each tick.
        self._traffic: Mapping[str, TrafficCounts] = traffic if traffic is not None else {}
        self._used: set[str] = set()
        self._last_used: dict[str, float] = {}
        self._pending: dict[str, int] = {}
        # Endpoints seen in the table, kept while requests still run on them.
        self._tracked: dict[str, tuple[str, EndpointState]] = {}
        self._urgent = asyncio.Event()
        self.connected_to = ""

    # -- what requests call ---------------------------------------------------

    def used(self, model: str) -> None:
        """A request for ``model`` (its canonical name) arrived."""
        self._used.add(model)

    def hold(self, model: str) -> None:
        """A request waits for ``model`` to get a ready replica: report it now."""
        self._pending[model] = self._pending.get(model, 0) + 1
        self._used.add(model)
        self._urgent.set()

    def release(self, model: str) -> None:
        n = self._pending.get(model, 0) - 1
        if n > 0:
            self._pending[model] = n
        else:
            self._pending.pop(model, None)

    # -- the report -------------------------------------------------------------

    def snapshot(self, urgent: bool = False) -> usage_pb2.UsageReport:
        now = self._clock()
        live: set[str] = set()
        for route in self._routes.all_routes():
            live.add(route.endpoint.id)
            if not route.endpoint.id.startswith("static:"):
                self._tracked[route.endpoint.id] = (route.endpoint.model, route.state)
        endpoints = []
        for eid, (model, state) in list(self._tracked.items()):
            if eid not in live and state.in_flight <= 0:
                del self._tracked[eid]
                continue
            if state.in_flight > 0:
                self._used.add(model)
            sample = state.engine
            fresh = sample is not None and now - sample.at <= self._sample_max_age
            if state.in_flight <= 0 and not (fresh and sample and sample.running + sample.waiting > 0):
                # Idle: left out, which the control plane reads as zero (an idle fleet reports nothing).
                continue
            endpoints.append(
                usage_pb2.EndpointLoad(
                    endpoint_id=eid,
                    model=model,
                    in_flight=state.in_flight,
                    engine_running=sample.running if fresh and sample else 0.0,
                    engine_waiting=sample.waiting if fresh and sample else 0.0,
                    engine_sampled=fresh,
                )
            )
        for model in self._used:
            self._last_used[model] = now
        self._used.clear()
        for model in [m for m, at in self._last_used.items() if now - at > FORGET_AFTER_SECONDS]:
            del self._last_used[model]
        models = [
            usage_pb2.ModelDemand(model=model, idle_seconds=now - at, pending=self._pending.get(model, 0))
            for model, at in sorted(self._last_used.items())
        ]
        return usage_pb2.UsageReport(
            router_id=self._router_id,
            interval_seconds=self._interval,
            endpoints=endpoints,
            models=models,
            urgent=urgent,
            traffic=[
                usage_pb2.ModelTraffic(
                    model=model,
                    requests=t.requests,
                    client_errors=t.client_errors,
                    server_errors=t.server_errors,
                )
                for model, t in sorted(self._traffic.items())
            ],
        )

    # -- the stream ---------------------------------------------------------------

    async def run(self) -> None:
        """Report to the leader until cancelled (:func:`.leader.follow_leader` says how it is found)."""
        await follow_leader(
            "usage reports", self._addresses, self._report_to, self._backoff, self._rng, ended=self._ended
        )

    def _ended(self) -> None:
        self.connected_to = ""

    async def _report_to(self, address: str) -> tuple[bool, str]:
        """One stream: (whether the leader accepted it, where a standby redirected to)."""
        out = _Outcome()
        async with aio_channel(address, self._tls, CHANNEL_OPTIONS) as channel:
            call = usage_pb2_grpc.UsageServiceStub(channel).Report()
            replies = asyncio.create_task(self._replies(call, address, out))
            try:
                urgent = self._urgent.is_set()
                while not replies.done():
                    self._urgent.clear()
                    await call.write(self.snapshot(urgent))
                    urgent = await self._wait_tick(replies)
                replies.result()
            except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
                # A write after the server ended the stream: its last reply says what next.
                if not out.redirect:
                    raise
            finally:
                try:
                    if not replies.done():
                        await cancel_and_wait(replies)
                finally:
                    call.cancel()
        return out.accepted, out.redirect

    async def _wait_tick(self, replies: asyncio.Task[None]) -> bool:
        """Sleep until the next tick, an urgent report, or the stream's end; True if urgent."""
        urgent = asyncio.ensure_future(self._urgent.wait())
        try:
            await asyncio.wait({urgent, replies}, timeout=self._interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            await cancel_and_wait(urgent)
        return self._urgent.is_set()

    async def _replies(self, call: grpc.aio.StreamStreamCall, address: str, out: _Outcome) -> None:
        async for reply in call:
            if not reply.accepted:
                # A standby, or a leader whose term ended: go where it says.
                log.info("%s does not lead; usage reports go to %r next", address, reply.leader_address)
                out.redirect = reply.leader_address
                return
            out.accepted = True
            self.connected_to = address
            log.info("usage reports go to the leader at %s", address)


@dataclass
class _Outcome:
    accepted: bool = False
    redirect: str = ""
