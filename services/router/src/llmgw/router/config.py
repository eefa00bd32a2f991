"""The router's configuration file (YAML), validated at start.

Two ways to run, and both can be combined:

- **cluster**: ``control`` lists control-plane addresses; the router watches
  endpoints and the catalog from whichever answers, and derives each
  replica's engine key from ``cluster_secret_file``.
- **standalone**: ``backends`` lists engines directly (no control plane),
  for simple deployments and benchmarks.

Example::

    # host:port of the OpenAI HTTP API.
    listen: 127.0.0.1:8080
    # Control-plane addresses (host:port) to watch endpoints and the catalog from, tried in turn.
    control: ["127.0.0.1:50051"]
    # File holding the cluster secret; engine keys are derived from it. Required with `control`.
    cluster_secret_file: /etc/llmgw/secret
    # Mutual TLS to the control planes (required with `control`, or `plaintext: true` for development).
    tls: {ca_file: /etc/llmgw/tls/ca.crt, cert_file: /etc/llmgw/tls/router-r1.crt,
          key_file: /etc/llmgw/tls/router-r1.key}
    # Static engines (standalone mode), alongside or instead of the control plane's.
    backends:
      - {model: tiny, url: "http://127.0.0.1:9001", api_key: "k1"}
    # Standalone routing policy: fallbacks, a canary share, an external provider.
    models:
      - {name: big, fallbacks: [tiny], canary: {model: big-next, percent: 5}}
      - name: gpt
        external: {url: "https://api.openai.com", model: gpt-4o, api_key_file: /etc/llmgw/openai.key}
    # Processes sharing the listen port.
    workers: 2
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from llmgw.common.config import Document
from llmgw.common.tls import TlsSettings, require

from .apis import API_NAMES


class Backend(Document):
    # Catalog name clients ask for.
    model: str
    # Engine base URL, without /v1.
    url: str = Field(pattern=r"^https?://")
    # Other names that resolve to this model.
    aliases: list[str] = Field(default_factory=list)
    # The model name the engine answers to; default: model.
    served_name: str = ""
    # Bearer key sent to the engine (the client's own key is never forwarded).
    api_key: str = ""
    # Relative share among endpoints of one tier.
    weight: int = Field(default=1, ge=1)
    # Lower is preferred; the next tier is used only when every endpoint of this one is saturated or down.
    priority: int = Field(default=0, ge=0)


class CanarySpec(Document):
    # The candidate model (name or alias) that takes a share of this model's requests.
    model: str = Field(min_length=1)
    # Share of requests sent to the candidate, in (0, 100].
    percent: float = Field(gt=0, le=100)


class ExternalSpec(Document):
    # Base URL of an OpenAI-compatible provider, without /v1.
    url: str = Field(pattern=r"^https?://[^\s/]+")
    # The provider's API dialect; only openai today.
    api: Literal["openai"] = "openai"
    # The provider's name for the model; default: the model's name here.
    model: str = ""
    # File holding the provider key; re-read when it changes, so a rotated key needs no restart.
    api_key_file: str = ""


class StaticModel(Document):
    # Catalog name clients ask for (standalone mode; the control plane's catalog wins a name clash).
    name: str = Field(min_length=1)
    # Other names that resolve to this model.
    aliases: list[str] = Field(default_factory=list)
    # Shown in /v1/models.
    owned_by: str = "llmgw"
    # Models (names or aliases) that answer, in order, when this one has no capacity.
    fallbacks: list[str] = Field(default_factory=list)
    # A candidate model taking a share of the requests.
    canary: CanarySpec | None = None
    # Served by this provider instead of by backends.
    external: ExternalSpec | None = None
    # The APIs it serves (chat, completions, embeddings, responses, messages, audio, rerank,
    # score, pooling, classify, tokenize); empty: every API.
    apis: list[str] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _no_self_reference(self) -> StaticModel:
        unknown = [a for a in self.apis if a not in API_NAMES]
        if unknown:
            raise ValueError(f"model {self.name!r}: unknown apis {unknown}; known: {', '.join(API_NAMES)}")
        if self.name in self.fallbacks:
            raise ValueError(f"model {self.name!r} lists itself as a fallback")
        if self.canary is not None and self.canary.model == self.name:
            raise ValueError(f"model {self.name!r} is its own canary candidate")
        return self


class Limits(Document):
    # Largest request body accepted; larger is a 413.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # A client must send a whole request (head and body) within this long of its first byte.
    client_read_timeout_seconds: float = Field(default=60.0, gt=0)
    # A request's head (request line and header fields) must arrive within this long of its first byte.
    head_timeout_seconds: float = Field(default=10.0, gt=0)
    # Longest silence while a request's body arrives.
    body_idle_timeout_seconds: float = Field(default=10.0, gt=0)
    # An idle keep-alive client connection is closed after this long.
    keepalive_timeout_seconds: float = Field(default=75.0, gt=0)
    # Longest a write to a client that does not read may wait before the connection is closed.
    client_write_timeout_seconds: float = Field(default=30.0, gt=0)
    # One line of a request's head: a longer request line is a 414, a longer header line a 431.
    max_line_bytes: int = Field(default=8 * 1024, ge=256)
    # A request's whole head; larger is a 431. Also an engine answer's head.
    max_head_bytes: int = Field(default=64 * 1024, ge=1024)
    # Header fields in one request (431 past it) or one engine answer.
    max_headers: int = Field(default=100, ge=8)
    # Client connections open at once, per worker; one more is answered 503 and closed.
    max_client_connections: int = Field(default=10_000, ge=1)
    # An engine's whole (not streamed) answer; larger fails the attempt (502).
    max_answer_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    # TCP connect to an engine.
    connect_timeout_seconds: float = Field(default=3.0, gt=0)
    # Until the engine's response headers arrive.
    first_byte_timeout_seconds: float = Field(default=120.0, gt=0)
    # Longest silence in a streamed response before the router gives up.
    idle_stream_timeout_seconds: float = Field(default=60.0, gt=0)
    # Whole request, end to end.
    request_timeout_seconds: float = Field(default=900.0, gt=0)
    # A realtime (WebSocket) session's longest message, either way: a longer one from the client
    # closes the session with code 1009, from the engine with 1011.
    realtime_max_message_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # A realtime session with no message either way for this long is closed (code 1008).
    realtime_idle_timeout_seconds: float = Field(default=300.0, gt=0)
    # A realtime session's longest life; then it is closed (code 1008).
    realtime_session_timeout_seconds: float = Field(default=3600.0, gt=0)
    # Other replicas tried after a failure before the first byte.
    retries: int = Field(default=2, ge=0, le=10)
    # Retry-After sent with 503 when a model has no ready replica.
    retry_after_seconds: int = Field(default=2, ge=1)
    # Circuit breaker: after this many consecutive failures an endpoint is
    # skipped for breaker_cooldown_seconds (unless every endpoint is skipped).
    breaker_failures: int = Field(default=3, ge=1)
    # How long a tripped endpoint is skipped.
    breaker_cooldown_seconds: float = Field(default=5.0, gt=0)


class Balancing(Document):
    # Bounded-load affinity: an endpoint takes a key only while its load would stay within this many
    # times the average (per unit of weight).
    load_factor: float = Field(default=1.25, ge=1.0)
    # An endpoint with this many requests in flight from this router is saturated (so is one whose
    # engine reports requests waiting); a tier is spilled from only when all of it is saturated or down.
    saturation_in_flight: int = Field(default=256, ge=1)
    # How often each engine's /metrics is polled for its queue; 0 turns polling off.
    engine_metrics_interval_seconds: float = Field(default=1.0, ge=0)
    # One poll's time limit; a slow engine keeps its last sample.
    engine_metrics_timeout_seconds: float = Field(default=0.5, gt=0)
    # A sample older than this is ignored (the load is then this router's in-flight count alone).
    engine_metrics_max_age_seconds: float = Field(default=10.0, gt=0)
    # Affinity key: this many leading characters of the messages (or of the prompt).
    prefix_chars: int = Field(default=512, ge=16)
    # A prefix shorter than this gets no affinity (too short for an engine to cache).
    min_prefix_chars: int = Field(default=64, ge=1)


class Quota(Document):
    # How often this router reports per-key usage to the leader and takes its share of what is
    # left (see docs/keys.md); a shorter interval overshoots less in a burst.
    sync_interval_seconds: float = Field(default=0.5, gt=0, le=10)
    # A sync answer slower than this counts as a failed sync (the router reconnects).
    sync_timeout_seconds: float = Field(default=3.0, gt=0)


class Autoscaling(Document):
    # How often this router reports its load to the leading control plane (requests in flight per
    # replica, engine queues, when each model was last used, requests waiting for a model to wake).
    report_interval_seconds: float = Field(default=1.0, gt=0, le=60)
    # A request for an on-demand model (scaling.min 0) with no ready replica waits this long for one
    # to start, then gets 503 with Retry-After.
    wake_timeout_seconds: float = Field(default=120.0, gt=0)


class Https(Document):
    # The certificate chain (PEM) the router serves its clients with; read again
    # when it changes. Empty (and key_file empty): plain HTTP.
    cert_file: str = ""
    # Its private key (PEM).
    key_file: str = ""

    @model_validator(mode="after")
    def _pair(self) -> Https:
        if bool(self.cert_file) != bool(self.key_file):
            raise ValueError("https: cert_file and key_file go together")
        return self


class RouterConfig(Document):
    # host:port the OpenAI HTTP API listens on.
    listen: str = "127.0.0.1:8080"
    # HTTPS for clients (router/https.py): certificate and key files, reloaded
    # when they change. Unset: plain HTTP, the default (TLS terminated in front).
    https: Https = Field(default_factory=Https)
    # Control-plane addresses (host:port) to watch endpoints, catalog and keys
    # from; any of them, leader or standby. Empty: standalone (`backends`).
    control: list[str] = Field(default_factory=list)
    # File holding the cluster secret (the control planes' file): engine keys
    # derive from it. Required with `control`.
    cluster_secret_file: str = ""
    # Mutual TLS to the control planes (common/tls.py): the CA, this router's
    # certificate (`llmgw certs issue router NAME`) and key, read again at each
    # reconnect. Required with `control`, unless `plaintext: true` (development only).
    tls: TlsSettings = Field(default_factory=TlsSettings)
    # Static engines, no control plane needed (`--backend MODEL=URL`); with
    # `control` they are added to the watched table.
    backends: list[Backend] = Field(default_factory=list)
    # Standalone models with routing policy (fallbacks, canary, external provider); backends add
    # endpoints to them by name.
    models: list[StaticModel] = Field(default_factory=list)
    # Size limits, timeouts, retries and the breaker.
    limits: Limits = Field(default_factory=Limits)
    # How a replica is chosen: prefix/session affinity with bounded load over power-of-two-choices,
    # power-of-two-choices on load alone, or plain rotation.
    balancer: Literal["affinity", "least-load", "round-robin"] = "affinity"
    # Knobs of the balancer and of the engine-metrics poll.
    balancing: Balancing = Field(default_factory=Balancing)
    # Load reports to the control plane and on-demand wake (only with `control`).
    autoscaling: Autoscaling = Field(default_factory=Autoscaling)
    # Name in logs and in the control plane's view; default host-pid.
    router_id: str = ""
    # Processes serving the one listen port (SO_REUSEPORT), each with its own watch and table; 1 serves
    # in the main process. A fixed port is needed for more than one.
    workers: int = Field(default=1, ge=1, le=256)
    # One key=value log line per proxied request (request id, model, replica, status, duration).
    access_log: bool = True
    # How often an external provider's key file is checked for a new key (see `models[].external`).
    key_file_recheck_seconds: float = Field(default=1.0, gt=0)
    # debug, info, warning or error.
    log_level: str = "info"
    # On SIGTERM: how long in-flight requests may finish before they are cut.
    shutdown_grace_seconds: float = Field(default=5.0, ge=0)
    # Reconnect backoff of the control-plane watch (jittered, capped).
    watch_backoff_initial_seconds: float = Field(default=0.1, gt=0)
    # Upper bound of that backoff.
    watch_backoff_max_seconds: float = Field(default=2.0, gt=0)
    # Client API keys: "none" serves every request; "keys" requires `Authorization: Bearer <key>`
    # with a key made by `llmgw keys create` and enforces its models and limits (needs `control`).
    auth: Literal["none", "keys"] = "none"
    # Sharing per-key limits among routers (with auth: keys).
    quota: Quota = Field(default_factory=Quota)

    @model_validator(mode="after")
    def _has_a_source(self) -> RouterConfig:
        if not self.control and not self.backends and not self.models:
            raise ValueError("set `control` (control-plane addresses) or `backends` (or `models`), or both")
        if self.control and not self.cluster_secret_file:
            raise ValueError("`cluster_secret_file` is required with `control`: engine keys derive from it")
        if self.control:
            require(self.tls)
        if self.workers > 1 and self.listen.rpartition(":")[2] == "0":
            raise ValueError(
                "`workers` above 1 needs a fixed port in `listen`: each worker binds the same one"
            )
        if self.auth == "keys" and not self.control:
            raise ValueError("`auth: keys` needs `control`: routers learn the keys from the control plane")
        return self
