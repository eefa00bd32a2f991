"""The pure reconcile decision: placement, spreading, packing, reasons, failure, orphans."""

from __future__ import annotations

from llmgw.control.decide.reconcile import (
    Backoff,
    CannotPlace,
    ClearBackoff,
    EnsureRunning,
    ForgetReplica,
    NoteFailure,
    PlanSettings,
    Replica,
    StartReplica,
    StopReplica,
    plan,
)
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.state.inventory import Engine, Gpu, Node, NodeState, ReportedReplica
from llmgw.control.store.replicas import ReplicaRecord, new_replica_id
from llmgw.v1 import agent_pb2

RS = agent_pb2.ReplicaState
NOW = 1000.0


def model(name="m", gpus=1, min_replicas=1, engine="simulator") -> Model:
    return Model(name=name, engine=engine, gpus=gpus, min_replicas=min_replicas)


def node(nid, gpus=2, engines=("simulator",), ready=True, since=None, reported=()) -> Node:
    return Node(
        id=nid,
        state=NodeState.READY if ready else NodeState.UNREACHABLE,
        last_seen=NOW,
        gpus=tuple(Gpu(i) for i in range(gpus)),
        engines=tuple(Engine(e) for e in engines),
        unreachable_since=None if ready else (NOW if since is None else since),
        replicas={r.id: r for r in reported},
    )


def record(rid, nid, gpus=(0,), m="m", created=1.0) -> ReplicaRecord:
    return ReplicaRecord(rid, m, nid, tuple(gpus), "simulator", m, created)


def seen(rid, state=RS.REPLICA_STATE_READY, gpus=(0,), m="m", message="") -> ReportedReplica:
    return ReportedReplica(rid, m, state, url="http://x", gpu_indices=tuple(gpus), message=message)


def of(kind, actions):
    return [a for a in actions if isinstance(a, kind)]


def test_places_min_replicas_on_free_gpus():
    actions = plan(Catalog([model(min_replicas=2, gpus=1)]), [node("a", gpus=2)], [], NOW)
    starts = of(StartReplica, actions)
    assert [(s.node, s.gpu_indices) for s in starts] == [("a", (0,)), ("a", (1,))]
    assert starts[0].engine == "simulator" and starts[0].served_name == "m"
    assert of(CannotPlace, actions) == []


def test_spreads_replicas_of_one_model_across_nodes():
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    actions = plan(Catalog([model(min_replicas=2)]), nodes, [], NOW)
    assert sorted(s.node for s in of(StartReplica, actions)) == ["a", "b"]


def test_spreading_counts_replicas_already_running():
    nodes = [node("a", gpus=4, reported=[seen("m-1")]), node("b", gpus=4)]
    actions = plan(Catalog([model(min_replicas=2)]), nodes, [Replica(record("m-1", "a"), seen("m-1"))], NOW)
    assert [s.node for s in of(StartReplica, actions)] == ["b"]


def test_packs_onto_the_node_with_fewest_free_gpus_left():
    nodes = [node("big", gpus=8), node("small", gpus=2)]
    actions = plan(Catalog([model(gpus=2)]), nodes, [], NOW)
    assert [(s.node, s.gpu_indices) for s in of(StartReplica, actions)] == [("small", (0, 1))]


def test_uses_only_gpus_not_taken_by_records_or_running_engines():
    orphan = seen("stray", RS.REPLICA_STATE_STARTING, gpus=(1,))
    nodes = [node("a", gpus=3, reported=[seen("m-1"), orphan])]
    actions = plan(
        Catalog([model(min_replicas=2)]), nodes, [Replica(record("m-1", "a", (0,)), seen("m-1"))], NOW
    )
    assert [s.gpu_indices for s in of(StartReplica, actions)] == [(2,)]


def test_reports_a_reason_per_node_when_a_model_cannot_fit():
    nodes = [
        node("a", gpus=1),
        node("b", gpus=4, engines=("vllm",)),
        node("c", gpus=2, ready=False),
    ]
    actions = plan(Catalog([model(gpus=2)]), nodes, [], NOW)
    assert of(StartReplica, actions) == []
    [cannot] = of(CannotPlace, actions)
    assert cannot.model == "m"
    assert "1 of 1 replica(s) cannot be placed" in cannot.message
    assert "a: 1 free GPU, profile needs 2" in cannot.message
    assert "b: does not offer engine 'simulator' (offers vllm)" in cannot.message
    assert "c: unreachable" in cannot.message


def test_places_what_fits_and_says_how_many_did_not():
    actions = plan(Catalog([model(min_replicas=3)]), [node("a", gpus=2)], [], NOW)
    assert len(of(StartReplica, actions)) == 2
    [cannot] = of(CannotPlace, actions)
    assert cannot.message.startswith("1 of 3 replica(s) cannot be placed: a: 0 free GPUs")


def test_with_no_nodes_says_so():
    [cannot] = plan(Catalog([model()]), [], [], NOW)
    assert isinstance(cannot, CannotPlace) and "no nodes are registered" in cannot.message


def test_failed_replica_is_stopped_forgotten_and_replaced_only_after_backoff():
    cat = Catalog([model()])
    failed = seen("m-1", RS.REPLICA_STATE_FAILED, message="exit 1: CUDA OOM")
    n = node("a", reported=[failed])
    first = plan(cat, [n], [Replica(record("m-1", "a"), failed)], NOW)
    assert StopReplica("m-1", "a", "replica failed: exit 1: CUDA OOM", True) in first
    assert NoteFailure("m", "m-1", "exit 1: CUDA OOM", "a", 0) in first
    assert of(StartReplica, first) == []
    # The record is gone; the model backs off.
    gone = node("a", reported=[seen("m-1", RS.REPLICA_STATE_STOPPED)])
    waiting = plan(cat, [gone], [], NOW + 1, {"m": Backoff(1, NOW + 5)})
    assert of(StartReplica, waiting) == []
    assert "retrying in 4s" in of(CannotPlace, waiting)[0].message
    retried = plan(cat, [gone], [], NOW + 6, {"m": Backoff(1, NOW + 5)})
    assert [s.gpu_indices for s in of(StartReplica, retried)] == [(0,)]


def test_backoff_is_cleared_once_the_model_is_fully_ready():
    cat = Catalog([model()])
    n = node("a", reported=[seen("m-2")])
    actions = plan(cat, [n], [Replica(record("m-2", "a"), seen("m-2"))], NOW, {"m": Backoff(3, NOW)})
    assert ClearBackoff("m") in actions


def test_stops_orphans_and_replicas_of_models_no_longer_in_the_catalog():
    cat = Catalog([model("kept")])
    kept = seen("kept-1", m="kept")
    removed = seen("old-1", m="old", gpus=(1,))
    orphan = seen("stray-1", m="kept", gpus=(2,))
    stopping = seen("bye-1", RS.REPLICA_STATE_STOPPING, m="kept", gpus=(3,))
    n = node("a", gpus=4, reported=[kept, removed, orphan, stopping])
    replicas = [
        Replica(record("kept-1", "a", m="kept"), kept),
        Replica(record("old-1", "a", (1,), m="old"), removed),
    ]
    stops = of(StopReplica, plan(cat, [n], replicas, NOW))
    assert [(s.replica_id, s.forget) for s in stops] == [("old-1", True), ("stray-1", False)]
    assert "no longer in the catalog" in stops[0].reason
    assert "orphan" in stops[1].reason


def test_replica_recorded_on_another_node_is_an_orphan_where_it_is_found():
    cat = Catalog([model()])
    n_a = node("a", reported=[seen("m-1")])
    n_b = node("b", reported=[seen("m-1")])
    actions = plan(cat, [n_a, n_b], [Replica(record("m-1", "a"), seen("m-1"))], NOW)
    assert of(StopReplica, actions) == [
        StopReplica("m-1", "b", "orphan: the leader has no record of this replica", False)
    ]


def test_briefly_unreachable_node_keeps_its_replicas_then_they_are_rebuilt():
    cat = Catalog([model()])
    settings = PlanSettings(node_lost_seconds=30)
    away = node("a", ready=False, since=NOW - 5, reported=[seen("m-1")])
    spare = node("b")
    reps = [Replica(record("m-1", "a"), seen("m-1"))]
    blip = plan(cat, [away, spare], reps, NOW, settings=settings)
    assert of(StartReplica, blip) == [] and of(ForgetReplica, blip) == []
    lost = node("a", ready=False, since=NOW - 31, reported=[seen("m-1")])
    actions = plan(cat, [lost, spare], reps, NOW, settings=settings)
    assert [f.replica_id for f in of(ForgetReplica, actions)] == ["m-1"]
    assert [s.node for s in of(StartReplica, actions)] == ["b"]


def test_recorded_replica_its_ready_node_does_not_report_is_started_again():
    cat = Catalog([Model(name="m", engine="simulator", gpus=1, min_replicas=1, args={"ttft-ms": "5"})])
    rec = record("m-1", "a")
    actions = plan(cat, [node("a")], [Replica(rec, None)], NOW)
    assert actions == [EnsureRunning(rec, {"ttft-ms": "5"})]


def test_excess_replicas_are_stopped_not_ready_and_newest_first():
    cat = Catalog([model(min_replicas=1)])
    old_ready = seen("m-old")
    new_ready = seen("m-new", gpus=(1,))
    starting = seen("m-starting", RS.REPLICA_STATE_STARTING, gpus=(2,))
    n = node("a", gpus=3, reported=[old_ready, new_ready, starting])
    reps = [
        Replica(record("m-old", "a", (0,), created=1), old_ready),
        Replica(record("m-new", "a", (1,), created=5), new_ready),
        Replica(record("m-starting", "a", (2,), created=3), starting),
    ]
    stops = of(StopReplica, plan(cat, [n], reps, NOW))
    assert sorted(s.replica_id for s in stops) == ["m-new", "m-starting"]
    assert all(s.forget for s in stops)


def test_bigger_models_are_placed_first():
    cat = Catalog([model("small", gpus=1), model("large", gpus=2)])
    starts = of(StartReplica, plan(cat, [node("a", gpus=2), node("b", gpus=1)], [], NOW))
    assert {(s.model, s.node) for s in starts} == {("large", "a"), ("small", "b")}


def test_plan_is_deterministic():
    cat = Catalog([model("x", min_replicas=2), model("y", gpus=2)])
    nodes = [node("b", gpus=4), node("a", gpus=4)]
    assert plan(cat, nodes, [], NOW) == plan(cat, list(reversed(nodes)), [], NOW)


def test_replica_ids_are_sanitized_and_unique():
    rid = new_replica_id("Org/Llama-3.1:8B", taken=set(), token=lambda: "abc123")
    assert rid == "org-llama-3-1-8b-abc123"
    tokens = iter(["aaa", "bbb"])
    assert new_replica_id("m", taken={"m-aaa"}, token=lambda: next(tokens)) == "m-bbb"
