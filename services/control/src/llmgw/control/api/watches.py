"""EndpointService.Watch, CatalogService.Watch and KeyTableService.Watch over the watch hubs.

Thin typed async generators: the hub decides snapshot or delta and when to
send; these only decode the stored bytes into messages. An entry that does
not parse is left out with a warning (a bad stored value is never a reason
to break every router's stream).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Protocol, TypeVar

import grpc
from google.protobuf.message import DecodeError, Message

from llmgw.common.owners import is_owner_path
from llmgw.v1 import endpoints_pb2, endpoints_pb2_grpc, keys_pb2, keys_pb2_grpc

from ..store.watchhub import Update

log = logging.getLogger("llmgw.control.api.watches")

M = TypeVar("M", bound=Message)


class UpdateSource(Protocol):
    name: str

    def updates(self, known_revision: int) -> AsyncIterator[Update]: ...


class WatcherGauge(Protocol):
    def labels(self, stream: str) -> _IncDec: ...


class _IncDec(Protocol):
    def inc(self) -> None: ...
    def dec(self) -> None: ...


def _decode(parse: Callable[[bytes], M], stream: str, items: Iterable[tuple[str, bytes]]) -> list[M]:
    out: list[M] = []
    for key, value in items:
        try:
            out.append(parse(value))
        except DecodeError:
            log.warning("%s/%s does not parse; not sent", stream, key)
    return out


async def _stream(
    source: UpdateSource,
    request: endpoints_pb2.WatchRequest,
    context: grpc.aio.ServicerContext,
    gauge: WatcherGauge,
) -> AsyncIterator[Update]:
    who = request.client_id or context.peer()
    log.info("%s watch opened by %s from revision %d", source.name, who, request.known_revision)
    gauge.labels(source.name).inc()
    try:
        async for update in source.updates(request.known_revision):
            yield update
    finally:
        gauge.labels(source.name).dec()
        log.info("%s watch by %s closed", source.name, who)


def _message(update_cls, item_cls, name: str, u):
    """One hub update as the stream's message type (EndpointUpdate or CatalogUpdate)."""
    return update_cls(
        revision=u.revision,
        snapshot=u.snapshot,
        upserts=_decode(item_cls.FromString, name, u.upserts),
        removals=list(u.removals),
    )


class EndpointWatchServicer(endpoints_pb2_grpc.EndpointServiceServicer):
    def __init__(self, hub: UpdateSource, gauge: WatcherGauge):
        self._hub = hub
        self._gauge = gauge

    async def Watch(  # noqa: N802 - gRPC method name
        self, request: endpoints_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[endpoints_pb2.EndpointUpdate]:
        async for u in _stream(self._hub, request, context, self._gauge):
            yield _message(endpoints_pb2.EndpointUpdate, endpoints_pb2.Endpoint, "endpoints", u)


class CatalogWatchServicer(endpoints_pb2_grpc.CatalogServiceServicer):
    def __init__(self, hub: UpdateSource, gauge: WatcherGauge):
        self._hub = hub
        self._gauge = gauge

    async def Watch(  # noqa: N802 - gRPC method name
        self, request: endpoints_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[endpoints_pb2.CatalogUpdate]:
        async for u in _stream(self._hub, request, context, self._gauge):
            yield _message(endpoints_pb2.CatalogUpdate, endpoints_pb2.ModelInfo, "catalog", u)


class KeyWatchServicer(keys_pb2_grpc.KeyTableServiceServicer):
    def __init__(self, hub: UpdateSource, gauge: WatcherGauge):
        self._hub = hub
        self._gauge = gauge

    async def Watch(  # noqa: N802 - gRPC method name
        self, request: endpoints_pb2.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[keys_pb2.KeyUpdate]:
        async for u in _stream(self._hub, request, context, self._gauge):
            update = _message(keys_pb2.KeyUpdate, keys_pb2.ApiKey, "keys", u)
            # Routers need hashes, models, limits and expiry, and an owner path (acme/search)
            # whose budgets the key spends; free-text owners (an email) are the operator's business.
            for key in update.upserts:
                if not is_owner_path(key.owner):
                    key.ClearField("owner")
            yield update
