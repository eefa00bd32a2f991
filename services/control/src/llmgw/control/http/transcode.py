"""JSON over HTTP for the admin services, mapped from the protos' ``google.api.http`` rules.

One generic transcoder, as grpc-gateway and Envoy's transcoder do it: each
annotated method becomes a route; the request message is built from the
path variables, the query string (every other field, for rules without a
body) and the JSON body (``body: "*"``) with protobuf's json_format; the
response is the reply message as JSON with the proto field names
(``node_id``, not ``nodeId``; the parser accepts both), fields at their
defaults included, 64-bit integers as strings (proto3's JSON mapping).

Calls run in-process through the gRPC server's interceptors (see the
package docstring): :class:`Dispatcher` records the method handlers the
generated ``add_*_to_server`` functions register, and a call is the
interceptors' chain over that handler, invoked with a :class:`CallContext`
that plays the servicer context (``abort`` raises :class:`Aborted`).

Every error has one shape, Google's JSON error::

    {"error": {"code": 404, "status": "NOT_FOUND", "message": "model 'x' ..."}}

``code`` is the HTTP status, ``status`` the gRPC code's name, ``message``
the servicer's words (what to fix). An exception a servicer did not turn
into a status is logged with its traceback and answered 500 INTERNAL
without details.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import grpc
from aiohttp import web
from google.api import annotations_pb2
from google.protobuf import descriptor, descriptor_pool, json_format, symbol_database
from google.protobuf.message import Message

log = logging.getLogger("llmgw.control.http")

# The services the HTTP port maps; every one of them needs the admin token.
ADMIN_SERVICES = (
    "llmgw.v1.AdminService",
    "llmgw.v1.SettingsService",
    "llmgw.v1.NodeService",
    "llmgw.v1.PlacementService",
    "llmgw.v1.OwnerService",
    "llmgw.v1.NodeAdminService",
    "llmgw.v1.FabricService",
    "llmgw.v1.KeyService",
    "llmgw.v1.FederationService",
    "llmgw.v1.JoinTokenService",
    "llmgw.v1.CertificateService",
)

# google/rpc/code.proto's HTTP mapping, as grpc-gateway uses it.
HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DATA_LOSS: 500,
    grpc.StatusCode.UNAUTHENTICATED: 401,
}
# A call that outlives this is answered 504 (the servicers' own timeouts are shorter).
CALL_TIMEOUT_SECONDS = 30.0
_VARIABLE = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


class Aborted(Exception):
    """A call ended with a gRPC status other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def error_response(code: grpc.StatusCode, message: str, http_status: int | None = None) -> web.Response:
    """The one error shape; ``http_status`` only where HTTP itself refused (404, 405, 413)."""
    status = http_status or HTTP_STATUS.get(code, 500)
    body = {"error": {"code": status, "status": code.name, "message": message}}
    return web.json_response(body, status=status)


class CallContext:
    """What a servicer sees of an HTTP call: its metadata and peer; ``abort`` raises."""

    def __init__(self, metadata: Sequence[tuple[str, str]], peer: str):
        self._metadata = tuple(metadata)
        self._peer = peer

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata=()) -> None:
        raise Aborted(code, details)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"transport_security_type": [b"http"]}

    def peer_identities(self) -> None:
        return None

    def time_remaining(self) -> float:
        return CALL_TIMEOUT_SECONDS


def _context(metadata: Sequence[tuple[str, str]], peer: str) -> grpc.ServicerContext:
    # What servicers call of a context, CallContext has; typed as what a handler takes.
    return cast(grpc.ServicerContext, CallContext(metadata, peer))


class _CallDetails(NamedTuple):
    method: str
    invocation_metadata: tuple[tuple[str, str], ...]


class _Recorder:
    """Stands in for a grpc server while the generated add_*_to_server functions register."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler] = {}

    def add_generic_rpc_handlers(self, handlers) -> None:
        pass  # the registered method handlers below carry the same methods

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler]
    ) -> None:
        for name, handler in handlers.items():
            self.handlers[f"/{service}/{name}"] = handler


class Dispatcher:
    """Calls a gRPC method in-process, through the gRPC server's interceptors."""

    def __init__(self, registrations: Sequence[tuple[Callable, object, str]], interceptors: Sequence):
        recorder = _Recorder()
        for register, servicer, _name in registrations:
            register(servicer, recorder)
        self._handlers = recorder.handlers
        self._interceptors = list(interceptors)

    def has(self, method: str) -> bool:
        return method in self._handlers

    async def _resolve(self, details: _CallDetails, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        async def chain(i: int, d: _CallDetails):
            if i == len(self._interceptors):
                return handler
            return await self._interceptors[i].intercept_service(lambda dd: chain(i + 1, dd), d)

        return await chain(0, details)

    async def authorize(self, method: str, metadata: Sequence[tuple[str, str]], peer: str) -> None:
        """Raise :class:`Aborted` unless the interceptors let this caller call ``method``; nothing runs.

        The authorizer decides inside the call (it wraps every handler), so
        the check is a call through the interceptors to a stand-in for the
        method's handler that does nothing: the servicer never sees it.
        (Calling the method itself with an empty request would run a
        change, CreateKey say, for a request refused as malformed.)
        """
        real = self._handlers[method]

        async def nothing(request: Message, context: grpc.ServicerContext) -> None:
            return None

        stand_in = grpc.unary_unary_rpc_method_handler(
            nothing,
            request_deserializer=real.request_deserializer,
            response_serializer=real.response_serializer,
        )
        assert real.request_deserializer is not None  # every generated handler has one
        await self._invoke(method, stand_in, real.request_deserializer(b""), metadata, peer)

    async def call(
        self, method: str, request: Message, metadata: Sequence[tuple[str, str]], peer: str
    ) -> Message:
        """One unary call; raises :class:`Aborted` for any status but OK."""
        handler = self._handlers.get(method)
        if handler is None:
            raise Aborted(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not served here")
        return await self._invoke(method, handler, request, metadata, peer)

    async def _invoke(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        request: Message,
        metadata: Sequence[tuple[str, str]],
        peer: str,
    ) -> Message:
        details = _CallDetails(method, tuple(metadata))
        chosen = await self._resolve(details, handler)
        if chosen is None or chosen.unary_unary is None:
            raise Aborted(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not a unary method")
        try:
            async with asyncio.timeout(CALL_TIMEOUT_SECONDS):
                return await chosen.unary_unary(request, _context(metadata, peer))
        except TimeoutError:
            raise Aborted(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"{method} did not answer within {CALL_TIMEOUT_SECONDS:.0f}s",
            ) from None


@dataclass(frozen=True)
class Binding:
    """One HTTP rule of one method."""

    method: descriptor.MethodDescriptor
    verb: str  # GET, POST, PUT, DELETE, PATCH
    path: str  # /api/v1/models/{name}
    body: str  # "*" or ""

    @property
    def full_method(self) -> str:
        return f"/{self.method.containing_service.full_name}/{self.method.name}"

    @property
    def path_fields(self) -> list[str]:
        return _VARIABLE.findall(self.path)

    @property
    def query_fields(self) -> list[descriptor.FieldDescriptor]:
        """The request fields taken from the query string (none when the body holds them)."""
        if self.body == "*":
            return []
        taken = set(self.path_fields)
        return [f for f in self.method.input_type.fields if f.name not in taken]


def bindings(services: Sequence[descriptor.ServiceDescriptor]) -> list[Binding]:
    """Every ``google.api.http`` rule of these services' methods (additional bindings included)."""
    out = []
    for service in services:
        for method in service.methods:
            options = method.GetOptions()
            if not options.HasExtension(annotations_pb2.http):
                continue
            rule = options.Extensions[annotations_pb2.http]
            for r in [rule, *rule.additional_bindings]:
                kind = r.WhichOneof("pattern")
                if kind in ("get", "post", "put", "delete", "patch"):
                    out.append(Binding(method, kind.upper(), getattr(r, kind), r.body))
    return out


def service_descriptors(names: Sequence[str] = ADMIN_SERVICES) -> list[descriptor.ServiceDescriptor]:
    # Importing the generated modules registers their descriptors in the default pool.
    from llmgw.v1 import (  # noqa: F401
        admin_pb2,
        fabric_pb2,
        federation_pb2,
        keys_pb2,
        nodeadmin_pb2,
        nodes_pb2,
        owners_pb2,
        settings_pb2,
        trust_pb2,
    )

    pool = descriptor_pool.Default()
    return [pool.FindServiceByName(n) for n in names]


def _message_class(d: descriptor.Descriptor) -> type[Message]:
    return symbol_database.Default().GetSymbol(d.full_name)


def _query_value(field: descriptor.FieldDescriptor, values: list[str]) -> Any:
    def one(v: str) -> Any:
        if field.type == descriptor.FieldDescriptor.TYPE_BOOL:
            if v not in ("true", "false"):
                raise json_format.ParseError(f"query parameter {field.name} is true or false, not {v!r}")
            return v == "true"
        return v  # json_format parses numbers given as strings, and says so when they are not

    if field.is_repeated:
        return [one(v) for v in values]
    if len(values) > 1:
        raise json_format.ParseError(f"query parameter {field.name} is given {len(values)} times")
    return one(values[0])


async def build_request(binding: Binding, request: web.Request) -> Message:
    """The request message from the path, the query string and the body; ParseError when wrong."""
    data: dict[str, Any] = {}
    if binding.body == "*":
        raw = await request.read()
        if raw.strip():
            if request.content_type != "application/json":
                raise json_format.ParseError("the body must be JSON (Content-Type: application/json)")
            try:
                data = json.loads(raw)
            except (ValueError, UnicodeDecodeError) as err:
                raise json_format.ParseError(f"the body is not valid JSON: {err}") from None
            if not isinstance(data, dict):
                raise json_format.ParseError("the body must be a JSON object")
    query_fields = {f.name: f for f in binding.query_fields}
    for name in request.query.keys():
        if name not in query_fields:
            known = ", ".join(sorted(query_fields)) or "none"
            raise json_format.ParseError(f"unknown query parameter {name!r} (known: {known})")
    for name, field in query_fields.items():
        values = request.query.getall(name, [])
        if values:
            data[name] = _query_value(field, values)
    for name in binding.path_fields:
        data[name] = request.match_info[name]
    message = _message_class(binding.method.input_type)()
    try:
        json_format.ParseDict(data, message)
    except RecursionError:
        raise json_format.ParseError("the body nests too deeply") from None
    return message


def to_json(message: Message) -> dict[str, Any]:
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )


Metadata = Callable[[web.Request], Awaitable[list[tuple[str, str]]]]


def handler_for(binding: Binding, dispatcher: Dispatcher, metadata: Metadata):
    """The aiohttp handler of one binding; ``metadata`` says who calls (or raises Aborted)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        try:
            md = await metadata(request)
            try:
                message = await build_request(binding, request)
            except json_format.ParseError as err:
                # Who may call is said before what is wrong with the call.
                await dispatcher.authorize(binding.full_method, md, _peer(request))
                raise Aborted(grpc.StatusCode.INVALID_ARGUMENT, str(err)) from None
            reply = await dispatcher.call(binding.full_method, message, md, _peer(request))
        except Aborted as err:
            return error_response(err.code, err.message)
        except web.HTTPException:
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return error_response(grpc.StatusCode.INTERNAL, "internal error; see the control plane's log")
        return web.json_response(to_json(reply))

    return handle


def _peer(request: web.Request) -> str:
    return f"http:{request.remote}"


def add_routes(app: web.Application, dispatcher: Dispatcher, metadata: Metadata) -> list[Binding]:
    routes = [b for b in bindings(service_descriptors()) if dispatcher.has(b.full_method)]
    for b in routes:
        app.router.add_route(b.verb, b.path, handler_for(b, dispatcher, metadata))
    return routes
