"""External providers: a real local HTTP server stands in for an OpenAI-compatible provider.

The provider checks the bearer key against the one it currently accepts,
as a real provider does, so a router that sent a stale key gets a 401.
"""

from __future__ import annotations

import asyncio
import os

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.router.config import Backend, ExternalSpec, RouterConfig, StaticModel
from llmgw.router.external import KeyFiles, KeyFileUnreadable
from llmgw.router.table import External, Model, RoutingTable, static_layer
from llmgw.v1 import endpoints_pb2 as pb

from .engines import FakeEngine
from .helpers import router, serve_app, wait_for
from .test_watch import Control, cluster, secret_file  # noqa: F401  (fixture)

CHAT = "/v1/chat/completions"


class Provider:
    """An OpenAI-compatible provider on port 0 that accepts exactly one key at a time."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.seen: list[tuple[str, str, dict]] = []
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def __aenter__(self) -> Provider:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner, self.url = await serve_app(app)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        auth = request.headers.get("Authorization", "")
        self.seen.append((request.path, auth, body))
        if auth != f"Bearer {self.key}":
            error = {"error": {"message": "Incorrect API key provided", "type": "invalid_request_error"}}
            return web.json_response(error, status=401)
        return web.json_response(
            {
                "id": "chatcmpl-p",
                "object": "chat.completion",
                "created": 1,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
            }
        )


def rotate(path, key: str) -> None:
    """Replace the key file atomically, as a secret manager does."""
    tmp = path.with_suffix(".new")
    tmp.write_text(key + "\n")
    os.replace(tmp, path)


def external_config(provider: Provider, key_file, **extra: object) -> RouterConfig:
    model = StaticModel(
        name="gpt",
        aliases=["gpt-latest"],
        external=ExternalSpec(url=provider.url, model="gpt-4o-2024", api_key_file=str(key_file)),
    )
    return RouterConfig(listen="127.0.0.1:0", models=[model], key_file_recheck_seconds=0.05, **extra)


async def test_external_model_goes_to_the_provider_with_its_model_name_and_the_key_from_its_file(tmp_path):
    key_file = tmp_path / "provider.key"
    rotate(key_file, "sk-first")
    async with Provider("sk-first") as provider, router(external_config(provider, key_file)) as r:
        client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="client-key", max_retries=0)
        answer = await client.chat.completions.with_raw_response.create(model="gpt-latest", messages=[])
        assert answer.headers["x-llmgw-model"] == "gpt"
        assert answer.headers["x-llmgw-replica"] == "external:gpt"
        assert answer.parse().model == "gpt-4o-2024"
        path, auth, body = provider.seen[-1]
        assert path == "/v1/chat/completions"
        # The client's own key never leaves the router; the provider's does.
        assert auth == "Bearer sk-first"
        assert body["model"] == "gpt-4o-2024"
        await client.close()


async def test_a_rotated_key_file_is_used_without_a_restart(tmp_path):
    key_file = tmp_path / "provider.key"
    rotate(key_file, "sk-old")
    async with (
        Provider("sk-old") as provider,
        router(external_config(provider, key_file)) as r,
        aiohttp.ClientSession() as client,
    ):
        async with client.post(r.url + CHAT, json={"model": "gpt"}) as resp:
            assert resp.status == 200
        provider.key = "sk-new"
        rotate(key_file, "sk-new")

        async def new_key_used() -> bool:
            async with client.post(r.url + CHAT, json={"model": "gpt"}) as resp:
                return resp.status == 200

        deadline = asyncio.get_running_loop().time() + 5
        while not await new_key_used():
            assert asyncio.get_running_loop().time() < deadline, "the rotated key was never used"
            await asyncio.sleep(0.05)
        assert provider.seen[-1][1] == "Bearer sk-new"


async def test_unreadable_key_file_is_a_500_naming_the_file_and_no_request_reaches_the_provider(tmp_path):
    missing = tmp_path / "nowhere.key"
    async with (
        Provider("sk") as provider,
        router(external_config(provider, missing)) as r,
        aiohttp.ClientSession() as client,
        client.post(r.url + CHAT, json={"model": "gpt"}) as resp,
    ):
        assert resp.status == 500
        assert str(missing) in (await resp.json())["error"]["message"]
        assert provider.seen == []


async def test_external_model_can_be_the_fallback_of_a_model_with_no_replica(tmp_path):
    key_file = tmp_path / "provider.key"
    rotate(key_file, "sk")
    async with Provider("sk") as provider:
        config = external_config(provider, key_file)
        config.models.append(StaticModel(name="local", fallbacks=["gpt"]))
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + CHAT, json={"model": "local"}) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-model"] == "gpt"


async def test_catalog_external_entry_from_the_control_plane_routes_to_the_provider(tmp_path, secret_file):  # noqa: F811
    key_file = tmp_path / "provider.key"
    rotate(key_file, "sk-cat")
    async with (
        Provider("sk-cat") as provider,
        FakeEngine() as engine,
        Control() as control,
        router(cluster(secret_file, control.address)) as r,
        aiohttp.ClientSession() as client,
    ):
        info = pb.ModelInfo(name="gpt", fallbacks=["m"])
        info.external.url = provider.url
        info.external.api = "openai"
        info.external.api_key_file = str(key_file)
        control.send_catalog(1, [info, pb.ModelInfo(name="m")])
        control.send_endpoints(1, [pb.Endpoint(id="r1", model="m", url=engine.url)])
        await wait_for(lambda: r.table.ready)
        async with client.post(r.url + CHAT, json={"model": "gpt"}) as resp:
            assert resp.status == 200
            assert resp.headers["x-llmgw-replica"] == "external:gpt"
        # The provider's model name defaults to ours; the catalog's fallbacks came through the watch.
        assert provider.seen[-1][2]["model"] == "gpt"
        assert r.table.resolve("gpt").fallbacks == ("m",)


def test_key_files_keep_the_last_key_while_the_file_is_missing_and_pick_up_a_new_one(tmp_path):
    now = [0.0]
    keys = KeyFiles(lambda: now[0], recheck_seconds=1.0)
    path = tmp_path / "k"
    with pytest.raises(KeyFileUnreadable, match=str(path)):
        keys.key(str(path))
    rotate(path, "one")
    assert keys.key(str(path)) == "one"
    rotate(path, "two")
    # Within the recheck interval the cached key is served without touching the file.
    assert keys.key(str(path)) == "one"
    now[0] = 1.5
    assert keys.key(str(path)) == "two"
    path.unlink()
    now[0] = 3.0
    assert keys.key(str(path)) == "two"
    path.write_text("\n")
    now[0] = 4.5
    assert keys.key(str(path)) == "two"


def test_external_model_has_one_stable_endpoint_that_keeps_its_state_across_catalog_updates():
    table = RoutingTable(cluster=True)
    gpt = Model("gpt", external=External("http://p/", "gpt-4o", "/k"))
    table.apply_catalog(snapshot=True, upserts=[gpt], removals=[])
    (route,) = table.routes("gpt")
    assert (route.endpoint.id, route.endpoint.url, route.endpoint.upstream_model) == (
        "external:gpt",
        "http://p",
        "gpt-4o",
    )
    assert route.endpoint.external
    route.state.consecutive_failures = 2
    table.apply_catalog(snapshot=True, upserts=[gpt, Model("other")], removals=[])
    assert table.state("external:gpt").consecutive_failures == 2


def test_static_backends_add_endpoints_and_aliases_to_a_declared_model():
    config = RouterConfig(
        models=[StaticModel(name="m", aliases=["a"], fallbacks=["x"])],
        backends=[Backend(model="m", url="http://e", aliases=["b"]), Backend(model="x", url="http://x")],
    )
    models, endpoints = static_layer(config.backends, 5, config.models)
    by_name = {m.name: m for m in models}
    assert by_name["m"].aliases == ("a", "b")
    assert by_name["m"].fallbacks == ("x",)
    assert [e.id for e in endpoints] == ["static:m:0", "static:x:0"]


def test_provider_with_an_api_the_router_does_not_speak_gets_no_route():
    table = RoutingTable(cluster=True)
    other = Model("claude", external=External("http://p", api="anthropic"))
    table.apply_catalog(snapshot=True, upserts=[other], removals=[])
    assert table.resolve("claude") is not None
    assert table.routes("claude") == ()
