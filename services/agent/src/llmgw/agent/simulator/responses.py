"""OpenAI response objects and SSE framing, as plain dicts and bytes.

Shapes follow the OpenAI API as vLLM emits it. Streams:

- chat: a first chunk with ``delta.role = "assistant"`` and empty content,
  one chunk per generated token with ``delta.content``, then a chunk with an
  empty delta and the ``finish_reason``;
- completions: one chunk per token with ``text``, then one with empty text
  and the ``finish_reason`` (the same split as chat, so both end alike);
- with ``stream_options.include_usage``: every chunk above carries
  ``"usage": null`` and a last chunk with empty ``choices`` carries the usage;
- then ``data: [DONE]``.

One request keeps one id and one ``created`` across its chunks.
"""

from __future__ import annotations

import base64
import json
import struct
import time
import uuid
from dataclasses import dataclass

DONE = b"data: [DONE]\n\n"


def sse(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


@dataclass(frozen=True)
class Envelope:
    """What every object of one response shares."""

    id: str
    created: int
    model: str
    # OpenAI's system_fingerprint ("the backend configuration"): the weights served, when given.
    fingerprint: str | None = None

    @classmethod
    def new(cls, prefix: str, model: str, fingerprint: str | None = None) -> Envelope:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), model, fingerprint)

    def wrap(self, obj: str, **fields: object) -> dict:
        out = {"id": self.id, "object": obj, "created": self.created, "model": self.model}
        if self.fingerprint is not None:
            out["system_fingerprint"] = self.fingerprint
        return out | fields


def chat_completion(env: Envelope, text: str, finish: str, use: dict) -> dict:
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish,
    }
    return env.wrap("chat.completion", choices=[choice], usage=use)


def completion(env: Envelope, text: str, finish: str, use: dict) -> dict:
    choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
    return env.wrap("text_completion", choices=[choice], usage=use)


class ChatStream:
    """Renders one chat completion as ``chat.completion.chunk`` objects."""

    def __init__(self, env: Envelope, *, include_usage: bool) -> None:
        self._env = env
        self._extra = {"usage": None} if include_usage else {}

    def _chunk(self, delta: dict, finish: str | None) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return self._env.wrap("chat.completion.chunk", choices=[choice], **self._extra)

    def opening(self) -> list[dict]:
        return [self._chunk({"role": "assistant", "content": ""}, None)]

    def step(self, text: str, finish: str | None) -> list[dict]:
        out = [self._chunk({"content": text}, None)] if text else []
        if finish is not None:
            out.append(self._chunk({}, finish))
        return out

    def usage(self, use: dict) -> dict:
        return self._env.wrap("chat.completion.chunk", choices=[], usage=use)


class CompletionStream:
    """Renders one text completion as streamed ``text_completion`` objects."""

    def __init__(self, env: Envelope, *, include_usage: bool) -> None:
        self._env = env
        self._extra = {"usage": None} if include_usage else {}

    def _chunk(self, text: str, finish: str | None) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return self._env.wrap("text_completion", choices=[choice], **self._extra)

    def opening(self) -> list[dict]:
        return []

    def step(self, text: str, finish: str | None) -> list[dict]:
        out = [self._chunk(text, None)] if text else []
        if finish is not None:
            out.append(self._chunk("", finish))
        return out

    def usage(self, use: dict) -> dict:
        return self._env.wrap("text_completion", choices=[], usage=use)


def embeddings(model: str, vectors: list[list[float]], encoding: str, prompt_tokens: int) -> dict:
    data = [
        {"object": "embedding", "index": i, "embedding": _encode(v, encoding)} for i, v in enumerate(vectors)
    ]
    return {
        "id": f"embd-{uuid.uuid4().hex}",
        "object": "list",
        "created": int(time.time()),
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _encode(vector: list[float], encoding: str) -> list[float] | str:
    if encoding == "base64":
        # OpenAI's base64 format: little-endian float32, what the official client decodes.
        return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
    return vector


def model_list(
    names: tuple[str, ...],
    root: str,
    max_model_len: int,
    created: int,
    adapters: dict[str, str] | None = None,
) -> dict:
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llmgw-simulator",
            "root": root,
            "parent": None,
            "max_model_len": max_model_len,
        }
        for name in names
    ]
    # vLLM lists each LoRA adapter with the base model as its parent.
    data += [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "llmgw-simulator",
            "root": path,
            "parent": names[0],
            "max_model_len": max_model_len,
        }
        for name, path in (adapters or {}).items()
    ]
    return {"object": "list", "data": data}
