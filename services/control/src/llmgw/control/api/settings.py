"""SettingsService: the cluster settings' versions over gRPC (see settings for the decisions).

Every control plane answers, leader or standby: reads and writes are etcd
reads and guarded etcd writes, not placement. ``in_force``, ``load_error``
and ``restart_pending`` describe the control plane asked, so an operator
can see that a version did not load on one of them.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import grpc

from llmgw.common.errors import LlmgwError, abort_with
from llmgw.v1 import settings_pb2, settings_pb2_grpc

from ..store.settings import InForce, SettingsStore, Version, changed_keys, parse_text


class RestartState(Protocol):
    @property
    def restart_pending(self) -> list[str]: ...


def _author(given: str, context: grpc.aio.ServicerContext) -> str:
    return given.strip()[:200] or f"unknown ({context.peer()})"


class SettingsServicer(settings_pb2_grpc.SettingsServiceServicer):
    def __init__(self, settings: SettingsStore, restart: RestartState):
        self._settings = settings
        self._restart = restart

    async def GetSettings(  # noqa: N802 - gRPC method name
        self, request: settings_pb2.GetSettingsRequest, context: grpc.aio.ServicerContext
    ) -> settings_pb2.SettingsVersion:
        try:
            version = await self._settings.get(request.version)
            previous = await self._previous(version.number)
        except LlmgwError as err:
            await abort_with(context, err)
        return self._message(version, previous)

    async def PutSettings(  # noqa: N802 - gRPC method name
        self, request: settings_pb2.PutSettingsRequest, context: grpc.aio.ServicerContext
    ) -> settings_pb2.SettingsVersion:
        async def write(author: str, reason: str) -> Version:
            document = parse_text(request.document, "the settings document")
            return await self._settings.put(
                document, if_version=request.if_version, author=author, reason=reason
            )

        return await self._write(request, context, write)

    async def RollbackSettings(  # noqa: N802 - gRPC method name
        self, request: settings_pb2.RollbackSettingsRequest, context: grpc.aio.ServicerContext
    ) -> settings_pb2.SettingsVersion:
        async def write(author: str, reason: str) -> Version:
            return await self._settings.rollback(
                request.version, if_version=request.if_version, author=author, reason=reason
            )

        return await self._write(request, context, write)

    async def _write(
        self,
        request: settings_pb2.PutSettingsRequest | settings_pb2.RollbackSettingsRequest,
        context: grpc.aio.ServicerContext,
        write: Callable[[str, str], Awaitable[Version]],
    ) -> settings_pb2.SettingsVersion:
        """One change: who and why from the request, the version it replaces for ``changed``."""
        try:
            previous = await self._previous(0)
            version = await write(_author(request.author, context), request.reason.strip()[:1000])
        except LlmgwError as err:
            await abort_with(context, err)
        return self._message(version, previous)

    async def ListSettingsVersions(  # noqa: N802 - gRPC method name
        self, request: settings_pb2.ListSettingsVersionsRequest, context: grpc.aio.ServicerContext
    ) -> settings_pb2.ListSettingsVersionsResponse:
        try:
            versions = await self._settings.versions()
        except LlmgwError as err:
            await abort_with(context, err)
        out = []
        for i, v in enumerate(versions):
            if request.limit and i >= request.limit:
                break
            previous = versions[i + 1] if i + 1 < len(versions) else None
            out.append(self._message(v, previous))
        return settings_pb2.ListSettingsVersionsResponse(versions=out)

    async def _previous(self, number: int) -> Version | None:
        """The version before ``number`` (before the newest when 0), if any."""
        if number == 0:
            number, _ = await self._settings.head()
            return await self._settings.get(number) if number else None
        if number <= 1:
            return None
        try:
            return await self._settings.get(number - 1)
        except LlmgwError:
            return None

    def _message(self, version: Version, previous: Version | None) -> settings_pb2.SettingsVersion:
        in_force: InForce = self._settings.in_force
        effective, error = "", ""
        try:
            effective = json.dumps(_effective(version.load()), sort_keys=True)
        except LlmgwError as err:
            error = str(err)
        return settings_pb2.SettingsVersion(
            version=version.number,
            document=json.dumps(version.document, sort_keys=True),
            effective=effective,
            author=version.author,
            created_at=version.created_at,
            reason=version.reason,
            changed=changed_keys(previous.document if previous else None, version.document),
            in_force=version.number == in_force.version,
            load_error=error,
            restart_pending=self._restart.restart_pending,
        )


def _effective(settings: Any) -> dict[str, Any]:
    data = settings.model_dump(mode="json")
    data["models"] = [m.model_dump(mode="json", exclude_defaults=True) for m in settings.models]
    return data
