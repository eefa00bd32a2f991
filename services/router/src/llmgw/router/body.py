"""OpenAI request bodies: what the router reads, and nothing more.

The router reads two fields, ``model`` (to route) and ``stream`` (only to
check its type), and passes every other field through untouched: engines
add parameters faster than a gateway could list them, so the model here is
tolerant (``extra="allow"``) and the forwarded body is the client's own
object with only ``model`` rewritten, not a re-serialisation of the model.

Decoding is orjson's (about a tenth of the standard library's time, and it
runs on every request), with the standard library as the judge of anything
orjson refuses: ``NaN``, ``Infinity``, numbers past a double's range, lone
surrogates, UTF-16 and UTF-32 bodies and a UTF-8 BOM are refused by orjson
and accepted by ``json``, so the router accepts and refuses exactly what it
did with ``json`` alone. orjson reads an integer past 64 bits as a float;
routing reads only strings and booleans, so the decoded body is the
routing view, and a body the router re-encodes (a rewritten ``model``, a
resume) is decoded again by :func:`exact`, so no number is ever forwarded
rounded. That second decode is rare: a body whose model needs no rewrite
is forwarded as the client's bytes.
"""

from __future__ import annotations

import json
from typing import Any, NamedTuple

import orjson
from pydantic import BaseModel, ConfigDict, StrictBool, StrictStr, ValidationError

from .errors import BadRequest

_TYPE_NAMES = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


class OpenAIRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr
    stream: StrictBool | None = None


def _type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), "number" if isinstance(value, int | float) else "value")


class RequestHead(NamedTuple):
    """What the router reads of a checked body (a tuple: built once per request, cheaply)."""

    model: str
    stream: bool | None


def decode(raw: bytes) -> Any:
    """The body for routing: ``json.loads(raw)``'s value or error, but for integers past 64 bits."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        # Refused by orjson: json says whether it is JSON (and why not).
        return json.loads(raw)


def exact(raw: bytes) -> dict[str, Any]:
    """The client's body decoded exactly (every integer whole), to re-encode it."""
    data: dict[str, Any] = json.loads(raw)
    return data


def parse_body(raw: bytes) -> tuple[dict[str, Any], RequestHead]:
    """Decode and check a request body; raise BadRequest saying what to fix."""
    try:
        data = decode(raw)
    except (ValueError, RecursionError) as err:
        raise BadRequest(
            f"The request body is not valid JSON ({err}); send a JSON object with "
            "Content-Type: application/json."
        ) from None
    if not isinstance(data, dict):
        raise BadRequest(f"The request body must be a JSON object, not {_type_name(data)}.")
    model, stream = data.get("model"), data.get("stream")
    if type(model) is str and (stream is None or type(stream) is bool):
        # The common case, checked without pydantic (a validation copies every
        # field of the body); one that fails it is validated below for the message.
        return data, RequestHead(model, stream)
    try:
        parsed = OpenAIRequest.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        param = str(first["loc"][0]) if first["loc"] else None
        if first["type"] == "missing":
            message = f"`{param}` is required; GET /v1/models lists the model names."
        else:
            wanted = "a string" if param == "model" else "a boolean (true or false)"
            message = f"`{param}` must be {wanted}, not {_type_name(data.get(param))}."
        raise BadRequest(message, param) from None
    return data, RequestHead(parsed.model, parsed.stream)
