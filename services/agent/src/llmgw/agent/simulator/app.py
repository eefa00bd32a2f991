"""The simulator's HTTP layer: vLLM's OpenAI routes over an injected engine.

``OpenAIApi`` depends only on an ``EngineClient`` (declared here, where it
is used) and the settings; it validates and tokenizes, checks the context
window, and renders what the engine yields. ``build_app`` wires the real
``SimulatedEngine`` and its metrics; ``create_app`` takes any engine.

Guarantees:

- Every error leaves through ``errors.error_response`` (one middleware), so
  every 4xx/5xx has the OpenAI error shape. Everything that can be refused
  is refused before a stream's headers are sent, so a stream that starts
  only ends by finishing, by the client leaving, or by shutdown.
- ``/v1/*`` requires the bearer key when one is set; ``/health``,
  ``/version`` and ``/metrics`` stay open, as in vLLM.
- The engine's iterator is always closed (``aclosing``) when a handler ends
  for any reason, so a client that hangs up frees its sequence slot at once.
  That relies on ``handler_cancellation=True``, which ``SimulatorServer``
  sets: aiohttp then cancels the handler when the connection drops.
"""

from __future__ import annotations

import hmac
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing
from importlib import metadata
from typing import Protocol, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4, generate_latest
from pydantic import BaseModel

from llmgw.common.errors import InvalidArgument

from . import responses
from .engine import GenerationRequest, GenerationStep, SimulatedEngine
from .errors import BodyTooLarge, Unauthenticated, UnknownModel, error_response
from .lora import Adapters
from .metrics import LoadCollector, RequestMetrics
from .moreapis import MoreApis
from .protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from .realtime import RealtimeApi
from .settings import SimulatorSettings
from .tokens import chat_prompt_tokens, count_tokens, tokenize

log = logging.getLogger(__name__)

B = TypeVar("B", bound=BaseModel)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class EngineClient(Protocol):
    """What the HTTP layer needs from an engine."""

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationStep, None]: ...

    def embed(self, text: str, prompt_tokens: int, dimensions: int | None = None) -> list[float]: ...


class StreamRenderer(Protocol):
    def opening(self) -> list[dict]: ...

    def step(self, text: str, finish: str | None) -> list[dict]: ...

    def usage(self, use: dict) -> dict: ...


def build_app(settings: SimulatorSettings) -> web.Application:
    """The simulator as an aiohttp app, with its own engine and metrics registry."""
    registry = CollectorRegistry()
    engine = SimulatedEngine(settings, RequestMetrics(registry, settings.primary_model))
    registry.register(LoadCollector(settings.primary_model, engine.stats))
    return create_app(settings, engine, registry)


def create_app(
    settings: SimulatorSettings, engine: EngineClient, registry: CollectorRegistry
) -> web.Application:
    middlewares: list[Middleware] = [_error_middleware]
    if settings.api_key is not None:
        middlewares.append(_auth_middleware(settings.api_key))
    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=middlewares)
    OpenAIApi(settings, engine, registry).add_routes(app)
    return app


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except Exception as exc:  # every error, by design: this is the one mapping point
        return error_response(exc, f"{request.method} {request.path}")


def _auth_middleware(api_key: str) -> Callable[..., Awaitable[web.StreamResponse]]:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/v1" or request.path.startswith("/v1/"):
            sent = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(sent, expected):
                raise Unauthenticated(
                    "missing or wrong API key: send `Authorization: Bearer <key>` with the "
                    "key this engine was started with (--api-key)"
                )
        return await handler(request)

    return auth


def _version() -> str:
    try:
        return metadata.version("llmgw-agent")
    except metadata.PackageNotFoundError:
        # Running from a source tree that was never installed.
        return "0+unknown"


class OpenAIApi:
    def __init__(
        self, settings: SimulatorSettings, engine: EngineClient, registry: CollectorRegistry
    ) -> None:
        self._settings = settings
        self._engine = engine
        self._registry = registry
        self._version = _version()
        self._created = int(time.time())
        self._adapters = Adapters(settings.lora_modules) if settings.enable_lora else None

    def add_routes(self, app: web.Application) -> None:
        if self._adapters is not None and self._settings.runtime_lora_updating:
            self._adapters.add_routes(app)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/embeddings", self.embeddings)
        MoreApis(self._settings, self).add_routes(app)
        RealtimeApi(self, self._settings.max_body_bytes).add_routes(app)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": self._version})

    async def metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_PLAIN_0_0_4})

    async def models(self, request: web.Request) -> web.Response:
        s = self._settings
        adapters = self._adapters.loaded() if self._adapters is not None else {}
        return web.json_response(
            responses.model_list(s.served_model_names, s.model_root, s.max_model_len, self._created, adapters)
        )

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.parse(request, ChatCompletionRequest)
        model = self._check_common(body.model, body.n, body.stream, body.stream_options)
        texts = [m.text() for m in body.messages]
        prompt_tokens = chat_prompt_tokens(texts)
        prompt = "\n".join(f"{m.role}: {t}" for m, t in zip(body.messages, texts, strict=True))
        # The reply is primed with "assistant:", so the next turn's prompt, which renders this
        # reply the same way, continues exactly the token sequence this request leaves cached.
        cache_tokens = (*tokenize(prompt), "assistant", ":")
        gen = self.generation_request(
            prompt, prompt_tokens, body.token_limit, "messages", body.stop_strings(), body.seed, cache_tokens
        )
        env = responses.Envelope.new("chatcmpl", model, self._settings.weights_served)
        if body.stream:
            renderer = responses.ChatStream(env, include_usage=body.include_usage)
            return await self._stream(request, gen, renderer, body.include_usage)
        text, finish, completion_tokens = await self.collect(gen)
        use = responses.usage(prompt_tokens, completion_tokens)
        return web.json_response(responses.chat_completion(env, text, finish, use))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await self.parse(request, CompletionRequest)
        model = self._check_common(body.model, body.n, body.stream, body.stream_options)
        prompt, prompt_tokens = _completion_prompt(body.prompt)
        gen = self.generation_request(
            prompt,
            prompt_tokens,
            body.token_limit,
            "prompt",
            body.stop_strings(),
            body.seed,
            tokenize(prompt),
        )
        env = responses.Envelope.new("cmpl", model, self._settings.weights_served)
        if body.stream:
            renderer = responses.CompletionStream(env, include_usage=body.include_usage)
            return await self._stream(request, gen, renderer, body.include_usage)
        text, finish, completion_tokens = await self.collect(gen)
        use = responses.usage(prompt_tokens, completion_tokens)
        return web.json_response(responses.completion(env, text, finish, use))

    async def embeddings(self, request: web.Request) -> web.Response:
        body = await self.parse(request, EmbeddingRequest)
        model = self.check_model(body.model)
        inputs = _embedding_inputs(body.input)
        vectors, total = [], 0
        for text, tokens in inputs:
            if tokens > self._settings.max_model_len:
                raise InvalidArgument(
                    f"This model's maximum context length is {self._settings.max_model_len} "
                    f"tokens. However, an input has {tokens} tokens. Please shorten the input."
                )
            vectors.append(self._engine.embed(text, tokens, body.dimensions))
            total += tokens
        return web.json_response(responses.embeddings(model, vectors, body.encoding_format, total))

    async def parse(self, request: web.Request, model: type[B]) -> B:
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise BodyTooLarge(
                f"request body is larger than {self._settings.max_body_bytes} bytes; send a smaller request"
            ) from None
        if not raw.strip():
            raise InvalidArgument("request body is empty; send a JSON object")
        return model.model_validate_json(raw)

    def check_model(self, requested: str | None) -> str:
        model = requested or self._settings.primary_model
        if model not in self._settings.served_model_names and (
            self._adapters is None or model not in self._adapters
        ):
            raise UnknownModel(model)
        return model

    def _check_common(self, requested: str | None, n: int, stream: bool, options: object) -> str:
        model = self.check_model(requested)
        if n != 1:
            raise InvalidArgument(f"n={n} is not supported by the simulator; send n=1")
        if options is not None and not stream:
            raise InvalidArgument("stream_options can only be set when stream is true")
        return model

    def generation_request(
        self,
        prompt: str,
        prompt_tokens: int,
        requested: int | None,
        what: str,
        stop: tuple[str, ...],
        seed: int | None,
        cache_tokens: tuple[str, ...],
    ) -> GenerationRequest:
        limit = self._settings.max_model_len
        if requested is None:
            if prompt_tokens >= limit:
                raise InvalidArgument(
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"request has {prompt_tokens} input tokens. Please reduce the length of "
                    f"the input {what}."
                )
            max_tokens = limit - prompt_tokens
        elif prompt_tokens + requested > limit:
            raise InvalidArgument(
                f"This model's maximum context length is {limit} tokens. However, you "
                f"requested {prompt_tokens + requested} tokens ({prompt_tokens} in the {what}, "
                f"{requested} in the completion). Please reduce the length of the {what} "
                "or completion."
            )
        else:
            max_tokens = requested
        return GenerationRequest(
            request_id=uuid.uuid4().hex,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            stop=stop,
            seed=seed,
            cache_tokens=cache_tokens,
        )

    def steps(self, gen: GenerationRequest) -> AsyncGenerator[GenerationStep, None]:
        return self._engine.generate(gen)

    async def collect(self, gen: GenerationRequest) -> tuple[str, str, int]:
        parts: list[str] = []
        finish, completion_tokens = "stop", 0
        async with aclosing(self._engine.generate(gen)) as steps:
            async for step in steps:
                parts.append(step.text)
                completion_tokens = step.completion_tokens
                if step.finish_reason is not None:
                    finish = step.finish_reason
        return "".join(parts), finish, completion_tokens

    async def _stream(
        self,
        request: web.Request,
        gen: GenerationRequest,
        renderer: StreamRenderer,
        include_usage: bool,
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        completion_tokens = 0
        try:
            for payload in renderer.opening():
                await resp.write(responses.sse(payload))
            async with aclosing(self._engine.generate(gen)) as steps:
                async for step in steps:
                    completion_tokens = step.completion_tokens
                    for payload in renderer.step(step.text, step.finish_reason):
                        await resp.write(responses.sse(payload))
            if include_usage:
                use = responses.usage(gen.prompt_tokens, completion_tokens)
                await resp.write(responses.sse(renderer.usage(use)))
            await resp.write(responses.DONE)
            await resp.write_eof()
        except ConnectionResetError:
            # The client left between two writes; the engine already saw the
            # iterator closed and counted the request as aborted.
            log.info("client left stream %s after %d tokens", gen.request_id, completion_tokens)
        return resp


def _completion_prompt(prompt: str | list[str] | list[int] | list[list[int]]) -> tuple[str, int]:
    if isinstance(prompt, str):
        return prompt, count_tokens(prompt)
    if not prompt:
        raise InvalidArgument("prompt must not be empty")
    if all(isinstance(x, int) for x in prompt):
        return " ".join(str(x) for x in prompt), len(prompt)
    if len(prompt) != 1:
        raise InvalidArgument(
            f"prompt holds {len(prompt)} prompts; the simulator answers one prompt per "
            "request, so send them separately"
        )
    only = prompt[0]
    if isinstance(only, str):
        return only, count_tokens(only)
    if isinstance(only, list):
        return " ".join(str(x) for x in only), len(only)
    raise InvalidArgument("prompt must be a string, a list of strings, or token lists, not a mix")


def _embedding_inputs(
    data: str | list[str] | list[int] | list[list[int]],
) -> list[tuple[str, int]]:
    if isinstance(data, str):
        return [(data, count_tokens(data))]
    if not data:
        raise InvalidArgument("input must not be empty")
    if all(isinstance(x, int) for x in data):
        return [(" ".join(str(x) for x in data), len(data))]
    out = []
    for item in data:
        if isinstance(item, str):
            out.append((item, count_tokens(item)))
        elif isinstance(item, list):
            out.append((" ".join(str(x) for x in item), len(item)))
        else:
            raise InvalidArgument("input must be a string, a list of strings, or token lists, not a mix")
    return out
