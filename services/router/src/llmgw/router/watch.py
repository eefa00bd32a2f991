"""The control-plane watch: keeps the routing table's cluster layer current.

Two streams, followed independently and concurrently: the endpoint table
(``llmgw.v1.EndpointService/Watch``) and the catalog
(``llmgw.v1.CatalogService/Watch``); and a third, the client key table
(``llmgw.v1.KeyTableService/Watch``), when the router checks keys. Guarantees:

- **Resumable.** Each stream remembers the last revision it applied and
  sends it as ``known_revision`` on every (re)connect, so a control plane
  that still has that history answers with a delta, otherwise a snapshot.
- **Monotonic.** A delta whose revision is not greater than the last
  applied is ignored (a replay, or a lagging control plane). A snapshot
  always replaces that stream's layer: it is the server's whole truth, and
  refusing it could strand the router on a history that was reset.
- **Statically stable.** Losing every control plane never clears the
  table: the router keeps serving the last one it applied, for as long as
  it takes, while it keeps reconnecting.
- **Fails over in turn.** After a stream ends or fails, the next configured
  address is tried, after a jittered exponential backoff (capped, and reset
  once a connection delivers a message). Each attempt uses a fresh channel,
  so gRPC's own reconnect backoff never adds to ours.
- **Never dies on one failure.** A bad message or a bug in applying it is
  logged and answered by reconnecting, which re-sends what was not applied.

Engine keys are derived here, once per endpoint update, by the ``key_for``
function given (HMAC of the cluster secret and the endpoint id), so the
HTTP layer never sees the secret.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc

from llmgw.common.backoff import BackoffPolicy
from llmgw.common.tls import PLAINTEXT, TlsSettings, aio_channel
from llmgw.v1 import endpoints_pb2, endpoints_pb2_grpc, keys_pb2, keys_pb2_grpc

from .auth import ClientKey, client_key
from .table import Canary, Endpoint, External, Model

log = logging.getLogger(__name__)

CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    # Find a dead control plane on an idle stream within ~15s.
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]


class TableSink(Protocol):
    def apply_catalog(self, *, snapshot: bool, upserts: Sequence[Model], removals: Sequence[str]) -> None: ...

    def apply_endpoints(
        self, *, snapshot: bool, upserts: Sequence[Endpoint], removals: Sequence[str]
    ) -> None: ...


class KeySink(Protocol):
    def apply_keys(
        self, *, snapshot: bool, upserts: Sequence[ClientKey], removals: Sequence[str]
    ) -> None: ...


class WatchGauges(Protocol):
    def watch_connected(self, stream: str, connected: bool) -> None: ...
    def table_revision(self, stream: str, revision: int) -> None: ...


class WatchClient:
    def __init__(
        self,
        addresses: Sequence[str],
        table: TableSink,
        key_for: Callable[[str], str],
        gauges: WatchGauges,
        *,
        client_id: str = "",
        backoff: BackoffPolicy | None = None,
        rng: random.Random | None = None,
        keys: KeySink | None = None,
        tls: TlsSettings = PLAINTEXT,
    ) -> None:
        if not addresses:
            raise ValueError("WatchClient needs at least one control-plane address")
        self._addresses = tuple(addresses)
        self._table = table
        self._key_for = key_for
        self._gauges = gauges
        self._client_id = client_id
        self._backoff = backoff or BackoffPolicy()
        self._rng = rng or random.Random()
        self._keys = keys
        self._tls = tls
        self._revisions = {"endpoints": 0, "catalog": 0, "keys": 0}

    def revision(self, stream: str) -> int:
        """The last revision applied on ``stream`` ("endpoints", "catalog" or "keys")."""
        return self._revisions[stream]

    async def run(self) -> None:
        """Follow every stream until cancelled."""
        async with asyncio.TaskGroup() as group:
            group.create_task(self._follow("endpoints"))
            group.create_task(self._follow("catalog"))
            if self._keys is not None:
                group.create_task(self._follow("keys"))

    async def _follow(self, stream: str) -> None:
        failures = 0
        for address in itertools.cycle(self._addresses):
            delivered = False
            try:
                delivered = await self._watch_once(stream, address)
                log.warning("%s watch on %s ended by the server; reconnecting", stream, address)
            except grpc.aio.AioRpcError as err:
                log.warning(
                    "%s watch on %s failed: %s %s; keeping the last table and reconnecting",
                    stream,
                    address,
                    err.code().name,
                    err.details(),
                )
            except Exception:
                log.exception("%s watch on %s broke; reconnecting", stream, address)
            finally:
                self._gauges.watch_connected(stream, False)
            failures = 0 if delivered else failures + 1
            await asyncio.sleep(self._backoff.delay(failures, self._rng))

    async def _watch_once(self, stream: str, address: str) -> bool:
        """One connection: apply what arrives until the stream ends or fails."""
        delivered = False
        request = endpoints_pb2.WatchRequest(
            known_revision=self._revisions[stream], client_id=self._client_id
        )
        async with aio_channel(address, self._tls, CHANNEL_OPTIONS) as channel:
            if stream == "endpoints":
                call: Any = endpoints_pb2_grpc.EndpointServiceStub(channel).Watch(request)
            elif stream == "keys":
                call = keys_pb2_grpc.KeyTableServiceStub(channel).Watch(request)
            else:
                call = endpoints_pb2_grpc.CatalogServiceStub(channel).Watch(request)
            log.info(
                "%s watch connecting to %s from revision %d",
                stream,
                address,
                request.known_revision,
            )
            async for update in call:
                if not delivered:
                    delivered = True
                    self._gauges.watch_connected(stream, True)
                    log.info("%s watch connected to %s", stream, address)
                self._apply(stream, update)
        return delivered

    def _apply(
        self,
        stream: str,
        update: endpoints_pb2.EndpointUpdate | endpoints_pb2.CatalogUpdate | keys_pb2.KeyUpdate,
    ) -> None:
        last = self._revisions[stream]
        if not update.snapshot and update.revision <= last:
            log.debug("%s delta at revision %d ignored (have %d)", stream, update.revision, last)
            return
        if update.snapshot and update.revision < last:
            log.warning(
                "%s snapshot at revision %d is older than the applied %d; applying it as the "
                "server's whole truth",
                stream,
                update.revision,
                last,
            )
        if isinstance(update, keys_pb2.KeyUpdate):
            assert self._keys is not None
            self._keys.apply_keys(
                snapshot=update.snapshot,
                upserts=[client_key(k) for k in update.upserts],
                removals=list(update.removals),
            )
        elif isinstance(update, endpoints_pb2.EndpointUpdate):
            self._table.apply_endpoints(
                snapshot=update.snapshot,
                upserts=[self._endpoint(e) for e in update.upserts],
                removals=list(update.removals),
            )
        else:
            self._table.apply_catalog(
                snapshot=update.snapshot,
                upserts=[_model(m) for m in update.upserts],
                removals=list(update.removals),
            )
        self._revisions[stream] = update.revision
        self._gauges.table_revision(stream, update.revision)
        log.info(
            "%s %s applied at revision %d (%d upserts, %d removals)",
            stream,
            "snapshot" if update.snapshot else "delta",
            update.revision,
            len(update.upserts),
            len(update.removals),
        )

    def _endpoint(self, pb: endpoints_pb2.Endpoint) -> Endpoint:
        return Endpoint(
            id=pb.id,
            model=pb.model,
            url=pb.url.rstrip("/"),
            served_name=pb.served_name,
            weight=max(pb.weight, 1),
            priority=pb.priority,
            api_key=self._key_for(pb.id),
            adapters=tuple(pb.adapters),
        )


def _model(pb: endpoints_pb2.ModelInfo) -> Model:
    canary = Canary(pb.canary.model, pb.canary.percent) if pb.HasField("canary") else None
    external = None
    if pb.HasField("external"):
        ext = pb.external
        external = External(
            ext.url,
            ext.model,
            ext.api_key_file,
            ext.api or "openai",
            peer=ext.peer,
            origin_cluster=ext.origin_cluster,
            hop_limit=max(ext.hop_limit, 1),
        )
    return Model(
        name=pb.name,
        aliases=tuple(pb.aliases),
        owned_by=pb.owned_by or "llmgw",
        created=pb.created,
        fallbacks=tuple(pb.fallbacks),
        canary=canary,
        external=external,
        on_demand=pb.on_demand,
        adapters=tuple(pb.adapters),
        apis=tuple(pb.apis),
    )
