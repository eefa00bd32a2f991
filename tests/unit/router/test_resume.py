"""Mid-stream resume: engines that die or go silent mid-stream, and a client that never notices.

The engines are real aiohttp servers on port 0 (:class:`ScriptedEngine`).
Each generates the words `` w0 w1 ... w{N-1}`` and honours a continuation
the way vLLM does: a chat whose last message is an assistant message sent
with ``continue_final_message: true`` (and ``add_generation_prompt:
false``), or a completions prompt ending in generated words, continues
after those words. A continuation that does not match what the engine
would have said produces ``MISMATCH``, so a test that checks the client's
text also checks what the router sent. Each engine has its own ``id`` and
``created``, so the tests see whether the router rewrote them.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
from aiohttp import web

from llmgw.router import sse
from llmgw.router.config import Backend, Limits, RouterConfig
from llmgw.router.resume import (
    Continuation,
    Kind,
    NotResumable,
    Rewriter,
    Transcript,
    continuation,
    request_refusal,
)

from .helpers import router

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
WORDS = re.compile(r"((?: w\d+)*)$")


def full_text(n: int) -> str:
    return "".join(f" w{i}" for i in range(n))


@dataclass
class ScriptedEngine:
    """A streaming engine that can be told to break, and records what it was asked."""

    name: str
    # Words in a whole answer.
    length: int = 8
    # After this many content chunks (counted per response), the connection is cut (-1: never).
    die_after: int = -1
    # After this many content chunks the engine sends nothing more, holding the connection (-1: never).
    hang_after: int = -1
    # Cut the connection halfway through the event after `die_after` chunks, not between events.
    die_mid_event: bool = False
    # After this many content chunks, end the body cleanly, without a finish chunk or [DONE] (-1: never).
    end_after: int = -1
    # Cut the connection after the finish chunk, before [DONE].
    die_after_finish: bool = False
    # Answer every request with this status (an OpenAI error body).
    fail_status: int = 0
    # Send headers, then close before any event.
    die_before_first_event: bool = False
    # Seconds before answering at all.
    delay: float = 0.0
    # Seconds between chunks.
    gap: float = 0.0
    # Serve vLLM's queue gauges at GET /metrics.
    metrics: bool = False
    bodies: list[dict[str, Any]] = field(default_factory=list)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    # Cleared: the engine is frozen (SIGSTOP): it answers nothing, /metrics included.
    # Reaching ``hang_after`` freezes it.
    thawed: asyncio.Event = field(default_factory=asyncio.Event)
    port: int = 0
    _runner: web.AppRunner | None = None

    def __post_init__(self) -> None:
        self.thawed.set()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def id(self) -> str:
        return f"chatcmpl-{self.name}"

    @property
    def created(self) -> int:
        return 1_700_000_000 + self.port

    async def __aenter__(self) -> ScriptedEngine:
        app = web.Application()
        app.router.add_post(CHAT, self._handle)
        app.router.add_post(COMPLETIONS, self._handle)
        if self.metrics:
            app.router.add_get("/metrics", self._metrics)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.2)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        await self.thawed.wait()
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        try:
            await self.thawed.wait()
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fail_status:
                error = {"error": {"message": f"{self.name} is failing", "type": "server_error"}}
                return web.json_response(error, status=self.fail_status)
            chat = request.path == CHAT
            start, words = self._continuation(body, chat)
            if not body.get("stream"):
                return web.json_response(self._whole(body, chat, "".join(words)))
            return await self._stream(request, body, chat, start, words)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def _continuation(self, body: dict[str, Any], chat: bool) -> tuple[int, list[str]]:
        """Where this request starts in the answer, and the words it gets."""
        if chat:
            last = body["messages"][-1]
            continuing = body.get("continue_final_message") and last["role"] == "assistant"
            if continuing and body.get("add_generation_prompt") is not False:
                raise web.HTTPBadRequest(text="continue_final_message needs add_generation_prompt false")
            already = last["content"] if continuing else ""
        else:
            already = WORDS.search(body["prompt"]).group(1)
        start = already.count(" w")
        if already != full_text(start):
            return start, [" MISMATCH"]
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or self.length
        words = [f" w{i}" for i in range(start, self.length)][:limit]
        return start, words

    def _whole(self, body: dict[str, Any], chat: bool, text: str) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {"id": self.id, "created": self.created, "model": body["model"], "choices": [choice]}

    def _chunk(
        self, body: dict[str, Any], chat: bool, delta: dict[str, Any] | str, finish: str | None
    ) -> bytes:
        if chat:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": delta, "logprobs": None, "finish_reason": finish}
            obj = "text_completion"
        event: dict[str, Any] = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": body["model"],
            "choices": [choice],
        }
        if (body.get("stream_options") or {}).get("include_usage"):
            event["usage"] = None
        return sse.encode(event)

    async def _stream(
        self, request: web.Request, body: dict[str, Any], chat: bool, start: int, words: list[str]
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.die_before_first_event:
            return self._cut(request, response)
        if chat:
            await response.write(self._chunk(body, chat, {"role": "assistant", "content": ""}, None))
        for sent, word in enumerate(words):
            if sent == self.die_after:
                if self.die_mid_event:
                    event = self._chunk(body, chat, {"content": word} if chat else word, None)
                    await response.write(event[: len(event) // 2])
                    await asyncio.sleep(0.05)
                return self._cut(request, response)
            if sent == self.end_after:
                await response.write_eof()
                return response
            if sent == self.hang_after:
                self.thawed.clear()
                await asyncio.Event().wait()
            if self.gap:
                await asyncio.sleep(self.gap)
            await response.write(self._chunk(body, chat, {"content": word} if chat else word, None))
        finish = "stop" if start + len(words) >= self.length else "length"
        await response.write(self._chunk(body, chat, {} if chat else "", finish))
        if self.die_after_finish:
            return self._cut(request, response)
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 10 + start, "completion_tokens": len(words)}
            usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
            event = {"id": self.id, "object": "x", "created": self.created, "model": body["model"]}
            await response.write(sse.encode({**event, "choices": [], "usage": usage}))
        await response.write(sse.DONE_EVENT)
        await response.write_eof()
        return response

    def _cut(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Drop the connection the way a killed engine does: no chunked-body terminator."""
        assert request.transport is not None
        request.transport.abort()
        raise asyncio.CancelledError


def standalone(*engines: ScriptedEngine, **limits: object) -> RouterConfig:
    # Priority puts the engines in order: the first is always the first choice.
    backends = [Backend(model="m", url=e.url, priority=i) for i, e in enumerate(engines)]
    return RouterConfig(listen="127.0.0.1:0", backends=backends, limits=Limits(**limits))


async def read_events(resp: aiohttp.ClientResponse) -> list[Any]:
    """Every event's data, parsed (``"[DONE]"`` kept as that string)."""
    raw = await asyncio.wait_for(resp.read(), 10)
    assert raw.endswith(b"\n\n"), raw[-80:]
    out: list[Any] = []
    for payload in sse.payloads(raw):
        out.append("[DONE]" if payload == sse.DONE else json.loads(payload))
    return out


def chat_text(events: list[Any]) -> str:
    return "".join(
        c["delta"].get("content") or "" for e in events if isinstance(e, dict) for c in e.get("choices", [])
    )


async def metric(client: aiohttp.ClientSession, base: str, line: str) -> bool:
    return line in await (await client.get(base + "/metrics")).text()


async def test_chat_stream_cut_after_k_chunks_resumes_on_another_replica_with_each_word_once():
    async with ScriptedEngine("a", die_after=3) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {
                "model": "m",
                "stream": True,
                "max_tokens": 20,
                "messages": [{"role": "user", "content": "hi"}],
            }
            async with client.post(r.url + CHAT, json=body) as resp:
                assert resp.status == 200
                assert resp.headers["x-llmgw-replica"] == "static:m:0"
                events = await read_events(resp)
            assert await metric(client, r.url, 'llmgw_router_stream_resumes_total{model="m"} 1.0')
        assert chat_text(events) == full_text(8)
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = events[:-1]
        assert {(e["id"], e["created"]) for e in chunks} == {(a.id, a.created)}
        assert sum("role" in c["delta"] for e in chunks for c in e["choices"]) == 1
        assert [c["finish_reason"] for e in chunks for c in e["choices"]].count("stop") == 1
        resumed = b.bodies[-1]
        assert resumed["messages"] == [*body["messages"], {"role": "assistant", "content": full_text(3)}]
        assert resumed["continue_final_message"] is True
        assert resumed["add_generation_prompt"] is False
        assert resumed["max_tokens"] == 17


async def test_official_openai_client_sees_one_unbroken_stream_with_whole_usage():
    async with ScriptedEngine("a", die_after=5) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r:
            client = openai.AsyncOpenAI(base_url=r.url + "/v1", api_key="k", max_retries=0)
            try:
                stream = await client.chat.completions.create(
                    model="m",
                    messages=[{"role": "user", "content": "hi"}],
                    stream=True,
                    stream_options={"include_usage": True},
                    max_completion_tokens=30,
                )
                chunks = [chunk async for chunk in stream]
            finally:
                await client.close()
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full_text(8)
    assert {c.id for c in chunks} == {a.id}
    usage = chunks[-1].usage
    assert usage is not None
    # b generated 3 of the 8 tokens; the router counts the 5 sent before the break.
    assert (usage.completion_tokens, usage.prompt_tokens) == (8, 10)
    assert b.bodies[-1]["max_completion_tokens"] == 25


async def test_completions_stream_resumes_with_the_text_appended_to_the_prompt():
    async with ScriptedEngine("a", die_after=2) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "prompt": "Count:", "max_tokens": 6}
            async with client.post(r.url + COMPLETIONS, json=body) as resp:
                events = await read_events(resp)
    text = "".join(c["text"] for e in events[:-1] for c in e["choices"])
    assert text == full_text(6)
    assert b.bodies[-1]["prompt"] == "Count:" + full_text(2)
    assert b.bodies[-1]["max_tokens"] == 4
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert {e["id"] for e in events[:-1]} == {a.id}


async def test_engine_silent_past_idle_timeout_is_resumed_and_its_request_cancelled():
    async with ScriptedEngine("a", hang_after=4) as a, ScriptedEngine("b") as b:
        config = standalone(a, b, idle_stream_timeout_seconds=0.3)
        async with router(config) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
            await asyncio.wait_for(a.cancelled.wait(), 3)
    assert chat_text(events) == full_text(8)
    assert len(b.bodies) == 1


async def test_stream_ending_cleanly_without_done_counts_as_broken_and_is_resumed():
    async with ScriptedEngine("a", end_after=4) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
    assert chat_text(events) == full_text(8)
    assert b.bodies[-1]["messages"][-1] == {"role": "assistant", "content": full_text(4)}


async def test_half_an_event_never_reaches_the_client_when_the_engine_dies_inside_it():
    async with ScriptedEngine("a", die_after=2, die_mid_event=True) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
    assert chat_text(events) == full_text(8)
    assert b.bodies[-1]["messages"][-1] == {"role": "assistant", "content": full_text(2)}


async def test_resumes_are_bounded_and_the_last_break_ends_the_stream_with_an_error_event():
    engines = [ScriptedEngine(name, die_after=1) for name in "abcd"]
    async with engines[0] as a, engines[1], engines[2], engines[3] as d:
        async with router(standalone(*engines)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
            assert await metric(client, r.url, 'llmgw_router_stream_resumes_total{model="m"} 2.0')
    # a, b and c each sent one word; two resumes are the budget, so d is never asked.
    assert chat_text(events) == full_text(3)
    assert "[DONE]" not in events
    assert events[-1]["error"]["type"] == "server_error"
    assert "mid-stream" in events[-1]["error"]["message"]
    assert {e["id"] for e in events[:-1]} == {a.id}
    assert d.bodies == []


async def test_break_after_the_finish_chunk_ends_the_stream_without_asking_for_more():
    async with ScriptedEngine("a", die_after_finish=True) as a, ScriptedEngine("b") as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
    assert chat_text(events) == full_text(8)
    assert events[-1] == "[DONE]"
    assert b.bodies == []
    assert len(a.bodies) == 1


async def test_a_replica_refusing_the_continuation_ends_the_stream_with_an_error():
    async with ScriptedEngine("a", die_after=2) as a, ScriptedEngine("b", fail_status=400) as b:
        async with router(standalone(a, b)) as r, aiohttp.ClientSession() as client:
            body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            async with client.post(r.url + CHAT, json=body) as resp:
                events = await read_events(resp)
    assert chat_text(events) == full_text(2)
    assert "answered 400 to the continuation" in events[-1]["error"]["message"]
    assert len(b.bodies) == 1


# The pure part, driven directly.


def _transcript(kind: Kind, data: dict[str, Any], *events: dict[str, Any]) -> Transcript:
    transcript = Transcript.for_request(kind, data)
    transcript.record(b"".join(sse.encode(e) for e in events))
    return transcript


def _delta(content: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": "x",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": content, **extra}}],
    }


def test_requests_that_cannot_be_resumed_say_why():
    assert request_refusal(Kind.CHAT, {"messages": [], "n": 2}) == "n=2 streams several choices"
    assert "echo" in request_refusal(Kind.COMPLETION, {"prompt": "x", "echo": True})
    assert "not text" in request_refusal(Kind.COMPLETION, {"prompt": [1, 2, 3]})
    assert request_refusal(Kind.COMPLETION, {"prompt": ["one"]}) == ""
    assert "messages" in request_refusal(Kind.CHAT, {"messages": "hi"})


def test_tool_call_deltas_make_a_stream_unresumable():
    data = {"messages": [{"role": "user", "content": "hi"}]}
    transcript = _transcript(Kind.CHAT, data, _delta("", tool_calls=[{"index": 0, "id": "t"}]))
    try:
        continuation(data, transcript)
    except NotResumable as err:
        assert "tool calls" in str(err)
    else:
        raise AssertionError("a tool-call stream was resumed")


def test_reaching_the_token_limit_ends_with_a_length_finish_instead_of_a_request():
    data = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    plan = continuation(data, _transcript(Kind.CHAT, data, _delta(" a"), _delta(" b")))
    assert plan.body is None
    events = list(sse.payloads(plan.tail))
    assert json.loads(events[0])["choices"][0]["finish_reason"] == "length"
    assert events[1] == sse.DONE


def test_a_clients_own_continued_assistant_message_is_extended_not_duplicated():
    data = {
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Once"}],
        "continue_final_message": True,
        "add_generation_prompt": False,
        "min_tokens": 5,
    }
    plan = continuation(data, _transcript(Kind.CHAT, data, _delta(" upon"), _delta(" a")))
    assert isinstance(plan, Continuation) and plan.body is not None
    assert plan.body["messages"][-1] == {"role": "assistant", "content": "Once upon a"}
    assert len(plan.body["messages"]) == 2
    assert plan.body["min_tokens"] == 3


def test_rewriter_drops_the_second_role_chunk_and_keeps_the_first_ids():
    data = {"messages": [{"role": "user", "content": "hi"}]}
    transcript = _transcript(Kind.CHAT, data, _delta(" a"))
    rewrite = Rewriter(transcript)
    role = {
        "id": "y",
        "created": 2,
        "model": "m",
        "usage": None,
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    }
    usage = {
        "id": "y",
        "created": 2,
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": 11, "completion_tokens": 1, "total_tokens": 12},
    }
    out = rewrite(
        sse.encode(role)
        + sse.encode({**_delta(" b"), "id": "y", "created": 2})
        + sse.encode(usage)
        + sse.DONE_EVENT
    )
    events = list(sse.payloads(out))
    assert len(events) == 3
    first, last = json.loads(events[0]), json.loads(events[1])
    assert (first["id"], first["created"]) == ("x", 1)
    assert first["choices"][0]["delta"] == {"content": " b"}
    assert last["usage"] == {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
    assert transcript.text == " a b" and transcript.done
