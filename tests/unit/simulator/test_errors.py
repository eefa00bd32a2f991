"""Every refusal has vLLM's OpenAI error shape and says what is wrong."""

from __future__ import annotations

import io
import json
import logging

import openai
import pytest

from tests.support.rawhttp import exchange

from .support import openai_client

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


async def test_unknown_model_is_404_with_vllm_error_shape(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/chat/completions", json={**CHAT, "model": "x"}) as resp:
        assert resp.status == 404
        body = await resp.json()
    assert body == {
        "error": {
            "message": "The model `x` does not exist.",
            "type": "NotFoundError",
            "param": "model",
            "code": 404,
        }
    }


async def test_openai_client_sees_unknown_model_as_not_found(start_simulator):
    sim = await start_simulator()
    async with openai_client(sim) as client:
        with pytest.raises(openai.NotFoundError, match="does not exist"):
            await client.completions.create(model="x", prompt="hi")


async def test_api_key_missing_or_wrong_is_401_and_right_key_passes(start_simulator, http):
    sim = await start_simulator(api_key="s3cret")
    url = sim.url + "/v1/chat/completions"
    async with http.post(url, json=CHAT) as resp:
        assert resp.status == 401
        error = (await resp.json())["error"]
    assert error["type"] == "AuthenticationError"
    assert error["code"] == 401
    assert "Authorization: Bearer" in error["message"]
    async with http.get(sim.url + "/v1/models", headers={"Authorization": "Bearer wrong"}) as resp:
        assert resp.status == 401

    async with openai_client(sim, api_key="wrong") as client:
        with pytest.raises(openai.AuthenticationError):
            await client.models.list()
    async with openai_client(sim, api_key="s3cret") as client:
        assert [m.id for m in (await client.models.list()).data] == ["simulated-model"]


async def test_health_and_metrics_stay_open_when_an_api_key_is_set(start_simulator, http):
    sim = await start_simulator(api_key="s3cret")
    for path in ("/health", "/metrics", "/version"):
        async with http.get(sim.url + path) as resp:
            assert resp.status == 200, path


async def test_invalid_json_is_400_saying_so(start_simulator, http):
    sim = await start_simulator()
    async with http.post(
        sim.url + "/v1/chat/completions",
        data=b'{"messages": [',
        headers={"Content-Type": "application/json"},
    ) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "BadRequestError"
    assert "not valid JSON" in error["message"]


async def test_missing_field_and_wrong_type_are_400_naming_the_field(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/chat/completions", json={"model": "simulated-model"}) as resp:
        assert resp.status == 400
        assert "messages: Field required" in (await resp.json())["error"]["message"]
    async with http.post(sim.url + "/v1/chat/completions", json={**CHAT, "max_tokens": "many"}) as resp:
        assert resp.status == 400
        assert "max_tokens" in (await resp.json())["error"]["message"]
    async with http.post(sim.url + "/v1/completions", json={"prompt": 5}) as resp:
        assert resp.status == 400
        assert "prompt" in (await resp.json())["error"]["message"]


async def test_empty_body_is_400(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/completions", data=b"") as resp:
        assert resp.status == 400
        assert "empty" in (await resp.json())["error"]["message"]


async def test_unknown_fields_are_accepted_like_openai(start_simulator, http):
    sim = await start_simulator()
    body = {**CHAT, "temperature": 0.2, "top_p": 0.9, "logit_bias": {}, "user": "u1", "x_custom": 1}
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200


async def test_body_over_4_mib_is_413_with_openai_shape(start_simulator, http):
    sim = await start_simulator()
    big = b'{"prompt": "' + b"a" * (4 * 1024 * 1024 + 1) + b'"}'
    async with http.post(
        sim.url + "/v1/completions", data=io.BytesIO(big), headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 413
        error = (await resp.json())["error"]
    assert error["code"] == 413
    assert "larger than 4194304 bytes" in error["message"]


async def test_unknown_route_and_wrong_method_have_openai_shape(start_simulator, http):
    sim = await start_simulator()
    async with http.get(sim.url + "/v1/nope") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["message"] == "Not Found: GET /v1/nope"
    async with http.get(sim.url + "/v1/chat/completions") as resp:
        assert resp.status == 405
        assert (await resp.json())["error"]["type"] == "MethodNotAllowedError"


async def test_stream_options_without_stream_is_400(start_simulator, http):
    sim = await start_simulator()
    body = {**CHAT, "stream_options": {"include_usage": True}}
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 400


async def test_bytes_aiohttp_cannot_parse_get_the_openai_shape_and_no_traceback(start_simulator, caplog):
    sim = await start_simulator()
    request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 9000 + b"\r\n\r\n"
    answer = await exchange(sim.port, request)  # the answer, then the simulator closes
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400", answer[:300]  # HTTP/1.0: aiohttp answers so
    error = json.loads(body)["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    assert error["message"].startswith("malformed HTTP request")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
