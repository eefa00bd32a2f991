"""The admin token: every gRPC method of the control plane needs it, except an allow-list.

Deny by default, deliberately: the interceptor names the services that are
*open* (what routers, agents and health checkers call, and reflection so
grpcurl can list), so a service added later (keys, quotas ...) is protected
without anyone remembering to protect it. A new service that routers or
agents call (they hold no admin token) goes into :data:`OPEN_SERVICES`,
deliberately, in the same change.

The token travels as gRPC metadata ``authorization: Bearer <token>``. A call
without it, or with another token, ends with UNAUTHENTICATED and a message
that says how to pass it; the token is compared in constant time and never
logged.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from llmgw.common.errors import InvalidArgument

log = logging.getLogger("llmgw.control.api.auth")

# Services anyone who can reach the port may call.
OPEN_SERVICES = frozenset(
    {
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
        "grpc.reflection.v1.ServerReflection",
        "llmgw.v1.EndpointService",
        "llmgw.v1.CatalogService",
        "llmgw.v1.AgentService",
        "llmgw.v1.UsageService",
        # Routers: the table of hashed client keys, and their quota shares.
        "llmgw.v1.KeyTableService",
        "llmgw.v1.QuotaService",
    }
)
METADATA_KEY = "authorization"
MIN_TOKEN_CHARS = 16
HOW_TO_PASS = (
    "pass the admin token as gRPC metadata `authorization: Bearer TOKEN` "
    "(llmgw: --token, --token-file or $LLMGW_ADMIN_TOKEN; grpcurl: -H 'authorization: Bearer TOKEN')"
)


def read_token(path: str | Path) -> str:
    """The admin token from a file, refusing one too short to be safe."""
    p = Path(path)
    try:
        token = p.read_text().strip()
    except OSError as err:
        raise InvalidArgument(
            f"admin token file {p}: {err.strerror}; create it with `head -c 32 /dev/urandom | base64 > {p}`"
        ) from None
    if len(token) < MIN_TOKEN_CHARS:
        raise InvalidArgument(
            f"the admin token in {p} is {len(token)} characters; use at least {MIN_TOKEN_CHARS}"
        )
    return token


def _service(method: str) -> str:
    # "/llmgw.v1.AdminService/ListModels" -> "llmgw.v1.AdminService"
    return method.lstrip("/").split("/", 1)[0]


def _refusal(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as ``handler`` that ends the call with UNAUTHENTICATED."""

    async def unary(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    async def streaming(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # pragma: no cover - makes this an async generator

    kw = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(streaming, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(unary, **kw)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(streaming, **kw)
    return grpc.unary_unary_rpc_method_handler(unary, **kw)


# Generic in the type stubs only, so a string the checker reads and Python never runs.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class AdminTokenInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, token: str, open_services: frozenset[str] = OPEN_SERVICES):
        self._token = f"Bearer {token}".encode()
        self._open = open_services

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None or _service(details.method) in self._open:
            return handler
        given = next((v for k, v in details.invocation_metadata or () if k == METADATA_KEY), None)
        if given is None:
            return _refusal(handler, f"{details.method} needs the admin token: {HOW_TO_PASS}")
        value = given.encode() if isinstance(given, str) else given
        if not hmac.compare_digest(value, self._token):
            log.warning("refused %s: wrong admin token", details.method)
            return _refusal(
                handler,
                f"{details.method}: the admin token given is not this cluster's "
                f"(see the control plane's admin_token_file); {HOW_TO_PASS}",
            )
        return handler
