"""The simulator's stand-in for a tokenizer and a model's weights.

Guarantees:

- ``count_tokens`` is deterministic and cheap: one token per run of word
  characters and one per punctuation mark (``"Hello, world!"`` is 4).
- ``chat_prompt_tokens`` adds OpenAI's documented chat overhead: 3 tokens
  per message plus 3 to prime the reply, so one user message "Hello, world!"
  counts 10.
- ``TokenSource`` yields the same words for the same (server seed, request
  seed, prompt), from a fixed vocabulary of plain lowercase words, each with
  a leading space. Each word is one token, and ``count_tokens`` of a
  generated text equals the number of tokens generated, so a reply fed back
  as a prompt counts the same.
- ``tokenize`` returns the tokens ``count_tokens`` counts; generated words
  tokenize to themselves, so an answer sent back in the next prompt matches
  the tokens the engine generated (prefix-cache hits across turns).
- ``embedding`` is a deterministic unit vector for a text.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Iterable, Iterator

_TOKEN = re.compile(r"\w+|[^\w\s]")

TOKENS_PER_MESSAGE = 3
TOKENS_REPLY_PRIMING = 3

VOCABULARY = (
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "with", "was", "on",
    "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an",
    "they", "which", "one", "you", "were", "all", "we", "when", "there", "can", "more",
    "if", "no", "out", "so", "said", "what", "up", "its", "about", "into", "than", "them",
    "only", "other", "new", "some", "could", "time", "these", "two", "may", "then", "do",
    "first", "any", "my", "now", "such", "like", "our", "over", "man", "me", "even",
    "most", "made", "after", "also", "did", "many", "before", "must", "through", "back",
    "years", "where", "much", "your", "way", "well", "down", "should", "because", "each",
    "just", "those", "people", "how", "too", "little", "state", "good", "very", "make",
    "world", "still", "own", "see", "men", "work", "long", "get", "here", "between",
    "both", "life", "being", "under", "never", "day", "same", "another", "know", "while",
    "last", "might", "us", "great", "old", "year", "off", "come", "since", "against",
)  # fmt: skip


def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def tokenize(text: str) -> tuple[str, ...]:
    """The tokens ``count_tokens`` counts, in order (the prefix cache hashes them)."""
    return tuple(_TOKEN.findall(text))


def chat_prompt_tokens(message_texts: Iterable[str]) -> int:
    total = TOKENS_REPLY_PRIMING
    for text in message_texts:
        total += TOKENS_PER_MESSAGE + count_tokens(text)
    return total


def _digest(*parts: object) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x00")
    return h.digest()


class TokenSource:
    """The deterministic words one request generates, in order."""

    def __init__(self, server_seed: int, request_seed: int | None, prompt: str) -> None:
        self._rng = random.Random(_digest(server_seed, request_seed, prompt))

    def __iter__(self) -> Iterator[str]:
        while True:
            yield " " + self._rng.choice(VOCABULARY)


def embedding(server_seed: int, text: str, dim: int) -> list[float]:
    rng = random.Random(_digest("embedding", server_seed, text))
    vector = [rng.gauss(0.0, 1.0) for _ in range(dim)]
    norm = math.sqrt(sum(x * x for x in vector)) or 1.0
    return [x / norm for x in vector]
