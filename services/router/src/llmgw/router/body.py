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

**Form bodies** (audio uploads, ``multipart/form-data``): the router reads
the ``model`` and ``stream`` fields by scanning the part heads for their
names (the file part is never copied or decoded), and forwards the client's
bytes with only the ``model`` value spliced when the engine knows the model
by another name. The body was already bounded by ``limits.max_body_bytes``
when read, so one whole upload is held once, not twice.
"""

from __future__ import annotations

import json
import re
from typing import Any

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


def parse_body(raw: bytes) -> tuple[dict[str, Any], str, bool | None]:
    """Decode and check a request body: the body, its ``model`` and ``stream``; raise BadRequest
    saying what to fix."""
    try:
        try:
            data = orjson.loads(raw)  # decode(), inline: this runs for every request
        except orjson.JSONDecodeError:
            data = json.loads(raw)
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
        return data, model, stream
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
    return data, parsed.model, parsed.stream


# A form field's part: its headers, then its value up to the next boundary.
_FIELD_NAME = re.compile(rb'content-disposition:[^\r\n]*?\bname="([^"]*)"', re.IGNORECASE)


def _boundary(content_type: str) -> bytes:
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise BadRequest(
            f"This API takes a multipart/form-data body (a file upload), not {kind.strip() or 'none'!r}."
        )
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary" and value.strip('"'):
            return value.strip('"').encode("latin-1", "replace")
    raise BadRequest("The multipart/form-data Content-Type has no boundary; let the client library set it.")


def _form_fields(raw: bytes, boundary: bytes) -> dict[str, tuple[int, int]]:
    """Each small field's value span in ``raw`` (file parts included: their spans are not read)."""
    spans: dict[str, tuple[int, int]] = {}
    delimiter = b"--" + boundary
    at = raw.find(delimiter)
    while at >= 0:
        head_start = at + len(delimiter)
        if raw[head_start : head_start + 2] == b"--":
            break  # the closing delimiter
        head_end = raw.find(b"\r\n\r\n", head_start)
        if head_end < 0:
            break
        value_start = head_end + 4
        following = raw.find(b"\r\n" + delimiter, value_start)
        if following < 0:
            break
        named = _FIELD_NAME.search(raw, head_start, head_end)
        if named is not None:
            spans.setdefault(named[1].decode("utf-8", "replace"), (value_start, following))
        at = following + 2
    return spans


def parse_form(raw: bytes, content_type: str) -> tuple[dict[str, Any], str, bool | None]:
    """A multipart body's routing view: its ``model`` (and ``stream``) fields, the rest left as sent."""
    spans = _form_fields(raw, _boundary(content_type))
    if "model" not in spans:
        raise BadRequest("`model` is required (a form field); GET /v1/models lists the model names.", "model")
    model = raw[slice(*spans["model"])].decode("utf-8", "replace").strip()
    stream = raw[slice(*spans["stream"])].strip().lower() == b"true" if "stream" in spans else None
    return {"model": model, "stream": stream}, model, stream


def replace_form_field(raw: bytes, content_type: str, name: str, value: str) -> bytes:
    """``raw`` with one form field's value replaced (the model an engine knows)."""
    start, end = _form_fields(raw, _boundary(content_type))[name]
    return raw[:start] + value.encode() + raw[end:]
