"""Federation on the router: a peer's model from the catalog watch, the hop header, the refusal.

A real router watches a scripted control plane (real gRPC); the peer is a
local HTTP server that records what it is sent, as a peer's router would
receive it.
"""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from llmgw.router.errors import BadRequest
from llmgw.router.federation import HOPS_HEADER, ORIGIN_HEADER, incoming_hops
from llmgw.v1 import endpoints_pb2 as pb

from .engines import FakeEngine
from .helpers import router, serve_app, wait_for
from .test_watch import Control, cluster, secret_file  # noqa: F401  (fixture)

CHAT = "/v1/chat/completions"


class PeerRouter:
    """A peer cluster's router on port 0: answers every chat, records the headers it got."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> PeerRouter:
        app = web.Application()
        app.router.add_post(CHAT, self._chat)
        self._runner, self.url = await serve_app(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.seen.append({"model": body["model"], **{k.lower(): v for k, v in request.headers.items()}})
        message = {"role": "assistant", "content": "hi"}
        return web.json_response(
            {
                "id": "c",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            }
        )


def peer_model(
    name: str, peer: PeerRouter, *, origin: str = "", hop_limit: int = 1, **fields
) -> pb.ModelInfo:
    info = pb.ModelInfo(name=name, **fields)
    info.external.url = peer.url
    info.external.api = "openai"
    info.external.model = name.split("/", 1)[1]
    info.external.peer = name.split("/", 1)[0]
    info.external.origin_cluster = origin
    info.external.hop_limit = hop_limit
    return info


async def test_a_peer_model_is_sent_with_the_hop_header_and_the_origin_tag_only_when_asked(
    secret_file,  # noqa: F811
):
    async with (
        PeerRouter() as peer,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        control.send_catalog(
            1, [peer_model("west/chat", peer, origin="east"), peer_model("north/chat", peer)]
        )
        control.send_endpoints(1, [])
        await wait_for(lambda: r.table.ready)
        async with client.post(r.url + CHAT, json={"model": "west/chat"}) as resp:
            assert resp.status == 200
            # Usage and the access log name the peer's endpoint.
            assert resp.headers["x-llmgw-replica"] == "peer:west/chat"
        sent = peer.seen[-1]
        assert sent["model"] == "chat"
        assert sent[HOPS_HEADER] == "1"
        assert sent[ORIGIN_HEADER] == "east"
        async with client.post(r.url + CHAT, json={"model": "north/chat"}) as resp:
            assert resp.status == 200
        assert peer.seen[-1][HOPS_HEADER] == "1"
        assert ORIGIN_HEADER not in peer.seen[-1]


async def test_a_request_that_came_from_a_peer_is_refused_for_a_peer_model_at_the_hop_limit(
    secret_file,  # noqa: F811
):
    async with (
        PeerRouter() as peer,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        control.send_catalog(1, [peer_model("west/chat", peer), peer_model("far/chat", peer, hop_limit=2)])
        control.send_endpoints(1, [])
        await wait_for(lambda: r.table.ready)
        async with client.post(r.url + CHAT, json={"model": "west/chat"}, headers={HOPS_HEADER: "1"}) as resp:
            assert resp.status == 400
            error = (await resp.json())["error"]
            assert error["code"] == "hop_limit_reached"
            assert error["type"] == "invalid_request_error"
            assert "west/chat" in error["message"]
        assert peer.seen == []
        # A peer model with a higher limit takes it, one hop further.
        async with client.post(r.url + CHAT, json={"model": "far/chat"}, headers={HOPS_HEADER: "1"}) as resp:
            assert resp.status == 200
        assert peer.seen[-1][HOPS_HEADER] == "2"
        async with client.post(r.url + CHAT, json={"model": "west/chat"}, headers={HOPS_HEADER: "x"}) as resp:
            assert resp.status == 400
            assert HOPS_HEADER in (await resp.json())["error"]["message"]


async def test_a_model_whose_fallback_is_a_peer_answers_locally_for_a_request_from_a_peer(
    secret_file,  # noqa: F811
):
    async with (
        PeerRouter() as peer,
        FakeEngine() as engine,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        # "m" with a peer as its canary-free fallback: the plan holds the local replica and the peer.
        control.send_catalog(
            1, [pb.ModelInfo(name="m", fallbacks=["west/chat"]), peer_model("west/chat", peer)]
        )
        control.send_endpoints(1, [pb.Endpoint(id="r1", model="m", url=engine.url)])
        await wait_for(lambda: r.table.ready)
        async with client.post(r.url + CHAT, json={"model": "m"}, headers={HOPS_HEADER: "1"}) as resp:
            assert resp.status == 200
            assert resp.headers["x-llmgw-replica"] == "r1"
        assert peer.seen == []
        # Without a local replica the peer is all that is left, and it is out of reach: a 400, not a loop.
        control.send_endpoints(2, [])
        await wait_for(lambda: not r.table.routes("m"))
        async with client.post(r.url + CHAT, json={"model": "m"}, headers={HOPS_HEADER: "1"}) as resp:
            assert resp.status == 400
            assert (await resp.json())["error"]["code"] == "hop_limit_reached"
        assert peer.seen == []


def test_incoming_hops_reads_the_header_and_refuses_garbage():
    assert incoming_hops({}) == 0
    assert incoming_hops({HOPS_HEADER: " 2 "}) == 2
    for bad in ("-1", "1.5", "abc", "65", "99999999999"):
        with pytest.raises(BadRequest, match=HOPS_HEADER):
            incoming_hops({HOPS_HEADER: bad})
