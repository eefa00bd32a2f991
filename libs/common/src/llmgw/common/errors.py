"""One error hierarchy for llmgw, and its single mapping to gRPC status.

::

    LlmgwError
    ├── InvalidArgument   the caller sent something wrong; fix it and retry (terminal)
    ├── NotFound          the named thing does not exist (terminal)
    ├── AlreadyExists     the name is taken by something else (terminal)
    ├── Conflict          the state moved under the caller; re-read and retry
    ├── FailedPrecondition the cluster is not in a state that allows this (terminal)
    └── Unavailable       a dependency is down or this process is not the leader;
                          retry with backoff (retryable)

Messages are written for the person who has to act on them: they name the
thing that is wrong and say what would make it right.
"""

from __future__ import annotations

import grpc


class LlmgwError(Exception):
    """Base of every error llmgw raises on purpose."""

    code: grpc.StatusCode = grpc.StatusCode.INTERNAL
    retryable: bool = False


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


class Unavailable(LlmgwError):
    code = grpc.StatusCode.UNAVAILABLE
    retryable = True


async def abort_with(context: grpc.aio.ServicerContext, err: LlmgwError) -> None:
    """End an RPC with the status that corresponds to ``err``."""
    await context.abort(err.code, str(err))
