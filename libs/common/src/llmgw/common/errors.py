"""One error hierarchy for llmgw, and its single mapping to gRPC status.

::

    LlmgwError
    ├── InvalidArgument   the caller sent something wrong; fix it and retry (terminal)
    ├── NotFound          the named thing does not exist (terminal)
    ├── AlreadyExists     the name is taken by something else (terminal)
    ├── Conflict          the state moved under the caller; re-read and retry
    ├── FailedPrecondition the cluster is not in a state that allows this (terminal)
    ├── PermissionDenied  the credential given does not allow this (terminal)
    ├── ResourceExhausted too many calls; wait and retry (retryable)
    └── Unavailable       a dependency is down or this process is not the leader;
                          retry with backoff (retryable)

Messages are written for the person who has to act on them: they name the
thing that is wrong and say what would make it right.

Messages are bounded. A message quotes user input through :func:`excerpt`
(a bounded excerpt and the input's length, never the whole of it), and every
:class:`LlmgwError` cuts its message to ``MAX_MESSAGE_BYTES`` as a backstop:
gRPC carries a status message in a header, percent-encoded (up to three
bytes per byte), under an 8 KiB limit, and a message past it reaches the
caller as RESOURCE_EXHAUSTED instead of the reason.
"""

from __future__ import annotations

from typing import Any, NoReturn

import grpc

# The longest message (UTF-8 bytes) an error carries; percent-encoded it stays under 8 KiB.
MAX_MESSAGE_BYTES = 2000
# How much of a piece of user input a message quotes.
EXCERPT_CHARS = 64


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """``value`` quoted for a message: whole when short, else its first ``limit`` characters and length."""
    text = str(value)
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}... ({len(text)} characters)"


def bounded(message: str, limit: int = MAX_MESSAGE_BYTES) -> str:
    """``message`` cut to at most ``limit`` UTF-8 bytes (plus a note of how much was cut)."""
    data = message.encode()
    if len(data) <= limit:
        return message
    kept = data[:limit].decode(errors="ignore")
    return f"{kept}... ({len(data) - len(kept.encode())} more bytes cut)"


class LlmgwError(Exception):
    """Base of every error llmgw raises on purpose; its message is :func:`bounded`."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable: bool = False

    def __init__(self, message: str = "") -> None:
        super().__init__(bounded(message))


class InvalidArgument(LlmgwError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(LlmgwError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(LlmgwError):
    code = grpc.StatusCode.ALREADY_EXISTS


class Conflict(LlmgwError):
    code = grpc.StatusCode.ABORTED
    retryable = True


class FailedPrecondition(LlmgwError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class PermissionDenied(LlmgwError):
    code = grpc.StatusCode.PERMISSION_DENIED


class ResourceExhausted(LlmgwError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED
    retryable = True


class Unavailable(LlmgwError):
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


async def abort_with(context: grpc.aio.ServicerContext[Any, Any], err: LlmgwError) -> NoReturn:
    """End an RPC with the status that corresponds to ``err``."""
    await context.abort(err.code, bounded(str(err)))
