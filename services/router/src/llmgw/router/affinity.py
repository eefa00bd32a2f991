"""The affinity key of a request: what should land on the same replica as what.

An engine's prefix cache pays off only when requests that share a prompt
prefix reach the same engine. The key is a 64-bit hash that the balancer
places on a consistent-hash ring (see :mod:`.balancer`); ``None`` means the
request has nothing worth keeping together and is balanced on load alone.

Decisions, in order of precedence:

1. **A session pins.** ``x-session-id`` (header), else the OpenAI ``user``
   field, keys the request by that value alone, so every turn of a
   conversation goes to one replica whatever its content.
2. **Chat: the conversation's opening**: the leading system (or developer)
   messages and the first message after them, rendered as role and text,
   cut at ``prefix_chars`` characters. The opening is the same in every
   turn of a conversation (later turns only append), so all its turns share
   a key; "every message but the last" would change with every turn (it
   grows by the previous answer) and scatter a conversation over replicas.
   Conversations under one long system prompt (longer than
   ``prefix_chars``) share a key and so share the cached system prompt;
   under a short one, the key reaches into the first user message and each
   conversation gets its own, which spreads load and loses little (a short
   system prompt is cheap to prefill).
3. **Completions: the first ``prefix_chars`` characters of the prompt**
   (a string, or a list holding one string); for token ids, the first
   ``prefix_chars // 4`` ids (about four characters a token).
4. **Too short to matter.** A head shorter than ``min_prefix_chars`` gets no
   key: an engine caches whole blocks (vLLM: 16 tokens, some 64 characters),
   so there is nothing to share. Embeddings never get one.

Cost: the body is already decoded by :mod:`.body`; this walks the messages
only until ``prefix_chars`` characters are collected, and hashes at most
that many (blake2b, stable across processes, unlike ``hash()``, so several
router workers agree on where a key goes). Compiled with the wire modules
(services/router/setup.py): it runs for every request, and its work (type
checks, dictionary reads, string slices) is what Cython turns into C calls.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import cython

# Whether this module runs compiled (services/router/setup.py); the router logs it at startup.
COMPILED: bool = cython.compiled

SESSION_HEADER = "x-session-id"
# Roles that lead a conversation; the opening ends with the first message of another role.
OPENING_ROLES = ("system", "developer")


def stable_hash(data: bytes) -> int:
    """A 64-bit hash that is the same in every process (ring points use it too)."""
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def key_for(
    prefix_chars: int, min_prefix_chars: int, path: str, headers: Mapping[str, str], body: Mapping[str, Any]
) -> int | None:
    """The request's affinity key, or None (the module docstring says which).

    The settings come first and every argument is positional, so that a ``functools.partial``
    of it needs no keyword dictionary per call (the balancer's, per request)."""
    session = headers.get(SESSION_HEADER) or body.get("user")
    if isinstance(session, str) and session:
        return stable_hash(b"session\0" + session.encode(errors="replace"))
    if path.endswith("/chat/completions"):
        head = _chat_head(body.get("messages"), prefix_chars)
    elif path.endswith("/completions"):
        head = _prompt_head(body.get("prompt"), prefix_chars)
    else:
        return None
    text, size = head
    if size < min_prefix_chars:
        return None
    return stable_hash(b"prefix\0" + text.encode(errors="replace"))


# (head, its size in characters); size 0 when the body has nothing to key on.
_Head = tuple[str, int]


def _chat_head(messages: object, limit: int) -> _Head:
    if not isinstance(messages, list):
        return "", 0
    if len(messages) == 1 or (messages and _role(messages[0]) not in OPENING_ROLES):
        # The common shape: the opening is the first message alone (no system prompt, or a
        # single message): one piece, no joining.
        message = messages[0]
        if not isinstance(message, dict):
            return "", 0
        role, content = message.get("role"), message.get("content")
        # The text cut to the limit before it is copied into the head: a prompt may be megabytes.
        if type(role) is str and type(content) is str:
            head = f"{role}\n{content[:limit]}\n"[:limit]
        else:
            head = f"{_role(message)}\n{_text(content)[:limit]}\n"[:limit]
        return head, len(head)
    parts: list[str] = []
    size = 0
    for message in messages:
        if size >= limit:
            break
        if not isinstance(message, dict):
            return "", 0
        role = _role(message)
        piece = f"{role}\n{_text(message.get('content'))[:limit]}\n"
        parts.append(piece)
        size += len(piece)
        if role not in OPENING_ROLES:
            break
    head = "".join(parts)[:limit]
    return head, len(head)


def _role(message: object) -> str:
    role = message.get("role") if isinstance(message, dict) else None
    return role if isinstance(role, str) else ""


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        # Multimodal parts: only text parts say anything about the prefix.
        return " ".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def _prompt_head(prompt: object, limit: int) -> _Head:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]
    if isinstance(prompt, str):
        head = prompt[:limit]
        return head, len(head)
    if isinstance(prompt, list):
        ids = prompt[: limit // 4]
        if ids and all(isinstance(t, int) for t in ids):
            # Each id stands for about four characters, so the length check means the same.
            return ",".join(str(t) for t in ids), 4 * len(ids)
    return "", 0
