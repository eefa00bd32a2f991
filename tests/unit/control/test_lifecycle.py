"""The leader's lifecycle duties over a MemoryStore: what the gate holds back, rollouts, rollbacks."""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.common.etcd import MemoryStore, Op
from llmgw.control.decide.reconcile import NoteFailure, Replica
from llmgw.control.leader.lifecycle import Lifecycle
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.inventory import ReportedReplica
from llmgw.control.store.lifecycle import EvalResult, LifecycleBook
from llmgw.control.store.replicas import ReplicaRecord
from llmgw.v1 import agent_pb2

READY = agent_pb2.ReplicaState.REPLICA_STATE_READY


class Writer:
    """The leader guard, always leading."""

    def __init__(self, store: MemoryStore):
        self.store = store

    async def commit(self, ops: Sequence[Op]) -> int:
        return (await self.store.commit([], ops)).revision


def model(revision: str, gate: dict | None = None) -> Model:
    doc = {
        "name": "m",
        "min_replicas": 2,
        "profile": {"engine": "simulator"},
        "weights": {"revision": revision},
    }
    if gate:
        doc["eval_gate"] = gate
    return Model.from_spec(ModelSpec.model_validate(doc), "runtime")


def replica(rid: str, version: str, created: float = 1.0) -> Replica:
    rec = ReplicaRecord(rid, "m", "a", (0,), "simulator", "m", created, version=version)
    return Replica(rec, ReportedReplica(rid, "m", READY, url="http://127.0.0.1:1"))


def lifecycle(store: MemoryStore) -> Lifecycle:
    return Lifecycle(LifecycleBook(store, Writer(store)), b"secret", lambda: 100.0, lambda: None)


def result(m: Model, passed: bool, suite: str = "qa", min_score: float = 0.5) -> EvalResult:
    return EvalResult("m", m.version, "", "", suite, min_score, 1.0 if passed else 0.0, passed, "", "r", 1.0)


GATE = {"suite": "qa", "min_score": 0.5}


async def test_the_gate_holds_back_a_version_without_a_pass_but_never_what_is_published():
    store = MemoryStore()
    life = lifecycle(store)
    m = model("v1", GATE)
    cat = Catalog([m])
    reps = [replica("m-1", m.version), replica("m-2", m.version)]
    assert life.gated(cat, reps, published=()) == {"m-1", "m-2"}
    assert life.gated(cat, reps, published={"m-1"}) == {"m-2"}, "a published replica keeps serving"
    await life.book.record(result(m, passed=False))
    assert life.gated(cat, reps, published=()) == {"m-1", "m-2"}
    await life.book.record(result(m, passed=True, suite="other"))
    assert life.gated(cat, reps, published=()) == {"m-1", "m-2"}, "a result of another gate does not count"
    await life.book.record(result(m, passed=True))
    assert life.gated(cat, reps, published=()) == frozenset()
    assert life.gated(Catalog([model("v1")]), reps, published=()) == frozenset(), "no gate, nothing held"


async def test_results_are_kept_in_etcd_and_a_new_term_reads_them():
    store = MemoryStore()
    m = model("v1", GATE)
    await lifecycle(store).book.record(result(m, passed=True))
    fresh = lifecycle(store)
    await fresh.load()
    assert fresh.gated(Catalog([m]), [replica("m-1", m.version)], published=()) == frozenset()


async def test_a_failing_gate_on_the_new_version_rolls_back_to_the_previous_document():
    store = MemoryStore()
    life = lifecycle(store)
    v1, v2 = model("v1", GATE), model("v2", GATE)
    life.catalog_replaced(Catalog([v1]), Catalog([v2]))
    reps = [replica("m-1", v1.version), replica("m-2", v1.version), replica("m-3", v2.version, 2.0)]
    declared = Catalog([v2])
    await life.after_pass(declared, declared, reps, [], frozenset({"m-3"}), {}, 0.0)
    ro = life.book.rollouts["m"]
    assert (ro.state, ro.target, ro.previous) == ("rolling", v2.version, v1.version)
    assert life.effective(declared) is declared
    assert "1 of 2 on the new revision" in life.status(v2, reps, 2)[0]

    await life.book.record(result(v2, passed=False))
    await life.after_pass(declared, declared, reps, [], frozenset({"m-3"}), {}, 0.0)
    assert life.book.rollouts["m"].state == "rolled_back"
    effective = life.effective(declared)
    back = effective.get("m")
    assert back is not None and back.version == v1.version, "planned with the previous document again"
    assert life.status(v2, reps, 2)[0].startswith(f"rolled back from v2 ({v2.version}) to {v1.version}")

    # A new leader reads the rollout from etcd and plans the same rollback.
    fresh = lifecycle(store)
    await fresh.load()
    fresh_back = fresh.effective(declared).get("m")
    assert fresh_back is not None and fresh_back.version == v1.version


async def test_a_failed_replica_of_the_new_version_rolls_back_and_one_of_the_old_does_not():
    store = MemoryStore()
    life = lifecycle(store)
    v1, v2 = model("v1"), model("v2")
    life.catalog_replaced(Catalog([v1]), Catalog([v2]))
    reps = [replica("m-1", v1.version), replica("m-2", v1.version), replica("m-3", v2.version, 2.0)]
    declared = Catalog([v2])
    await life.after_pass(declared, declared, reps, [], frozenset(), {}, 0.0)
    old_failed = [NoteFailure("m", "m-1", "oom")]
    await life.after_pass(declared, declared, reps, old_failed, frozenset(), {}, 0.0)
    assert life.book.rollouts["m"].state == "rolling"
    new_failed = [NoteFailure("m", "m-3", "exited with code 2")]
    await life.after_pass(declared, declared, reps, new_failed, frozenset(), {}, 0.0)
    ro = life.book.rollouts["m"]
    assert ro.state == "rolled_back" and "m-3 of the new version failed: exited with code 2" in ro.reason


async def test_a_rollout_is_done_once_only_the_new_version_runs_ready():
    store = MemoryStore()
    life = lifecycle(store)
    v1, v2 = model("v1"), model("v2")
    life.catalog_replaced(Catalog([v1]), Catalog([v2]))
    declared = Catalog([v2])
    await life.after_pass(declared, declared, [replica("m-1", v1.version)], [], frozenset(), {}, 0.0)
    await life.after_pass(declared, declared, [replica("m-3", v2.version)], [], frozenset(), {}, 0.0)
    assert life.book.rollouts["m"].state == "done"
    assert life.status(v2, [replica("m-3", v2.version)], 1) == ("", "")


async def test_results_and_rollouts_no_version_needs_are_deleted_from_etcd():
    store = MemoryStore()
    life = lifecycle(store)
    versions = [model(f"v{i}", GATE) for i in range(1, 6)]
    for m in versions:
        await life.book.record(result(m, passed=True))
    v4, v5 = versions[3], versions[4]
    life.catalog_replaced(Catalog([v4]), Catalog([v5]))
    declared = Catalog([v5])
    # v4's replica still runs while v5 rolls in; v1-v3 are nobody's any more.
    reps = [replica("m-1", v4.version), replica("m-2", v5.version, 2.0)]
    await life.after_pass(declared, declared, reps, [], frozenset(), {}, 0.0)
    kept = {e.key.split("/")[-1] for e in (await store.range("evals/")).entries}
    assert kept == {v4.version, v5.version}
    assert set(life.book.evals) == {("m", v4.version), ("m", v5.version)}
    assert "m" in life.book.rollouts

    # A new leader reads only what is left; once the model is removed, all of it goes.
    fresh = lifecycle(store)
    await fresh.load()
    assert set(fresh.book.evals) == {("m", v4.version), ("m", v5.version)}
    empty = Catalog([])
    await fresh.after_pass(empty, empty, [], [], frozenset(), {}, 0.0)
    assert (await store.range("evals/")).entries == []
    assert (await store.range("rollouts/")).entries == []


async def test_forgetting_more_results_than_etcd_takes_in_one_transaction_deletes_them_all():
    # A catalog with a long history: over etcd's 128 operations per transaction to delete at once.
    store = MemoryStore()
    life = lifecycle(store)
    for i in range(300):
        await life.book.record(result(model(f"v{i}", GATE), passed=True))
    empty = Catalog([])
    await life.after_pass(empty, empty, [], [], frozenset(), {}, 0.0)
    assert (await store.range("evals/")).entries == []
    assert not life.book.evals
