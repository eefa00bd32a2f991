"""Rolling updates, decided: decide.rollout through reconcile.plan, no I/O."""

from __future__ import annotations

from dataclasses import replace

from llmgw.control.decide.reconcile import (
    CannotPlace,
    ForgetReplica,
    Replica,
    StartReplica,
    StopReplica,
    plan,
)
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.store.replicas import ReplicaRecord

from .test_reconcile import NOW, node, of, seen

RS_STARTING = 1


def versioned(revision: str, replicas: int = 2) -> Model:
    spec = ModelSpec.model_validate(
        {
            "name": "m",
            "profile": {"engine": "simulator", "gpus": 1},
            "weights": {"source": "/w/m", "revision": revision},
            "min_replicas": replicas,
        }
    )
    return Model.from_spec(spec)


OLD, NEW = versioned("v1"), versioned("v2")


def rec(rid: str, nid: str, version: str, gpu: int = 0, created: float = 1.0) -> ReplicaRecord:
    return ReplicaRecord(rid, "m", nid, (gpu,), "simulator", "m", created, version=version)


def test_a_version_is_the_weights_and_profiles_and_nothing_else():
    assert OLD.version != NEW.version
    spec = NEW.spec
    assert spec is not None
    same = ModelSpec.model_validate({**spec.model_dump(), "aliases": ["x"], "scaling": {"min": 5}})
    assert same.version == spec.version
    args = ModelSpec.model_validate(
        {**spec.model_dump(), "profiles": [{"engine": "simulator", "gpus": 1, "args": {"seed": "1"}}]}
    )
    assert args.version != spec.version


def _fleet(gpus_per_node: int = 2):
    """Two old-version replicas, ready, one on node a and one on node b."""
    reps = [
        Replica(rec("m-a", "a", OLD.version, created=1.0), seen("m-a")),
        Replica(rec("m-b", "b", OLD.version, created=2.0), seen("m-b")),
    ]
    nodes = [
        node("a", gpus=gpus_per_node, reported=[seen("m-a")]),
        node("b", gpus=gpus_per_node, reported=[seen("m-b")]),
    ]
    return nodes, reps


def test_a_new_version_surges_one_replica_and_stops_nothing_yet():
    nodes, reps = _fleet()
    actions = plan(Catalog([NEW]), nodes, reps, NOW)
    starts = of(StartReplica, actions)
    assert len(starts) == 1 and starts[0].version == NEW.version
    assert of(StopReplica, actions) == []


def test_nothing_more_is_placed_while_the_new_replica_is_not_ready():
    nodes, reps = _fleet()
    starting = Replica(
        rec("m-n1", "a", NEW.version, gpu=1, created=3.0), seen("m-n1", state=RS_STARTING, gpus=(1,))
    )
    actions = plan(Catalog([NEW]), nodes, [*reps, starting], NOW)
    assert of(StartReplica, actions) == [] and of(StopReplica, actions) == []


def test_an_old_replica_is_retired_only_once_a_new_one_is_ready_and_past_the_gate():
    nodes, reps = _fleet()
    new = Replica(rec("m-n1", "a", NEW.version, gpu=1, created=3.0), seen("m-n1", gpus=(1,)))
    gated = plan(Catalog([NEW]), nodes, [*reps, new], NOW, gated={"m-n1"})
    assert of(StopReplica, gated) == [], "a replica the gate holds back replaces nothing"
    assert of(StartReplica, gated) == []
    passed = plan(Catalog([NEW]), nodes, [*reps, new], NOW)
    # The oldest old one goes; the next new one is placed in the same pass.
    assert [s.replica_id for s in of(StopReplica, passed)] == ["m-a"]
    assert len(of(StartReplica, passed)) == 1


def test_the_last_old_replica_goes_when_every_new_one_is_in():
    nodes = [
        node("a", reported=[seen("m-n1", gpus=(1,))]),
        node("b", reported=[seen("m-b"), seen("m-n2", gpus=(1,))]),
    ]
    reps = [
        Replica(rec("m-b", "b", OLD.version, created=2.0), seen("m-b")),
        Replica(rec("m-n1", "a", NEW.version, gpu=1, created=3.0), seen("m-n1", gpus=(1,))),
        Replica(rec("m-n2", "b", NEW.version, gpu=1, created=4.0), seen("m-n2", gpus=(1,))),
    ]
    actions = plan(Catalog([NEW]), nodes, reps, NOW)
    assert [s.replica_id for s in of(StopReplica, actions)] == ["m-b"]
    assert of(StartReplica, actions) == []


def test_without_room_to_surge_an_old_replica_is_drained_first_while_two_serve():
    nodes, reps = _fleet(gpus_per_node=1)
    actions = plan(Catalog([NEW]), nodes, reps, NOW)
    assert of(StartReplica, actions) == []
    assert [s.replica_id for s in of(StopReplica, actions)] == ["m-a"], "the oldest goes first"


def test_a_single_replica_without_room_waits_rather_than_go_dark():
    one_old = versioned("v1", replicas=1)
    one_new = versioned("v2", replicas=1)
    assert one_old.version == OLD.version
    reps = [Replica(rec("m-a", "a", OLD.version), seen("m-a"))]
    actions = plan(Catalog([one_new]), [node("a", gpus=1, reported=[seen("m-a")])], reps, NOW)
    assert of(StopReplica, actions) == [] and of(StartReplica, actions) == []
    (waits,) = of(CannotPlace, actions)
    assert "rolling update waits for room" in waits.message


def test_records_without_a_version_count_as_current():
    nodes, reps = _fleet()
    legacy = [Replica(replace(r.record, version=""), r.reported) for r in reps]
    actions = plan(Catalog([NEW]), nodes, legacy, NOW)
    assert of(StartReplica, actions) == [] and of(StopReplica, actions) == []


def test_an_old_replica_its_node_no_longer_runs_is_forgotten_not_restarted():
    reps = [Replica(rec("m-a", "a", OLD.version), None)]
    actions = plan(Catalog([NEW]), [node("a")], reps, NOW)
    assert [f.replica_id for f in of(ForgetReplica, actions)] == ["m-a"]
