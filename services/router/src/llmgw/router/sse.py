"""Server-sent events, as little of them as the router needs.

The relay copies bytes; it looks at SSE framing only to cut what it has
read at the last complete event (so a stream that breaks never leaves half
an event with the client) and, when a stream must be resumed or rewritten,
to read the ``data:`` payloads. Events end with a blank line, ``\\n\\n`` or
``\\r\\n\\r\\n`` (engines use the first; both are accepted). Comments
(``: ...``) and fields other than ``data`` carry nothing the router needs.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"


def complete_prefix(buffer: bytes) -> int:
    """Length of the part of ``buffer`` made of whole events (0 when none)."""
    end = buffer.rfind(b"\n\n")
    if end >= 0:
        return end + 2
    end = buffer.rfind(b"\r\n\r\n")
    return end + 4 if end >= 0 else 0


def payloads(events: bytes) -> Iterator[bytes]:
    """Each event's ``data`` payload (multi-line data joined by ``\\n``), in order."""
    for event in events.replace(b"\r\n", b"\n").split(b"\n\n"):
        data = [line[5:].removeprefix(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
        if data:
            yield b"\n".join(data)


def ends_with_done(events: bytes) -> bool:
    """Whether the last event in ``events`` is ``data: [DONE]``."""
    return events.rstrip().endswith(b"data: " + DONE) or events.rstrip().endswith(b"data:" + DONE)


def encode(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
