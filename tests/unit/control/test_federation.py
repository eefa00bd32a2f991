"""Federation on the control plane: peer settings, checks against real HTTP peers, the catalog merge,
and adding or removing a peer as a settings change over real gRPC.

A peer is a local aiohttp server on port 0 answering ``/v1/models`` the way
a peer's router would (and checking the key); the catalog sink is the seam
the controller implements (``set_federated``), recorded here.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable

import grpc
import pytest
from aiohttp import web
from pydantic import ValidationError

from llmgw.common.errors import InvalidArgument
from llmgw.common.etcd import MemoryStore
from llmgw.common.grpcserver import GrpcServer
from llmgw.control.api.federation import FederationServicer
from llmgw.control.config import ClusterSettings, ControlConfig
from llmgw.control.leader.federation import HttpPeerCheck, PeerChecker, PeerState, offered
from llmgw.control.spec.catalog import Catalog, Model, with_federated
from llmgw.control.spec.federation import Federation, Peer
from llmgw.control.spec.model import ModelSpec
from llmgw.control.store.settings import SettingsStore
from llmgw.v1 import federation_pb2, federation_pb2_grpc

SIM = {"engine": "simulator"}


class PeerRouter:
    """A peer's router on port 0: ``/v1/models`` lists ``models`` to a caller with ``key``."""

    def __init__(self, key: str, models: Iterable[str]) -> None:
        self.key = key
        self.models = list(models)
        self.status = 200
        self.delay = 0.0
        self.body: bytes | None = None
        self.calls = 0
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> PeerRouter:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.StreamResponse:
        self.calls += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
        if self.body is not None:
            return web.Response(body=self.body, content_type="application/json")
        data = {"object": "list", "data": [{"id": m, "object": "model"} for m in self.models]}
        return web.json_response(data, status=self.status)


class Sink:
    """The controller's side of the seam: what it was told to offer, each time."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.models: list[Model] = []

    def set_federated(self, models: Iterable[Model]) -> None:
        self.models = list(models)
        self.calls.append([m.name for m in self.models])


def key_file(tmp_path, key: str = "sk-peer") -> str:
    path = tmp_path / "peer.key"
    path.write_text(key + "\n")
    return str(path)


def settings(*peers: Peer, **kw) -> Federation:
    return Federation(peers=list(peers), check_interval_seconds=kw.pop("interval", 1.0), **kw)


# -- settings ---------------------------------------------------------------------


def test_peer_settings_refuse_what_cannot_work():
    with pytest.raises(ValidationError, match="must be http"):
        Peer(name="west", url="ftp://x")
    with pytest.raises(ValidationError, match="no path"):
        Peer(name="west", url="http://x/v1")
    with pytest.raises(ValidationError, match="lists no model"):
        Peer(name="west", url="http://x", models=[])
    with pytest.raises(ValidationError):
        Peer(name="West!", url="http://x")
    with pytest.raises(ValidationError, match="repeat"):
        Federation(peers=[Peer(name="w", url="http://a"), Peer(name="w", url="http://b")])
    assert Peer(name="w", url="http://a/").url == "http://a"


def test_a_fallback_may_name_a_declared_peers_model_and_no_other():
    local = {"name": "local", "profile": SIM, "fallbacks": ["west/chat"]}
    ok = ClusterSettings(models=[local], federation={"peers": [{"name": "west", "url": "http://w"}]})
    assert ok.models[0].fallbacks == ["west/chat"]
    with pytest.raises(ValidationError, match="west/chat"):
        ClusterSettings(models=[local])


def test_a_local_name_wins_over_a_peers_and_the_clash_is_reported():
    base = Catalog.from_specs(
        [
            ModelSpec(name="west/chat", profiles=[SIM]),
            ModelSpec(name="m", profiles=[SIM], aliases=["west/m"]),
        ],
        peers=frozenset({"west"}),
    )
    state = PeerState(Peer(name="west", url="http://w"), True, 1.0, "", ("chat", "m", "other"))
    merged, clashes = with_federated(base, offered([state], "east", 1))
    assert sorted(clashes) == ["west/chat", "west/m"]
    assert merged.get("west/chat").origin == "declared"
    assert merged.get("west/other").origin == "peer"
    assert merged.peers == frozenset({"west"})


def test_offered_models_are_external_models_of_the_peer_router_with_tags_only_when_asked():
    tagged = PeerState(
        Peer(name="west", url="http://w", api_key_file="/k", send_tags=True), True, 1.0, "", ("c",)
    )
    plain = PeerState(Peer(name="north", url="http://n"), True, 1.0, "", ("c",))
    down = PeerState(Peer(name="south", url="http://s"), False, 1.0, "refused", ("c",))
    west, north = offered([tagged, plain, down], "east", 2)
    assert west.name == "west/c" and west.external and west.min_replicas == 0
    assert west.spec.external.url == "http://w" and west.spec.external.model == "c"
    assert west.spec.external.api_key_file == "/k"
    assert (west.peer.peer, west.peer.origin_cluster, west.peer.hop_limit) == ("west", "east", 2)
    assert north.peer.origin_cluster == ""


# -- checks against real peers ------------------------------------------------------


async def test_a_healthy_peer_is_offered_then_withdrawn_when_it_fails_and_offered_again(tmp_path):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat", "embed"]) as peer:
        check = HttpPeerCheck()
        checker = PeerChecker(
            check, sink, "east", settings(Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path)))
        )
        try:
            await checker.check_all()
            assert sink.calls == [["west/chat", "west/embed"]]
            (state,) = checker.peers()
            assert state.health == "healthy" and state.checked_at > 0 and state.error == ""
            # Nothing changed: the controller is not told again.
            await checker.check_all()
            assert len(sink.calls) == 1
            peer.status = 503
            await checker.check_all()
            assert sink.calls[-1] == []
            (state,) = checker.peers()
            assert state.health == "unhealthy" and "503" in state.error
            peer.status = 200
            peer.models = ["chat"]
            await checker.check_all()
            assert sink.calls[-1] == ["west/chat"]
        finally:
            await check.close()


async def test_a_list_of_models_offers_only_those_and_names_the_missing(tmp_path):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat", "embed"]) as peer:
        check = HttpPeerCheck()
        wanted = Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path), models=["embed", "gone"])
        checker = PeerChecker(check, sink, "east", settings(wanted))
        try:
            await checker.check_all()
            assert sink.calls == [["west/embed"]]
            (state,) = checker.peers()
            assert state.missing == ("gone",)
        finally:
            await check.close()


@pytest.mark.parametrize(
    ("breaks", "says"),
    [
        (lambda p: setattr(p, "key", "sk-other"), "must be a client key of the peer's"),
        (lambda p: setattr(p, "body", b'{"data": 5}'), "did not answer an OpenAI model list"),
        (lambda p: setattr(p, "body", b"<html>"), "did not answer an OpenAI model list"),
        (lambda p: setattr(p, "body", b'{"data": [' + b'{"id": "m"},' * 500_000 + b"]}"), "more than"),
        (lambda p: setattr(p, "delay", 2.0), "did not answer within 0.3s"),
    ],
)
async def test_a_peer_that_does_not_answer_a_model_list_is_unhealthy_and_says_why(tmp_path, breaks, says):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat"]) as peer:
        breaks(peer)
        check = HttpPeerCheck()
        fed = settings(
            Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path)), check_timeout_seconds=0.3
        )
        checker = PeerChecker(check, sink, "east", fed)
        try:
            started = time.monotonic()
            await checker.check_all()
            assert time.monotonic() - started < 1.5
            (state,) = checker.peers()
            assert state.health == "unhealthy" and says in state.error, state.error
            assert sink.calls == []
        finally:
            await check.close()


async def test_an_unreadable_key_file_fails_the_check_naming_the_file_and_asks_nothing(tmp_path):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat"]) as peer:
        check = HttpPeerCheck()
        missing = str(tmp_path / "nowhere.key")
        checker = PeerChecker(
            check, sink, "east", settings(Peer(name="west", url=peer.url, api_key_file=missing))
        )
        try:
            await checker.check_all()
            (state,) = checker.peers()
            assert state.health == "unhealthy" and missing in state.error
            assert peer.calls == 0
        finally:
            await check.close()


async def test_removing_a_peer_withdraws_its_models_at_once(tmp_path):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat"]) as peer:
        check = HttpPeerCheck()
        west = Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path))
        checker = PeerChecker(check, sink, "east", settings(west))
        try:
            await checker.check_all()
            assert sink.calls[-1] == ["west/chat"]
            checker.configure(settings())
            assert sink.calls[-1] == []
            assert checker.peers() == []
        finally:
            await check.close()


async def test_the_checker_runs_on_its_interval_until_cancelled(tmp_path):
    sink = Sink()
    async with PeerRouter("sk-peer", ["chat"]) as peer:
        check = HttpPeerCheck()
        fed = settings(Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path)), interval=0.2)
        checker = PeerChecker(check, sink, "east", fed)
        task = asyncio.create_task(checker.run())
        try:
            deadline = time.monotonic() + 5
            while peer.calls < 3:
                assert time.monotonic() < deadline, "the peer was not checked on the interval"
                await asyncio.sleep(0.02)
            assert sink.calls == [["west/chat"]]
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await check.close()


# -- adding and removing peers: settings changes over gRPC ----------------------------


async def test_peers_are_added_and_removed_as_settings_versions_and_bad_input_writes_nothing():
    store = MemoryStore()
    settings_store = SettingsStore(store, lambda: 1.0)
    await settings_store.start(
        ControlConfig(cluster_secret_file="/dev/null", tls={"plaintext": True}, node_lost_seconds=9), "c.yaml"
    )
    checker = PeerChecker(HttpPeerCheck(), Sink(), "east")

    class Clashes:
        federation_clashes: list[str] = []

    server = GrpcServer(
        "127.0.0.1:0",
        [
            (
                federation_pb2_grpc.add_FederationServiceServicer_to_server,
                FederationServicer(checker, Clashes(), settings_store),
                "llmgw.v1.FederationService",
            )
        ],
    )
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            stub = federation_pb2_grpc.FederationServiceStub(channel)
            doc = json.dumps(
                {"name": "west", "url": "http://w.example", "models": ["chat"], "send_tags": True}
            )
            added = await stub.AddPeer(federation_pb2.AddPeerRequest(document=doc, author="me"))
            assert added.settings_version == 2
            v2 = await settings_store.get(0)
            assert v2.document["federation"]["peers"] == [
                {"name": "west", "url": "http://w.example", "models": ["chat"], "send_tags": True}
            ]
            assert v2.document["node_lost_seconds"] == 9 and v2.author == "me"
            assert v2.reason == "add peer west"
            for bad, code, says in [
                (doc, grpc.StatusCode.FAILED_PRECONDITION, "exists"),
                ('{"name": "x", "url": "nope"}', grpc.StatusCode.INVALID_ARGUMENT, "url"),
                ("[1]", grpc.StatusCode.INVALID_ARGUMENT, "mapping"),
            ]:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.AddPeer(federation_pb2.AddPeerRequest(document=bad))
                assert refused.value.code() == code and says in refused.value.details()
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.RemovePeer(federation_pb2.RemovePeerRequest(name="east"))
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND and "west" in refused.value.details()
            assert (await settings_store.get(0)).number == 2
            removed = await stub.RemovePeer(federation_pb2.RemovePeerRequest(name="west"))
            assert removed.settings_version == 3
            assert (await settings_store.get(0)).document["federation"]["peers"] == []
            listed = await stub.ListPeers(federation_pb2.ListPeersRequest())
            assert list(listed.peers) == [] and listed.hop_limit == 1
    finally:
        await server.stop(0)


def test_a_peer_document_that_is_not_a_peer_is_refused_with_the_field():
    from llmgw.control.api.federation import parse_peer

    with pytest.raises(InvalidArgument, match="name"):
        parse_peer('{"url": "http://x"}')


async def test_peer_health_is_exported_as_metrics_for_every_declared_peer(tmp_path):
    from prometheus_client import CollectorRegistry

    from llmgw.control.leader.federation import PeerCollector

    async with PeerRouter("sk-peer", ["chat", "embed"]) as peer:
        check = HttpPeerCheck()
        west = Peer(name="west", url=peer.url, api_key_file=key_file(tmp_path))
        never = Peer(name="never", url=peer.url, api_key_file=str(tmp_path / "none"))
        checker = PeerChecker(check, Sink(), "east", settings(west, never))
        registry = CollectorRegistry()
        registry.register(PeerCollector(checker))
        try:
            assert registry.get_sample_value("llmgw_control_peer_up", {"peer": "west"}) == 0
            await checker.check_all()
            await checker.check_all()
            value = registry.get_sample_value
            assert value("llmgw_control_peer_up", {"peer": "west"}) == 1
            assert value("llmgw_control_peer_models_offered", {"peer": "west"}) == 2
            assert value("llmgw_control_peer_last_check_timestamp_seconds", {"peer": "west"}) > 0
            assert value("llmgw_control_peer_check_failures_total", {"peer": "west"}) == 0
            assert value("llmgw_control_peer_up", {"peer": "never"}) == 0
            assert value("llmgw_control_peer_check_failures_total", {"peer": "never"}) == 2
        finally:
            await check.close()


async def test_a_runtime_model_may_fall_back_to_a_declared_peers_model():
    from llmgw.control.store.models import RuntimeModels

    spec = ModelSpec(name="local", profiles=[SIM], fallbacks=["west/chat"])
    with pytest.raises(InvalidArgument, match="west/chat"):
        await RuntimeModels(MemoryStore(), []).put(spec, replace=False)
    catalog = await RuntimeModels(MemoryStore(), [], peers=frozenset({"west"})).put(spec, replace=False)
    assert catalog.get("local").fallbacks == ("west/chat",)


async def test_a_check_that_fails_unexpectedly_still_withdraws_the_peer():
    class Broken:
        """A PeerCheck (the seam) whose first answer is a list and whose second is a bug."""

        def __init__(self) -> None:
            self.calls = 0

        async def models(self, peer: Peer, limit_seconds: float) -> list[str]:
            self.calls += 1
            if self.calls > 1:
                raise RuntimeError("boom")
            return ["chat"]

    sink = Sink()
    checker = PeerChecker(Broken(), sink, "east", settings(Peer(name="west", url="http://w")))
    await checker.check_all()
    assert sink.calls == [["west/chat"]]
    await checker.check_all()
    assert sink.calls[-1] == []
    (state,) = checker.peers()
    assert state.health == "unhealthy" and "RuntimeError: boom" in state.error
