"""The one mapping from exceptions to OpenAI-shaped error responses.

Every error body has vLLM's shape::

    {"error": {"message": "...", "type": "NotFoundError", "param": "model", "code": 404}}

Errors raised on purpose are llmgw's own tree (``llmgw.common.errors``);
the two HTTP-only cases it lacks are added here as subclasses::

    LlmgwError
    ├── InvalidArgument        400 BadRequestError
    │   └── BodyTooLarge       413 RequestEntityTooLargeError
    ├── NotFound               404 NotFoundError
    │   └── UnknownModel       404, param "model"
    ├── Unauthenticated        401 AuthenticationError
    └── Unavailable            503 ServiceUnavailableError

pydantic ``ValidationError`` becomes 400 with every problem named by its
field path; aiohttp's own HTTP exceptions (unknown route, wrong method)
keep their status; anything else is a 500 and is
logged with its traceback, never hidden.
"""

from __future__ import annotations

import logging

import grpc
from aiohttp import web
from pydantic import ValidationError

from llmgw.common.errors import (
    Conflict,
    FailedPrecondition,
    InvalidArgument,
    LlmgwError,
    NotFound,
    Unavailable,
)

log = logging.getLogger(__name__)


class Unauthenticated(LlmgwError):
    code = grpc.StatusCode.UNAUTHENTICATED


class BodyTooLarge(InvalidArgument):
    pass


class UnknownModel(NotFound):
    def __init__(self, model: str) -> None:
        super().__init__(f"The model `{model}` does not exist.")


_BY_CLASS: tuple[tuple[type[LlmgwError], int, str], ...] = (
    # Most specific first.
    (BodyTooLarge, 413, "RequestEntityTooLargeError"),
    (InvalidArgument, 400, "BadRequestError"),
    (UnknownModel, 404, "NotFoundError"),
    (NotFound, 404, "NotFoundError"),
    (Unauthenticated, 401, "AuthenticationError"),
    (Conflict, 409, "ConflictError"),
    (FailedPrecondition, 400, "BadRequestError"),
    (Unavailable, 503, "ServiceUnavailableError"),
)

_BY_STATUS = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    405: "MethodNotAllowedError",
    413: "RequestEntityTooLargeError",
}


def error_body(message: str, err_type: str, status: int, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def error_response(exc: BaseException, route: str = "") -> web.Response:
    """The HTTP response for ``exc`` (``route``, e.g. "GET /v1/x", names what was asked)."""
    if isinstance(exc, LlmgwError):
        for cls, status, err_type in _BY_CLASS:
            if isinstance(exc, cls):
                param = "model" if isinstance(exc, UnknownModel) else None
                return _json(error_body(str(exc), err_type, status, param), status)
    if isinstance(exc, ValidationError):
        return _json(error_body(describe_validation_error(exc), "BadRequestError", 400), 400)
    if isinstance(exc, web.HTTPException):
        status = exc.status
        err_type = _BY_STATUS.get(status, "HTTPError")
        message = f"{exc.reason}: {route}" if route else exc.reason
        return _json(error_body(message, err_type, status), status, headers=_allow(exc))
    log.error("unhandled error answering %s", route or "a request", exc_info=exc)
    return _json(error_body(f"internal error: {exc!r}", "InternalServerError", 500), 500)


def describe_validation_error(err: ValidationError) -> str:
    problems = []
    for e in err.errors(include_url=False):
        if e["type"] == "json_invalid":
            problems.append(f"request body is not valid JSON: {e['msg']}")
            continue
        where = ".".join(str(p) for p in e["loc"]) or "body"
        problems.append(f"{where}: {e['msg']}")
    return "; ".join(problems)


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}


def _json(body: dict, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)
