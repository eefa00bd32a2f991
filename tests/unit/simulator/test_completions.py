"""Text completions, /v1/models and the open informational routes."""

from __future__ import annotations

import json

from .support import openai_client, read_sse


async def test_non_streaming_completion_returns_text_and_usage(start_simulator):
    sim = await start_simulator(output_tokens=7)
    async with openai_client(sim) as client:
        reply = await client.completions.create(model="simulated-model", prompt="Once upon a time")
    assert reply.object == "text_completion"
    (choice,) = reply.choices
    assert choice.finish_reason == "stop"
    assert choice.text.startswith(" ")
    assert len(choice.text.split()) == 7
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (4, 7)
    assert reply.usage.total_tokens == 11


async def test_completion_accepts_token_id_prompts_and_counts_each_id(start_simulator):
    sim = await start_simulator()
    async with openai_client(sim) as client:
        reply = await client.completions.create(model="simulated-model", prompt=[101, 102, 103], max_tokens=2)
    assert reply.usage.prompt_tokens == 3
    assert reply.usage.completion_tokens == 2
    assert reply.choices[0].finish_reason == "length"


async def test_streaming_completion_sends_one_chunk_per_token_then_finish_and_done(start_simulator, http):
    sim = await start_simulator(output_tokens=4)
    body = {"prompt": "hi", "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(sim.url + "/v1/completions", json=body) as resp:
        events = await read_sse(resp)
    assert events[-1] == "[DONE]"
    *tokens, finish, usage = [json.loads(e) for e in events[:-1]]
    assert [t["choices"][0]["finish_reason"] for t in tokens] == [None] * 4
    assert all(t["choices"][0]["text"].startswith(" ") for t in tokens)
    assert finish["choices"][0] == {"index": 0, "text": "", "logprobs": None, "finish_reason": "stop"}
    assert usage["usage"] == {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}


async def test_several_prompts_in_one_completion_request_are_refused_with_400(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/completions", json={"prompt": ["a", "b"]}) as resp:
        assert resp.status == 400
        assert "one prompt per request" in (await resp.json())["error"]["message"]


async def test_models_lists_every_served_name_with_max_model_len(start_simulator):
    sim = await start_simulator(
        served_model_names=("primary", "alias"), model="/weights/llama", max_model_len=2048
    )
    async with openai_client(sim) as client:
        page = await client.models.list()
    assert [m.id for m in page.data] == ["primary", "alias"]
    for m in page.data:
        assert m.object == "model"
        assert m.owned_by == "llmgw-simulator"
        extra = m.model_dump()
        assert extra["max_model_len"] == 2048
        assert extra["root"] == "/weights/llama"


async def test_health_is_empty_200_and_version_is_reported(start_simulator, http):
    sim = await start_simulator()
    async with http.get(sim.url + "/health") as resp:
        assert resp.status == 200
        assert await resp.read() == b""
    async with http.get(sim.url + "/version") as resp:
        assert resp.status == 200
        assert isinstance((await resp.json())["version"], str)
