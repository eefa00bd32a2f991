"""Chat completions: the stream's chunk order and usage, the non-streaming object, limits."""

from __future__ import annotations

import json

from .support import openai_client, read_sse

HELLO = [{"role": "user", "content": "Hello, world!"}]
# "Hello, world!" is 4 tokens, plus 3 for the message and 3 to prime the reply.
HELLO_PROMPT_TOKENS = 10


async def test_streaming_chat_with_include_usage_sends_role_then_tokens_then_finish_then_usage_then_done(
    start_simulator, http
):
    sim = await start_simulator(output_tokens=5, served_model_names=("sim",))
    body = {
        "model": "sim",
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = await read_sse(resp)

    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "sim" for c in chunks)
    first, *tokens, finish, usage = chunks
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len(tokens) == 5
    for chunk in tokens:
        (choice,) = chunk["choices"]
        assert set(choice["delta"]) == {"content"}
        assert choice["delta"]["content"].startswith(" ")
        assert choice["finish_reason"] is None
        assert chunk["usage"] is None
    assert finish["choices"][0]["delta"] == {}
    assert finish["choices"][0]["finish_reason"] == "stop"
    assert usage["choices"] == []
    assert usage["usage"] == {
        "prompt_tokens": HELLO_PROMPT_TOKENS,
        "completion_tokens": 5,
        "total_tokens": HELLO_PROMPT_TOKENS + 5,
    }


async def test_streaming_chat_without_include_usage_has_no_usage_chunk(start_simulator, http):
    sim = await start_simulator(output_tokens=3)
    body = {"messages": HELLO, "stream": True}
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        events = await read_sse(resp)
    chunks = [json.loads(e) for e in events[:-1]]
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_openai_client_streams_chat_and_max_tokens_caps_with_length(start_simulator):
    sim = await start_simulator(output_tokens=20)
    async with openai_client(sim) as client:
        stream = await client.chat.completions.create(
            model="simulated-model",
            messages=HELLO,
            max_tokens=4,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage.completion_tokens == 4
    assert len(text.split()) == 4


async def test_non_streaming_chat_returns_full_message_and_usage(start_simulator):
    sim = await start_simulator(output_tokens=6)
    async with openai_client(sim) as client:
        reply = await client.chat.completions.create(model="simulated-model", messages=HELLO)
    assert reply.object == "chat.completion"
    (choice,) = reply.choices
    assert choice.message.role == "assistant"
    assert len(choice.message.content.split()) == 6
    assert choice.finish_reason == "stop"
    assert reply.usage.prompt_tokens == HELLO_PROMPT_TOKENS
    assert reply.usage.completion_tokens == 6
    assert reply.usage.total_tokens == HELLO_PROMPT_TOKENS + 6


async def test_max_completion_tokens_caps_the_reply_like_max_tokens(start_simulator):
    sim = await start_simulator(output_tokens=10)
    async with openai_client(sim) as client:
        reply = await client.chat.completions.create(
            model="simulated-model", messages=HELLO, max_completion_tokens=3
        )
    assert reply.usage.completion_tokens == 3
    assert reply.choices[0].finish_reason == "length"


async def test_same_prompt_and_seed_give_the_same_text_and_another_prompt_differs(start_simulator):
    sim = await start_simulator(output_tokens=12)
    async with openai_client(sim) as client:

        async def ask(content: str, seed: int | None = None) -> str:
            reply = await client.chat.completions.create(
                model="simulated-model", messages=[{"role": "user", "content": content}], seed=seed
            )
            return reply.choices[0].message.content

        first = await ask("tell me a story")
        assert await ask("tell me a story") == first
        assert await ask("tell me another story") != first
        assert await ask("tell me a story", seed=7) != first


async def test_model_answers_to_every_served_name(start_simulator):
    sim = await start_simulator(served_model_names=("primary", "alias"))
    async with openai_client(sim) as client:
        reply = await client.chat.completions.create(model="alias", messages=HELLO)
    assert reply.model == "alias"


async def test_stop_string_ends_the_reply_early_with_finish_stop(start_simulator):
    sim = await start_simulator(output_tokens=30)
    async with openai_client(sim) as client:
        full = await client.chat.completions.create(model="simulated-model", messages=HELLO)
        full_text = full.choices[0].message.content
        stop = " " + full_text.split()[5]
        cut = await client.chat.completions.create(model="simulated-model", messages=HELLO, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].message.content == full_text[: full_text.index(stop)]
    assert cut.usage.completion_tokens < 30


async def test_prompt_plus_max_tokens_over_max_model_len_is_400(start_simulator, http):
    sim = await start_simulator(max_model_len=20)
    body = {"messages": HELLO, "max_tokens": 11}
    async with http.post(sim.url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["type"] == "BadRequestError"
    assert "maximum context length is 20 tokens" in error["message"]
    assert "21 tokens (10 in the messages, 11 in the completion)" in error["message"]


async def test_n_greater_than_one_is_refused_with_400(start_simulator, http):
    sim = await start_simulator()
    async with http.post(sim.url + "/v1/chat/completions", json={"messages": HELLO, "n": 2}) as resp:
        assert resp.status == 400
        assert "n=2" in (await resp.json())["error"]["message"]


async def test_the_weights_given_are_the_answers_system_fingerprint_and_none_without(start_simulator):
    # A bare hub id with vLLM's --revision (a cache path comes without one).
    sim = await start_simulator(model="org/tiny", revision="v2")
    async with openai_client(sim) as client:
        reply = await client.chat.completions.create(model="simulated-model", messages=HELLO)
        stream = await client.chat.completions.create(model="simulated-model", messages=HELLO, stream=True)
        fingerprints = {chunk.system_fingerprint async for chunk in stream}
        text = await client.completions.create(model="simulated-model", prompt="hi")
    assert reply.system_fingerprint == "org/tiny@v2" == text.system_fingerprint
    assert fingerprints == {"org/tiny@v2"}, "every chunk says which weights stream it"
    local = await start_simulator(model="/models/tiny-v2")
    async with openai_client(local) as client:
        reply = await client.chat.completions.create(model="simulated-model", messages=HELLO)
    assert reply.system_fingerprint == "/models/tiny-v2"
    plain = await start_simulator()
    async with openai_client(plain) as client:
        reply = await client.chat.completions.create(model="simulated-model", messages=HELLO)
    assert reply.system_fingerprint is None
