"""deploy/grafana's dashboard queries only metrics the services really export.

The exported names are read from the services' own registries, built the
way each process builds them (the control plane's collectors with the
fleet collector as a leader's, the router app in cluster mode with client
keys, the agent's collector, so every optional family is there), not from
a list kept by hand: a metric renamed in a service fails this test until
the dashboard follows. And every family the agent exports has a panel.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import CollectorRegistry

from llmgw.agent.config import GpuGroup
from llmgw.agent.gpus import DeclaredGpus
from llmgw.agent.metrics import AgentCollector
from llmgw.control.leader.fleetmetrics import FleetCollector, OwnerRequestsCollector
from llmgw.control.metrics import AutoscaleMetrics, ControlMetrics
from llmgw.control.spec.catalog import Catalog
from llmgw.control.state.ownerrequests import OwnerRequests
from llmgw.router.app import build_app
from llmgw.router.config import Backend, RouterConfig

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "llmgw-fleet.json"
NAME = re.compile(r"\bllmgw_[a-zA-Z0-9_]+")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}


class LeaderView:
    """A leader with an empty fleet: every family is yielded, without samples."""

    accepting = True
    catalog = Catalog()
    unplaced: dict[str, str] = {}

    def nodes(self):
        return []

    def replicas(self):
        return []

    def used_gpus(self, node):
        return set()

    def wanted(self, model_name):
        return 0

    def quotas(self):
        return {}


def exported(registry: CollectorRegistry) -> set[str]:
    names = set()
    for family in registry.collect():
        names.add(family.name)
        names.update(family.name + s for s in SUFFIXES.get(family.type, ()))
    return names


def control_names() -> set[str]:
    registry = CollectorRegistry()
    ControlMetrics(registry)
    AutoscaleMetrics(registry)
    registry.register(FleetCollector(LeaderView(), lambda: 1))
    registry.register(OwnerRequestsCollector(OwnerRequests(), lambda: "term", lambda: 0.0))
    return exported(registry)


class NoReplicas:
    def snapshot(self):
        return []


def agent_names() -> set[str]:
    registry = CollectorRegistry()
    registry.register(AgentCollector("n", NoReplicas(), DeclaredGpus("n", [GpuGroup()]), "declared"))
    return exported(registry)


def router_names(tmp_path: Path) -> set[str]:
    secret = tmp_path / "secret"
    secret.write_text("s" * 32)
    registry = CollectorRegistry()
    config = RouterConfig(
        listen="127.0.0.1:0",
        control=["127.0.0.1:1"],
        cluster_secret_file=str(secret),
        auth="keys",
        tls={"plaintext": True},
        backends=[Backend(model="m", url="http://127.0.0.1:1")],
    )
    build_app(config, registry=registry)
    return exported(registry)


def queries() -> list[tuple[str, str]]:
    doc = json.loads(DASHBOARD.read_text())
    out = []

    def walk(panels):
        for p in panels:
            out.extend((p["title"], t["expr"]) for t in p.get("targets", []))
            walk(p.get("panels", []))

    walk(doc["panels"])
    return out


def test_every_dashboard_query_names_only_metrics_a_service_exports(tmp_path):
    known = control_names() | router_names(tmp_path) | agent_names()
    found = queries()
    assert len(found) >= 20
    unknown = {(title, name) for title, expr in found for name in NAME.findall(expr) if name not in known}
    assert not unknown, f"queries name metrics no service exports: {sorted(unknown)}"
    assert all(NAME.search(expr) for _, expr in found), "a query names no llmgw metric"


def test_the_check_catches_a_name_no_service_exports(tmp_path):
    known = control_names()
    assert "llmgw_control_node_gpus_free" in known and "llmgw_control_placement_failures_total" in known
    assert "llmgw_control_node_gpus_spare" not in known
    assert "llmgw_router_requests_total" in router_names(tmp_path)
    assert "llmgw_router_owner_tokens_total" in router_names(tmp_path)
    assert "llmgw_control_owner_requests_total" in known


def test_every_metric_the_agent_exports_has_a_panel():
    queried = {name for _, expr in queries() for name in NAME.findall(expr)}
    registry = CollectorRegistry()
    registry.register(AgentCollector("n", NoReplicas(), DeclaredGpus("n", [GpuGroup()]), "declared"))
    families = {f.name + ("_total" if f.type == "counter" else "") for f in registry.collect()}
    assert len(families) >= 10
    assert not families - queried, f"agent metrics with no panel: {sorted(families - queried)}"
