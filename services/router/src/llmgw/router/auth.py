"""Client API keys on the router: who may call, which models, how fast.

Opt-in: ``auth: keys`` in the router's configuration (the default,
``none``, serves every request as before). Keys are made with
``llmgw keys create`` and reach every router through the control plane's
``KeyTableService.Watch`` (see :mod:`.watch`); limits are shared among
routers as :mod:`.quota` describes.

Decisions:

- **Lookup**: a presented key is hashed once (SHA-256) and looked up in a
  dict built when the table changes; nothing else happens per request for a
  key without limits or model restrictions.
- **Which paths**: every path under ``/v1/`` and every proxied path outside
  it (``/v2/rerank``, ``/tokenize``, ...: :data:`.apis.PATHS`). ``/health``,
  ``/ready`` and ``/metrics`` stay open: they are for the operator's probes.
- **Which header**: ``Authorization: Bearer <key>``, or on the Anthropic
  Messages paths ``x-api-key: <key>`` (what the ``anthropic`` client sends);
  a request that sends both is judged by ``Authorization``.
- **401** (``invalid_api_key``) for a missing key, or one that is unknown,
  revoked or expired. Expiry is checked per request.
- **A model the key may not use is a 404 ``model_not_found``**, the same
  answer as a model that does not exist (OpenAI does the same), and
  ``/v1/models`` lists only the models the key may use: a key learns
  nothing about models it cannot use. A key may list names or aliases; an
  alias allows its model under every name.
- **429** (``rate_limit_exceeded``, type ``requests`` or ``tokens``) with
  ``Retry-After`` in whole seconds when a limit refuses the request.
- **Usage per owner**: every request admitted for a key whose owner is an
  owner path is counted by (owner, answering model) with its tokens (the
  engine's usage where it said, else the estimate), in
  ``llmgw_router_owner_requests_total`` / ``..._tokens_total`` and in the
  quota reports the leader sums (:mod:`.quota`).
- **Never received a key table**: 503 (``keys_not_loaded``) with
  ``Retry-After: 1``, and ``/ready`` answers 503. Failing open would let
  anyone in during every router start; failing closed costs only until the
  first watch answer. Once received, the table is kept when every control
  plane is gone (static stability): keys keep working, and a revocation
  made meanwhile applies when the watch resumes.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge

from llmgw.common.keys import client_key_hash
from llmgw.common.owners import is_owner_path
from llmgw.v1 import keys_pb2

from .answer import Answer
from .apis import PATHS
from .errors import InvalidApiKey, KeysNotLoaded, ModelNotFound, RateLimited
from .quota import KeyLimits, Quotas
from .requestkeys import MODEL_LABEL, STREAM_USAGE, STREAMED_USAGE, TRANSCRIPT
from .seam import Reply, RequestView
from .table import Model

Handler = Callable[[RequestView], Awaitable[Reply]]

REFUSALS = (
    "missing_key",
    "invalid_key",
    "expired_key",
    "model_not_allowed",
    "requests_limit",
    "tokens_limit",
    "keys_not_loaded",
)
# Retry-After while the key table has not arrived.
NOT_LOADED_RETRY_SECONDS = 1


@dataclass(frozen=True)
class ClientKey:
    id: str
    name: str
    prefix: str
    hash: str
    models: frozenset[str]
    limits: KeyLimits
    # Unix seconds; 0: never.
    expires: int = 0
    # Who the key is for; an owner path ("acme/search") also spends that owner's budgets.
    owner: str = ""

    def allows(self, model: Model) -> bool:
        if not self.models:
            return True
        # A key that may use a model may use its LoRA adapters too.
        return (
            model.name in self.models
            or not self.models.isdisjoint(model.aliases)
            or (bool(model.parent) and model.parent in self.models)
        )

    @property
    def label(self) -> str:
        return f"{self.id} ({self.name})" if self.name else self.id


def client_key(pb: keys_pb2.ApiKey) -> ClientKey:
    return ClientKey(
        id=pb.id,
        name=pb.name,
        prefix=pb.prefix,
        hash=pb.hash,
        models=frozenset(pb.models),
        limits=KeyLimits(pb.requests_per_minute, pb.tokens_per_minute),
        expires=pb.expires,
        owner=pb.owner,
    )


CLIENT_KEY = web.RequestKey("client_key", ClientKey)


@dataclass(frozen=True)
class _Ticket:
    """An admitted request of a limited key: what to settle when it ends."""

    key: ClientKey
    tokens_estimate: int
    # The owner budgets charged with it: (budget id, limits).
    owners: tuple[tuple[str, KeyLimits], ...] = ()
    # Whether the answer's usage is charged (not for a stored response fetched again).
    tokens: bool = True


TICKET = web.RequestKey("quota_ticket", _Ticket)
# (owner path, model) of an admitted request whose key has an owner path: counted when it ends.
OWNED = web.RequestKey("owner_usage", tuple)


class KeyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.refusals = Counter(
            "llmgw_router_auth_refusals",
            "Requests refused by key checks, by reason.",
            ["reason"],
            registry=registry,
        )
        self.keys = Gauge("llmgw_router_keys", "Client API keys in this router's table.", registry=registry)
        self.routers = Gauge(
            "llmgw_router_quota_routers",
            "Routers sharing each key's budget, as the leader last said (1 until it has).",
            registry=registry,
        )
        self.synced = Gauge(
            "llmgw_router_quota_synced", "1 while the quota sync with the leader works.", registry=registry
        )
        self.owner_requests = Counter(
            "llmgw_router_owner_requests",
            "Requests of each owner path's client keys, by the model that answered.",
            ["owner", "model"],
            registry=registry,
        )
        self.owner_tokens = Counter(
            "llmgw_router_owner_tokens",
            "Prompt plus completion tokens of each owner path's client keys, by model "
            "(the engine's usage where it said, else the router's estimate).",
            ["owner", "model"],
            registry=registry,
        )
        for reason in REFUSALS:
            self.refusals.labels(reason)
        self.routers.set(1)

    # The quota sync's view (see quotasync.SyncGauges).
    def quota_synced(self, routers: int | None) -> None:
        self.synced.set(0 if routers is None else 1)
        if routers is not None:
            self.routers.set(routers)


class KeyTable:
    """The key table the watch keeps current: by id, and by hash for lookups."""

    def __init__(self, metrics: KeyMetrics) -> None:
        self.metrics = metrics
        self._by_id: dict[str, ClientKey] = {}
        self._by_hash: dict[str, ClientKey] = {}
        self.loaded = False

    def apply_keys(self, *, snapshot: bool, upserts: Sequence[ClientKey], removals: Sequence[str]) -> None:
        by_id = {} if snapshot else dict(self._by_id)
        for key_id in removals:
            by_id.pop(key_id, None)
        for key in upserts:
            by_id[key.id] = key
        self._by_id = by_id
        self._by_hash = {k.hash: k for k in by_id.values()}
        self.loaded = True
        self.metrics.keys.set(len(by_id))

    def lookup(self, secret: str) -> ClientKey | None:
        return self._by_hash.get(client_key_hash(secret))

    def __len__(self) -> int:
        return len(self._by_id)


class Auth:
    """The key checks: a middleware for /v1/, the proxy's gate, and settling tokens."""

    def __init__(
        self,
        table: KeyTable,
        quotas: Quotas,
        metrics: KeyMetrics,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.table = table
        self.quotas = quotas
        self.metrics = metrics
        self._clock = clock
        self._wall = wall

    @property
    def ready(self) -> bool:
        return self.table.loaded

    @web.middleware
    async def middleware(self, request: RequestView, handler: Handler) -> Reply:
        if not request.path.startswith("/v1/") and request.path not in PATHS:
            return await handler(request)
        request[CLIENT_KEY] = self._authenticate(request)
        response: Reply | None = None
        try:
            response = await handler(request)
            return response
        finally:
            ticket = request.get(TICKET)
            if ticket is not None:
                self._settle(request, ticket, response)
            owned = request.get(OWNED)
            if owned is not None:
                self._tally(request, owned, ticket, response)

    def _refuse(self, reason: str) -> None:
        self.metrics.refusals.labels(reason).inc()

    def _authenticate(self, request: RequestView) -> ClientKey:
        if not self.table.loaded:
            self._refuse("keys_not_loaded")
            raise KeysNotLoaded(NOT_LOADED_RETRY_SECONDS)
        headers = request.headers
        scheme, _, secret = headers.get("Authorization", "").partition(" ")
        secret = secret.strip()
        if not scheme and "x-api-key" in headers and _anthropic(request.path):
            scheme, secret = "bearer", headers["x-api-key"].strip()
        if scheme.lower() != "bearer" or not secret:
            self._refuse("missing_key")
            raise InvalidApiKey(
                "You didn't provide an API key. Send it in the header `Authorization: Bearer <key>` "
                "(or `x-api-key: <key>` on /v1/messages); "
                "an operator makes one with `llmgw keys create`."
            )
        key = self.table.lookup(secret)
        if key is None:
            self._refuse("invalid_key")
            raise InvalidApiKey(
                f"Incorrect API key provided: {_mask(secret)}. It is unknown or was revoked; "
                "ask an operator for a valid key."
            )
        if key.expires and self._wall() >= key.expires:
            self._refuse("expired_key")
            when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(key.expires))
            raise InvalidApiKey(
                f"The API key {key.prefix}... expired at {when}; ask an operator for a new key."
            )
        return key

    def visible(self, request: RequestView, model: Model) -> bool:
        """Whether this request's key may see ``model`` (every model when auth is off)."""
        key = request.get(CLIENT_KEY)
        return key is None or key.allows(model)

    def admit(self, request: RequestView, requested: str, model: Model, *, tokens: bool = True) -> None:
        """The proxy's gate, once the model is known: may this key use it, now?

        ``tokens=False``: a request that generates nothing (a stored response
        fetched, deleted or cancelled): it counts against the key's request
        rate only, whatever usage its answer shows.
        """
        key = request.get(CLIENT_KEY)
        if key is None:
            return
        if not key.allows(model):
            self._refuse("model_not_allowed")
            raise ModelNotFound(requested)
        limits = key.limits
        owners = self.quotas.owner_budgets(key.owner)
        if not limits.limited and not owners:
            self._own(request, key, model)
            return
        # About four bytes of JSON per prompt token; corrected when the request ends.
        counted = limits.tokens_per_minute or any(lim.tokens_per_minute for _, lim in owners)
        # Not for an upload (audio): its bytes are no prompt.
        api = PATHS.get(request.path)
        if (api is not None and api.form) or not tokens:
            counted = False
        estimate = (request.content_length or 0) // 4 if counted else 0
        refusal = self.quotas.admit(key.id, limits, estimate, self._clock(), owners)
        if refusal is not None:
            self._refuse(f"{refusal.dimension}_limit")
            per = (
                "requests per minute (RPM)" if refusal.dimension == "requests" else "tokens per minute (TPM)"
            )
            whose = f"owner {refusal.owner} (key {key.label})" if refusal.owner else f"key {key.label}"
            raise RateLimited(
                f"Rate limit reached for {whose} on {per}: limit {refusal.limit}. "
                f"Retry in {refusal.retry_after}s.",
                refusal.dimension,
                refusal.retry_after,
            )
        request[TICKET] = _Ticket(key, estimate, owners, tokens)
        self._own(request, key, model)

    def _own(self, request: RequestView, key: ClientKey, model: Model) -> None:
        """Count an admitted request for its key's owner when it ends (a refused one spends nothing)."""
        if key.owner and is_owner_path(key.owner):
            request[OWNED] = (key.owner, model.name)

    def _settle(self, request: RequestView, ticket: _Ticket, response: Reply | None) -> None:
        key = ticket.key
        if not ticket.tokens:
            return
        budgets = [(key.id, key.limits)] if key.limits.tokens_per_minute else []
        budgets += [(i, lim) for i, lim in ticket.owners if lim.tokens_per_minute]
        if not budgets:
            return
        used = tokens_used(
            response, request.get(TRANSCRIPT), ticket.tokens_estimate, request.get(STREAM_USAGE)
        )
        if used != ticket.tokens_estimate:
            for budget_id, limits in budgets:
                self.quotas.charge(budget_id, limits, 0, used - ticket.tokens_estimate, self._clock())

    def _tally(
        self, request: RequestView, owned: tuple, ticket: _Ticket | None, response: Reply | None
    ) -> None:
        owner, admitted = owned
        model = request.get(MODEL_LABEL) or admitted
        streamed = request.get(STREAMED_USAGE)
        if streamed is not None:
            used = streamed[0] + streamed[1]
        else:
            if ticket is not None:
                estimate = ticket.tokens_estimate
            else:
                api = PATHS.get(request.path)
                estimate = 0 if api is not None and api.form else (request.content_length or 0) // 4
            used = tokens_used(response, request.get(TRANSCRIPT), estimate)
        self.quotas.tally(owner, model, used)
        self.metrics.owner_requests.labels(owner, model).inc()
        self.metrics.owner_tokens.labels(owner, model).inc(max(0, used))


def tokens_used(
    response: Reply | None, transcript, estimate: int, streamed: tuple[int, int] | None = None
) -> int:
    """Tokens one request used: the engine's ``usage`` when it said, else an estimate.

    A request that failed before anything was generated used none.
    """
    if isinstance(response, Answer | web.Response):
        if response.status >= 400:
            return 0
        body = response.body
        if isinstance(body, bytes | bytearray) and body.find(b'"usage"') >= 0:
            try:
                usage = json.loads(body).get("usage") or {}
                total = usage.get("total_tokens")
                if isinstance(total, int):
                    return total
                # OpenAI's chat names, or the Responses and Messages APIs' input/output.
                prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
                return int(prompt) + int(usage.get("completion_tokens", usage.get("output_tokens", 0)))
            except (ValueError, TypeError, AttributeError):
                pass
        return estimate
    if streamed is not None and transcript is None:
        # A stream's own usage (the Responses and Messages APIs end with it).
        return streamed[0] + streamed[1]
    if transcript is not None:
        produced = transcript.produced
        return estimate + produced if produced or response is not None else 0
    return estimate if response is not None else 0


def _anthropic(path: str) -> bool:
    api = PATHS.get(path)
    return api is not None and api.anthropic


def _mask(secret: str) -> str:
    if len(secret) <= 12:
        return "*" * len(secret)
    return f"{secret[:8]}***{secret[-4:]}"
