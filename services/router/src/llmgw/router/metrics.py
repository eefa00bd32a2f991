"""The router's Prometheus metrics, on a registry owned by one app.

Series (names by Prometheus convention):

- ``llmgw_router_requests_total{model,status}``: proxied requests by the
  status the client got (499: the client hung up first). ``model`` is the
  canonical name, or empty when the request named no known model, so client
  input cannot blow up cardinality.
- ``llmgw_router_request_duration_seconds{model}``: until the last byte.
- ``llmgw_router_in_flight{model}``: requests this router has upstream now.
- ``llmgw_router_upstream_retries_total{model}``: attempts on another endpoint
  after a failure before anything reached the client.
- ``llmgw_router_stream_resumes_total{model}``: broken streams re-issued on
  another endpoint to continue where they broke (see :mod:`.resume`).
- ``llmgw_router_endpoints{model}``: routable endpoints, read from the table
  at scrape time so it can never drift from it.
- ``llmgw_router_table_revision{stream}`` and
  ``llmgw_router_watch_connected{stream}``: per watch stream (``endpoints``,
  ``catalog``); a label rather than two names because the two streams
  share the meaning.

Per-model series are created at zero as soon as a model enters the table;
per-stream series at construction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .table import Model, Route

STREAMS = ("endpoints", "catalog")

# LLM requests run from milliseconds (embeddings) to many minutes (long
# generations), so the buckets span that range.
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class TableView(Protocol):
    def models(self) -> list[Model]: ...
    def routes(self, model: str) -> Sequence[Route]: ...


class _EndpointsCollector(Collector):
    def __init__(self, table: TableView) -> None:
        self._table = table

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily(
            "llmgw_router_endpoints", "Routable endpoints per model.", labels=["model"]
        )
        for model in self._table.models():
            family.add_metric([model.name], len(self._table.routes(model.name)))
        yield family


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry, table: TableView) -> None:
        self.registry = registry
        self._table = table
        self.requests = Counter(
            "llmgw_router_requests",
            "Proxied requests by model and the HTTP status sent to the client.",
            ["model", "status"],
            registry=registry,
        )
        self.duration = Histogram(
            "llmgw_router_request_duration_seconds",
            "Proxied request duration, until the last byte.",
            ["model"],
            buckets=DURATION_BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "llmgw_router_in_flight",
            "Requests this router has sent upstream and not finished.",
            ["model"],
            registry=registry,
        )
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
        registry.register(_EndpointsCollector(table))
        for stream in STREAMS:
            self.revision.labels(stream)
            self.connected.labels(stream)
        self.table_changed()

    def table_changed(self) -> None:
        """Create every model's series at zero (idempotent)."""
        for model in self._table.models():
            self.requests.labels(model.name, "200")
            self.duration.labels(model.name)
            self.in_flight.labels(model.name)
            self.retries.labels(model.name)
            self.resumes.labels(model.name)

    # The watch client's view (see watch.WatchGauges).
    def watch_connected(self, stream: str, connected: bool) -> None:
        self.connected.labels(stream).set(1 if connected else 0)

    def table_revision(self, stream: str, revision: int) -> None:
        self.revision.labels(stream).set(revision)
