"""Client keys on one in-process router in front of a real simulator: 503 before the key
table, 401 shapes, model restrictions as 404 and a filtered /v1/models, 429 with
Retry-After for requests and tokens, and tokens counted from the engine's usage.

The key table is applied directly (the watch's seam); the control plane address is
one nobody listens on, so nothing else feeds it.
"""

from __future__ import annotations

import json
import time

import aiohttp
import pytest

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.common.keys import client_key_hash
from llmgw.router.answer import Answer
from llmgw.router.app import AUTH
from llmgw.router.auth import ClientKey, tokens_used
from llmgw.router.config import Backend, RouterConfig
from llmgw.router.quota import KeyLimits
from llmgw.router.resume import Kind, Transcript
from tests.support.procs import free_port

from .helpers import router

SECRET = "sk-llmgw-test-secret-0123456789abcdefghijkl"


def key(secret: str = SECRET, *, id: str = "k-1", models=(), rpm=0, tpm=0, expires=0, owner="") -> ClientKey:
    return ClientKey(
        id=id,
        name="",
        prefix=secret[:15],
        hash=client_key_hash(secret),
        models=frozenset(models),
        limits=KeyLimits(rpm, tpm),
        expires=expires,
        owner=owner,
    )


@pytest.fixture
async def setup(tmp_path):
    secret_file = tmp_path / "secret"
    secret_file.write_text("a-cluster-secret-of-enough-bytes\n")
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=8, served_model_names=("sim",))
    async with SimulatorServer(settings) as sim:
        config = RouterConfig(
            listen="127.0.0.1:0",
            control=[f"127.0.0.1:{free_port()}"],
            cluster_secret_file=str(secret_file),
            tls={"plaintext": True},
            auth="keys",
            backends=[
                Backend(model="tiny", url=sim.url, served_name="sim", aliases=["tiny-chat"]),
                Backend(model="other", url=sim.url, served_name="sim"),
            ],
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            yield r, client


def keys_of(r):
    return r.app[AUTH].table


async def chat(client, r, secret: str | None = SECRET, model: str = "tiny", max_tokens: int = 4):
    headers = {"Authorization": f"Bearer {secret}"} if secret else {}
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    async with client.post(r.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        return resp.status, resp.headers, await resp.json()


async def test_before_any_key_table_every_api_call_is_503_with_retry_after_and_not_ready(setup):
    r, client = setup
    status, headers, body = await chat(client, r)
    assert status == 503 and headers["Retry-After"] == "1"
    assert body["error"]["code"] == "keys_not_loaded"
    async with client.get(r.url + "/ready") as resp:
        assert resp.status == 503
    async with client.get(r.url + "/health") as resp:
        assert resp.status == 200, "probes stay open"


async def test_missing_unknown_and_expired_keys_are_401_invalid_api_key(setup):
    r, client = setup
    expired = "sk-llmgw-expired-0123456789abcdefghijklmnop"
    keys_of(r).apply_keys(
        snapshot=True, upserts=[key(), key(expired, id="k-2", expires=int(time.time()) - 1)], removals=[]
    )
    for secret, says in [
        (None, "didn't provide"),
        ("sk-llmgw-wrong", "Incorrect API key"),
        (expired, "expired"),
    ]:
        status, _, body = await chat(client, r, secret)
        assert status == 401, secret
        assert body["error"]["code"] == "invalid_api_key" and says in body["error"]["message"]
        assert body["error"]["type"] == "invalid_request_error"
    assert (await chat(client, r))[0] == 200


async def test_a_removed_key_is_refused_at_once(setup):
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key()], removals=[])
    assert (await chat(client, r))[0] == 200
    keys_of(r).apply_keys(snapshot=False, upserts=[], removals=["k-1"])
    assert (await chat(client, r))[0] == 401


async def test_a_model_the_key_may_not_use_looks_exactly_like_one_that_does_not_exist(setup):
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(models=["tiny-chat"])], removals=[])
    assert (await chat(client, r, model="tiny"))[0] == 200, "an alias allows its model by any name"
    denied = await chat(client, r, model="other")
    missing = await chat(client, r, model="ghost")
    assert denied[0] == missing[0] == 404
    assert denied[2]["error"]["code"] == missing[2]["error"]["code"] == "model_not_found"
    assert denied[2]["error"]["message"] == missing[2]["error"]["message"].replace("ghost", "other")
    headers = {"Authorization": f"Bearer {SECRET}"}
    async with client.get(r.url + "/v1/models", headers=headers) as resp:
        assert [m["id"] for m in (await resp.json())["data"]] == ["tiny"]
    async with client.get(r.url + "/v1/models/other", headers=headers) as resp:
        assert resp.status == 404


async def test_over_the_request_limit_is_429_rate_limit_exceeded_with_retry_after(setup):
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(rpm=3)], removals=[])
    statuses = [(await chat(client, r))[0] for _ in range(3)]
    assert statuses == [200, 200, 200]
    status, headers, body = await chat(client, r)
    assert status == 429
    assert int(headers["Retry-After"]) == 20, "3 per minute: one back every 20 s"
    assert body["error"]["type"] == "requests" and body["error"]["code"] == "rate_limit_exceeded"
    assert "k-1" in body["error"]["message"] and "limit 3" in body["error"]["message"]


async def test_keys_of_one_owner_spend_its_budget_and_the_429_names_the_owner(setup):
    r, client = setup
    other = "sk-llmgw-test-secret-other-456789abcdefghijkl"
    keys_of(r).apply_keys(
        snapshot=True,
        upserts=[key(owner="acme/search"), key(other, id="k-2", owner="acme/search/qa")],
        removals=[],
    )
    r.app[AUTH].quotas.apply_view({}, 1, time.monotonic(), {"acme/search": KeyLimits(requests_per_minute=3)})
    statuses = [(await chat(client, r, s))[0] for s in (SECRET, other, SECRET)]
    assert statuses == [200, 200, 200]
    status, _, body = await chat(client, r, other)
    assert status == 429 and "Rate limit reached for owner acme/search (key k-2)" in body["error"]["message"]


async def test_tokens_are_charged_from_the_engines_usage_and_refuse_once_spent(setup):
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(tpm=60)], removals=[])
    status, _, body = await chat(client, r, max_tokens=8)
    assert status == 200
    used = body["usage"]["total_tokens"]
    quotas = r.app[AUTH].quotas
    assert quotas.level("k-1", "tokens", time.monotonic()) == pytest.approx(60 - used, abs=1.0)
    while (result := await chat(client, r, max_tokens=8))[0] == 200:
        pass
    status, headers, body = result
    assert status == 429 and body["error"]["type"] == "tokens" and int(headers["Retry-After"]) >= 1


async def test_without_auth_nothing_is_checked(tmp_path):
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=2, served_model_names=("sim",))
    async with SimulatorServer(settings) as sim:
        config = RouterConfig(
            listen="127.0.0.1:0", backends=[Backend(model="tiny", url=sim.url, served_name="sim")]
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            assert AUTH not in r.app
            assert (await chat(client, r, secret=None))[0] == 200


def test_a_stream_is_charged_its_estimate_plus_the_chunks_it_carried():
    transcript = Transcript(Kind.CHAT)
    transcript.record(
        b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"a"}}]}\n\n'
        b'data: {"id":"x","choices":[{"index":0,"delta":{"content":"b"}}]}\n\n'
    )
    from aiohttp import web

    assert tokens_used(web.StreamResponse(), transcript, 10) == 12
    assert tokens_used(None, Transcript(Kind.CHAT), 10) == 0, "failed before generating: nothing"
    assert tokens_used(web.Response(status=502, body=b"{}"), None, 10) == 0
    assert tokens_used(web.Response(body=b'{"usage": {"total_tokens": 33}}'), None, 10) == 33
    # The front's own answer type, as for aiohttp's.
    assert tokens_used(Answer(502, {}, b"{}"), None, 10) == 0
    assert tokens_used(Answer(200, {}, b'{"usage": {"total_tokens": 33}}'), None, 10) == 33


async def test_a_streamed_answer_is_charged_when_it_ends(setup):
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(tpm=6000)], removals=[])
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}
    headers = {"Authorization": f"Bearer {SECRET}"}
    started = time.monotonic()
    async with client.post(r.url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        raw = await resp.read()
    chunks = raw.count(b'"content":"') - raw.count(b'"content":""')
    assert chunks > 0
    estimate = len(json.dumps(body)) // 4
    now = time.monotonic()
    level = r.app[AUTH].quotas.level("k-1", "tokens", now)
    # The bucket refills at 100 tokens a second while the request runs (a slow machine takes a while).
    charged = 6000 - estimate - chunks
    assert charged - 2.0 <= level <= charged + 100 * (now - started) + 2.0
