"""The simulator's other vLLM APIs: Responses, Anthropic Messages, rerank, score, pooling, tokenize.

Enough of each for a gateway to be tested through it with the official
clients, deterministic so tests can assert on answers:

- **Responses** (``POST /v1/responses``): ``input`` (a string or a list of
  messages) and ``instructions`` make the prompt, ``max_output_tokens``
  bounds the answer; streamed as typed events (``event: response.created``
  ... ``response.output_text.delta`` ... ``response.completed``, each with a
  ``sequence_number``), with no ``[DONE]``, as OpenAI and vLLM send them.
  Answers are stored (``store``, default true) in a bounded in-memory table
  (the last :data:`STORED_RESPONSES`), as vLLM does: ``GET
  /v1/responses/{id}`` returns one, ``DELETE`` forgets it, ``POST
  .../cancel`` answers it as it is (nothing runs in the background here),
  and ``previous_response_id`` puts its input and output before the new
  input; an unknown id is a 404.
- **Messages** (``POST /v1/messages``, Anthropic's shape): ``system`` and
  ``messages`` make the prompt, ``max_tokens`` is required; streamed as
  ``message_start``, ``content_block_start``, ``ping``,
  ``content_block_delta`` per token, ``content_block_stop``,
  ``message_delta`` (stop reason and usage) and ``message_stop``.
  ``/v1/messages/count_tokens`` answers ``{"input_tokens": n}``.
- **Rerank** (``/v1/rerank``, ``/v2/rerank``) and **score** (``/v1/score``):
  a pair's score is ``(1 + cos) / 2`` of the two texts' simulated
  embeddings, so the same pair always scores the same; rerank sorts by it.
- **Pooling** and **classify**: the input's embedding, and two classes
  whose probabilities come from it.
- **Audio** (``/v1/audio/transcriptions``, ``/v1/audio/translations``, a
  multipart upload with ``file`` and ``model``): a fixed sentence naming the
  file's size, ``{"text": ...}`` (or plain text with
  ``response_format=text``); the file must be a WAV (``RIFF``...``WAVE``).
- **Tokenize** / **detokenize**: a word of the generation vocabulary is its
  index there, any other token ``1000 + crc32 % 100000``; detokenize maps
  ids back through the vocabulary (ids past it are ``<unk>``), so a
  generated text round-trips.

Errors are the simulator's OpenAI-shaped ones (:mod:`.errors`), for every
path: vLLM answers its Anthropic endpoint's errors the same way.
"""

from __future__ import annotations

import json
import logging
import math
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from typing import Any, Protocol, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from llmgw.common.errors import InvalidArgument, NotFound

from .engine import GenerationRequest, GenerationStep
from .settings import SimulatorSettings
from .tokens import VOCABULARY, count_tokens, embedding, tokenize

log = logging.getLogger(__name__)

EMBEDDING_DIM = 32
STORED_RESPONSES = 1024
B = TypeVar("B", bound=BaseModel)
_UNKNOWN_BASE = 1000


class Generator(Protocol):
    """What these APIs need of the simulator's OpenAI layer (:class:`.app.OpenAIApi`)."""

    async def parse(self, request: web.Request, model: type[B]) -> B: ...
    def check_model(self, requested: str | None) -> str: ...
    def generation_request(
        self,
        prompt: str,
        prompt_tokens: int,
        requested: int | None,
        what: str,
        stop: tuple[str, ...],
        seed: int | None,
        cache_tokens: tuple[str, ...],
    ) -> GenerationRequest: ...
    async def collect(self, gen: GenerationRequest) -> tuple[str, str, int]: ...
    def steps(self, gen: GenerationRequest) -> AsyncGenerator[GenerationStep, None]: ...


class _Body(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str | None = None


class ResponsesRequest(_Body):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    previous_response_id: str | None = None
    store: bool = True
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False


class MessagesRequest(_Body):
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int = Field(ge=1)
    stream: bool = False


class CountTokensRequest(_Body):
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None


class RerankRequest(_Body):
    query: str
    documents: list[str] = Field(min_length=1)
    top_n: int | None = Field(default=None, ge=1)


class ScoreRequest(_Body):
    text_1: str | list[str]
    text_2: str | list[str]


class InputRequest(_Body):
    input: str | list[str]


class TokenizeRequest(_Body):
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None


class DetokenizeRequest(_Body):
    tokens: list[int]


def _text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict) and "text" in p)
    return ""


def _messages_prompt(system: str | None, messages: list[dict[str, Any]]) -> tuple[str, int]:
    lines = [f"system: {system}"] if system else []
    lines += [f"{m.get('role', 'user')}: {_text(m.get('content'))}" for m in messages]
    prompt = "\n".join(lines)
    return prompt, count_tokens(prompt)


def token_id(token: str) -> int:
    word = token.strip()
    if word in _VOCAB_INDEX:
        return _VOCAB_INDEX[word]
    return _UNKNOWN_BASE + zlib.crc32(word.encode()) % 100_000


_VOCAB_INDEX = {w: i for i, w in enumerate(VOCABULARY)}


def _sse(event: str, payload: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: ".encode() + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class MoreApis:
    def __init__(self, settings: SimulatorSettings, generator: Generator) -> None:
        self._settings = settings
        self._gen = generator
        # Stored responses, oldest first: id -> (the prompt it answered, the response object).
        self._stored: OrderedDict[str, tuple[str, dict[str, Any]]] = OrderedDict()

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/responses", self.responses)
        app.router.add_get("/v1/responses/{id}", self.stored)
        app.router.add_delete("/v1/responses/{id}", self.forget)
        app.router.add_post("/v1/responses/{id}/cancel", self.stored)
        app.router.add_post("/v1/messages", self.messages)
        app.router.add_post("/v1/messages/count_tokens", self.count_tokens)
        app.router.add_post("/v1/audio/transcriptions", self.transcribe)
        app.router.add_post("/v1/audio/translations", self.transcribe)
        app.router.add_post("/v1/rerank", self.rerank)
        app.router.add_post("/v2/rerank", self.rerank)
        app.router.add_post("/v1/score", self.score)
        app.router.add_post("/pooling", self.pooling)
        app.router.add_post("/classify", self.classify)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_post("/detokenize", self.detokenize)

    def _vector(self, text: str) -> list[float]:
        return embedding(self._settings.seed, text, EMBEDDING_DIM)

    def _similarity(self, a: str, b: str) -> float:
        cos = sum(x * y for x, y in zip(self._vector(a), self._vector(b), strict=True))
        return round((1 + cos) / 2, 6)

    # --- Responses ---------------------------------------------------------------

    async def responses(self, request: web.Request) -> web.StreamResponse:
        body: ResponsesRequest = await self._gen.parse(request, ResponsesRequest)
        model = self._gen.check_model(body.model)
        if isinstance(body.input, str):
            prompt, prompt_tokens = _messages_prompt(
                body.instructions, [{"role": "user", "content": body.input}]
            )
        else:
            prompt, prompt_tokens = _messages_prompt(body.instructions, body.input)
        gen = self._gen.generation_request(
            prompt, prompt_tokens, body.max_output_tokens, "input", (), None, tokenize(prompt)
        )
        rid, mid, created = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}", int(time.time())

        def response(status: str, text: str | None, use: dict[str, Any] | None) -> dict[str, Any]:
            output = [] if text is None else [_output_message(mid, text, status)]
            return {
                "id": rid, "object": "response", "created_at": created, "status": status, "model": model,
                "output": output, "usage": use, "error": None, "incomplete_details": None,
                "instructions": body.instructions, "metadata": {}, "parallel_tool_calls": True,
                "temperature": 1.0, "top_p": 1.0, "tool_choice": "auto", "tools": [],
                "text": {"format": {"type": "text"}}, "truncation": "disabled",
            }  # fmt: skip

        def usage(output_tokens: int) -> dict[str, Any]:
            return {
                "input_tokens": prompt_tokens, "output_tokens": output_tokens,
                "total_tokens": prompt_tokens + output_tokens,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            }  # fmt: skip

        def store(answer: dict[str, Any]) -> dict[str, Any]:
            if body.store:
                self._stored[rid] = (prompt, answer)
                while len(self._stored) > STORED_RESPONSES:
                    self._stored.popitem(last=False)
            return answer

        if not body.stream:
            text, _, produced = await self._gen.collect(gen)
            return web.json_response(store(response("completed", text, usage(produced))))
        resp = await _open_stream(request)
        try:
            await self._responses_stream(resp, gen, lambda *a: store(response(*a)), usage, mid)
        except ConnectionResetError:
            log.info("client left Responses stream %s", gen.request_id)
        return resp

    async def _responses_stream(
        self,
        resp: web.StreamResponse,
        gen: GenerationRequest,
        response: Callable[[str, str | None, dict[str, Any] | None], dict[str, Any]],
        usage: Callable[[int], dict[str, Any]],
        mid: str,
    ) -> None:
        seq = 0

        async def send(kind: str, **fields: Any) -> None:
            nonlocal seq
            await resp.write(_sse(kind, {"type": kind, "sequence_number": seq, **fields}))
            seq += 1

        at = {"item_id": mid, "output_index": 0, "content_index": 0}
        await send("response.created", response=response("in_progress", None, None))
        await send("response.in_progress", response=response("in_progress", None, None))
        await send("response.output_item.added", output_index=0, item=_output_message(mid, "", "in_progress"))
        await send("response.content_part.added", **at, part=_output_text(""))
        parts: list[str] = []
        produced = 0
        async with aclosing(self._gen.steps(gen)) as steps:
            async for step in steps:
                parts.append(step.text)
                produced = step.completion_tokens
                await send("response.output_text.delta", **at, delta=step.text, logprobs=[])
        text = "".join(parts)
        await send("response.output_text.done", **at, text=text, logprobs=[])
        await send("response.content_part.done", **at, part=_output_text(text))
        await send("response.output_item.done", output_index=0, item=_output_message(mid, text, "completed"))
        await send("response.completed", response=response("completed", text, usage(produced)))
        await resp.write_eof()

    def _lookup(self, response_id: str) -> tuple[str, dict[str, Any]]:
        found = self._stored.get(response_id)
        if found is None:
            raise NotFound(f"Response with id {response_id!r} not found.")
        return found

    async def stored(self, request: web.Request) -> web.Response:
        return web.json_response(self._lookup(request.match_info["id"])[1])

    async def forget(self, request: web.Request) -> web.Response:
        response_id = request.match_info["id"]
        self._lookup(response_id)
        del self._stored[response_id]
        return web.json_response({"id": response_id, "object": "response.deleted", "deleted": True})

    # --- Anthropic Messages ------------------------------------------------------

    async def messages(self, request: web.Request) -> web.StreamResponse:
        body: MessagesRequest = await self._gen.parse(request, MessagesRequest)
        model = self._gen.check_model(body.model)
        prompt, prompt_tokens = _messages_prompt(_text(body.system), body.messages)
        gen = self._gen.generation_request(
            prompt, prompt_tokens, body.max_tokens, "messages", (), None, tokenize(prompt)
        )
        mid = f"msg_{uuid.uuid4().hex}"

        def message(content: list[dict[str, Any]], stop: str | None, output_tokens: int) -> dict[str, Any]:
            return {
                "id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": stop, "stop_sequence": None,
                "usage": {"input_tokens": prompt_tokens, "output_tokens": output_tokens},
            }  # fmt: skip

        if not body.stream:
            text, finish, produced = await self._gen.collect(gen)
            return web.json_response(
                message([{"type": "text", "text": text}], _stop_reason(finish), produced)
            )
        resp = await _open_stream(request)
        try:
            await self._messages_stream(resp, gen, message, prompt_tokens)
        except ConnectionResetError:
            log.info("client left Messages stream %s", gen.request_id)
        return resp

    async def _messages_stream(
        self,
        resp: web.StreamResponse,
        gen: GenerationRequest,
        message: Callable[[list[dict[str, Any]], str | None, int], dict[str, Any]],
        prompt_tokens: int,
    ) -> None:
        async def send(kind: str, **fields: Any) -> None:
            await resp.write(_sse(kind, {"type": kind, **fields}))

        await send("message_start", message=message([], None, 1))
        await send("content_block_start", index=0, content_block={"type": "text", "text": ""})
        await send("ping")
        finish, produced = "stop", 0
        async with aclosing(self._gen.steps(gen)) as steps:
            async for step in steps:
                produced = step.completion_tokens
                finish = step.finish_reason or finish
                await send("content_block_delta", index=0, delta={"type": "text_delta", "text": step.text})
        await send("content_block_stop", index=0)
        await send(
            "message_delta",
            delta={"stop_reason": _stop_reason(finish), "stop_sequence": None},
            usage={"input_tokens": prompt_tokens, "output_tokens": produced},
        )
        await send("message_stop")
        await resp.write_eof()

    async def count_tokens(self, request: web.Request) -> web.Response:
        body: CountTokensRequest = await self._gen.parse(request, CountTokensRequest)
        self._gen.check_model(body.model)
        _, prompt_tokens = _messages_prompt(_text(body.system), body.messages)
        return web.json_response({"input_tokens": prompt_tokens})

    # --- Audio -------------------------------------------------------------------

    async def transcribe(self, request: web.Request) -> web.Response:
        if not request.content_type.startswith("multipart/"):
            raise InvalidArgument("send the audio as a multipart/form-data upload with `file` and `model`")
        form = await request.post()
        upload = form.get("file")
        if not isinstance(upload, web.FileField):
            raise InvalidArgument("`file` is required: the audio file, as a form upload")
        audio = upload.file.read()
        if audio[:4] != b"RIFF" or audio[8:12] != b"WAVE":
            raise InvalidArgument("`file` is not a WAV file; the simulator transcribes WAV only")
        model = form.get("model")
        self._gen.check_model(model if isinstance(model, str) else None)
        text = f"The simulated transcription of {len(audio)} bytes of audio."
        if form.get("response_format") == "text":
            return web.Response(text=text + "\n", content_type="text/plain")
        return web.json_response({"text": text})

    # --- Rerank, score, pooling, classify ----------------------------------------

    async def rerank(self, request: web.Request) -> web.Response:
        body: RerankRequest = await self._gen.parse(request, RerankRequest)
        model = self._gen.check_model(body.model)
        results = [
            {"index": i, "document": {"text": doc}, "relevance_score": self._similarity(body.query, doc)}
            for i, doc in enumerate(body.documents)
        ]
        results.sort(key=lambda r: -float(r["relevance_score"]))  # type: ignore[arg-type]
        tokens = sum(count_tokens(body.query) + count_tokens(d) for d in body.documents)
        return web.json_response(
            {
                "id": f"rerank-{uuid.uuid4().hex}",
                "model": model,
                "usage": {"total_tokens": tokens},
                "results": results[: body.top_n] if body.top_n else results,
            }
        )

    async def score(self, request: web.Request) -> web.Response:
        body: ScoreRequest = await self._gen.parse(request, ScoreRequest)
        model = self._gen.check_model(body.model)
        lefts = [body.text_1] if isinstance(body.text_1, str) else body.text_1
        rights = [body.text_2] if isinstance(body.text_2, str) else body.text_2
        if len(lefts) == 1:
            lefts = lefts * len(rights)
        if len(lefts) != len(rights) or not rights:
            raise InvalidArgument("text_1 must be one text, or as many texts as text_2")
        data = [
            {"index": i, "object": "score", "score": self._similarity(a, b)}
            for i, (a, b) in enumerate(zip(lefts, rights, strict=True))
        ]
        tokens = sum(count_tokens(a) + count_tokens(b) for a, b in zip(lefts, rights, strict=True))
        return web.json_response(_list_answer("score", model, data, tokens))

    def _inputs(self, body: InputRequest) -> list[str]:
        inputs = [body.input] if isinstance(body.input, str) else body.input
        if not inputs:
            raise InvalidArgument("input must not be empty")
        return inputs

    async def pooling(self, request: web.Request) -> web.Response:
        body: InputRequest = await self._gen.parse(request, InputRequest)
        model = self._gen.check_model(body.model)
        inputs = self._inputs(body)
        data = [{"index": i, "object": "pooling", "data": self._vector(t)} for i, t in enumerate(inputs)]
        return web.json_response(_list_answer("pooling", model, data, sum(map(count_tokens, inputs))))

    async def classify(self, request: web.Request) -> web.Response:
        body: InputRequest = await self._gen.parse(request, InputRequest)
        model = self._gen.check_model(body.model)
        inputs = self._inputs(body)
        data = []
        for i, text in enumerate(inputs):
            positive = 1 / (1 + math.exp(-4 * self._vector(text)[0]))
            probs = [round(1 - positive, 6), round(positive, 6)]
            label = "positive" if positive >= 0.5 else "negative"
            data.append({"index": i, "object": "classify", "label": label, "probs": probs, "num_classes": 2})
        return web.json_response(_list_answer("classify", model, data, sum(map(count_tokens, inputs))))

    # --- Tokenize ----------------------------------------------------------------

    async def tokenize(self, request: web.Request) -> web.Response:
        body: TokenizeRequest = await self._gen.parse(request, TokenizeRequest)
        self._gen.check_model(body.model)
        if body.prompt is not None:
            text = body.prompt
        elif body.messages is not None:
            text, _ = _messages_prompt(None, body.messages)
        else:
            raise InvalidArgument("send `prompt` (a string) or `messages` to tokenize")
        ids = [token_id(t) for t in tokenize(text)]
        return web.json_response(
            {"count": len(ids), "max_model_len": self._settings.max_model_len, "tokens": ids}
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        body: DetokenizeRequest = await self._gen.parse(request, DetokenizeRequest)
        self._gen.check_model(body.model)
        words = [VOCABULARY[i] if 0 <= i < len(VOCABULARY) else "<unk>" for i in body.tokens]
        return web.json_response({"prompt": "".join(" " + w for w in words)})


def _output_text(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": []}


def _output_message(mid: str, text: str, status: str) -> dict[str, Any]:
    content = [_output_text(text)] if text or status == "completed" else []
    return {"type": "message", "id": mid, "status": status, "role": "assistant", "content": content}


def _stop_reason(finish: str) -> str:
    return "max_tokens" if finish == "length" else "end_turn"


def _list_answer(kind: str, model: str, data: list[dict[str, Any]], tokens: int) -> dict[str, Any]:
    return {
        "id": f"{kind}-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0},
    }


async def _open_stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    return resp
