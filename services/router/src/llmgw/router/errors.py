"""OpenAI-shaped errors: the router's one mapping from an exception to an answer.

Every error a client sees is ``{"error": {"message", "type", "param",
"code"}}``, built by :func:`error_response` and nothing else. The router's own
errors extend the shared tree in :mod:`llmgw.common.errors`::

    LlmgwError
    ├── InvalidApiKey         401 invalid_request_error, code invalid_api_key
    ├── HttpRefusal           its status (400, 405, 408, 413, 414, 417, 431, 501, 505, 503): bytes
    │                         the front will not serve (:mod:`.front`); code says which limit or rule
    ├── RateLimited           429 type requests|tokens, code rate_limit_exceeded + Retry-After
    ├── InvalidArgument
    │   └── BadRequest        400 invalid_request_error; param names the field
    │       ├── ApiNotServed  400, code api_not_supported: the model's catalog ``apis`` lack it
    │       └── HopLimitReached 400, code hop_limit_reached: a peer's model, asked by a peer
    │                         (:mod:`.federation`)
    ├── NotFound
    │   ├── ModelNotFound     404 invalid_request_error, code model_not_found
    │   └── ResponseNotFound  404, code response_not_found: a stored response's id that does not route
    └── Unavailable
        ├── NoReadyReplica    503 server_error + Retry-After
        │   └── ModelWaking   503, code model_waking: an on-demand model did not wake in time
        ├── KeysNotLoaded     503 server_error + Retry-After (auth: keys, no key table yet)
        ├── UpstreamFailed    502 server_error (after retries)
        └── UpstreamTimeout   504 server_error

aiohttp's own HTTP exceptions (no such path 404, wrong method 405, body over
``client_max_size`` 413) map by status; any other exception is a 500 whose
message carries no internals (the log has them).
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from llmgw.common.errors import InvalidArgument, LlmgwError, NotFound, Unavailable

# Kept in step with :data:`.apis.PATHS` by a unit test (errors cannot import the proxy's table).
API_PATHS = (
    "POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses, /v1/messages, "
    "/v1/messages/count_tokens, /v1/audio/transcriptions, /v1/audio/translations, /v1/rerank, "
    "/v2/rerank, /v1/score, /pooling, /classify, /tokenize, /detokenize; GET /v1/models; "
    "a WebSocket on /v1/realtime?model=<name>"
)


class BadRequest(InvalidArgument):
    # The OpenAI error's code; empty: none.
    error_code = ""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class ApiNotServed(BadRequest):
    """A request for an API its model does not serve (the catalog's ``apis``)."""

    def __init__(self, model: str, api: str, served: tuple[str, ...]) -> None:
        super().__init__(
            f"Model {model!r} does not serve the {api} API; it serves: {', '.join(served)}. "
            "Send this request to a model that serves it.",
            "model",
        )


class ModelNotFound(NotFound):
    def __init__(self, model: str) -> None:
        super().__init__(
            f"The model {model!r} does not exist on this gateway; GET /v1/models lists the models it serves."
        )
        self.model = model


class ResponseNotFound(NotFound):
    """A stored response's id that does not route: not ours, or its replica is gone."""

    def __init__(self, response_id: str, why: str) -> None:
        super().__init__(
            f"Response with id {response_id[:200]!r} not found: {why}. A stored response lives on the "
            "replica that made it; create a new response."
        )


class NoReadyReplica(Unavailable):
    # The OpenAI error code (``code`` is the gRPC status of llmgw.common.errors).
    error_code = "no_ready_replica"

    def __init__(self, model: str, retry_after: int) -> None:
        super().__init__(
            f"Model {model!r} has no ready replica right now (it may be starting or scaled "
            f"to zero); retry in {retry_after}s."
        )
        self.retry_after = retry_after


class InvalidApiKey(LlmgwError):
    """No key, or one that is unknown, revoked or expired."""


class HttpRefusal(LlmgwError):
    """A request the front refuses for its HTTP, before any handler sees it."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.error_code = code


class RateLimited(LlmgwError):
    def __init__(self, message: str, dimension: str, retry_after: int) -> None:
        super().__init__(message)
        self.dimension = dimension
        self.retry_after = retry_after


class KeysNotLoaded(Unavailable):
    def __init__(self, retry_after: int) -> None:
        super().__init__(
            "This router has not received the key table from the control plane yet, so it cannot "
            f"check API keys; retry in {retry_after}s."
        )
        self.retry_after = retry_after


class ModelWaking(NoReadyReplica):
    error_code = "model_waking"

    def __init__(self, model: str, waited: float, retry_after: int) -> None:
        Unavailable.__init__(
            self,
            f"Model {model!r} is on demand and is still starting after {waited:g}s; retry in "
            f"{retry_after}s (or raise autoscaling.wake_timeout_seconds on the router).",
        )
        self.model = model
        self.retry_after = retry_after


class UpstreamFailed(Unavailable):
    pass


class UpstreamTimeout(Unavailable):
    pass


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=json.dumps(body).encode(),
        content_type="application/json",
        headers=headers,
    )


def error_response(exc: BaseException) -> web.Response:
    """The one mapping from an exception to the OpenAI error a client sees."""
    match exc:
        case ApiNotServed():
            body = error_body(str(exc), "invalid_request_error", exc.param, "api_not_supported")
            return _json(400, body)
        case BadRequest() if exc.error_code:
            body = error_body(str(exc), "invalid_request_error", exc.param, exc.error_code)
            return _json(400, body)
        case BadRequest():
            body = error_body(str(exc), "invalid_request_error", exc.param)
            return _json(400, body)
        case InvalidArgument():
            return _json(400, error_body(str(exc), "invalid_request_error"))
        case ModelNotFound():
            body = error_body(str(exc), "invalid_request_error", "model", "model_not_found")
            return _json(404, body)
        case ResponseNotFound():
            return _json(404, error_body(str(exc), "invalid_request_error", None, "response_not_found"))
        case InvalidApiKey():
            return _json(401, error_body(str(exc), "invalid_request_error", None, "invalid_api_key"))
        case HttpRefusal():
            type_ = "server_error" if exc.status >= 500 and exc.status != 501 else "invalid_request_error"
            return _json(exc.status, error_body(str(exc), type_, None, exc.error_code))
        case RateLimited():
            body = error_body(str(exc), exc.dimension, None, "rate_limit_exceeded")
            return _json(429, body, {"Retry-After": str(exc.retry_after)})
        case KeysNotLoaded():
            body = error_body(str(exc), "server_error", None, "keys_not_loaded")
            return _json(503, body, {"Retry-After": str(exc.retry_after)})
        case NoReadyReplica():
            body = error_body(str(exc), "server_error", None, exc.error_code)
            return _json(503, body, {"Retry-After": str(exc.retry_after)})
        case UpstreamTimeout():
            return _json(504, error_body(str(exc), "server_error", None, "upstream_timeout"))
        case UpstreamFailed():
            return _json(502, error_body(str(exc), "server_error", None, "upstream_error"))
        case LlmgwError():
            return _json(500, error_body(str(exc), "server_error", None, "internal_error"))
        case web.HTTPRequestEntityTooLarge():
            message = f"{exc.text} Send a smaller request body."
            return _json(413, error_body(message, "invalid_request_error", None, "request_too_large"))
        case web.HTTPMethodNotAllowed():
            allowed = ", ".join(sorted(exc.allowed_methods))
            message = f"Method {exc.method} is not allowed here; use {allowed}."
            body = error_body(message, "invalid_request_error", None, "method_not_allowed")
            return _json(405, body, {"Allow": ",".join(sorted(exc.allowed_methods))})
        case web.HTTPNotFound():
            message = f"No such path; this gateway serves {API_PATHS}."
            return _json(404, error_body(message, "invalid_request_error", None, "not_found"))
        case web.HTTPException() if exc.status >= 500:
            return _json(exc.status, error_body(exc.reason, "server_error"))
        case web.HTTPException():
            return _json(exc.status, error_body(exc.reason, "invalid_request_error"))
    return _json(
        500,
        error_body(
            "The gateway failed to handle this request; it was logged. Retry, and report it if it persists.",
            "server_error",
            None,
            "internal_error",
        ),
    )
