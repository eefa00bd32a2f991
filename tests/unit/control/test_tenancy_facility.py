"""Quotas per owner (org / team / project), domain holds and power budgets in the pure decision."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from llmgw.control.config import ClusterSettings
from llmgw.control.decide.reconcile import CannotPlace, EvictReplica, PlanSettings, StopReplica, plan
from llmgw.control.spec.catalog import Catalog
from llmgw.control.spec.tenancy import Quota, owner_path, scopes
from llmgw.control.state.inventory import DomainHold, Inventory
from llmgw.v1 import agent_pb2

from .test_placement import NOW, node, of, running, spec_model, starts, with_reports

SEARCH = {"org": "acme", "team": "search"}


def quotas(**by_path) -> PlanSettings:
    return PlanSettings(quotas={k.replace("__", "/"): Quota(**v) for k, v in by_path.items()})


def owned(name="m", owner=SEARCH, gpus=1, min_replicas=1, cls="standard"):
    return spec_model(
        name=name,
        owner=owner,
        capacity_class=cls,
        profile={"engine": "vllm", "gpus": gpus},
        min_replicas=min_replicas,
    )


def test_owner_path_and_scopes():
    assert owner_path("acme", "search", "qa") == "acme/search/qa"
    assert owner_path("acme", "", "qa") == "acme"
    assert scopes("acme/search/qa") == ["acme", "acme/search", "acme/search/qa"]
    assert scopes("") == []
    assert owned().owner == "acme/search"


def test_team_gpu_quota_refuses_the_replica_past_it_with_the_reason():
    m = owned(min_replicas=3)
    actions = plan(Catalog([m]), [node("a", gpus=4)], [], NOW, settings=quotas(acme__search={"gpus": 2}))
    assert len(starts(actions)) == 2
    [cannot] = of(CannotPlace, actions)
    assert cannot.message == (
        "1 of 3 replica(s) cannot be placed: "
        "team acme/search: GPU quota 2, 2 in use, the replica needs 1 more"
    )


def test_an_ancestor_quota_binds_every_team_under_it():
    a = owned("a", {"org": "acme", "team": "search"}, gpus=2)
    b = owned("b", {"org": "acme", "team": "ads", "project": "x"}, gpus=2)
    settings = quotas(acme={"gpus": 3}, acme__ads={"gpus": 8})
    actions = plan(Catalog([a, b]), [node("n", gpus=8)], [], NOW, settings=settings)
    assert [s[0] for s in starts(actions)] == ["a"]
    [cannot] = of(CannotPlace, actions)
    assert (
        cannot.model == "b" and "org acme: GPU quota 3, 2 in use, the replica needs 2 more" in cannot.message
    )


def test_running_replicas_count_and_raising_the_quota_places_the_next():
    m = owned(min_replicas=2)
    r1 = running("m-1", "a")
    nodes = [with_reports(node("a", gpus=4), r1)]
    tight = plan(Catalog([m]), nodes, [r1], NOW, settings=quotas(acme__search={"replicas": 1}))
    assert starts(tight) == []
    assert "team acme/search: replica quota 1, 1 in use" in of(CannotPlace, tight)[0].message
    raised = plan(Catalog([m]), nodes, [r1], NOW, settings=quotas(acme__search={"replicas": 2}))
    assert starts(raised) == [("m", "a", (1,), 0)]


def test_gpu_memory_quota_counts_whole_gpus_of_the_chosen_node():
    m = owned(min_replicas=2)
    # node() GPUs have 80 GiB each: one fits under 100 GiB, two do not.
    actions = plan(Catalog([m]), [node("a", gpus=4)], [], NOW, settings=quotas(acme={"gpu_memory_gb": 100}))
    assert len(starts(actions)) == 1
    assert "org acme: GPU memory quota 100 GiB, 80 GiB in use, the replica needs 80 GiB more" in (
        of(CannotPlace, actions)[0].message
    )


def test_a_model_without_owner_and_a_path_without_quota_are_not_limited():
    free = spec_model(name="free", profile={"engine": "vllm", "gpus": 1}, min_replicas=2)
    other = owned("other", {"org": "beta"}, min_replicas=2)
    actions = plan(Catalog([free, other]), [node("a", gpus=4)], [], NOW, settings=quotas(acme={"gpus": 0}))
    assert len(starts(actions)) == 4 and of(CannotPlace, actions) == []


def test_a_quota_skips_to_a_profile_it_allows():
    m = spec_model(
        owner=SEARCH,
        profiles=[{"engine": "vllm", "gpus": 2}, {"engine": "vllm", "gpus": 1}],
    )
    actions = plan(Catalog([m]), [node("a", gpus=4)], [], NOW, settings=quotas(acme__search={"gpus": 1}))
    assert starts(actions) == [("m", "a", (0,), 1)]


def test_critical_model_over_its_quota_evicts_nobody():
    crit = owned("crit", cls="critical")
    opp = spec_model(name="opp", capacity_class="opportunistic", profile={"engine": "vllm", "gpus": 1})
    o1 = running("opp-1", "a", m="opp")
    nodes = [with_reports(node("a", gpus=1), o1)]
    settings = quotas(acme__search={"gpus": 0})
    actions = plan(Catalog([crit, opp]), nodes, [o1], NOW, settings=settings)
    assert of(EvictReplica, actions) == []
    assert "GPU quota 0" in of(CannotPlace, actions)[0].message
    # Within its quota it evicts as before.
    allowed = plan(Catalog([crit, opp]), nodes, [o1], NOW, settings=quotas(acme__search={"gpus": 1}))
    assert [e.replica_id for e in of(EvictReplica, allowed)] == ["opp-1"]


def test_a_replica_leaving_a_held_node_does_not_block_its_replacement():
    m = owned()
    r1 = running("m-1", "a")
    held_a = with_reports(node("a", held=True), r1)
    actions = plan(Catalog([m]), [held_a, node("b")], [r1], NOW, settings=quotas(acme__search={"gpus": 1}))
    assert starts(actions) == [("m", "b", (0,), 0)]


def test_quota_keys_are_owner_paths():
    ok = ClusterSettings.model_validate({"quotas": {"acme/search/qa": {"gpus": 1}}})
    assert ok.quotas["acme/search/qa"].gpus == 1
    for bad in ("acme/", "a/b/c/d", "", "acme search"):
        with pytest.raises(ValidationError, match="not an owner path"):
            ClusterSettings.model_validate({"quotas": {bad: {"gpus": 1}}})
    with pytest.raises(ValidationError):
        ClusterSettings.model_validate({"quotas": {"acme": {"gpus": -1}}})
    with pytest.raises(ValidationError):
        ClusterSettings.model_validate({"quotas": {"acme": {"cpus": 1}}})


# -- domain holds ------------------------------------------------------------------


def register(inv: Inventory, nid: str, labels: dict[str, str]) -> None:
    reg = agent_pb2.Register(node_id=nid, labels=labels, address="127.0.0.1:1")
    reg.gpus.add(index=0, memory_total_bytes=1, memory_free_bytes=1)
    reg.engines.add(kind="vllm")
    inv.register(reg, NOW)


def test_a_domain_hold_holds_every_node_with_the_label_including_later_ones():
    inv = Inventory(node_timeout=10)
    register(inv, "r1-a", {"rack": "r1"})
    register(inv, "r2-a", {"rack": "r2"})
    assert inv.set_domain_holds([DomainHold("rack", "r1", "power work")])
    register(inv, "r1-b", {"rack": "r1"})
    by = {n.id: n for n in inv.nodes()}
    assert by["r1-a"].held and by["r1-b"].held and not by["r2-a"].held
    assert by["r1-a"].hold_reason == "domain rack=r1: power work"
    # Without drain: no new replicas, but what runs stays.
    assert not by["r1-a"].placeable and not by["r1-a"].draining
    inv.set_domain_holds([DomainHold("rack", "r1", drain=True)])
    assert all(n.draining for n in inv.nodes() if n.labels["rack"] == "r1")
    assert inv.set_domain_holds([])
    assert not any(n.held for n in inv.nodes())


def test_a_held_domain_without_drain_keeps_its_replicas_and_places_elsewhere():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=2)
    a1 = running("m-a", "a")
    inv = Inventory(node_timeout=10)
    register(inv, "a", {"rack": "r1"})
    register(inv, "b", {"rack": "r2"})
    inv.set_domain_holds([DomainHold("rack", "r1")])
    actions = plan(Catalog([m]), inv.nodes(), [a1], NOW)
    assert of(StopReplica, actions) == []
    assert [s[1] for s in starts(actions)] == ["b"]


def test_a_drained_domain_moves_replicas_out_only_once_replacements_are_ready():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    a1 = running("m-a", "a")
    inv = Inventory(node_timeout=10)
    register(inv, "a", {"rack": "r1"})
    register(inv, "b", {"rack": "r2"})
    inv.set_domain_holds([DomainHold("rack", "r1", "swap", drain=True)])
    first = plan(Catalog([m]), inv.nodes(), [a1], NOW)
    assert [s[1] for s in starts(first)] == ["b"] and of(StopReplica, first) == []
    b1 = running("m-b", "b")
    second = plan(Catalog([m]), inv.nodes(), [a1, b1], NOW)
    [stop] = of(StopReplica, second)
    assert stop.replica_id == "m-a" and "in held domain rack=r1: swap" in stop.reason


# -- power budgets -----------------------------------------------------------------


def powered(nid: str, feed: str, watts: float = 700, gpus: int = 2, reported=()):
    n = node(nid, gpus=gpus, labels={"power-feed": feed}, reported=reported)
    return dataclasses.replace(n, gpus=tuple(dataclasses.replace(g, power_watts=watts) for g in n.gpus))


def test_placement_keeps_each_power_domain_within_its_budget_and_says_why():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=3)
    nodes = [powered("a1", "a"), powered("a2", "a")]
    budgets = PlanSettings(power_budgets={"power-feed=a": 1500})
    actions = plan(Catalog([m]), nodes, [], NOW, settings=budgets)
    assert len(starts(actions)) == 2
    [cannot] = of(CannotPlace, actions)
    assert (
        "a1: power budget of power-feed=a: 1400 W of 1500 W in use, the replica adds 700 W" in cannot.reasons
    )
    # Another feed has room: the third goes there.
    actions = plan(Catalog([m]), [*nodes, powered("b1", "b")], [], NOW, settings=budgets)
    assert sorted(s[1][0] for s in starts(actions)) == ["a", "a", "b"] and of(CannotPlace, actions) == []


def test_running_replicas_draw_from_the_budget_and_unknown_power_counts_nothing():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=2)
    r1 = running("m-1", "a1")
    a1 = powered("a1", "a", reported=[r1.reported])
    budgets = PlanSettings(power_budgets={"power-feed=a": 1000})
    actions = plan(Catalog([m]), [a1], [r1], NOW, settings=budgets)
    assert starts(actions) == [] and "700 W of 1000 W in use" in of(CannotPlace, actions)[0].message
    unknown = powered("a1", "a", watts=0, reported=[r1.reported])
    assert starts(plan(Catalog([m]), [unknown], [r1], NOW, settings=budgets)) == [("m", "a1", (1,), 0)]


def test_power_budget_keys_are_domains():
    ok = ClusterSettings.model_validate({"power_budgets": {"power-feed=a": 3000}})
    assert ok.power_budgets == {"power-feed=a": 3000}
    for bad in ("power-feed", "=a", "rack=", "rack=r 1"):
        with pytest.raises(ValidationError, match="is not LABEL=VALUE"):
            ClusterSettings.model_validate({"power_budgets": {bad: 1}})
    with pytest.raises(ValidationError, match="negative"):
        ClusterSettings.model_validate({"power_budgets": {"rack=r1": -1}})
