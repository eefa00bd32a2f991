"""Stored responses routed home: response ids that carry their replica, signed.

An engine stores a Responses API answer (``store``, the default) in its own
memory, so ``GET /v1/responses/{id}``, ``.../cancel`` and a new request's
``previous_response_id`` must reach the replica that answered. Rather than
keep a map (memory per response, lost on restart, not shared between
routers), the router rewrites each response id it relays into one that
names the replica: ``resp_<token>.<signature>``, where the token is the
replica's endpoint id and the engine's own id (base64url), and the
signature an HMAC-SHA256 of the token, cut to 128 bits, under a key
derived from the cluster secret, so every router of a cluster reads every
other's ids and a client cannot forge one that routes elsewhere.

An id that does not verify, or whose replica is no longer in the table, is
a 404 in OpenAI's shape (``response_not_found``) rather than a guess at
another replica, which could not hold it. A standalone router without a
cluster secret signs with a key of its own, made at start: its ids last as
long as the process.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
from typing import Protocol

import aiohttp
from aiohttp import web

from .errors import ResponseNotFound, UpstreamFailed, UpstreamTimeout
from .requestkeys import MODEL_LABEL, REPLICA_LABEL
from .seam import RequestView
from .table import Model, Route

PREFIX = "resp_"
# The stored responses' routes: {id}, {id}/cancel, {id}/input_items.
STORED_PREFIX = "/v1/responses/"
_SIG_BYTES = 16
# The engine's id in a Responses answer: the first "id" of a response object.
_ENGINE_ID = re.compile(rb'"id"\s*:\s*"(resp_[A-Za-z0-9_\-]{1,200})"')


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ResponseIds:
    def __init__(self, secret: bytes | None) -> None:
        material = secret if secret else secrets.token_bytes(32)
        self._key = hmac.new(material, b"llmgw response ids v1", hashlib.sha256).digest()

    def _sign(self, token: str) -> str:
        return _b64(hmac.new(self._key, token.encode(), hashlib.sha256).digest()[:_SIG_BYTES])

    def wrap(self, endpoint_id: str, engine_id: str) -> str:
        token = _b64(f"{endpoint_id}\n{engine_id}".encode())
        return f"{PREFIX}{token}.{self._sign(token)}"

    def unwrap(self, response_id: str) -> tuple[str, str]:
        """(endpoint id, the engine's id) of one of our ids; ResponseNotFound for any other."""
        token, dot, signature = response_id.removeprefix(PREFIX).rpartition(".")
        if (
            not response_id.startswith(PREFIX)
            or not dot
            or not hmac.compare_digest(signature.encode(), self._sign(token).encode())
        ):
            raise ResponseNotFound(response_id, "it was not issued by this gateway")
        try:
            endpoint_id, _, engine_id = _unb64(token).decode().partition("\n")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            raise ResponseNotFound(response_id, "it was not issued by this gateway") from None
        return endpoint_id, engine_id


class IdRewriter:
    """One attempt's answer with the engine's response id replaced by the routed one.

    The engine's id is learnt from the first answer bytes that carry one (a
    whole answer, or a stream's ``response.created``); every later
    occurrence is a plain bytes replace, so a stream costs one search per
    chunk, and nothing for the other APIs (which never make one of these).
    """

    def __init__(self, ids: ResponseIds, endpoint_id: str) -> None:
        self._ids = ids
        self._endpoint_id = endpoint_id
        self._engine: bytes = b""
        self._routed: bytes = b""

    def __call__(self, data: bytes) -> bytes:
        if not self._engine:
            found = _ENGINE_ID.search(data)
            if found is None:
                return data
            self._engine = b'"' + found[1] + b'"'
            self._routed = b'"' + self._ids.wrap(self._endpoint_id, found[1].decode()).encode() + b'"'
        return data.replace(self._engine, self._routed)


class Endpoints(Protocol):
    def all_routes(self) -> list[Route]: ...
    def resolve(self, name: str) -> Model | None: ...


class Gate(Protocol):
    """Client keys (:class:`.auth.Auth`): which models a key sees, and its request rate."""

    def visible(self, request: RequestView, model: Model) -> bool: ...
    def admit(self, request: RequestView, requested: str, model: Model, *, tokens: bool = True) -> None: ...


class StoredResponses:
    """``GET``/``DELETE /v1/responses/{id}``, ``GET .../input_items`` and ``POST .../cancel``: asked of
    the replica that holds it.

    Rare requests with no body to route by, so they go through aiohttp's
    client (one connection each) rather than the pooled engine client, with
    the request's timeout; the answer's ids are rewritten like any other.
    Like any other request they are counted (``llmgw_router_requests_total``,
    under the stored response's model and replica) and, with client keys,
    count against the key's request rate (429 past it); no tokens are
    charged, since nothing is generated.
    """

    def __init__(self, ids: ResponseIds, table: Endpoints, keys: Gate | None, timeout: float) -> None:
        self._ids = ids
        self._table = table
        self._keys = keys
        self._timeout = timeout

    def handles(self, path: str) -> bool:
        rest = path.removeprefix(STORED_PREFIX)
        return rest != path and bool(rest)

    async def __call__(self, request: RequestView) -> web.Response:
        rest = request.path[len(STORED_PREFIX) :]
        response_id, slash, action = rest.partition("/")
        allowed = {"": ("GET", "DELETE"), "cancel": ("POST",), "input_items": ("GET",)}.get(action)
        if allowed is None or (slash and not action):
            raise web.HTTPNotFound()
        if request.method not in allowed:
            raise web.HTTPMethodNotAllowed(request.method, list(allowed))
        endpoint_id, engine_id = self._ids.unwrap(response_id)
        route = next((r for r in self._table.all_routes() if r.endpoint.id == endpoint_id), None)
        model = self._table.resolve(route.endpoint.model) if route is not None else None
        if route is None or model is None:
            raise ResponseNotFound(response_id, f"the replica that stored it ({endpoint_id}) is gone")
        request[MODEL_LABEL] = model.name
        request[REPLICA_LABEL] = route.endpoint.id
        if self._keys is not None:
            if not self._keys.visible(request, model):
                raise ResponseNotFound(response_id, "it was not issued by this gateway")
            self._keys.admit(request, model.name, model, tokens=False)
        endpoint = route.endpoint
        url = f"{endpoint.url}{STORED_PREFIX}{engine_id}{slash}{action}"
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        try:
            async with aiohttp.request(
                request.method,
                url,
                params=request.query_string or None,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            ) as upstream:
                body = await upstream.read()
                status, content_type = upstream.status, upstream.content_type
        except TimeoutError:
            raise UpstreamTimeout(f"Replica {endpoint.id} did not answer in time; retry.") from None
        except aiohttp.ClientError as err:
            raise UpstreamFailed(f"Replica {endpoint.id} failed: {type(err).__name__}") from None
        if status == 200:
            body = IdRewriter(self._ids, endpoint.id)(body)
        headers = {"Content-Type": content_type or "application/json", "x-llmgw-replica": endpoint.id}
        return web.Response(status=status, body=body, headers=headers)
