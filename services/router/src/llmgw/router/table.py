"""The routing table: which models this router answers for, and where they run.

Decisions recorded here:

- **Two layers, one index.** The *cluster* layer is what the control plane's
  watch sends (catalog models and endpoints); the *static* layer is the
  backends named in the configuration. Both feed one index. A static backend
  whose model is also in the catalog adds endpoints (and aliases) to it; the
  catalog's ModelInfo wins for everything else.
- **Names before aliases.** A name resolves to the model of that name even
  when another model lists it as an alias; among aliases the catalog comes
  first, then static backends, each in the order given.
- **An endpoint routes only if its model is in the index.** A model removed
  from the catalog therefore stops receiving traffic the moment the catalog
  delta lands, before its replicas are stopped.
- **Live state is keyed by endpoint id, outside the index.** An endpoint that
  survives an update (same id, any fields changed) keeps its EndpointState
  object: in-flight count, breaker, and the load its engine last reported
  survive. A removed endpoint's state is dropped from the table; requests
  still holding it finish against it harmlessly. An engine sample records
  the URL it was read from, so after a URL change the balancer ignores it
  until the poller reads the new engine (see :mod:`.enginemetrics`).
- **A LoRA adapter is a model of its own in the index**, with its base as
  ``parent`` (so /v1/models lists it as vLLM does) and one route per
  endpoint of the base that has it loaded (``Endpoint.adapters``, as the
  control plane publishes it). Its route is the base endpoint with the
  adapter's name as the name the engine answers to, and it shares the
  base endpoint's EndpointState: one engine, one in-flight count, one
  breaker, one load, however it is named. The balancer and the proxy
  therefore need nothing else: a request naming an adapter can only pick
  replicas that hold it, and an adapter with no holder yet waits like an
  on-demand model (see :mod:`.wake`) until the control plane has loaded
  it. :meth:`RoutingTable.all_routes` lists each endpoint once (the base
  model's route), so pollers and usage reports do not count it twice.
- **Rebuilt and swapped whole.** Updates are rare and lookups happen per
  request, so every change builds a new immutable index and swaps it in; a
  request sees one consistent version. Everything runs on one event loop and
  no method awaits, so there are no locks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .config import Backend, StaticModel

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Canary:
    """A candidate model that takes ``percent`` of a model's requests."""

    model: str
    percent: float


@dataclass(frozen=True)
class External:
    """An OpenAI-compatible provider serving a model instead of replicas."""

    # Base URL of the provider's OpenAI API, without /v1.
    url: str
    # The provider's name for the model; empty: the catalog name.
    model: str = ""
    # File holding the provider key, read per request through a cache (see :mod:`.external`).
    api_key_file: str = ""
    # The provider's API dialect: "openai", or "comfyui" (a ComfyUI server; the model's
    # ``comfy`` says what to submit).
    api: str = "openai"
    # A peer cluster's router (federation): the peer's name; see :mod:`.federation`.
    peer: str = ""
    # Sent as x-llmgw-origin-cluster to the peer; empty: no tag.
    origin_cluster: str = ""
    # Requests that already crossed this many clusters are not sent to the peer.
    hop_limit: int = 1


@dataclass(frozen=True)
class Comfy:
    """What a request for an image model served by ComfyUI submits (see :mod:`.comfyui`)."""

    # A built-in workflow's name, or an API-format workflow as JSON text; "" when the control
    # plane could not read the model's workflow file (requests are then refused with why).
    workflow: str
    # The checkpoint file name the workflow loads.
    checkpoint: str
    # A shared environment's member: the hidden model whose replicas serve it.
    served_by: str = ""


@dataclass(frozen=True)
class Model:
    name: str
    aliases: tuple[str, ...] = ()
    owned_by: str = "llmgw"
    # Unix seconds when the model entered the catalog.
    created: int = 0
    # Names (or aliases) that answer, in order, when this model has no capacity.
    fallbacks: tuple[str, ...] = ()
    canary: Canary | None = None
    external: External | None = None
    # scaling.min is 0: a request finding no replica waits for one to wake (see wake).
    on_demand: bool = False
    # LoRA adapters served on this model's replicas (each also a Model with this one as parent).
    adapters: tuple[str, ...] = ()
    # For an adapter: the base model whose replicas serve it.
    parent: str = ""
    # The APIs it serves (names of :data:`.apis.PATHS`); empty: every API.
    apis: tuple[str, ...] = ()
    # An image model served by ComfyUI.
    comfy: Comfy | None = None
    # Routed to only through its members' names (a shared ComfyUI environment's entry):
    # not listed, not resolvable.
    hidden: bool = False


@dataclass(frozen=True)
class Endpoint:
    id: str
    model: str
    # Base URL of the engine's OpenAI API, without /v1.
    url: str
    # The model name the engine answers to; empty means the catalog name.
    served_name: str = ""
    weight: int = 1
    priority: int = 0
    # Sent upstream as `Authorization: Bearer <api_key>`; empty sends none.
    api_key: str = field(default="", repr=False)
    # An external provider: its key is read from this file instead (see :mod:`.external`),
    # and it has no engine /metrics to poll.
    api_key_file: str = ""
    external: bool = False
    # LoRA adapters its engine holds now.
    adapters: tuple[str, ...] = ()
    # A ComfyUI server: it has no /metrics to poll, and answers workflows (see :mod:`.comfyui`).
    comfyui: bool = False
    # A peer cluster's router (federation, see :mod:`.federation`): the peer's name, the
    # origin tag to send (empty: none), and the hops past which a request is not sent.
    peer: str = ""
    origin_cluster: str = ""
    hop_limit: int = 1
    # The model name the engine is asked for: served_name, else model. Read per attempt, so a
    # field set once (not a cached_property: writing an instance's __dict__ after it is built
    # leaves some instances' attributes where the interpreter's attribute cache cannot reach).
    upstream_model: str = field(init=False, repr=False, compare=False)
    # Whether its engine's /metrics are polled, and so its attempts watched for a hang (see
    # :mod:`.stall`): not an external provider nor a ComfyUI server. Set once, like upstream_model.
    polled: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "upstream_model", self.served_name or self.model)
        object.__setattr__(self, "polled", not (self.external or self.comfyui))


@dataclass(frozen=True)
class EngineSample:
    """The load one engine reported on its ``/metrics``, and when."""

    # The endpoint URL it was read from; a sample for another URL is stale.
    url: str
    # vllm:num_requests_running and vllm:num_requests_waiting.
    running: float
    waiting: float
    # This router's in-flight count to the endpoint when the sample arrived:
    # the part of running + waiting that is this router's own.
    own_in_flight: int
    # Monotonic time the sample arrived.
    at: float


@dataclass(eq=False)
class EndpointState:
    """What this router knows of one endpoint: its own traffic, and its engine's report.

    Mutated only from the event loop, by the proxy (in_flight), the breaker
    and the engine-metrics poller (engine, poll_failures, next_poll,
    unresponsive_since).
    """

    in_flight: int = 0
    consecutive_failures: int = 0
    # Monotonic time before which the breaker skips this endpoint.
    open_until: float = 0.0
    # The last successful poll of the engine's /metrics; kept when a poll fails.
    engine: EngineSample | None = None
    # Consecutive failed polls, and the monotonic time the next poll is due.
    poll_failures: int = 0
    next_poll: float = 0.0
    # Monotonic time since which its /metrics poll goes unanswered (timed out);
    # None once it answers again. Such an endpoint is not chosen (see :mod:`.stall`).
    unresponsive_since: float | None = None


@dataclass(frozen=True)
class Route:
    endpoint: Endpoint
    state: EndpointState


@dataclass(frozen=True)
class _Index:
    models: dict[str, Model]
    # Name or alias -> canonical model name.
    names: dict[str, str]
    routes: dict[str, tuple[Route, ...]]


class RoutingTable:
    """Models and endpoints from both layers, with live state per endpoint.

    ``cluster`` says whether a control plane is expected to fill the cluster
    layer; until both its catalog and its endpoints have arrived once, the
    table is not ``ready``. A standalone table is ready from the start.
    """

    def __init__(
        self,
        static_models: Iterable[Model] = (),
        static_endpoints: Iterable[Endpoint] = (),
        *,
        cluster: bool = False,
    ) -> None:
        self._static_models = tuple(static_models)
        self._static_endpoints = tuple(static_endpoints)
        self._catalog: dict[str, Model] = {}
        self._endpoints: dict[str, Endpoint] = {}
        self._states: dict[str, EndpointState] = {}
        self._cluster = cluster
        self._catalog_loaded = False
        self._endpoints_loaded = False
        self._listeners: list[Callable[[], None]] = []
        self._index = self._build()

    # -- read side (the HTTP layer) -------------------------------------

    @property
    def ready(self) -> bool:
        return not self._cluster or (self._catalog_loaded and self._endpoints_loaded)

    def resolve(self, name: str) -> Model | None:
        canonical = self._index.names.get(name)
        if canonical is None:
            return None
        model = self._index.models[canonical]
        return None if model.hidden else model

    def models(self) -> list[Model]:
        return [m for m in self._index.models.values() if not m.hidden]

    def routes(self, model: str) -> Sequence[Route]:
        return self._index.routes.get(model, ())

    def state(self, endpoint_id: str) -> EndpointState | None:
        return self._states.get(endpoint_id)

    def all_routes(self) -> list[Route]:
        """Every routable endpoint once, of every model (the engine-metrics poller reads it)."""
        return [
            route
            for model, routes in self._index.routes.items()
            if not self._index.models[model].parent and not _served_by(self._index.models[model])
            for route in routes
        ]

    def subscribe(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` after every change (metrics use it to add series)."""
        self._listeners.append(listener)

    # -- write side (the watch client) ----------------------------------

    def apply_catalog(self, *, snapshot: bool, upserts: Sequence[Model], removals: Sequence[str]) -> None:
        if snapshot:
            self._catalog = {}
        for name in removals:
            self._catalog.pop(name, None)
        for model in upserts:
            self._catalog[model.name] = model
        self._catalog_loaded = True
        self._changed()

    def apply_endpoints(
        self, *, snapshot: bool, upserts: Sequence[Endpoint], removals: Sequence[str]
    ) -> None:
        if snapshot:
            self._endpoints = {}
        for endpoint_id in removals:
            self._endpoints.pop(endpoint_id, None)
        for endpoint in upserts:
            self._endpoints[endpoint.id] = endpoint
        self._endpoints_loaded = True
        self._changed()

    # -- internals --------------------------------------------------------

    def _changed(self) -> None:
        self._index = self._build()
        for listener in self._listeners:
            listener()

    def _build(self) -> _Index:
        models: dict[str, Model] = dict(self._catalog)
        extra_aliases: dict[str, list[str]] = {}
        for model in self._static_models:
            if model.name in models:
                extra_aliases.setdefault(model.name, []).extend(model.aliases)
            else:
                models[model.name] = model
        for name, aliases in extra_aliases.items():
            base = models[name]
            merged = base.aliases + tuple(a for a in aliases if a not in base.aliases)
            models[name] = replace(base, aliases=merged)

        for model in list(models.values()):
            for adapter in model.adapters:
                if adapter in models:
                    log.warning("adapter %r of model %r is also a model's name; ignored", adapter, model.name)
                    continue
                models[adapter] = Model(
                    adapter,
                    (),
                    model.owned_by,
                    model.created,
                    on_demand=True,
                    parent=model.name,
                    apis=model.apis,
                )

        names = {name: name for name in models}
        for model in models.values():
            for alias in model.aliases:
                if alias in names and names[alias] != model.name:
                    log.warning(
                        "alias %r of model %r is already taken by model %r; ignored",
                        alias,
                        model.name,
                        names[alias],
                    )
                    continue
                names[alias] = model.name

        live: dict[str, EndpointState] = {}
        grouped: dict[str, list[Route]] = {}
        externals = [external_endpoint(m) for m in models.values() if _routable_external(m)]
        for endpoint in (*self._endpoints.values(), *self._static_endpoints, *externals):
            if endpoint.model not in models:
                continue
            state = live.get(endpoint.id) or self._states.get(endpoint.id) or EndpointState()
            live[endpoint.id] = state
            grouped.setdefault(endpoint.model, []).append(Route(endpoint, state))
            for adapter in endpoint.adapters:
                if models.get(adapter, None) is not None and models[adapter].parent == endpoint.model:
                    as_adapter = replace(endpoint, model=adapter, served_name=adapter, adapters=())
                    grouped.setdefault(adapter, []).append(Route(as_adapter, state))
        for model in models.values():
            # A shared ComfyUI environment's member: the entry's replicas, under the member's
            # name, sharing their live state (one engine, one in-flight count, one breaker).
            entry = _served_by(model)
            if entry and entry in grouped:
                grouped[model.name] = [
                    Route(replace(r.endpoint, model=model.name), r.state) for r in grouped[entry]
                ]
        self._states = live
        return _Index(models, names, {m: tuple(r) for m, r in grouped.items()})


def _served_by(model: Model) -> str:
    return model.comfy.served_by if model.comfy is not None else ""


def _routable_external(model: Model) -> bool:
    if model.external is None:
        return False
    if model.external.api not in ("", "openai", "comfyui"):
        log.warning(
            "model %r is served by a provider with api %r, which this router does not speak; "
            "it gets no route (its fallbacks still answer)",
            model.name,
            model.external.api,
        )
        return False
    return True


def external_endpoint(model: Model) -> Endpoint:
    """The one endpoint of a model served by an external provider.

    Its id, ``external:<model>`` (``peer:<model>`` for a peer cluster's,
    which is what usage records as the endpoint that answered), is stable
    while the model is, so its breaker and in-flight count survive catalog
    updates like a replica's.
    """
    ext = model.external
    assert ext is not None
    return Endpoint(
        id=f"{'peer' if ext.peer else 'external'}:{model.name}",
        model=model.name,
        url=ext.url.rstrip("/"),
        served_name=ext.model,
        api_key_file=ext.api_key_file,
        external=True,
        comfyui=ext.api == "comfyui",
        peer=ext.peer,
        origin_cluster=ext.origin_cluster,
        hop_limit=ext.hop_limit,
    )


def static_layer(
    backends: Iterable[Backend], created: int, declared: Iterable[StaticModel] = ()
) -> tuple[list[Model], list[Endpoint]]:
    """Models and endpoints for the configured models and backends.

    A declared model carries its routing policy (fallbacks, canary, external
    provider); a backend adds an endpoint to the model of its name, declared
    or not, and its aliases to that model's.

    Endpoint ids are ``static:<model>:<n>`` (n counts backends of that model
    from 0), so they never collide with replica ids and stay stable across
    restarts with the same configuration.
    """
    models: dict[str, Model] = {m.name: _declared(m, created) for m in declared}
    endpoints: list[Endpoint] = []
    counts: dict[str, int] = {}
    for backend in backends:
        known = models.get(backend.model) or Model(backend.model, (), "llmgw", created)
        extra = tuple(a for a in backend.aliases if a not in known.aliases)
        models[backend.model] = replace(known, aliases=known.aliases + extra)
        n = counts.get(backend.model, 0)
        counts[backend.model] = n + 1
        endpoints.append(
            Endpoint(
                id=f"static:{backend.model}:{n}",
                model=backend.model,
                url=backend.url.rstrip("/"),
                served_name=backend.served_name,
                weight=backend.weight,
                priority=backend.priority,
                api_key=backend.api_key,
            )
        )
    return list(models.values()), endpoints


def _declared(spec: StaticModel, created: int) -> Model:
    ext = spec.external
    return Model(
        name=spec.name,
        aliases=tuple(spec.aliases),
        owned_by=spec.owned_by,
        created=created,
        fallbacks=tuple(spec.fallbacks),
        canary=Canary(spec.canary.model, spec.canary.percent) if spec.canary else None,
        external=External(ext.url, ext.model, ext.api_key_file) if ext else None,
        apis=tuple(spec.apis),
    )
