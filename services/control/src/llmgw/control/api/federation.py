"""FederationService: the peer clusters, their health, and adding or removing one.

``ListPeers`` answers from this control plane's checks (every control
plane checks its peers: see leader.federation) and its catalog's clashes.
``AddPeer`` and ``RemovePeer`` are settings changes: the newest settings
document with ``federation.peers`` edited, stored as the next version,
guarded by the version read (a concurrent change is ABORTED, nothing
lost), validated whole before anything is written. The change is in
force on every control plane within a watch round trip, like any other.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import grpc
import yaml
from pydantic import ValidationError

from llmgw.common.config import format_validation_error
from llmgw.common.errors import FailedPrecondition, InvalidArgument, LlmgwError, NotFound, abort_with, excerpt
from llmgw.v1 import federation_pb2, federation_pb2_grpc

from ..leader.federation import PeerState
from ..spec.federation import Federation, Peer
from ..store.settings import SettingsStore

MAX_DOCUMENT_BYTES = 16 * 1024
# A change to the settings' list of peers (as JSON-shaped documents); raises to refuse it.
Edit = Callable[[list[dict[str, Any]]], list[dict[str, Any]]]


class PeerView(Protocol):
    """What the checks found (:class:`~llmgw.control.leader.federation.PeerChecker`)."""

    @property
    def settings(self) -> Federation: ...
    def peers(self) -> list[PeerState]: ...


class ClashView(Protocol):
    """Peer model names that a local model already has (the controller's merge)."""

    @property
    def federation_clashes(self) -> list[str]: ...


def _author(given: str, context: grpc.aio.ServicerContext) -> str:
    return given.strip()[:200] or f"unknown ({context.peer()})"


def parse_peer(text: str) -> Peer:
    """A peer's settings entry from JSON or YAML text, with errors that name the field."""
    if len(text) > MAX_DOCUMENT_BYTES:
        raise InvalidArgument(f"the peer document is {len(text)} bytes; the limit is {MAX_DOCUMENT_BYTES}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise InvalidArgument(f"the peer document is not valid JSON or YAML: {err}") from None
    if not isinstance(data, dict):
        raise InvalidArgument("a peer is a mapping: {name, url, api_key_file, models, send_tags}")
    try:
        return Peer.model_validate(data)
    except ValidationError as err:
        raise InvalidArgument(format_validation_error(err, "the peer")) from None


def peer_info(state: PeerState, clashes: Sequence[str]) -> federation_pb2.PeerInfo:
    peer = state.peer
    mine = [c for c in clashes if c.startswith(peer.name + "/")]
    names = [f"{peer.name}/{m}" for m in state.listed] if state.healthy else []
    return federation_pb2.PeerInfo(
        name=peer.name,
        url=peer.url,
        health=state.health,
        last_check=state.checked_at,
        error=state.error,
        offered=[n for n in names if n not in mine],
        clashes=mine,
        missing=list(state.missing),
        models=["all"] if peer.models == "all" else list(peer.models),
        send_tags=peer.send_tags,
    )


class FederationServicer(federation_pb2_grpc.FederationServiceServicer):
    def __init__(self, checks: PeerView, clashes: ClashView, settings: SettingsStore):
        self._checks = checks
        self._clashes = clashes
        self._settings = settings

    async def ListPeers(  # noqa: N802 - gRPC method name
        self, request: federation_pb2.ListPeersRequest, context: grpc.aio.ServicerContext
    ) -> federation_pb2.ListPeersResponse:
        clashes = self._clashes.federation_clashes
        settings = self._checks.settings
        return federation_pb2.ListPeersResponse(
            peers=[peer_info(s, clashes) for s in self._checks.peers()],
            check_interval_seconds=settings.check_interval_seconds,
            hop_limit=settings.hop_limit,
        )

    async def AddPeer(  # noqa: N802 - gRPC method name
        self, request: federation_pb2.AddPeerRequest, context: grpc.aio.ServicerContext
    ) -> federation_pb2.PeerChange:
        try:
            peer = parse_peer(request.document)

            def add(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
                if any(p.get("name") == peer.name for p in peers):
                    raise FailedPrecondition(
                        f"a peer named {peer.name!r} exists; remove it first, or change it with "
                        "`llmgw settings edit`"
                    )
                return [*peers, peer.model_dump(mode="json", exclude_defaults=True)]

            version = await self._change(
                add, _author(request.author, context), request.reason or f"add peer {peer.name}"
            )
        except LlmgwError as err:
            await abort_with(context, err)
        return federation_pb2.PeerChange(settings_version=version)

    async def RemovePeer(  # noqa: N802 - gRPC method name
        self, request: federation_pb2.RemovePeerRequest, context: grpc.aio.ServicerContext
    ) -> federation_pb2.PeerChange:
        name = request.name

        def remove(peers: list[dict[str, Any]]) -> list[dict[str, Any]]:
            kept = [p for p in peers if p.get("name") != name]
            if len(kept) == len(peers):
                known = ", ".join(str(p.get("name")) for p in peers) or "none"
                raise NotFound(f"no peer is named {excerpt(name)} (peers: {known})")
            return kept

        try:
            version = await self._change(
                remove, _author(request.author, context), request.reason or f"remove peer {name}"
            )
        except LlmgwError as err:
            await abort_with(context, err)
        return federation_pb2.PeerChange(settings_version=version)

    async def _change(self, edit: Edit, author: str, reason: str) -> int:
        """The newest settings with their peers edited, stored as the next version; its number."""
        current = await self._settings.get(0)
        document = copy.deepcopy(current.document)
        federation = document.get("federation") or {}
        if not isinstance(federation, dict):
            raise InvalidArgument(
                "the settings' federation is not a mapping; fix it with `llmgw settings edit`"
            )
        peers = federation.get("peers") or []
        federation["peers"] = edit(list(peers))
        document["federation"] = federation
        # Round-trips through JSON so what is validated is what is stored.
        document = json.loads(json.dumps(document))
        version = await self._settings.put(
            document, if_version=current.number, author=author, reason=reason[:1000]
        )
        return version.number
