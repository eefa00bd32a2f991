"""The router's Prometheus metrics, on a registry owned by one app.

Series (names by Prometheus convention; ``model`` is the canonical name of
the model that answered, which differs from the one asked for after a
fallback or a canary draw, or empty when the request named no known model,
so client input cannot blow up cardinality):

- ``llmgw_router_requests_total{model,status,replica}``: proxied requests by
  the status the client got (499: the client hung up first) and the replica
  of the last attempt (empty when none was tried); the stored responses'
  routes by id count too, and a realtime session once it ends (status 101:
  it opened; its duration is the session's). A replica's series are
  dropped when it leaves the table, so replica churn does not grow the
  exposition for ever.
- ``llmgw_router_request_duration_seconds{model}``: until the last byte.
- ``llmgw_router_time_to_first_token_seconds{model}``: streams, from the
  request's arrival to its first event reaching the client.
- ``llmgw_router_inter_token_seconds{model}``: streams, the gap between
  successive writes of events to the client. An engine sends one event per
  token; events that arrive in one read are one write, so under load this
  reads as the gap between batches the client sees.
- ``llmgw_router_prompt_tokens_total{model}`` and
  ``llmgw_router_completion_tokens_total{model}``: from the ``usage`` the
  engine reports (every non-streamed answer; a stream only when the client
  asked for ``stream_options.include_usage``, since the router does not parse
  the tokens it relays).
- ``llmgw_router_in_flight{model}``: requests this router has upstream now,
  summed from the table's per-endpoint counts at scrape time.
- ``llmgw_router_upstream_retries_total{model}``: attempts on another endpoint
  after a failure before anything reached the client.
- ``llmgw_router_stream_resumes_total{model}``: broken streams re-issued on
  another endpoint to continue where they broke (see :mod:`.resume`).
- ``llmgw_router_fallbacks_total{model,fallback}`` and
  ``llmgw_router_canary_requests_total{model,candidate}``: requests for
  ``model`` sent to another model (see :mod:`.fallbacks`).
- ``llmgw_router_endpoints{model}`` and
  ``llmgw_router_breaker_state{model,replica,state}`` (1 for the state the
  replica's breaker is in, 0 for the other two): read from the table at
  scrape time, so they can never drift from it.
- ``llmgw_router_engine_requests_running{model,replica}`` and
  ``llmgw_router_engine_requests_waiting{model,replica}``: what each engine
  last reported on its own ``/metrics`` (``vllm:num_requests_running`` and
  ``vllm:num_requests_waiting``, every client's requests, not only this
  router's), as polled for balancing (see :mod:`.enginemetrics`); absent for
  a replica with no sample yet, or a stale one from a previous engine.
- ``llmgw_router_table_revision{stream}`` and
  ``llmgw_router_watch_connected{stream}``: per watch stream (``endpoints``,
  ``catalog``); a label rather than two names because the two streams
  share the meaning.

Per-model series are created at zero as soon as a model enters the table;
per-stream series at construction.

Cost on the request path, which every request and every streamed chunk
pays: a model's series are reached through one dictionary lookup
(:meth:`RouterMetrics.series`), not a ``labels()`` call per observation, and
the three histograms are :class:`LoopHistogram`: a bucket increment with no
lock (only the event loop's thread writes them, and the scrape runs on that
loop too), about a fifth of ``prometheus_client``'s locked ``observe``. An
inter-token observation per chunk is thus a fraction of a microsecond. The
counters every request moves (requests, tokens) are :class:`LoopCounter`
for the same reason.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .table import Model, Route
from .tokens import usage

STREAMS = ("endpoints", "catalog")
BREAKER_STATES = ("closed", "open", "half_open")

# LLM requests run from milliseconds (embeddings) to many minutes (long
# generations), so the buckets span that range.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
# Time to first token: prefill, from tens of milliseconds to a long prompt's minute.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# Between tokens: a few milliseconds on a fast GPU, seconds when a batch stalls.
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class TableView(Protocol):
    def models(self) -> list[Model]: ...
    def routes(self, model: str) -> Sequence[Route]: ...
    def resolve(self, name: str) -> Model | None: ...


class LoopHistogram:
    """One histogram series, written only from the event loop's thread (no lock)."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        # counts[i] observations fell in (bounds[i-1], bounds[i]]; the last one past every bound.
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, float]]:
        out: list[tuple[str, float]] = []
        total = 0
        for bound, count in zip((*map(float, self.bounds), float("inf")), self.counts, strict=True):
            total += count
            out.append((_le(bound), total))
        return out


class LoopCounter:
    """One counter series, written only from the event loop's thread (no lock)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


class _Counters(Collector):
    """A family of :class:`LoopCounter` by label values, exposed at scrape time."""

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...]) -> None:
        self.name = name
        self._documentation = documentation
        self._labels = labels
        self.children: dict[tuple[str, ...], LoopCounter] = {}

    def labels(self, *values: str) -> LoopCounter:
        """The child for these label values, made at zero the first time."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = LoopCounter()
        return child

    def remove(self, *values: str) -> None:
        self.children.pop(values, None)

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self._documentation, labels=list(self._labels))
        for values, child in self.children.items():
            family.add_metric(list(values), child.value)
        yield family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


class _Histograms(Collector):
    """A family of :class:`LoopHistogram` by model, exposed at scrape time."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...]) -> None:
        self.name = name
        self._documentation = documentation
        self._bounds = bounds
        self.children: dict[str, LoopHistogram] = {}

    def labels(self, model: str) -> LoopHistogram:
        child = self.children.get(model)
        if child is None:
            child = self.children[model] = LoopHistogram(self._bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self._documentation, labels=["model"])
        for model, child in self.children.items():
            family.add_metric([model], child.cumulative(), child.sum)
        yield family


class Traffic:
    """One model's answered requests and errors since start, for the usage report (not exported).

    ``llmgw_router_requests_total`` has the same counts by status, but its
    series go with their replica; these never go down while the router runs.
    """

    __slots__ = ("client_errors", "requests", "server_errors")

    def __init__(self) -> None:
        self.requests = 0
        self.client_errors = 0
        self.server_errors = 0


# What one request's end counts in: its requests_total child, its model's duration histogram,
# its model's Traffic, and whether its status is a server (1) or client (2) error, or neither (0).
_Done = tuple[LoopCounter, LoopHistogram, Traffic, int]
_SERVER_ERROR, _CLIENT_ERROR = 1, 2


@dataclass(frozen=True)
class ModelSeries:
    """One model's children of the per-model families, resolved once."""

    duration: LoopHistogram
    ttft: LoopHistogram
    inter_token: LoopHistogram
    prompt_tokens: LoopCounter
    completion_tokens: LoopCounter
    retries: Counter
    resumes: Counter


class _TableCollector(Collector):
    def __init__(self, table: TableView, breaker_state: Callable[[Route], str] | None) -> None:
        self._table = table
        self._breaker_state = breaker_state

    def collect(self) -> Iterator[Metric]:
        endpoints = GaugeMetricFamily(
            "llmgw_router_endpoints", "Routable endpoints per model.", labels=["model"]
        )
        in_flight = GaugeMetricFamily(
            "llmgw_router_in_flight",
            "Requests this router has sent upstream and not finished.",
            labels=["model"],
        )
        running = GaugeMetricFamily(
            "llmgw_router_engine_requests_running",
            "Requests running on each replica's engine, as it last reported them (all clients).",
            labels=["model", "replica"],
        )
        waiting = GaugeMetricFamily(
            "llmgw_router_engine_requests_waiting",
            "Requests queued on each replica's engine, as it last reported them (all clients).",
            labels=["model", "replica"],
        )
        breaker = GaugeMetricFamily(
            "llmgw_router_breaker_state",
            "1 for the state each replica's circuit breaker is in (closed, open, half_open).",
            labels=["model", "replica", "state"],
        )
        for model in self._table.models():
            routes = self._table.routes(model.name)
            endpoints.add_metric([model.name], len(routes))
            in_flight.add_metric([model.name], sum(r.state.in_flight for r in routes))
            for route in routes:
                sample = route.state.engine
                if sample is not None and sample.url == route.endpoint.url:
                    running.add_metric([model.name, route.endpoint.id], sample.running)
                    waiting.add_metric([model.name, route.endpoint.id], sample.waiting)
                if self._breaker_state is None:
                    continue
                current = self._breaker_state(route)
                for state in BREAKER_STATES:
                    breaker.add_metric([model.name, route.endpoint.id, state], 1 if state == current else 0)
        yield endpoints
        yield in_flight
        yield running
        yield waiting
        if self._breaker_state is not None:
            yield breaker


class RouterMetrics:
    def __init__(
        self,
        registry: CollectorRegistry,
        table: TableView,
        breaker_state: Callable[[Route], str] | None = None,
    ) -> None:
        self.registry = registry
        self._table = table
        self._series: dict[str, ModelSeries] = {}
        # Per model that answered, since start (see Traffic); read by the usage reporter.
        self.traffic: dict[str, Traffic] = {}
        # (model, status, replica) -> what request_done counts in (see _request_series).
        self._done: dict[tuple[str, int, str], _Done] = {}
        self.requests = _Counters(
            "llmgw_router_requests",
            "Proxied requests by the model that answered, the HTTP status sent to the client and "
            "the replica of the last attempt.",
            ("model", "status", "replica"),
        )
        self.duration = _Histograms(
            "llmgw_router_request_duration_seconds",
            "Proxied request duration, until the last byte.",
            DURATION_BUCKETS,
        )
        self.ttft = _Histograms(
            "llmgw_router_time_to_first_token_seconds",
            "Streams: from the request's arrival to its first event reaching the client.",
            TTFT_BUCKETS,
        )
        self.inter_token = _Histograms(
            "llmgw_router_inter_token_seconds",
            "Streams: the gap between successive writes of events to the client.",
            ITL_BUCKETS,
        )
        for histograms in (self.duration, self.ttft, self.inter_token):
            registry.register(histograms)
        self.prompt_tokens = _Counters(
            "llmgw_router_prompt_tokens",
            "Prompt tokens of answered requests, from the usage the engine reported.",
            ("model",),
        )
        self.completion_tokens = _Counters(
            "llmgw_router_completion_tokens",
            "Completion tokens of answered requests, from the usage the engine reported.",
            ("model",),
        )
        for counters in (self.requests, self.prompt_tokens, self.completion_tokens):
            registry.register(counters)
        self.retries = Counter(
            "llmgw_router_upstream_retries",
            "Attempts on another endpoint after a failure before the first byte.",
            ["model"],
            registry=registry,
        )
        self.resumes = Counter(
            "llmgw_router_stream_resumes",
            "Broken streams continued on another endpoint.",
            ["model"],
            registry=registry,
        )
        self.fallbacks = Counter(
            "llmgw_router_fallbacks",
            "Requests for a model answered through one of its fallbacks.",
            ["model", "fallback"],
            registry=registry,
        )
        self.canary = Counter(
            "llmgw_router_canary_requests",
            "Requests for a model sent to its canary candidate.",
            ["model", "candidate"],
            registry=registry,
        )
        self.revision = Gauge(
            "llmgw_router_table_revision",
            "Last revision applied from the control plane, per watch stream.",
            ["stream"],
            registry=registry,
        )
        self.connected = Gauge(
            "llmgw_router_watch_connected",
            "1 while the watch stream is connected to a control plane.",
            ["stream"],
            registry=registry,
        )
        registry.register(_TableCollector(table, breaker_state))
        for stream in STREAMS:
            self.revision.labels(stream)
            self.connected.labels(stream)
        self.series("")
        self.table_changed()

    def series(self, model: str) -> ModelSeries:
        found = self._series.get(model)
        if found is None:
            found = ModelSeries(
                duration=self.duration.labels(model),
                ttft=self.ttft.labels(model),
                inter_token=self.inter_token.labels(model),
                prompt_tokens=self.prompt_tokens.labels(model),
                completion_tokens=self.completion_tokens.labels(model),
                retries=self.retries.labels(model),
                resumes=self.resumes.labels(model),
            )
            self._series[model] = found
        return found

    def request_done(self, model: str, status: int, replica: str, seconds: float) -> None:
        done = self._done.get((model, status, replica))
        if done is None:
            done = self._request_series(model, status, replica)
        counter, duration, traffic, kind = done
        counter.value += 1
        duration.counts[bisect.bisect_left(duration.bounds, seconds)] += 1  # observe(), inline
        duration.sum += seconds
        traffic.requests += 1
        if kind:
            if kind == _SERVER_ERROR:
                traffic.server_errors += 1
            else:
                traffic.client_errors += 1

    def _request_series(self, model: str, status: int, replica: str) -> _Done:
        """What a request with these labels counts in, found once (and again after a table change,
        which may drop a departed replica's series)."""
        traffic = self.traffic.get(model)
        if traffic is None:
            traffic = self.traffic[model] = Traffic()
        kind = _SERVER_ERROR if status >= 500 else _CLIENT_ERROR if 400 <= status != 499 else 0
        done = (self.requests.labels(model, str(status), replica), self.series(model).duration, traffic, kind)
        self._done[(model, status, replica)] = done
        return done

    def answered(self, model: str, body: bytes) -> tuple[int, int] | None:
        """Count the tokens of an answer from the usage at the end of ``body``; those counts."""
        counts = usage(body)
        if counts is not None:
            series = self._series.get(model) or self.series(model)
            series.prompt_tokens.value += counts[0]
            series.completion_tokens.value += counts[1]
        return counts

    def table_changed(self) -> None:
        """Create every model's series at zero, and drop departed replicas' (idempotent)."""
        replicas: set[str] = {""}
        for model in self._table.models():
            self.series(model.name)
            for route in self._table.routes(model.name):
                replicas.add(route.endpoint.id)
                self.requests.labels(model.name, "200", route.endpoint.id)
            for name in model.fallbacks:
                target = self._table.resolve(name)
                if target is not None:
                    self.fallbacks.labels(model.name, target.name)
            if model.canary is not None:
                candidate = self._table.resolve(model.canary.model)
                if candidate is not None:
                    self.canary.labels(model.name, candidate.name)
        for key in [k for k in self.requests.children if k[2] not in replicas]:
            self.requests.remove(*key)
        self._done.clear()

    # The watch client's view (see watch.WatchGauges).
    def watch_connected(self, stream: str, connected: bool) -> None:
        self.connected.labels(stream).set(1 if connected else 0)

    def table_revision(self, stream: str, revision: int) -> None:
        self.revision.labels(stream).set(revision)
