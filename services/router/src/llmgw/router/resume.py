"""Resuming a broken stream: what the client was sent, and how to go on from it.

A streamed chat or text completion that breaks mid-way (the engine killed,
the connection reset, the engine silent past the idle timeout) is re-issued
on another replica with what was already generated, and the client sees one
unbroken stream. This module is the pure part of that: no I/O, so tests
call it directly.

- :class:`Transcript` is what the client has been sent, as far as a resume
  needs it: the generated text, how many tokens that was, the first chunk's
  ``id``/``created``/``model``, whether a ``finish_reason`` or ``[DONE]``
  went out. On the hot path it only *keeps* the forwarded bytes
  (:meth:`Transcript.record` is one buffer append); they are parsed when a
  resume needs them, or in batches once they pass :data:`FOLD_BYTES`, so a
  stream that never breaks costs one JSON parse per ``FOLD_BYTES`` of
  events at most and a short one costs none.
- :func:`continuation` turns the original request and the transcript into
  the request that continues it. Chat: the partial text becomes a final
  assistant message with ``continue_final_message: true`` and
  ``add_generation_prompt: false`` (vLLM's names; a client's own trailing
  assistant message being continued is extended instead). Completions: the
  text is appended to the prompt. ``max_tokens`` / ``max_completion_tokens``
  (and vLLM's ``min_tokens``) shrink by the tokens already produced.
- :class:`Rewriter` makes a resumed attempt's events look like the rest of
  the first one: the original ``id``, ``created`` and ``model``; no second
  role chunk; usage counted over the whole response.

Decisions:

- **Tokens produced** are the content chunks counted (one chunk is one token
  for vLLM and the simulator, an estimate elsewhere), or the engine's own
  ``usage.completion_tokens`` when it streams usage per chunk.
- **Usage on a resumed stream** adds the tokens produced before the resume
  to ``completion_tokens`` and takes them off ``prompt_tokens`` (the resumed
  engine read them as prompt), leaving ``total_tokens`` as the engine said.
- **Not resumable**, so a break ends the stream with an error event as
  before: ``n`` > 1 (several choices interleave), ``echo`` (the resumed
  prompt would be echoed again), a completions prompt that is not a string
  (token ids cannot take text appended), a chat whose ``messages`` is not a
  list, a delta carrying tool calls or reasoning (continuing half a tool
  call is not something engines promise), an engine error event, or a chunk
  the router cannot read.
- **Already finished**: when a ``finish_reason`` went out, only the tail of
  the stream was lost; the router ends it with ``[DONE]`` rather than ask
  for more text. When the tokens produced reach the request's limit, it
  ends it with a ``finish_reason: "length"`` chunk and ``[DONE]``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from . import sse

# Forwarded bytes kept unparsed before they are folded into the text.
FOLD_BYTES = 64 * 1024

CHAT_LIMITS = ("max_tokens", "max_completion_tokens")
COMPLETION_LIMITS = ("max_tokens",)
# Delta fields that make a chat stream unresumable when they carry anything.
_UNRESUMABLE_DELTA = ("tool_calls", "function_call", "reasoning_content", "reasoning")


class Kind(Enum):
    CHAT = "chat"
    COMPLETION = "completion"


class NotResumable(Exception):
    """This stream cannot be continued elsewhere; the message says why."""


def request_refusal(kind: Kind, data: dict[str, Any]) -> str:
    """Why a request's stream could never be resumed ("" when it could)."""
    n = data.get("n")
    if n is not None and n != 1:
        return f"n={n} streams several choices"
    if data.get("echo"):
        return "echo would repeat the prompt"
    if kind is Kind.CHAT:
        messages = data.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return "messages is not a list of objects"
    else:
        prompt = data.get("prompt")
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        ):
            return "the prompt is not text"
    return ""


@dataclass
class Transcript:
    """What one client has been sent of one streamed response."""

    kind: Kind
    # Set once the stream cannot be resumed, saying why.
    refusal: str = ""
    envelope: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False
    counted_tokens: int = 0
    usage_tokens: int | None = None
    _parts: list[str] = field(default_factory=list)
    _raw: bytearray = field(default_factory=bytearray)

    @classmethod
    def for_request(cls, kind: Kind, data: dict[str, Any]) -> Transcript:
        return cls(kind, refusal=request_refusal(kind, data))

    def record(self, events: bytes) -> None:
        """Remember events the client was sent (whole events, as forwarded)."""
        if self.refusal:
            return
        self._raw += events
        if len(self._raw) >= FOLD_BYTES:
            self.fold()

    def fold(self) -> None:
        """Parse what :meth:`record` kept into the text and flags."""
        raw, self._raw = bytes(self._raw), bytearray()
        for payload in sse.payloads(raw):
            if self.refusal:
                return
            if payload == sse.DONE:
                self.done = True
                continue
            try:
                obj = json.loads(payload)
            except ValueError:
                self.refusal = "the engine sent an event that is not JSON"
                return
            self.observe(obj)

    def observe(self, obj: object) -> None:
        """Account for one parsed chunk the client was sent."""
        try:
            self._observe(obj)
        except (AttributeError, TypeError):
            self.refusal = "the engine sent a chunk of an unexpected shape"

    def _observe(self, obj: Any) -> None:
        if "error" in obj:
            self.refusal = "the engine reported an error mid-stream"
            return
        if self.envelope is None and "id" in obj:
            self.envelope = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        for choice in obj.get("choices") or ():
            if choice.get("index", 0) != 0:
                self.refusal = "the stream has several choices"
                return
            if self.kind is Kind.CHAT:
                delta = choice.get("delta") or {}
                if any(delta.get(name) for name in _UNRESUMABLE_DELTA):
                    self.refusal = "the stream carries tool calls or reasoning"
                    return
                text = delta.get("content")
            else:
                text = choice.get("text")
            if text:
                self._parts.append(text)
                self.counted_tokens += 1
            if choice.get("finish_reason") is not None:
                self.finish_reason = choice["finish_reason"]
        usage = obj.get("usage")
        if usage and isinstance(usage.get("completion_tokens"), int):
            self.usage_tokens = usage["completion_tokens"]

    @property
    def text(self) -> str:
        self.fold()
        return "".join(self._parts)

    @property
    def produced(self) -> int:
        """Tokens generated so far (the engine's count when it streamed one)."""
        self.fold()
        return self.usage_tokens if self.usage_tokens is not None else self.counted_tokens


@dataclass(frozen=True)
class Continuation:
    """How to go on: a request to send, or (``body`` None) events that end the stream."""

    body: dict[str, Any] | None
    tail: bytes = b""


def continuation(data: dict[str, Any], transcript: Transcript) -> Continuation:
    """The request that continues ``data`` after what ``transcript`` holds.

    Raises :class:`NotResumable` saying why when it cannot be continued.
    """
    transcript.fold()
    if transcript.refusal:
        raise NotResumable(transcript.refusal)
    if transcript.done:
        return Continuation(None)
    if transcript.finish_reason is not None:
        return Continuation(None, sse.DONE_EVENT)
    produced = transcript.produced
    body = dict(data)
    limits = CHAT_LIMITS if transcript.kind is Kind.CHAT else COMPLETION_LIMITS
    for key in limits:
        limit = data.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool):
            if limit - produced <= 0:
                return Continuation(None, _length_finish(transcript) + sse.DONE_EVENT)
            body[key] = limit - produced
    min_tokens = data.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool):
        body["min_tokens"] = max(0, min_tokens - produced)
    text = transcript.text
    if not text:
        return Continuation(body)
    if transcript.kind is Kind.CHAT:
        messages = list(data["messages"])
        last = messages[-1] if messages else None
        if (
            data.get("continue_final_message")
            and isinstance(last, dict)
            and last.get("role") == "assistant"
            and isinstance(last.get("content"), str)
        ):
            messages[-1] = {**last, "content": last["content"] + text}
        else:
            messages.append({"role": "assistant", "content": text})
        body.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    else:
        prompt = data["prompt"]
        body["prompt"] = prompt + text if isinstance(prompt, str) else [prompt[0] + text]
    return Continuation(body)


def _length_finish(transcript: Transcript) -> bytes:
    envelope = transcript.envelope or {}
    if transcript.kind is Kind.CHAT:
        choice: dict[str, Any] = {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}
        obj = "text_completion"
    return sse.encode({**envelope, "object": obj, "choices": [choice]})


class Rewriter:
    """Rewrites a resumed attempt's events to continue the client's stream.

    Every event is parsed (a resumed attempt is rare; its cost does not
    matter), rewritten, re-encoded, and accounted in the transcript so a
    second break can be resumed too. Events it cannot read pass unchanged
    and make the stream unresumable.
    """

    def __init__(self, transcript: Transcript) -> None:
        self._transcript = transcript
        self._before = transcript.produced

    def __call__(self, events: bytes) -> bytes:
        out: list[bytes] = []
        for payload in sse.payloads(events):
            if payload == sse.DONE:
                self._transcript.done = True
                out.append(sse.DONE_EVENT)
                continue
            try:
                obj = json.loads(payload)
                keep = self._rewrite(obj)
            except (ValueError, AttributeError, TypeError):
                self._transcript.refusal = "the engine sent a chunk of an unexpected shape"
                out.append(b"data: " + payload + b"\n\n")
                continue
            if keep:
                self._transcript.observe(obj)
                out.append(sse.encode(obj))
        return b"".join(out)

    def _rewrite(self, obj: Any) -> bool:
        """Rewrite ``obj`` in place; False when it should be dropped."""
        if "error" in obj:
            return True
        envelope = self._transcript.envelope or {}
        for key, value in envelope.items():
            if key in obj:
                obj[key] = value
        role_only = False
        for choice in obj.get("choices") or ():
            delta = choice.get("delta")
            if isinstance(delta, dict) and "role" in delta:
                del delta["role"]
                role_only = not any(delta.values()) and choice.get("finish_reason") is None
        usage = obj.get("usage")
        if usage:
            if isinstance(usage.get("completion_tokens"), int):
                usage["completion_tokens"] += self._before
            if isinstance(usage.get("prompt_tokens"), int):
                usage["prompt_tokens"] = max(0, usage["prompt_tokens"] - self._before)
        return not (role_only and not usage)
