"""The pure decision's placement rules: resource fits, profiles in priority order,
spread and pack, holds that drain without a gap, preemption by capacity class,
crash backoff. Each test calls ``plan()`` directly."""

from __future__ import annotations

import dataclasses

from llmgw.control.decide.reconcile import (
    Backoff,
    CannotPlace,
    EvictReplica,
    ForgetReplica,
    PlanSettings,
    Replica,
    StartReplica,
    StopReplica,
    plan,
)
from llmgw.control.spec.catalog import GB, Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.inventory import Engine, Gpu, Node, NodeState, ReportedReplica
from llmgw.control.store.replicas import ReplicaRecord
from llmgw.v1 import agent_pb2

RS = agent_pb2.ReplicaState
NOW = 1000.0


def spec_model(**doc) -> Model:
    doc.setdefault("name", "m")
    return Model.from_spec(ModelSpec.model_validate(doc))


def node(
    nid,
    gpus=2,
    gpu_gb=80,
    engines=("vllm",),
    memory_gb=256,
    cores=32,
    labels=None,
    held=False,
    reported=(),
    free_gb=None,
) -> Node:
    free = gpu_gb if free_gb is None else free_gb
    return Node(
        id=nid,
        state=NodeState.READY,
        last_seen=NOW,
        gpus=tuple(Gpu(i, f"GPU-{nid}-{i}", "H100", gpu_gb * GB, free * GB) for i in range(gpus)),
        engines=tuple(Engine(e) for e in engines),
        labels=labels or {},
        memory_bytes=memory_gb * GB,
        cpu_cores=cores,
        held=held,
        replicas={r.id: r for r in reported},
    )


def running(rid, nid, m="m", gpus=(0,), ready=True, created=1.0, memory_gb=0, cores=0.0):
    """A replica with its record and its node's report of it (ready or starting)."""
    state = RS.REPLICA_STATE_READY if ready else RS.REPLICA_STATE_STARTING
    rec = ReplicaRecord(rid, m, nid, tuple(gpus), "vllm", m, created, 0, memory_gb * GB, cores)
    rep = ReportedReplica(rid, m, state, url="http://x", gpu_indices=tuple(gpus))
    return Replica(rec, rep)


def with_reports(n: Node, *reps: Replica) -> Node:
    return dataclasses.replace(n, replicas={r.id: r.reported for r in reps})


def of(kind, actions):
    return [a for a in actions if isinstance(a, kind)]


def starts(actions):
    return [(s.model, s.node, s.gpu_indices, s.profile) for s in of(StartReplica, actions)]


# -- fits ---------------------------------------------------------------------------


def test_profile_fits_only_where_every_resource_and_label_is_free():
    m = spec_model(
        profile={
            "engine": "vllm",
            "gpus": 2,
            "gpu_memory_gb": 40,
            "memory_gb": 64,
            "cpu_cores": 8,
            "node_selector": {"zone": "a"},
        }
    )
    nodes = [
        node("n1-wrong-zone", gpus=4, labels={"zone": "b"}),
        node("n2-no-label", gpus=4),
        node("n3-small-gpus", gpus=4, gpu_gb=24, labels={"zone": "a"}),
        node("n4-low-memory", gpus=4, memory_gb=32, labels={"zone": "a"}),
        node("n5-few-cores", gpus=4, cores=4, labels={"zone": "a"}),
        node("n6-one-gpu", gpus=1, labels={"zone": "a"}),
        node("n7-fits", gpus=4, labels={"zone": "a"}),
    ]
    assert starts(plan(Catalog([m]), nodes, [], NOW)) == [("m", "n7-fits", (0, 1), 0)]
    # Without n7 nothing fits, and each node says why.
    [cannot] = of(CannotPlace, plan(Catalog([m]), nodes[:-1], [], NOW))
    assert cannot.reasons == (
        "n1-wrong-zone: label zone=a required, node has zone=b",
        "n2-no-label: no label zone=a",
        "n3-small-gpus: 0 free GPUs with 40 GiB free, profile needs 2",
        "n4-low-memory: 32 GiB host memory free, profile needs 64 GiB",
        "n5-few-cores: 4 CPU cores free, profile needs 8",
        "n6-one-gpu: 1 free GPU, profile needs 2",
    )
    assert "n6-one-gpu: 1 free GPU, profile needs 2" in cannot.message


def test_gpu_memory_counts_what_the_agent_reports_free():
    m = spec_model(profile={"engine": "vllm", "gpus": 1, "gpu_memory_gb": 40})
    busy = node("a", gpus=1, free_gb=10)  # something outside llmgw holds 70 GB
    assert starts(plan(Catalog([m]), [busy, node("b", gpus=1)], [], NOW)) == [("m", "b", (0,), 0)]


def test_host_memory_and_cores_claimed_by_running_replicas_are_not_free():
    m = spec_model(profile={"engine": "vllm", "gpus": 1, "memory_gb": 100, "cpu_cores": 16}, min_replicas=2)
    r = running("m-1", "a", memory_gb=100, cores=16)
    a = with_reports(node("a", gpus=4, memory_gb=256, cores=24), r)
    [cannot] = of(CannotPlace, plan(Catalog([m]), [a], [r], NOW))
    assert cannot.reasons == ("a: 8 CPU cores free, profile needs 16",)
    # Two placements in one pass debit the node too.
    fresh = spec_model(profile={"engine": "vllm", "gpus": 1, "memory_gb": 100}, min_replicas=3)
    actions = plan(Catalog([fresh]), [node("a", gpus=4, memory_gb=256)], [], NOW)
    assert len(of(StartReplica, actions)) == 2
    assert of(CannotPlace, actions)[0].reasons == ("a: 56 GiB host memory free, profile needs 100 GiB",)


def test_cpu_only_profile_needs_no_gpu():
    m = spec_model(profile={"engine": "llama.cpp", "cpu_only": True, "memory_gb": 8, "cpu_cores": 4})
    full = node("a", gpus=0, engines=("llama.cpp",))
    assert starts(plan(Catalog([m]), [full], [], NOW)) == [("m", "a", (), 0)]


# -- profiles in priority order -----------------------------------------------------


def test_profiles_are_tried_in_priority_order_and_the_first_that_fits_is_used():
    m = spec_model(
        profiles=[
            {"engine": "vllm", "gpus": 4, "args": {"tp": "4"}},
            {"engine": "vllm", "gpus": 2, "args": {"tp": "2"}},
            {"engine": "llama.cpp", "cpu_only": True, "memory_gb": 16},
        ],
        min_replicas=3,
    )
    nodes = [node("a", gpus=4), node("b", gpus=2), node("c", gpus=0, engines=("llama.cpp",))]
    actions = plan(Catalog([m]), nodes, [], NOW)
    assert sorted(starts(actions)) == [("m", "a", (0, 1, 2, 3), 0), ("m", "b", (0, 1), 1), ("m", "c", (), 2)]
    by_node = {s.node: s for s in of(StartReplica, actions)}
    assert by_node["b"].args == {"tp": "2"} and by_node["b"].engine == "vllm"
    assert by_node["c"].engine == "llama.cpp" and by_node["c"].memory_bytes == 16 * GB


def test_a_model_no_profile_fits_explains_each_profile_per_node():
    m = spec_model(profiles=[{"engine": "vllm", "gpus": 4}, {"engine": "sglang", "gpus": 2}])
    [cannot] = of(CannotPlace, plan(Catalog([m]), [node("a", gpus=2)], [], NOW))
    assert cannot.reasons == (
        "profile 1 (vllm, 4 GPUs) a: 2 free GPUs, profile needs 4",
        "profile 2 (sglang, 2 GPUs) a: does not offer engine 'sglang' (offers vllm)",
    )


def test_a_long_list_of_reasons_is_cut_in_the_message_but_kept_whole():
    m = spec_model(profile={"engine": "vllm", "gpus": 8})
    nodes = [node(f"n{i:02d}", gpus=1) for i in range(20)]
    [cannot] = of(CannotPlace, plan(Catalog([m]), nodes, [], NOW, settings=PlanSettings(reasons_shown=3)))
    assert len(cannot.reasons) == 20
    assert cannot.message.endswith("n02: 1 free GPU, profile needs 8; and 17 more (llmgw explain m)")


# -- spread and pack ------------------------------------------------------------------


def test_replicas_of_one_model_spread_across_nodes_under_both_policies():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=3)
    nodes = [node("a", gpus=8), node("b", gpus=8), node("c", gpus=8)]
    for policy in ("pack", "spread"):
        actions = plan(Catalog([m]), nodes, [], NOW, settings=PlanSettings(policy=policy))
        assert sorted(s.node for s in of(StartReplica, actions)) == ["a", "b", "c"], policy


def test_pack_keeps_whole_machines_free_and_spread_balances_them():
    small = spec_model(name="small", profile={"engine": "vllm", "gpus": 1})
    busy = running("x-1", "a", m="x", gpus=(0, 1, 2, 3, 4, 5))
    x = spec_model(name="x", profile={"engine": "vllm", "gpus": 6})
    nodes = [with_reports(node("a", gpus=8), busy), node("b", gpus=8)]
    cat = Catalog([small, x])
    packed = plan(cat, nodes, [busy], NOW, settings=PlanSettings(policy="pack"))
    assert starts(packed) == [("small", "a", (6,), 0)]  # b stays whole for an 8-GPU model
    spread = plan(cat, nodes, [busy], NOW, settings=PlanSettings(policy="spread"))
    assert starts(spread) == [("small", "b", (0,), 0)]


def test_second_replica_goes_to_the_fullest_node_already_holding_one_when_nothing_else_fits():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=3)
    a1, b1 = running("m-1", "a"), running("m-2", "b")
    nodes = [with_reports(node("a", gpus=4), a1), with_reports(node("b", gpus=2), b1)]
    assert starts(plan(Catalog([m]), nodes, [a1, b1], NOW)) == [("m", "b", (1,), 0)]


# -- holds ------------------------------------------------------------------------


def test_held_node_gets_no_new_replica_and_says_why():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    held = dataclasses.replace(node("a"), hold_reason="disk swap", held=True)
    [cannot] = of(CannotPlace, plan(Catalog([m]), [held], [], NOW))
    assert cannot.reasons == ("a: held by an operator (disk swap)",)
    assert starts(plan(Catalog([m]), [held, node("b")], [], NOW)) == [("m", "b", (0,), 0)]


def test_drain_starts_the_replacement_first_and_stops_the_old_replica_only_once_it_is_ready():
    m = spec_model(profile={"engine": "vllm", "gpus": 1}, min_replicas=2)
    cat = Catalog([m])
    a1, b1 = running("m-a", "a"), running("m-b", "b")
    held_a = dataclasses.replace(with_reports(node("a"), a1), held=True)
    b, c = with_reports(node("b"), b1), node("c")
    # Pass 1: the replacement is placed elsewhere; the held replica keeps serving.
    first = plan(cat, [held_a, b, c], [a1, b1], NOW)
    assert starts(first) == [("m", "c", (0,), 0)]
    assert of(StopReplica, first) == []
    # Pass 2: the replacement is starting, not ready: still no stop.
    c1 = running("m-c", "c", ready=False)
    c_starting = with_reports(c, c1)
    second = plan(cat, [held_a, b, c_starting], [a1, b1, c1], NOW)
    assert of(StopReplica, second) == [] and of(StartReplica, second) == []
    # Pass 3: it is ready: now the old one stops, and is forgotten.
    c1 = running("m-c", "c")
    third = plan(cat, [held_a, b, with_reports(c, c1)], [a1, b1, c1], NOW)
    [stop] = of(StopReplica, third)
    assert (stop.replica_id, stop.node, stop.forget) == ("m-a", "a", True)
    assert "node a is held" in stop.reason
    assert of(StartReplica, third) == []


def test_drain_with_no_room_elsewhere_keeps_the_old_replica_serving():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    a1 = running("m-a", "a")
    held_a = dataclasses.replace(with_reports(node("a"), a1), held=True)
    full = with_reports(node("b", gpus=1), running("other-1", "b", m="other"))
    other = spec_model(name="other", profile={"engine": "vllm", "gpus": 1})
    actions = plan(Catalog([m, other]), [held_a, full], [a1, running("other-1", "b", m="other")], NOW)
    assert of(StopReplica, actions) == []
    [cannot] = of(CannotPlace, actions)
    assert cannot.model == "m" and "a: held by an operator" in cannot.message


def test_a_held_replica_that_is_not_ready_is_stopped_once_its_replacement_is_placed():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    a1 = running("m-a", "a", ready=False)
    held_a = dataclasses.replace(with_reports(node("a"), a1), held=True)
    actions = plan(Catalog([m]), [held_a, node("b")], [a1], NOW)
    assert starts(actions) == [("m", "b", (0,), 0)]
    assert [s.replica_id for s in of(StopReplica, actions)] == ["m-a"]


def test_a_held_node_that_went_away_has_its_replaced_replica_forgotten_not_sent_a_stop():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    a1, b1 = running("m-a", "a"), running("m-b", "b")
    gone = dataclasses.replace(
        with_reports(node("a"), a1), held=True, state=NodeState.UNREACHABLE, unreachable_since=NOW
    )
    actions = plan(Catalog([m]), [gone, with_reports(node("b"), b1)], [a1, b1], NOW)
    assert of(StopReplica, actions) == []
    assert [f.replica_id for f in of(ForgetReplica, actions)] == ["m-a"]


# -- capacity classes ---------------------------------------------------------------


def test_critical_model_evicts_the_fewest_opportunistic_replicas_and_waits_for_them():
    crit = spec_model(name="crit", capacity_class="critical", profile={"engine": "vllm", "gpus": 2})
    opp = spec_model(
        name="opp", capacity_class="opportunistic", min_replicas=2, profile={"engine": "vllm", "gpus": 1}
    )
    big = spec_model(name="big", capacity_class="opportunistic", profile={"engine": "vllm", "gpus": 2})
    o1, o2 = running("opp-1", "a", m="opp", gpus=(0,)), running("opp-2", "a", m="opp", gpus=(1,))
    b1 = running("big-1", "b", m="big", gpus=(0, 1))
    nodes = [with_reports(node("a"), o1, o2), with_reports(node("b"), b1)]
    cat = Catalog([crit, opp, big])
    actions = plan(cat, nodes, [o1, o2, b1], NOW)
    [evict] = of(EvictReplica, actions)
    # One eviction on b beats two on a.
    assert (evict.replica_id, evict.node, evict.model) == ("big-1", "b", "big")
    assert "critical model 'crit' needs room on b" in evict.reason
    assert of(StartReplica, actions) == []
    crit_msg = next(c.message for c in of(CannotPlace, actions) if c.model == "crit")
    assert "evicting big-1" in crit_msg
    # Next pass: big-1 is stopping (no record): wait, evict nothing more.
    stopping = ReportedReplica("big-1", "big", RS.REPLICA_STATE_STOPPING, gpu_indices=(0, 1))
    b_stopping = dataclasses.replace(nodes[1], replicas={"big-1": stopping})
    waiting = plan(cat, [nodes[0], b_stopping], [o1, o2], NOW)
    assert of(EvictReplica, waiting) == [] and of(StartReplica, waiting) == []
    assert "waiting for replicas that are stopping" in next(
        c.message for c in of(CannotPlace, waiting) if c.model == "crit"
    )
    # Once it has stopped, the critical model takes the room.
    b_free = dataclasses.replace(nodes[1], replicas={})
    assert ("crit", "b", (0, 1), 0) in starts(plan(cat, [nodes[0], b_free], [o1, o2], NOW))


def test_standard_model_never_evicts():
    std = spec_model(name="std", profile={"engine": "vllm", "gpus": 1})
    opp = spec_model(name="opp", capacity_class="opportunistic", profile={"engine": "vllm", "gpus": 1})
    o1 = running("opp-1", "a", m="opp")
    actions = plan(Catalog([std, opp]), [with_reports(node("a", gpus=1), o1)], [o1], NOW)
    assert of(EvictReplica, actions) == []
    assert [c.model for c in of(CannotPlace, actions)] == ["std"]


def test_critical_model_never_evicts_standard_replicas():
    crit = spec_model(name="crit", capacity_class="critical", profile={"engine": "vllm", "gpus": 1})
    std = spec_model(name="std", profile={"engine": "vllm", "gpus": 1})
    s1 = running("std-1", "a", m="std")
    actions = plan(Catalog([crit, std]), [with_reports(node("a", gpus=1), s1)], [s1], NOW)
    assert of(EvictReplica, actions) == [] and of(StopReplica, actions) == []


def test_critical_models_are_placed_before_others_when_room_is_short():
    crit = spec_model(name="z-crit", capacity_class="critical", profile={"engine": "vllm", "gpus": 1})
    std = spec_model(name="a-std", profile={"engine": "vllm", "gpus": 2})
    assert starts(plan(Catalog([crit, std]), [node("a", gpus=2)], [], NOW))[0][0] == "z-crit"


# -- backoff ----------------------------------------------------------------------


def test_a_crash_looping_model_backs_off_shows_its_last_error_and_retries_on_another_node():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    b = Backoff(3, NOW + 20, "exit 1: CUDA out of memory\ntraceback ...", "m-1", "a")
    waiting = plan(Catalog([m]), [node("a"), node("b")], [], NOW, {"m": b})
    [cannot] = of(CannotPlace, waiting)
    assert cannot.message == (
        "1 of 1 replica(s) wait to be replaced after 3 failure(s); retrying in 20s; "
        "last error: exit 1: CUDA out of memory"
    )
    # After the backoff, another node than the one it failed on, though "a" sorts first.
    assert starts(plan(Catalog([m]), [node("a"), node("b")], [], NOW + 21, {"m": b})) == [("m", "b", (0,), 0)]
    # The node it failed on is still used when it is the only one.
    assert starts(plan(Catalog([m]), [node("a")], [], NOW + 21, {"m": b})) == [("m", "a", (0,), 0)]


def test_a_profile_that_failed_twice_in_a_row_is_tried_after_the_others():
    m = spec_model(profiles=[{"engine": "vllm", "gpus": 2}, {"engine": "vllm", "gpus": 1}])
    nodes = [node("a", gpus=2)]
    once = Backoff(1, NOW, "exit 1: OOM", "m-1", "a", profile=0)
    assert starts(plan(Catalog([m]), nodes, [], NOW, {"m": once})) == [("m", "a", (0, 1), 0)]
    twice = dataclasses.replace(once, failures=2)
    assert starts(plan(Catalog([m]), nodes, [], NOW, {"m": twice})) == [("m", "a", (0,), 1)]


def test_a_failing_replica_does_not_disturb_its_nodes_other_replicas():
    m = spec_model(profile={"engine": "vllm", "gpus": 1})
    other = spec_model(name="other", profile={"engine": "vllm", "gpus": 1})
    ok = running("other-1", "a", m="other", gpus=(1,))
    failed = Replica(
        ReplicaRecord("m-1", "m", "a", (0,), "vllm", "m", 1.0),
        ReportedReplica("m-1", "m", RS.REPLICA_STATE_FAILED, gpu_indices=(0,), message="exit 1"),
    )
    a = dataclasses.replace(node("a"), replicas={"m-1": failed.reported, "other-1": ok.reported})
    actions = plan(Catalog([m, other]), [a], [failed, ok], NOW)
    assert [s.replica_id for s in of(StopReplica, actions)] == ["m-1"]
    assert not any(isinstance(x, StopReplica) and x.replica_id == "other-1" for x in actions)
