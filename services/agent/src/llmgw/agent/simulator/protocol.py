"""OpenAI request bodies the simulator accepts (pydantic, the HTTP edge).

Tolerant like the OpenAI API and vLLM: unknown fields (temperature, top_p,
logprobs, tools, user, ...) are accepted and have no effect, so any client
or benchmark that talks to vLLM talks to the simulator. Fields that matter
are type-checked, and a wrong one is a 400 naming the field.

``model`` is optional, as in vLLM: missing means the primary served name.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field


class OpenAIBody(BaseModel):
    model_config = ConfigDict(extra="allow")


class StreamOptions(OpenAIBody):
    include_usage: bool = False


class TextPart(OpenAIBody):
    type: str
    text: str | None = None


class ChatMessage(OpenAIBody):
    role: str
    # None for assistant turns that only carry tool calls; parts for multimodal content.
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return " ".join(p.text for p in self.content if p.text)


class _GenerationBody(OpenAIBody):
    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stop: str | list[str] | None = None
    seed: int | None = None

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return tuple(s for s in stops if s)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatCompletionRequest(_GenerationBody):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    # The newer name for max_tokens; wins when both are sent, as in vLLM.
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class CompletionRequest(_GenerationBody):
    # A string, a list holding one string, or token ids; batches of prompts are refused.
    prompt: str | list[str] | list[int] | list[list[int]]

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens


class EmbeddingRequest(OpenAIBody):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1, le=65536)] | None = None
