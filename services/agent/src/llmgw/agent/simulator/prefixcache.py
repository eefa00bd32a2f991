"""A prefix cache like vLLM's automatic prefix caching: an LRU of token-block hashes.

What it models, and how:

- A prompt is cut into blocks of ``block_size`` tokens (vLLM's default 16);
  only full blocks are cached. Block ``i``'s hash chains the hash of block
  ``i - 1`` with its own tokens, so a block hits only when everything
  before it matches too, as in vLLM.
- ``lookup`` counts the leading blocks already cached (stopping at the
  first miss) and returns how many prompt tokens they cover. As in vLLM, at
  least one prompt token is always computed, so a fully cached prompt still
  counts its last token as uncached.
- ``store`` records every full block of a sequence (prompt and generated
  tokens: the next turn of a conversation sends the answer back as part of
  its prompt) as most recently used, evicting the least recently used
  beyond ``capacity`` blocks. The engine stores after prefill for the
  prompt and when the sequence ends for the rest, so two identical requests
  that arrive together both miss, as they would on vLLM.
- A lookup refreshes the blocks it hit, as a scheduled request's blocks do.

Capacity 0 disables the cache: every lookup misses and nothing is stored.
Single event loop only.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

BLOCK_SIZE = 16


def block_hashes(tokens: Sequence[str], block_size: int) -> list[bytes]:
    """Chained hashes of the full blocks of ``tokens``."""
    hashes: list[bytes] = []
    parent = b""
    for start in range(0, len(tokens) - block_size + 1, block_size):
        h = hashlib.blake2b(parent, digest_size=16)
        for token in tokens[start : start + block_size]:
            h.update(token.encode())
            h.update(b"\x00")
        parent = h.digest()
        hashes.append(parent)
    return hashes


class PrefixCache:
    def __init__(self, capacity: int, block_size: int = BLOCK_SIZE) -> None:
        if capacity < 0 or block_size < 1:
            raise ValueError(f"capacity must be >= 0 and block_size >= 1, got {capacity}, {block_size}")
        self._capacity = capacity
        self._block_size = block_size
        self._blocks: OrderedDict[bytes, None] = OrderedDict()

    @property
    def block_size(self) -> int:
        return self._block_size

    def __len__(self) -> int:
        return len(self._blocks)

    def lookup(self, hashes: Sequence[bytes], prompt_tokens: int) -> int:
        """Prompt tokens already cached: the leading hit blocks, less one token if that is all of them."""
        hit = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += 1
        return max(0, min(hit * self._block_size, prompt_tokens - 1))

    def store(self, hashes: Sequence[bytes]) -> None:
        if not self._capacity:
            return
        for h in hashes:
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)
