"""Every API of the path table through one in-process router in front of a real simulator:
the path table itself, each stream's last event, the catalog's API check (400 before any
engine is asked), Anthropic's x-api-key, and keys on the paths outside /v1/."""

from __future__ import annotations

import io
import json
import time
import wave

import aiohttp
import openai
import pytest
from aiohttp import web

from llmgw.agent.simulator import SimulatorServer, SimulatorSettings
from llmgw.router import errors
from llmgw.router.apis import API_NAMES, PATHS, stream_ended
from llmgw.router.app import AUTH, METRICS
from llmgw.router.config import Backend, RouterConfig, StaticModel
from llmgw.router.proxy import PROXY_PATHS
from llmgw.router.resume import Kind

from .engines import FakeEngine
from .helpers import router, serve_app
from .test_auth import SECRET, key, keys_of, setup  # noqa: F401 (setup: a fixture)

# One body per path: what a client of that API sends.
BODIES: dict[str, dict] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/completions": {"prompt": "hi", "max_tokens": 3},
    "/v1/embeddings": {"input": "hi"},
    "/v1/responses": {"input": "hi", "max_output_tokens": 3},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    "/v1/messages/count_tokens": {"messages": [{"role": "user", "content": "Hello, world!"}]},
    "/v1/rerank": {"query": "cats", "documents": ["dogs", "cats", "birds"]},
    "/v2/rerank": {"query": "cats", "documents": ["dogs", "cats"]},
    "/v1/score": {"text_1": "cats", "text_2": ["dogs", "cats"]},
    "/pooling": {"input": "hi"},
    "/classify": {"input": ["good", "bad"]},
    "/tokenize": {"prompt": "the of and"},
    "/detokenize": {"tokens": [0, 1, 2]},
}

# Uploads (multipart/form-data), tested with the openai client below.
FORMS = {"/v1/audio/transcriptions", "/v1/audio/translations"}

# Answered through ComfyUI (tests/unit/router/test_images.py, tests/integration/test_comfyui.py).
IMAGES = {"/v1/images/generations"}

STREAMED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages")


def test_the_path_table_is_what_the_router_serves_and_its_404_names():
    assert set(PROXY_PATHS) == set(PATHS) == set(BODIES) | FORMS | IMAGES
    assert {p for p, a in PATHS.items() if a.form} == FORMS
    assert {p for p, a in PATHS.items() if a.images} == IMAGES
    for path in PATHS:
        assert path in errors.API_PATHS
    # Only chat and completions streams resume (docs/router.md says why).
    assert {p for p, a in PATHS.items() if a.resume} == {"/v1/chat/completions", "/v1/completions"}
    assert PATHS["/v1/chat/completions"].resume is Kind.CHAT


def test_the_catalog_names_apis_as_the_router_does():
    from typing import get_args

    from llmgw.control.spec.model import ApiName

    assert set(get_args(ApiName)) == set(API_NAMES)


def test_each_api_stream_ends_with_its_own_last_event():
    chat, responses, messages = (PATHS[p] for p in ("/v1/chat/completions", "/v1/responses", "/v1/messages"))
    assert stream_ended(b'data: {"x":1}\n\ndata: [DONE]\n\n', chat)
    assert not stream_ended(b'data: {"x":1}\n\n', chat)
    done = b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n'
    assert stream_ended(done, responses)
    assert stream_ended(b'data: {"type":"response.incomplete"}\n\n', responses)
    delta = b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta"}\n\n'
    assert not stream_ended(delta, responses)
    assert stream_ended(b'event: message_stop\ndata: {"type":"message_stop"}\n\n', messages)
    assert not stream_ended(b'event: content_block_delta\ndata: {"type":"content_block_delta"}\n\n', messages)
    assert not stream_ended(b"event: message_stop\ndata: {not json\n\n", responses)


@pytest.fixture
async def routed():
    settings = SimulatorSettings(ttft_ms=1, itl_ms=1, output_tokens=8, served_model_names=("sim",))
    async with SimulatorServer(settings) as sim:
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="m", url=sim.url, served_name="sim")],
            models=[StaticModel(name="reranker", apis=["rerank", "score"])],
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            yield r, client


@pytest.mark.parametrize("path", list(BODIES))
async def test_every_path_is_routed_by_the_model_in_its_body(routed, path):
    r, client = routed
    async with client.post(r.url + path, json={"model": "m", **BODIES[path]}) as resp:
        body = await resp.json()
        assert resp.status == 200, body
        assert resp.headers["x-llmgw-replica"] == "static:m:0"
        assert resp.headers["x-llmgw-model"] == "m"
    async with client.post(r.url + path, json={"model": "nope", **BODIES[path]}) as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("path", STREAMED)
async def test_each_stream_is_relayed_to_its_last_event_and_counted(routed, path):
    r, client = routed
    body = {"model": "m", "stream": True, **BODIES[path]}
    async with client.post(r.url + path, json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        text = await resp.read()
    assert stream_ended(text, PATHS[path]), text[-300:]
    assert b'"error": {' not in text and b"event: error" not in text


@pytest.mark.parametrize(
    ("path", "event", "error"),
    [
        ("/v1/responses", b"event: response.created\ndata: {}\n\n", b'data: {"error": {'),
        ("/v1/messages", b"event: message_start\ndata: {}\n\n", b'event: error\ndata: {"type": "error"'),
    ],
)
async def test_a_stream_that_stops_before_its_last_event_ends_with_an_error_event_of_its_api(
    path, event, error
):
    async def broken(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(event)
        await resp.write_eof()  # no response.completed / message_stop
        return resp

    app = web.Application()
    app.router.add_post(path, broken)
    runner, url = await serve_app(app)
    try:
        config = RouterConfig(listen="127.0.0.1:0", backends=[Backend(model="m", url=url)])
        async with router(config) as r, aiohttp.ClientSession() as client:
            async with client.post(r.url + path, json={"model": "m", "stream": True}) as resp:
                assert resp.status == 200
                text = await resp.read()
    finally:
        await runner.cleanup()
    assert text.startswith(event)
    assert error in text
    assert b"without its last event" in text


async def test_a_model_that_does_not_serve_an_api_is_refused_400_naming_what_it_serves():
    async with FakeEngine() as engine:
        config = RouterConfig(
            listen="127.0.0.1:0",
            backends=[Backend(model="reranker", url=engine.url)],
            models=[StaticModel(name="reranker", apis=["rerank", "score"])],
        )
        async with router(config) as r, aiohttp.ClientSession() as client:
            body = {"model": "reranker", "messages": []}
            async with client.post(r.url + "/v1/chat/completions", json=body) as resp:
                assert resp.status == 400
                error = (await resp.json())["error"]
            assert error["code"] == "api_not_supported"
            assert error["param"] == "model"
            assert "chat" in error["message"] and "rerank, score" in error["message"]
            assert engine.seen == []  # refused before any engine was asked
            async with client.get(r.url + "/v1/models") as resp:
                listed = {m["id"]: m["apis"] for m in (await resp.json())["data"]}
            assert listed["reranker"] == ["rerank", "score"]


def test_unknown_apis_in_a_static_model_are_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="unknown apis"):
        StaticModel(name="x", apis=["chat", "speech"])


@pytest.fixture
async def keyed(setup):  # noqa: F811 (test_auth's fixture)
    """test_auth's router (model ``tiny`` on a simulator, keys on) with one key."""
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key()], removals=[])
    return r, client


async def test_messages_accept_the_anthropic_x_api_key_header_and_chat_does_not(keyed):
    r, client = keyed
    messages = {"model": "tiny", **BODIES["/v1/messages"]}
    async with client.post(r.url + "/v1/messages", json=messages, headers={"x-api-key": SECRET}) as resp:
        assert resp.status == 200, await resp.text()
    async with client.post(r.url + "/v1/messages", json=messages, headers={"x-api-key": "sk-wrong"}) as resp:
        assert resp.status == 401
    chat = {"model": "tiny", **BODIES["/v1/chat/completions"]}
    async with client.post(r.url + "/v1/chat/completions", json=chat, headers={"x-api-key": SECRET}) as resp:
        assert resp.status == 401


@pytest.mark.parametrize("path", [p for p in PATHS if not p.startswith("/v1/")])
async def test_paths_outside_v1_need_a_key_too(keyed, path):
    r, client = keyed
    body = {"model": "tiny", **BODIES[path]}
    async with client.post(r.url + path, json=body) as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "invalid_api_key"
    async with client.post(r.url + path, json=body, headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        assert resp.status == 200


def wav(seconds: float = 0.1) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(8000)
        w.writeframes(b"\0\0" * int(8000 * seconds))
    return out.getvalue()


async def test_audio_uploads_are_routed_by_their_model_field_with_the_openai_client(routed):
    r, _ = routed
    # Closed in this test's loop: a client left to the collector closes in another test's.
    async with openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="unused", max_retries=0) as client:
        await _transcribe(client)


async def _transcribe(client: openai.AsyncOpenAI) -> None:
    audio = wav()
    # The router's "m" is the engine's "sim": the form's model field is rewritten on the way.
    text = await client.audio.transcriptions.create(model="m", file=("a.wav", audio))
    assert text.text == f"The simulated transcription of {len(audio)} bytes of audio."
    translated = await client.audio.translations.create(model="m", file=("a.wav", audio))
    assert translated.text == text.text
    plain = await client.audio.transcriptions.create(model="m", file=("a.wav", audio), response_format="text")
    assert plain.strip() == text.text
    with pytest.raises(openai.NotFoundError):
        await client.audio.transcriptions.create(model="nope", file=("a.wav", audio))


async def test_a_bad_upload_is_a_400_saying_what_to_fix(routed):
    r, client = routed
    url = r.url + "/v1/audio/transcriptions"
    async with client.post(url, json={"model": "m"}) as resp:
        assert resp.status == 400
        assert "multipart/form-data" in (await resp.json())["error"]["message"]
    form = aiohttp.FormData()
    form.add_field("file", wav(), filename="a.wav")
    async with client.post(url, data=form) as resp:
        assert resp.status == 400
        assert (await resp.json())["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("path", "limit"), [("/v1/responses", "max_output_tokens"), ("/v1/messages", "max_tokens")]
)
async def test_a_key_is_charged_a_streams_own_usage_not_its_estimate(setup, path, limit):  # noqa: F811
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(tpm=6000)], removals=[])
    # Padding no engine reads: the estimate from the body's size is far from the usage.
    body = {"model": "tiny", **BODIES[path], limit: 3, "stream": True, "metadata": {"pad": "x" * 800}}
    started = time.monotonic()
    async with client.post(r.url + path, json=body, headers={"Authorization": f"Bearer {SECRET}"}) as resp:
        assert resp.status == 200
        raw = await resp.read()
    used = json.loads(raw.rstrip().rsplit(b"data: ", 1)[1] if path == "/v1/responses" else b"{}")
    total = used["response"]["usage"]["total_tokens"] if used else None
    if total is None:  # Messages: input_tokens and output_tokens of the message_delta event
        delta = next(
            json.loads(line[6:]) for line in raw.decode().splitlines() if '"type":"message_delta"' in line
        )
        total = delta["usage"]["input_tokens"] + delta["usage"]["output_tokens"]
    assert total < 20 < len(json.dumps(body)) // 4
    now = time.monotonic()
    level = r.app[AUTH].quotas.level("k-1", "tokens", now)
    assert 6000 - total - 2.0 <= level <= 6000 - total + 100 * (now - started) + 2.0


async def test_stored_response_routes_are_counted_and_limited_like_other_requests(setup):  # noqa: F811
    r, client = setup
    keys_of(r).apply_keys(snapshot=True, upserts=[key(rpm=3, tpm=6000)], removals=[])
    bearer = {"Authorization": f"Bearer {SECRET}"}
    body = {"model": "tiny", **BODIES["/v1/responses"]}
    async with client.post(r.url + "/v1/responses", json=body, headers=bearer) as resp:
        assert resp.status == 200
        made = await resp.json()
        replica = resp.headers["x-llmgw-replica"]
    requests = r.app[METRICS].requests
    before = requests.labels("tiny", "200", replica).value
    quotas = r.app[AUTH].quotas
    tokens = quotas.level("k-1", "tokens", time.monotonic())
    stored = r.url + "/v1/responses/" + made["id"]
    async with client.get(stored, headers=bearer) as resp:
        assert resp.status == 200
        assert (await resp.json())["usage"]["total_tokens"] > 0
    # Counted under the stored response's model and replica, like the request that made it.
    assert requests.labels("tiny", "200", replica).value == before + 1
    # Nothing was generated: the usage it shows is not charged again (the bucket only refilled).
    assert quotas.level("k-1", "tokens", time.monotonic()) >= tokens
    async with client.delete(stored, headers=bearer) as resp:
        assert resp.status == 200
    # The fourth request of the minute is over the key's rate, a stored response's route too.
    async with client.get(stored, headers=bearer) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"]
        assert (await resp.json())["error"]["code"] == "rate_limit_exceeded"
    assert requests.labels("tiny", "429", replica).value == 1
    async with client.get(r.url + "/v1/responses/resp_forged.x", headers=bearer) as resp:
        assert resp.status == 404
    assert requests.labels("", "404", "").value == 1
