"""The control plane's Prometheus metrics, on a registry handed in by the entry point.

No module-level collectors: each :class:`ControlMetrics` registers on its
own registry, so two control planes in one test process do not collide.
Every labelled series is created at zero, so a dashboard sees a flat line
rather than a gap before the first event.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

COMMAND_KINDS = ("start", "stop", "set_adapters")
STREAMS = ("endpoints", "catalog", "keys")


class ControlMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.registry = registry
        self.leader = Gauge(
            "llmgw_control_leader", "1 while this control plane leads, else 0", registry=registry
        )
        self.terms = Counter(
            "llmgw_control_leader_terms_total", "Terms of leadership begun", registry=registry
        )
        self.reconcile_passes = Counter(
            "llmgw_control_reconcile_passes_total", "Reconcile passes run", registry=registry
        )
        self.reconcile_failures = Counter(
            "llmgw_control_reconcile_failures_total",
            "Reconcile passes that failed (logged; the loop goes on)",
            registry=registry,
        )
        self.commands = Counter(
            "llmgw_control_agent_commands_total",
            "Commands sent to agents",
            ["kind"],
            registry=registry,
        )
        self.evictions = Counter(
            "llmgw_control_evictions_total",
            "Opportunistic replicas evicted to make room for a critical model",
            registry=registry,
        )
        self.agents = Gauge("llmgw_control_agents_connected", "Agent streams open", registry=registry)
        self.endpoint_puts = Counter(
            "llmgw_control_endpoint_puts_total", "Endpoints written to etcd", registry=registry
        )
        self.endpoint_deletes = Counter(
            "llmgw_control_endpoint_deletes_total", "Endpoints removed from etcd", registry=registry
        )
        self.watchers = Gauge("llmgw_control_watchers", "Open Watch streams", ["stream"], registry=registry)
        self.watch_resyncs = Counter(
            "llmgw_control_watch_resyncs_total",
            "Times a mirrored prefix was re-read from etcd (start, compaction, outage)",
            ["stream"],
            registry=registry,
        )
        for kind in COMMAND_KINDS:
            self.commands.labels(kind)
        for stream in STREAMS:
            self.watchers.labels(stream)
            self.watch_resyncs.labels(stream)

    def resynced(self, stream: str) -> None:
        self.watch_resyncs.labels(stream).inc()

    def endpoint_written(self, puts: int, deletes: int) -> None:
        self.endpoint_puts.inc(puts)
        self.endpoint_deletes.inc(deletes)


class AutoscaleMetrics:
    """What the scaler decided and what it decides on (series per model appear with the model)."""

    def __init__(self, registry: CollectorRegistry):
        self.desired = Gauge(
            "llmgw_control_desired_replicas",
            "Replicas the autoscaler wants per model (leader only)",
            ["model"],
            registry=registry,
        )
        self.load = Gauge(
            "llmgw_control_model_load",
            "Requests in flight, queued or held per model, summed over reporting routers",
            ["model"],
            registry=registry,
        )
        self.draining = Gauge(
            "llmgw_control_draining_replicas", "Replicas unpublished and waiting to drain", registry=registry
        )
        self.routers = Gauge(
            "llmgw_control_usage_routers", "Routers whose usage reports are live", registry=registry
        )
        self.changes = Counter(
            "llmgw_control_scale_changes_total",
            "Changes of a model's desired replica count",
            ["model", "direction"],
            registry=registry,
        )
