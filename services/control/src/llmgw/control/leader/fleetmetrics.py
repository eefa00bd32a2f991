"""The fleet as Prometheus metrics, read from the leader's state at each scrape.

A collector rather than gauges kept up to date: the figures are computed
from the controller's inventory, records and last pass when Prometheus
asks, so they cannot drift from what ``llmgw nodes``/``llmgw replicas``
show, and nothing is written on the hot path. Only the leader knows the
fleet: a standby exports the settings version and none of the fleet
series (dashboards sum over control planes and still count each node
once; ``llmgw_control_leader`` says which one leads).

Series (units in names, gauges unless ``_total``):

- ``llmgw_control_nodes{state}``: nodes by ``ready``, ``held``,
  ``unreachable``, ``lost`` (every state present, zero included).
- ``llmgw_control_node_gpus{node}``, ``..._gpus_used{node}``,
  ``..._gpus_free{node}``: a GPU is used when a record or a running engine
  holds it (placement's rule).
- ``llmgw_control_replicas{model,state}``: replicas with a record, by the
  state their agent reports (``unreported`` before the first report).
- ``llmgw_control_model_replicas_wanted{model}`` and
  ``llmgw_control_model_replicas_ready{model}``: desired vs ready.
- ``llmgw_control_models_unplaced{reason}``: models with replicas waiting
  unplaced after the last pass, by reason (the counter
  ``llmgw_control_placement_failures_total{reason}`` is in metrics).
- ``llmgw_control_owner_replicas{owner}``, ``llmgw_control_owner_gpus{owner}``,
  ``llmgw_control_owner_gpu_memory_bytes{owner}``: what each owner scope
  (org, org/team, org/team/project) holds, as quotas count it; and
  ``llmgw_control_owner_quota_gpus{owner}`` etc. for the scopes with a quota.
- ``llmgw_control_settings_version``: the cluster settings version in force.
- ``llmgw_control_owner_requests_total{owner,model}`` and
  ``llmgw_control_owner_tokens_total{owner,model}``: what each owner path's
  client keys consumed, by model, as the routers reported it this term
  (:class:`OwnerRequestsCollector`; per exact path, sum for a team or org).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from llmgw.v1 import agent_pb2

from ..decide.reconcile import UNPLACED_KINDS, Replica
from ..decide.tenancy import Ledger
from ..spec.catalog import GB, Catalog
from ..spec.tenancy import Quota
from ..state.inventory import Node
from ..state.ownerrequests import OwnerRequests

NODE_STATES = ("ready", "held", "unreachable", "lost")


class FleetView(Protocol):
    @property
    def accepting(self) -> bool: ...
    @property
    def catalog(self) -> Catalog: ...
    @property
    def unplaced(self) -> Mapping[str, str]: ...
    def nodes(self) -> list[Node]: ...
    def replicas(self) -> list[Replica]: ...
    def used_gpus(self, node: Node) -> set[int]: ...
    def wanted(self, model_name: str) -> int: ...
    def quotas(self) -> Mapping[str, Quota]: ...


def _state(r: Replica) -> str:
    if r.reported is None:
        return "unreported"
    return agent_pb2.ReplicaState.Name(r.reported.state).removeprefix("REPLICA_STATE_").lower()


class FleetCollector(Collector):
    def __init__(self, view: FleetView, settings_version: Callable[[], int]):
        self._view = view
        self._version = settings_version

    def describe(self) -> list:
        # Nothing to describe up front: registering must not run a scrape.
        return []

    def collect(self) -> Iterator[GaugeMetricFamily]:
        version = GaugeMetricFamily(
            "llmgw_control_settings_version", "The cluster settings version in force on this control plane"
        )
        version.add_metric([], self._version())
        yield version
        view = self._view
        if not view.accepting:
            return
        nodes, replicas, catalog = view.nodes(), view.replicas(), view.catalog
        yield from self._nodes(nodes)
        by_model: dict[str, Counter[str]] = {m.name: Counter() for m in catalog if m.profiles}
        for r in replicas:
            by_model.setdefault(r.record.model, Counter())[_state(r)] += 1
        reps = GaugeMetricFamily(
            "llmgw_control_replicas", "Recorded replicas by reported state", labels=["model", "state"]
        )
        wanted = GaugeMetricFamily(
            "llmgw_control_model_replicas_wanted", "Replicas the leader wants per model", labels=["model"]
        )
        ready = GaugeMetricFamily(
            "llmgw_control_model_replicas_ready", "Ready replicas per model", labels=["model"]
        )
        for model in sorted(by_model):
            for state, n in sorted(by_model[model].items()):
                reps.add_metric([model, state], n)
            wanted.add_metric([model], view.wanted(model))
            ready.add_metric([model], by_model[model]["ready"])
        yield from (reps, wanted, ready)
        unplaced = GaugeMetricFamily(
            "llmgw_control_models_unplaced",
            "Models with replicas waiting unplaced, by reason",
            labels=["reason"],
        )
        kinds = Counter(view.unplaced.values())
        for kind in UNPLACED_KINDS:
            unplaced.add_metric([kind], kinds[kind])
        yield unplaced
        yield from self._owners(catalog, nodes, replicas, view.quotas())

    def _nodes(self, nodes: list[Node]) -> Iterator[GaugeMetricFamily]:
        states = Counter(n.status for n in nodes)
        by_state = GaugeMetricFamily("llmgw_control_nodes", "Nodes by state", labels=["state"])
        for state in NODE_STATES:
            by_state.add_metric([state], states[state])
        yield by_state
        total = GaugeMetricFamily("llmgw_control_node_gpus", "GPUs a node reports", labels=["node"])
        used = GaugeMetricFamily("llmgw_control_node_gpus_used", "GPUs a replica holds", labels=["node"])
        free = GaugeMetricFamily("llmgw_control_node_gpus_free", "GPUs no replica holds", labels=["node"])
        for n in nodes:
            taken = len({g.index for g in n.gpus} & self._view.used_gpus(n))
            total.add_metric([n.id], len(n.gpus))
            used.add_metric([n.id], taken)
            free.add_metric([n.id], len(n.gpus) - taken)
        yield from (total, used, free)

    @staticmethod
    def _owners(
        catalog: Catalog, nodes: list[Node], replicas: list[Replica], quotas: Mapping[str, Quota]
    ) -> Iterator[GaugeMetricFamily]:
        ledger = Ledger(quotas, catalog, {n.id: n for n in nodes}, [r.record for r in replicas])
        reps = GaugeMetricFamily("llmgw_control_owner_replicas", "Replicas per owner scope", labels=["owner"])
        gpus = GaugeMetricFamily("llmgw_control_owner_gpus", "GPUs per owner scope", labels=["owner"])
        mem = GaugeMetricFamily(
            "llmgw_control_owner_gpu_memory_bytes", "Memory of the GPUs per owner scope", labels=["owner"]
        )
        for owner in sorted(set(ledger.use) | set(quotas)):
            u = ledger.usage(owner)
            reps.add_metric([owner], u.replicas)
            gpus.add_metric([owner], u.gpus)
            mem.add_metric([owner], u.gpu_memory_bytes)
        yield from (reps, gpus, mem)
        q_reps = GaugeMetricFamily(
            "llmgw_control_owner_quota_replicas", "Replica quota per owner scope", labels=["owner"]
        )
        q_gpus = GaugeMetricFamily(
            "llmgw_control_owner_quota_gpus", "GPU quota per owner scope", labels=["owner"]
        )
        q_mem = GaugeMetricFamily(
            "llmgw_control_owner_quota_gpu_memory_bytes", "GPU memory quota per owner scope", labels=["owner"]
        )
        for owner, q in sorted(quotas.items()):
            if q.replicas is not None:
                q_reps.add_metric([owner], q.replicas)
            if q.gpus is not None:
                q_gpus.add_metric([owner], q.gpus)
            if q.gpu_memory_gb is not None:
                q_mem.add_metric([owner], q.gpu_memory_gb * GB)
        yield from (q_reps, q_gpus, q_mem)


def register(registry: CollectorRegistry, view: FleetView, settings_version: Callable[[], int]) -> None:
    registry.register(FleetCollector(view, settings_version))


class OwnerRequestsCollector(Collector):
    """Requests and tokens per owner path and model: the leader's book, this term's (nothing on a standby)."""

    def __init__(self, book: OwnerRequests, term: Callable[[], object | None], wall: Callable[[], float]):
        self._book = book
        self._term = term
        self._wall = wall

    def describe(self) -> list:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        requests = CounterMetricFamily(
            "llmgw_control_owner_requests",
            "Requests of each owner path's client keys, by model, this term (routers' reports)",
            labels=["owner", "model"],
        )
        tokens = CounterMetricFamily(
            "llmgw_control_owner_tokens",
            "Prompt plus completion tokens of each owner path's client keys, by model, this term",
            labels=["owner", "model"],
        )
        term = self._term()
        if term is not None:
            for (owner, model), (n, t) in sorted(self._book.term(term, self._wall()).totals().items()):
                requests.add_metric([owner, model], n)
                tokens.add_metric([owner, model], t)
        yield from (requests, tokens)
