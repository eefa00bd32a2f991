"""The simulated engine: admission, timing and token generation, no HTTP.

Plays the part of vLLM's ``AsyncLLM``: the serving layer hands it a
request whose prompt is already tokenized and limits already checked, and
iterates the steps it yields.

Guarantees:

- A request waits (FIFO) for one of ``max_num_seqs`` slots, then sleeps
  ``ttft_ms`` plus ``prefill_us_per_token`` for every prompt token the
  prefix cache does not hold (prefill), yields its first token, and sleeps
  ``itl_ms`` before each later one. Every step carries exactly one generated token's
  text (possibly cut short by a stop string).
- A request's natural length is ``output_tokens``; ``max_tokens`` below
  that cuts it short with finish reason ``length``, otherwise it ends with
  ``stop``. A stop string found in the output ends it with ``stop``; text
  from earlier steps that began the stop string has already been yielded
  (the simulator does not hold text back the way vLLM's detokenizer does).
- The slot and the KV tokens a request holds are released however the
  iteration ends: finished, cancelled (client hung up) or closed early.
  Callers must close the iterator (``contextlib.aclosing``) so the release
  happens at once rather than at garbage collection.
- KV cache usage is tokens held by running sequences (prompt plus tokens
  generated so far) over ``max_num_seqs * max_model_len``: the share of the
  worst-case cache the configured limits imply, which moves with both load
  and sequence length like vLLM's block usage does.
- Timing is measured from arrival (before queueing), as vLLM measures it.
- Prefix cache (:mod:`.prefixcache`): looked up when the slot is granted
  (``prefix_cache(queried=prompt tokens, hit=cached tokens)`` goes to the
  observer), the prompt's blocks stored once prefill is done, the generated
  tokens' blocks when the sequence ends however it ends. Concurrent
  prefills do not slow each other down (a real GPU batches them; the
  simulator charges each its own uncached tokens).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from .prefixcache import PrefixCache, block_hashes
from .settings import SimulatorSettings
from .slots import SequenceSlots
from .tokens import TokenSource, embedding


class EngineObserver(Protocol):
    """What the engine reports as requests progress (the metrics implement it)."""

    def first_token(self, *, prompt_tokens: int, seconds_since_arrival: float) -> None: ...

    def generated_token(self) -> None: ...

    def finished(self, *, reason: str, seconds_since_arrival: float) -> None: ...

    def embedded(self, *, prompt_tokens: int) -> None: ...

    def prefix_cache(self, *, queried: int, hit: int) -> None: ...


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str
    # The text that seeds the deterministic output; not re-tokenized here.
    prompt: str
    prompt_tokens: int
    # Upper bound on generated tokens, already clamped to the context window.
    max_tokens: int | None
    stop: tuple[str, ...] = ()
    seed: int | None = None
    # The prompt as the prefix cache sees it: tokens in order (empty: nothing to cache).
    cache_tokens: tuple[str, ...] = ()


@dataclass(frozen=True)
class GenerationStep:
    text: str
    # Set on the last step only: "stop" or "length".
    finish_reason: str | None
    completion_tokens: int


@dataclass(frozen=True)
class EngineStats:
    running: int
    waiting: int
    kv_cache_usage: float


class SimulatedEngine:
    def __init__(self, settings: SimulatorSettings, observer: EngineObserver | None = None) -> None:
        self._settings = settings
        self._observer = observer
        self._slots = SequenceSlots(settings.max_num_seqs)
        self._tokens_held = 0
        self._kv_capacity = settings.max_num_seqs * settings.max_model_len
        self._prefix_cache = PrefixCache(settings.prefix_cache_blocks, settings.block_size)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=self._slots.running,
            waiting=self._slots.waiting,
            kv_cache_usage=min(1.0, self._tokens_held / self._kv_capacity),
        )

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationStep, None]:
        arrival = time.monotonic()
        natural = self._settings.output_tokens
        if request.max_tokens is not None and request.max_tokens < natural:
            total, reason = request.max_tokens, "length"
        else:
            total, reason = natural, "stop"
        finish: str = "abort"
        held = 0
        acquired = False
        generated: list[str] = []
        prompt_blocks: list[bytes] = []
        try:
            await self._slots.acquire()
            acquired = True
            held = request.prompt_tokens
            self._tokens_held += held
            prompt_blocks = block_hashes(request.cache_tokens, self._prefix_cache.block_size)
            cached = self._prefix_cache.lookup(prompt_blocks, request.prompt_tokens)
            if self._observer is not None:
                self._observer.prefix_cache(queried=request.prompt_tokens, hit=cached)
            uncached = max(0, request.prompt_tokens - cached)
            prefill_ms = self._settings.ttft_ms + uncached * self._settings.prefill_us_per_token / 1000
            await asyncio.sleep(prefill_ms / 1000)
            self._prefix_cache.store(prompt_blocks)
            if self._observer is not None:
                self._observer.first_token(
                    prompt_tokens=request.prompt_tokens,
                    seconds_since_arrival=time.monotonic() - arrival,
                )
            text = ""
            words = iter(TokenSource(self._settings.seed, request.seed, request.prompt))
            for index in range(total):
                if index > 0:
                    await asyncio.sleep(self._settings.itl_ms / 1000)
                piece = next(words)
                generated.append(piece.strip())
                held += 1
                self._tokens_held += 1
                if self._observer is not None:
                    self._observer.generated_token()
                cut = _stop_index(text, piece, request.stop)
                if cut is not None:
                    finish = "stop"
                    yield GenerationStep(piece[:cut], "stop", index + 1)
                    return
                text += piece
                last = index == total - 1
                if last:
                    finish = reason
                yield GenerationStep(piece, reason if last else None, index + 1)
        finally:
            if generated:
                tokens = (*request.cache_tokens, *generated)
                self._prefix_cache.store(block_hashes(tokens, self._prefix_cache.block_size))
            self._tokens_held -= held
            if acquired:
                self._slots.release()
            if self._observer is not None:
                self._observer.finished(reason=finish, seconds_since_arrival=time.monotonic() - arrival)

    def embed(self, text: str, prompt_tokens: int, dimensions: int | None = None) -> list[float]:
        if self._observer is not None:
            self._observer.embedded(prompt_tokens=prompt_tokens)
        return embedding(self._settings.seed, text, dimensions or self._settings.embedding_dim)


def _stop_index(text: str, piece: str, stops: tuple[str, ...]) -> int | None:
    """Where in ``piece`` the output must end, if appending it completes a stop string.

    Returns how many characters of ``piece`` to keep (0 when the stop string
    began in text already yielded).
    """
    if not stops:
        return None
    candidate = text + piece
    best: int | None = None
    for stop in stops:
        # Only matches that end inside the new piece are new.
        start = max(0, len(text) - len(stop) + 1)
        found = candidate.find(stop, start)
        if found != -1 and (best is None or found < best):
            best = found
    if best is None:
        return None
    return max(0, best - len(text))
