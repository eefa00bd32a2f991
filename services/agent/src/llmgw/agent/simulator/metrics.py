"""Prometheus metrics under vLLM's names, so dashboards and the router read the simulator as vLLM.

Every series carries ``model_name=<primary served name>`` and exists from the
first scrape (counters at zero, one ``request_success`` series per finish
reason). Each app has its own ``CollectorRegistry``; nothing touches the
global one, so several simulators can live in one process (tests do).

Two parts, deliberately: ``RequestMetrics`` counts what happened (the
engine pushes events into it, it is the engine's ``EngineObserver``), and
``LoadCollector`` reads the current load from the engine at scrape time, so
the gauges can never drift from the engine's own state.

kv_cache_usage_perc is a fraction 0..1, as in vLLM; what it measures is
documented in ``engine.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from .engine import EngineStats

FINISH_REASONS = ("stop", "length", "abort")

# vLLM's bucket boundaries, so histograms from real and simulated engines compare.
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class RequestMetrics:
    """Counters and histograms fed by engine events."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        labels = ["model_name"]
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=registry
        ).labels(model_name)
        self._generation_tokens = Counter(
            "vllm:generation_tokens",
            "Number of generation tokens processed.",
            labels,
            registry=registry,
        ).labels(model_name)
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=registry,
        )
        self._success = {r: success.labels(model_name, r) for r in FINISH_REASONS}
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=registry,
        ).labels(model_name)
        self._cache_queries = Counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
            labels,
            registry=registry,
        ).labels(model_name)
        self._cache_hits = Counter(
            "vllm:prefix_cache_hits",
            "Prefix cache hits, in terms of number of cached tokens.",
            labels,
            registry=registry,
        ).labels(model_name)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=E2E_BUCKETS,
            registry=registry,
        ).labels(model_name)

    def first_token(self, *, prompt_tokens: int, seconds_since_arrival: float) -> None:
        self._prompt_tokens.inc(prompt_tokens)
        self._ttft.observe(seconds_since_arrival)

    def generated_token(self) -> None:
        self._generation_tokens.inc()

    def finished(self, *, reason: str, seconds_since_arrival: float) -> None:
        self._success[reason].inc()
        self._e2e.observe(seconds_since_arrival)

    def prefix_cache(self, *, queried: int, hit: int) -> None:
        self._cache_queries.inc(queried)
        self._cache_hits.inc(hit)

    def embedded(self, *, prompt_tokens: int) -> None:
        self._prompt_tokens.inc(prompt_tokens)
        self._success["stop"].inc()


class LoadCollector:
    """The load gauges, read from the engine at scrape time."""

    def __init__(self, model_name: str, stats: Callable[[], EngineStats]) -> None:
        self._model_name = model_name
        self._stats = stats

    def describe(self) -> Iterator[Metric]:
        return self._families(EngineStats(running=0, waiting=0, kv_cache_usage=0.0))

    def collect(self) -> Iterator[Metric]:
        return self._families(self._stats())

    def _families(self, stats: EngineStats) -> Iterator[Metric]:
        for name, doc, value in (
            ("vllm:num_requests_running", "Number of requests in model execution batches.",
             stats.running),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
             stats.waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
             stats.kv_cache_usage),
        ):  # fmt: skip
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self._model_name], value)
            yield family
