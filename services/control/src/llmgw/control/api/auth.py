"""Who may call what: every gRPC method of the control plane, by the caller's role.

Each caller is one or more roles, from what it proves:

- ``node <id>``, ``router <name>``, ``admin <name>``: the llmgw identity
  of its certificate (``llmgw://<role>/<id>`` URI SAN, common/pki.py),
  which gRPC has verified against the cluster CA (mutual TLS,
  common/tls.py);
- ``admin`` also by the admin token (``authorization: Bearer TOKEN``,
  compared in constant time, never logged), whatever certificate carries
  the call.

:data:`POLICY` is the one table of which roles may call which method. Deny
by default: a method not in it is refused for everyone, so a service added
later is closed until someone writes its line here
(tests/integration/test_trust.py lists every method through reflection and
checks that). A refusal is UNAUTHENTICATED (no identity at all: what to
present) or PERMISSION_DENIED (an identity without the right: which roles
may). Node-specific checks of AgentService's messages (a node speaks only
as itself, publishes only its own hosts) are :mod:`.nodeguard`'s.

Plaintext mode (``tls.plaintext: true``, development only) has no
identities: every caller is every router and every node, and admin when it
gives the token (or when no token is configured); the control plane warns
at every start.

A certificate revoked by an admin (api/revocation.py) is refused every
call, whatever token comes with it, and its open streams are ended.
JoinService, the one method open to callers without a certificate, is not
on this port: it has its own (api/join.py).

Servicers learn the caller with :func:`caller` (a context variable set for
the call's task: gRPC runs each call in its own task).
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import inspect
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc

from llmgw.common.errors import InvalidArgument
from llmgw.common.pki import Identity, identity_of

from .nodeguard import guard_agent_stream
from .revocation import Enforcer

log = logging.getLogger("llmgw.control.api.auth")

ADMIN, ROUTER, NODE = "admin", "router", "node"
_ANY = frozenset({ADMIN, ROUTER, NODE})
_ADMIN = frozenset({ADMIN})
_WATCHERS = frozenset({ROUTER, ADMIN})
_ROUTER = frozenset({ROUTER})
_NODE = frozenset({NODE})

# Method -> roles that may call it. A method missing here is refused to all.
POLICY: dict[str, frozenset[str]] = {
    # Health checks and reflection (grpcurl list): any identity of the cluster.
    "/grpc.health.v1.Health/Check": _ANY,
    "/grpc.health.v1.Health/Watch": _ANY,
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": _ANY,
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": _ANY,
    # Agents: one stream per node, as itself (nodeguard).
    "/llmgw.v1.AgentService/Connect": _NODE,
    # A node renews its own certificate (api/renewal.py holds it to its identity).
    "/llmgw.v1.RenewalService/RenewCertificate": _NODE,
    # Routers: the tables they route with (admins may watch them too), their
    # load reports and quota shares (theirs alone: an admin's report would be counted).
    "/llmgw.v1.EndpointService/Watch": _WATCHERS,
    "/llmgw.v1.CatalogService/Watch": _WATCHERS,
    "/llmgw.v1.KeyTableService/Watch": _WATCHERS,
    "/llmgw.v1.UsageService/Report": _ROUTER,
    "/llmgw.v1.QuotaService/Sync": _ROUTER,
    # Everything else is the operator's.
    **{
        f"/llmgw.v1.{service}/{method}": _ADMIN
        for service, methods in {
            "AdminService": (
                "GetClusterStatus",
                "ListModels",
                "ListNodes",
                "ListReplicas",
                "ListRouters",
                "GetModel",
                "AddModel",
                "UpdateModel",
                "RemoveModel",
            ),
            "SettingsService": ("GetSettings", "PutSettings", "ListSettingsVersions", "RollbackSettings"),
            "NodeService": (
                "HoldNode",
                "ReleaseNode",
                "LabelNode",
                "ListNodeOverrides",
                "HoldDomain",
                "ReleaseDomain",
                "ListDomainHolds",
            ),
            "PlacementService": ("ExplainPlacement",),
            "OwnerService": ("ListOwnerUsage",),
            "NodeAdminService": (
                "GetReplicaLogs",
                "ListWeights",
                "FetchWeights",
                "RemoveWeights",
                "UpgradeAgent",
            ),
            "FabricService": ("RunFabricTest", "ListFabricResults"),
            "KeyService": ("CreateKey", "ListKeys", "RevokeKey"),
            "FederationService": ("ListPeers", "AddPeer", "RemovePeer"),
            "JoinTokenService": ("CreateJoinToken", "ListJoinTokens", "RevokeJoinToken"),
            "CertificateService": ("RevokeCertificate", "ListRevocations", "ListIssuedCertificates"),
        }.items()
        for method in methods
    },
}

METADATA_KEY = "authorization"
MIN_TOKEN_CHARS = 16
HOW_TO_PASS = (
    "pass the admin token as gRPC metadata `authorization: Bearer TOKEN` "
    "(llmgw: --token, --token-file or $LLMGW_ADMIN_TOKEN; grpcurl: -H 'authorization: Bearer TOKEN') "
    "or call with an admin certificate (`llmgw certs issue admin NAME`)"
)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the roles proven, the certificate's identity (None in plaintext mode)."""

    roles: frozenset[str]
    identity: Identity | None
    peer: str
    # The verified certificate (PEM) the call came with; empty in plaintext mode.
    cert: bytes = b""

    @property
    def verified(self) -> bool:
        return self.identity is not None

    @property
    def name(self) -> str:
        """The certificate's id (node id, router name); empty in plaintext mode."""
        return self.identity.name if self.identity else ""

    def __str__(self) -> str:
        return str(self.identity) if self.identity else f"unverified caller {self.peer}"


_CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar("llmgw_caller", default=None)


def caller() -> Caller | None:
    """The caller of the gRPC call this task serves (None outside one, e.g. in unit tests)."""
    return _CALLER.get()


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


# Generic in the type stubs only, so a string the checker reads and Python never runs.
Handler: TypeAlias = "grpc.RpcMethodHandler[Any, Any]"


class Authorizer(grpc.aio.ServerInterceptor):
    """Wraps every handler: decide the caller, check :data:`POLICY`, then run the method."""

    def __init__(
        self, token: str = "", *, plaintext: bool = False, policy=POLICY, enforcer: Enforcer | None = None
    ):
        self._token = f"Bearer {token}".encode() if token else b""
        self._plaintext = plaintext
        self._policy = policy
        # Revoked certificates (api/revocation.py); None: no revocations (unit tests).
        self.enforcer = enforcer

    def _caller(self, context: grpc.aio.ServicerContext, metadata) -> tuple[Caller, bool]:
        """The caller, and whether it gave a token that is not this cluster's."""
        given = next((v for k, v in metadata or () if k == METADATA_KEY), None)
        token_ok = False
        wrong = False
        if given is not None and self._token:
            value = given.encode() if isinstance(given, str) else given
            token_ok = hmac.compare_digest(value, self._token)
            wrong = not token_ok
        if self._plaintext:
            roles = {ROUTER, NODE}
            if token_ok or not self._token:
                roles.add(ADMIN)
            return Caller(frozenset(roles), None, context.peer()), wrong
        pems = list(context.auth_context().get("x509_pem_cert") or [])
        identity = identity_of(pems[0]) if pems else None
        roles = set()
        if identity is not None and identity.role in _ANY:
            roles.add(identity.role)
        if token_ok:
            roles.add(ADMIN)
        return Caller(frozenset(roles), identity, context.peer(), pems[0] if pems else b""), wrong

    def _refusal(self, method: str, who: Caller, wrong_token: bool) -> tuple[grpc.StatusCode, str]:
        allowed = self._policy.get(method)
        if allowed is None:
            return grpc.StatusCode.PERMISSION_DENIED, f"{method} is not open to any caller"
        needs = " or ".join(sorted(allowed))
        if wrong_token:
            return (
                grpc.StatusCode.UNAUTHENTICATED,
                f"{method}: the admin token given is not this cluster's "
                f"(see the control plane's admin_token_file); {HOW_TO_PASS}",
            )
        if not who.verified and ADMIN not in who.roles:
            what = (
                "no credentials"
                if self._plaintext
                else "a certificate with no llmgw identity (URI llmgw://ROLE/ID)"
            )
            hint = HOW_TO_PASS if ADMIN in allowed else f"use a {needs} certificate"
            return grpc.StatusCode.UNAUTHENTICATED, f"{method} needs a {needs} identity; {what}: {hint}"
        msg = f"{method} is for {needs} callers only; {who} may not call it"
        if ADMIN in allowed:
            msg += f": {HOW_TO_PASS}"
        return grpc.StatusCode.PERMISSION_DENIED, msg

    def _check(self, method: str, context, metadata) -> tuple[Caller, tuple | None]:
        who, wrong = self._caller(context, metadata)
        revoked = self.enforcer.why(who.cert) if self.enforcer and who.cert else ""
        if revoked:
            log.warning("refused %s to %s: %s", method, who, revoked)
            return who, (grpc.StatusCode.PERMISSION_DENIED, f"{method}: {revoked}; {REVOKED_HINT}")
        allowed = self._policy.get(method, frozenset())
        if who.roles & allowed:
            return who, None
        refusal = self._refusal(method, who, wrong)
        log.warning("refused %s to %s: %s", method, who, refusal[0].name)
        return who, refusal

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(details)
        if handler is None:
            return handler
        return _wrap(handler, details.method, details.invocation_metadata, self._check, self.enforcer)


REVOKED_HINT = "an admin revoked it (`llmgw certs revocations`); this process needs a new certificate"


class _Tracked:
    """A streaming call registered with the enforcer, so a revocation can end it."""

    def __init__(self, enforcer: Enforcer | None, who: Caller):
        self._enforcer = enforcer
        self._key = enforcer.open(who.cert) if enforcer is not None and who.cert else 0

    def ended_by_revocation(self) -> str:
        """On cancellation: why a revocation ended the call ("" when it did not: re-raise)."""
        reason = self.close()
        if reason:
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
        return reason

    def close(self) -> str:
        key, self._key = self._key, 0
        return self._enforcer.close(key) if self._enforcer is not None and key else ""


async def _abort_revoked(context, method: str, reason: str) -> None:
    await context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{method}: {reason}; {REVOKED_HINT}")


def _wrap(handler: Handler, method: str, metadata, check, enforcer: Enforcer | None = None) -> Handler:
    """The same handler, checking the caller first (and, for agents, every message).

    Streaming calls are registered with the revocation enforcer while they
    run: a revocation of their certificate ends them with PERMISSION_DENIED.
    """
    kw: dict[str, Any] = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }

    async def admit(context) -> Caller:
        who, refusal = check(method, context, metadata)
        if refusal is not None:
            await context.abort(*refusal)
        _CALLER.set(who)
        return who

    # The behaviours as grpc.aio runs them: async generators or coroutines.
    inner: Any
    if handler.request_streaming and handler.response_streaming:
        inner = handler.stream_stream
        if not inspect.isasyncgenfunction(inner):
            return grpc.stream_stream_rpc_method_handler(_coroutine(admit, inner, method, enforcer), **kw)

        async def stream_stream(requests, context):
            who = await admit(context)
            tracked = _Tracked(enforcer, who)
            try:
                if method == "/llmgw.v1.AgentService/Connect":
                    guard = guard_agent_stream(requests, who)
                    async for reply in inner(guard.requests, context):
                        yield reply
                    if guard.violation:
                        await context.abort(grpc.StatusCode.PERMISSION_DENIED, guard.violation)
                    return
                async for reply in inner(requests, context):
                    yield reply
            except asyncio.CancelledError:
                reason = tracked.ended_by_revocation()
                if not reason:
                    raise
                await _abort_revoked(context, method, reason)
            finally:
                tracked.close()

        return grpc.stream_stream_rpc_method_handler(stream_stream, **kw)
    if handler.response_streaming:
        inner = handler.unary_stream
        if not inspect.isasyncgenfunction(inner):
            return grpc.unary_stream_rpc_method_handler(_coroutine(admit, inner, method, enforcer), **kw)

        async def unary_stream(request, context):
            tracked = _Tracked(enforcer, await admit(context))
            try:
                async for reply in inner(request, context):
                    yield reply
            except asyncio.CancelledError:
                reason = tracked.ended_by_revocation()
                if not reason:
                    raise
                await _abort_revoked(context, method, reason)
            finally:
                tracked.close()

        return grpc.unary_stream_rpc_method_handler(unary_stream, **kw)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(
            _coroutine(admit, handler.stream_unary, method, enforcer), **kw
        )
    return grpc.unary_unary_rpc_method_handler(_coroutine(admit, handler.unary_unary), **kw)


def _coroutine(
    admit: Callable[[Any], Awaitable[Caller]],
    inner: Any,
    method: str = "",
    enforcer: Enforcer | None = None,
) -> Callable[[Any, Any], Awaitable[Any]]:
    """A coroutine behaviour; a streaming one (``method`` given) is tracked for revocations."""

    async def behaviour(request, context):
        who = await admit(context)
        if not method:
            return await inner(request, context)
        tracked = _Tracked(enforcer, who)
        try:
            return await inner(request, context)
        except asyncio.CancelledError:
            reason = tracked.ended_by_revocation()
            if not reason:
                raise
            await _abort_revoked(context, method, reason)
        finally:
            tracked.close()

    return behaviour
