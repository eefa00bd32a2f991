"""The REST API's OpenAPI 3 document, generated from proto/ (the same rules the transcoder serves).

:func:`build` turns a FileDescriptorSet compiled with source info (so the
protos' comments become descriptions) into the document;
scripts/gen_openapi.py compiles proto/ and writes it twice: docs/openapi.json
for readers, and ``openapi.json`` beside this module, which the control
plane serves at ``/openapi.json`` (the installed package has no proto/).
tests/unit/control/test_http_openapi.py fails when either is stale.

Schemas follow proto3's JSON mapping as the transcoder speaks it: proto
field names, 64-bit integers as decimal strings, enums as their names, maps
as objects; unknown fields are refused (``additionalProperties: false``).

Errors, per operation: what the method declares in proto/ with the
``(llmgw.v1.errors)`` option (proto/llmgw/v1/errors.proto), and what the
HTTP port answers for any call (:data:`GENERIC_ERRORS`; 413 only where
there is a body, 404 for a path variable that normalizes away only where
there are some), grouped by HTTP status, each status listing its gRPC
codes under ``x-grpc-status`` and every one with the Error schema.
tests/unit/control/test_http_errors.py makes every listed (operation, code)
happen against a running control plane. Anything else (UNAVAILABLE when
etcd does not answer, DEADLINE_EXCEEDED past the call timeout, an agent's
own refusal passed through) is the ``default`` response, in the same shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import grpc
from google.api import annotations_pb2
from google.protobuf import descriptor_pb2

from llmgw.v1 import errors_pb2

from .transcode import ADMIN_SERVICES, HTTP_STATUS

SERVED = Path(__file__).parent / "openapi.json"
F = descriptor_pb2.FieldDescriptorProto
_SCALARS: dict[int, dict[str, Any]] = {
    F.TYPE_STRING: {"type": "string"},
    F.TYPE_BYTES: {"type": "string", "format": "byte"},
    F.TYPE_BOOL: {"type": "boolean"},
    F.TYPE_DOUBLE: {"type": "number", "format": "double"},
    F.TYPE_FLOAT: {"type": "number", "format": "float"},
    F.TYPE_INT32: {"type": "integer", "format": "int32"},
    F.TYPE_SINT32: {"type": "integer", "format": "int32"},
    F.TYPE_SFIXED32: {"type": "integer", "format": "int32"},
    F.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295},
    F.TYPE_FIXED32: {"type": "integer", "format": "int64", "minimum": 0, "maximum": 4294967295},
}
_INT64 = (F.TYPE_INT64, F.TYPE_SINT64, F.TYPE_SFIXED64, F.TYPE_UINT64, F.TYPE_FIXED64)
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every error: the HTTP status, the gRPC code's name and what to fix.",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["code", "status", "message"],
            "properties": {
                "code": {"type": "integer", "description": "The HTTP status."},
                "status": {"type": "string", "description": "The gRPC status code's name, e.g. NOT_FOUND."},
                "message": {"type": "string", "description": "What went wrong and what to do."},
            },
        }
    },
}


# What the HTTP port answers for any admin call, before the method runs (code, when).
GENERIC_ERRORS = (
    ("INVALID_ARGUMENT", "the request does not parse: an unknown query parameter or field, a wrong type"),
    ("UNAUTHENTICATED", "no admin token, another one, or an expired console session"),
    (
        "PERMISSION_DENIED",
        "this control plane has no admin_token_file, or a change made with the session cookie lacks "
        "the X-CSRF-Token header",
    ),
)
BODY_ERRORS = (("RESOURCE_EXHAUSTED", "the body is larger than 1 MiB (HTTP 413)"),)
# Where the path has variables: one that is empty, "." or ".." is normalized out of the URL.
PATH_ERRORS = (("NOT_FOUND", "a path variable that is empty, '.' or '..' leaves no route"),)


def method_errors(method: descriptor_pb2.MethodDescriptorProto) -> list[tuple[str, str]]:
    """The (code, when) a method declares with ``(llmgw.v1.errors)``; a code that is no gRPC code fails."""
    out = []
    # The generated stub types the extension as a plain FieldDescriptor.
    declared: list[errors_pb2.MethodError] = list(method.options.Extensions[cast(Any, errors_pb2.errors)])
    for e in declared:
        if e.code not in grpc.StatusCode.__members__ or e.code == "OK":
            raise ValueError(f"{method.name}: (llmgw.v1.errors) code {e.code!r} is not a gRPC status code")
        out.append((e.code, e.when))
    return out


def http_status(code: str, body: bool) -> int:
    """The HTTP status the port answers ``code`` with (413 for a body over the limit)."""
    if code == "RESOURCE_EXHAUSTED" and body:
        return 413
    return HTTP_STATUS[grpc.StatusCode[code]]


def _comment(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()).strip()


class _Index:
    """Messages, enums and comments of a descriptor set, by full name."""

    def __init__(self, fds: descriptor_pb2.FileDescriptorSet):
        self.messages: dict[str, descriptor_pb2.DescriptorProto] = {}
        self.enums: dict[str, descriptor_pb2.EnumDescriptorProto] = {}
        self.comments: dict[tuple[str, ...], str] = {}
        self.services: dict[str, tuple[descriptor_pb2.ServiceDescriptorProto, str]] = {}
        for f in fds.file:
            comments = {
                tuple(loc.path): _comment(loc.leading_comments) for loc in f.source_code_info.location
            }
            for i, m in enumerate(f.message_type):
                self._message(f.package, m, (4, i), comments)
            for e in f.enum_type:
                self.enums[f"{f.package}.{e.name}"] = e
            for i, s in enumerate(f.service):
                name = f"{f.package}.{s.name}"
                self.services[name] = (s, f.package)
                self.comments[(name,)] = comments.get((6, i), "")
                for j, method in enumerate(s.method):
                    self.comments[(name, method.name)] = comments.get((6, i, 2, j), "")

    def _message(self, scope: str, m, path: tuple[int, ...], comments) -> None:
        name = f"{scope}.{m.name}"
        self.messages[name] = m
        self.comments[(name,)] = comments.get(path, "")
        for k, field in enumerate(m.field):
            self.comments[(name, field.name)] = comments.get((*path, 2, k), "")
        for k, nested in enumerate(m.nested_type):
            self._message(name, nested, (*path, 3, k), comments)
        for e in m.enum_type:
            self.enums[f"{name}.{e.name}"] = e


def _short(full: str) -> str:
    return full.rsplit(".", 1)[-1]


class _Builder:
    def __init__(self, index: _Index):
        self.index = index
        self.schemas: dict[str, Any] = {"Error": ERROR_SCHEMA}

    def field_schema(self, field: descriptor_pb2.FieldDescriptorProto) -> dict[str, Any]:
        if field.type == F.TYPE_MESSAGE:
            entry = self.index.messages[field.type_name.lstrip(".")]
            if entry.options.map_entry:
                value = self.field_schema(entry.field[1])
                return {"type": "object", "additionalProperties": value}
            one: dict[str, Any] = {"$ref": self.ref(field.type_name.lstrip("."))}
        elif field.type == F.TYPE_ENUM:
            enum = self.index.enums[field.type_name.lstrip(".")]
            one = {"type": "string", "enum": [v.name for v in enum.value]}
        elif field.type in _INT64:
            one = {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"}
        else:
            one = dict(_SCALARS[field.type])
        if field.label == F.LABEL_REPEATED:
            return {"type": "array", "items": one}
        return one

    def ref(self, full: str) -> str:
        name = _short(full)
        if name not in self.schemas:
            self.schemas[name] = {}  # placeholder against recursion
            m = self.index.messages[full]
            properties = {}
            for field in m.field:
                prop = self.field_schema(field)
                doc = self.index.comments.get((full, field.name), "")
                if doc and "$ref" not in prop:
                    prop = {**prop, "description": doc}
                properties[field.name] = prop
            schema: dict[str, Any] = {
                "type": "object",
                "properties": properties,
                "additionalProperties": False,
            }
            doc = self.index.comments.get((full,), "")
            if doc:
                schema["description"] = doc
            self.schemas[name] = schema
        return f"#/components/schemas/{name}"

    def operation(self, service: str, method, verb: str, path: str, body: str) -> dict[str, Any]:
        inp = self.index.messages[method.input_type.lstrip(".")]
        in_name = method.input_type.lstrip(".")
        path_fields = [seg[1:-1] for seg in path.split("/") if seg.startswith("{")]
        parameters = []
        for name in path_fields:
            field = next(f for f in inp.field if f.name == name)
            parameters.append(
                {
                    "name": name,
                    "in": "path",
                    "required": True,
                    "description": self.index.comments.get((in_name, name), ""),
                    "schema": self.field_schema(field),
                }
            )
        op: dict[str, Any] = {
            "operationId": f"{_short(service)}_{method.name}",
            "tags": [_short(service)],
            "summary": self.index.comments.get((service, method.name), "") or method.name,
            "description": f"gRPC: {service}/{method.name}",
        }
        if body == "*":
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"$ref": self.ref(in_name)}}},
            }
        else:
            for field in inp.field:
                if field.name in path_fields or field.type == F.TYPE_MESSAGE:
                    continue
                parameters.append(
                    {
                        "name": field.name,
                        "in": "query",
                        "required": False,
                        "description": self.index.comments.get((in_name, field.name), ""),
                        "schema": self.field_schema(field),
                        **({"style": "form", "explode": True} if field.label == F.LABEL_REPEATED else {}),
                    }
                )
        if parameters:
            op["parameters"] = parameters
        op["responses"] = {
            "200": {
                "description": "OK",
                "content": {
                    "application/json": {"schema": {"$ref": self.ref(method.output_type.lstrip("."))}}
                },
            },
            **_error_responses(method, body == "*", bool(path_fields)),
        }
        return op


def _error_responses(
    method: descriptor_pb2.MethodDescriptorProto, body: bool, variables: bool
) -> dict[str, Any]:
    """Per HTTP status: the gRPC codes behind it and when, all with the Error schema."""
    declared = method_errors(method)
    errors = [*GENERIC_ERRORS, *(BODY_ERRORS if body else ()), *(PATH_ERRORS if variables else ()), *declared]
    by_status: dict[int, list[tuple[str, str]]] = {}
    for code, when in errors:
        by_status.setdefault(http_status(code, body), []).append((code, when))
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    out: dict[str, Any] = {}
    for status in sorted(by_status):
        pairs = by_status[status]
        out[str(status)] = {
            "description": "; ".join(f"{code}: {when}" for code, when in pairs),
            "content": error,
            "x-grpc-status": list(dict.fromkeys(code for code, _ in pairs)),
        }
    out["default"] = {
        "description": "Any other status, in the same shape (UNAVAILABLE when etcd does not answer, "
        "DEADLINE_EXCEEDED past 30 s)",
        "content": error,
    }
    return out


def build(fds: descriptor_pb2.FileDescriptorSet, services=ADMIN_SERVICES) -> dict[str, Any]:
    index = _Index(fds)
    b = _Builder(index)
    paths: dict[str, dict[str, Any]] = {}
    tags = []
    for service in services:
        s, _ = index.services[service]
        tags.append({"name": _short(service), "description": index.comments.get((service,), "")})
        for method in s.method:
            if not method.options.HasExtension(annotations_pb2.http):
                continue
            rule = method.options.Extensions[annotations_pb2.http]
            for r in [rule, *rule.additional_bindings]:
                kind = r.WhichOneof("pattern")
                if kind in ("get", "post", "put", "delete", "patch"):
                    path = getattr(r, kind)
                    paths.setdefault(path, {})[kind] = b.operation(service, method, kind, path, r.body)
    return {
        "openapi": "3.0.3",
        "info": {
            "title": "llmgw admin API",
            "version": "v1",
            "description": (
                "JSON over HTTP for the control plane's admin gRPC services, generated from the "
                "google.api.http rules in proto/ (scripts/gen_openapi.py). Every control plane serves it "
                "on its http_listen port. Authenticate with `Authorization: Bearer <admin token>`; the "
                "console's session cookie works too, and then every change needs the X-CSRF-Token header."
            ),
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"session": []}],
        "tags": tags,
        "paths": dict(sorted(paths.items())),
        "components": {
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer", "description": "The admin token."},
                "session": {"type": "apiKey", "in": "cookie", "name": "llmgw_session"},
            },
            "schemas": dict(sorted(b.schemas.items())),
        },
    }


def dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2, sort_keys=False) + "\n"


def document() -> dict[str, Any]:
    """The document the control plane serves (the generated file shipped with this package)."""
    return json.loads(SERVED.read_text())
