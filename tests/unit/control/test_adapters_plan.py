"""decide.adapters: which adapters each ready replica should hold (affinity, load, max_loras)."""

from __future__ import annotations

from llmgw.control.decide.adapters import plan_adapters
from llmgw.control.decide.reconcile import Replica
from llmgw.control.spec.catalog import Catalog
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.inventory import ReportedReplica
from llmgw.control.store.replicas import ReplicaRecord
from llmgw.v1 import agent_pb2

READY = agent_pb2.REPLICA_STATE_READY


def catalog(adapters=("a", "b"), max_loras=4, lora=True, target=4.0) -> Catalog:
    doc = {
        "name": "m",
        "profile": {"engine": "simulator"},
        "scaling": {"target_load": target},
        "adapters": [{"name": n, "source": f"/lora/{n}"} for n in adapters],
    }
    if lora:
        doc["lora"] = {"max_loras": max_loras}
    return Catalog.from_specs([ModelSpec.model_validate(doc)])


def replica(rid: str, holds=(), state=READY, model="m") -> Replica:
    rec = ReplicaRecord(rid, model, "n", (0,), "simulator", model, 0.0)
    return Replica(rec, ReportedReplica(rid, model, state, url="http://x", adapters=tuple(holds)))


def names(plan, rid):
    return sorted(a.name for a in plan[rid])


def test_each_adapter_goes_to_one_replica_spread_over_the_replicas():
    plan = plan_adapters(catalog(), [replica("r1"), replica("r2")], lambda rid: 0.0)
    assert sorted(names(plan, "r1") + names(plan, "r2")) == ["a", "b"]
    assert names(plan, "r1") != names(plan, "r2"), "the fewest-adapters rule spreads them"


def test_a_loaded_adapter_stays_where_it_is():
    plan = plan_adapters(catalog(("a",)), [replica("r1"), replica("r2", ["a"])], lambda rid: 0.0)
    assert names(plan, "r1") == [] and names(plan, "r2") == ["a"]


def test_a_busy_adapter_is_loaded_on_one_more_replica_and_shrinks_back_when_quiet():
    reps = [replica("r1", ["a"]), replica("r2"), replica("r3")]
    busy = plan_adapters(catalog(("a",)), reps, lambda rid: 10.0 if rid == "r1" else 0.0)
    assert sum("a" in names(busy, r) for r in ("r1", "r2", "r3")) == 2
    assert "a" in names(busy, "r1")
    two = [replica("r1", ["a"]), replica("r2", ["a"]), replica("r3")]
    quiet = plan_adapters(catalog(("a",)), two, lambda rid: 1.5 if rid == "r2" else 0.0)
    assert [r for r in ("r1", "r2", "r3") if "a" in names(quiet, r)] == ["r2"], "the busier holder keeps it"


def test_max_loras_bounds_each_replica():
    plan = plan_adapters(
        catalog(("a", "b", "c"), max_loras=1), [replica("r1"), replica("r2")], lambda rid: 0.0
    )
    assert all(len(plan[r]) <= 1 for r in plan)
    assert sorted(names(plan, "r1") + names(plan, "r2")) == ["a", "b"], "the first declared get the room"


def test_removed_adapters_are_unloaded_and_models_without_lora_get_no_plan():
    plan = plan_adapters(catalog(("a",)), [replica("r1", ["a", "gone"])], lambda rid: 0.0)
    assert names(plan, "r1") == ["a"]
    assert plan_adapters(catalog((), lora=False), [replica("r1")], lambda rid: 0.0) == {}


def test_only_ready_replicas_get_adapters():
    starting = replica("r1", state=agent_pb2.REPLICA_STATE_STARTING)
    assert plan_adapters(catalog(("a",)), [starting], lambda rid: 0.0) == {}
