"""Holds, labels, explanations and failures through the real gRPC API, two control planes on one store."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.spec.model import ModelSpec, Profile
from llmgw.v1 import admin_pb2, agent_pb2, nodes_pb2, nodes_pb2_grpc

from .helpers import until
from .test_controlplane import SECRET, admin, config, ready_status, register_with_leader, running

RS = agent_pb2.ReplicaState


def nodes_api(address: str) -> tuple[grpc.aio.Channel, nodes_pb2_grpc.NodeServiceStub]:
    channel = grpc.aio.insecure_channel(address)
    return channel, nodes_pb2_grpc.NodeServiceStub(channel)


async def test_hold_taken_on_a_standby_drains_the_node_without_a_gap_and_a_new_leader_keeps_it(tmp_path):
    store = MemoryStore()
    first = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    second = ControlPlane(config(tmp_path, "control-b"), store, SECRET)
    stop_first = asyncio.Event()
    first_task = asyncio.create_task(first.run(stop_first))
    try:
        await until(lambda: first.controller.accepting)
        async with running(second):
            a, _ = await register_with_leader(first.address, "node-a")
            old = (await a.inbox.next()).start
            await a.status(**ready_status(old, "http://127.0.0.1:39990"))
            b, _ = await register_with_leader(first.address, "node-b")
            await until(lambda: any(r.ready for r in first.controller.replicas()))

            # Any control plane takes the hold; the leader follows it through the store.
            nchan, nodes = nodes_api(second.address)
            held = await nodes.HoldNode(nodes_pb2.HoldNodeRequest(node_id="node-a", reason="disk swap"))
            assert (held.held, held.hold_reason) == (True, "disk swap") and held.held_since > 0
            assert await store.get("node-overrides/node-a") is not None

            # The replacement starts on node-b; node-a's replica keeps serving meanwhile.
            new = (await b.inbox.next()).start
            assert new.model == "demo"
            assert await a.inbox.quiet(0.5), "the old replica must not stop before its replacement is ready"
            await b.status(**ready_status(new, "http://127.0.0.1:39991"))
            stop = await a.inbox.next_matching(lambda m: m.HasField("stop"))
            assert stop.stop.replica_id == old.replica_id and "node node-a is held" in stop.stop.reason

            achan, stub = admin(first.address)
            listed = {n.node_id: n for n in (await stub.ListNodes(admin_pb2.ListNodesRequest())).nodes}
            assert (listed["node-a"].state, listed["node-a"].held, listed["node-a"].hold_reason) == (
                "held",
                True,
                "disk swap",
            )
            assert listed["node-b"].state == "ready"

            # A new leader has the hold before any agent reconnects.
            stop_first.set()
            await asyncio.wait_for(first_task, 10)
            await until(lambda: second.controller.accepting, within=5)
            for agent in (a, b):
                await agent.close()
            running_b = agent_pb2.ReplicaStatus(**ready_status(new, "http://127.0.0.1:39991"))
            a, _ = await register_with_leader(second.address, "node-a")
            b, _ = await register_with_leader(second.address, "node-b", [running_b])
            schan, sstub = admin(second.address)
            listed = {n.node_id: n for n in (await sstub.ListNodes(admin_pb2.ListNodesRequest())).nodes}
            assert listed["node-a"].state == "held"
            assert await a.inbox.quiet(1.0) and await b.inbox.quiet(0.0), "adopted; nothing placed on node-a"

            # Released: node-a may take replicas again (the hold's key is gone).
            released = await nodes.ReleaseNode(nodes_pb2.ReleaseNodeRequest(node_id="node-a"))
            assert not released.held
            assert await store.get("node-overrides/node-a") is None
            await until(lambda: not second.controller.nodes()[0].held)
            for closer in (nchan.close, achan.close, schan.close, a.close, b.close):
                await closer()
    finally:
        stop_first.set()
        await asyncio.wait_for(first_task, 10)


async def test_operator_labels_steer_a_node_selector_and_bad_input_is_refused_with_nothing_written(tmp_path):
    models = [
        ModelSpec(
            name="gpu-a",
            profile=Profile(engine="simulator", gpus=1, node_selector={"pool": "inference"}),
        )
    ]
    store = MemoryStore()
    plane = ControlPlane(config(tmp_path, "control-a", models), store, SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        await until(lambda: "gpu-a" in plane.controller.placement_messages)
        assert "node-a: no label pool=inference" in plane.controller.placement_messages["gpu-a"]

        chan, nodes = nodes_api(plane.address)
        for bad, what in [
            (nodes_pb2.LabelNodeRequest(node_id="node a", set={"pool": "x"}), "node id 'node a'"),
            (nodes_pb2.LabelNodeRequest(node_id="node-a", set={"pool": "a b"}), "label pool='a b'"),
            (nodes_pb2.LabelNodeRequest(node_id="node-a", set={"-x": "1"}), "label key '-x'"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await nodes.LabelNode(bad)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and what in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nodes.HoldNode(nodes_pb2.HoldNodeRequest(node_id="", reason="x"))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert (await store.range("node-overrides/")).entries == []

        done = await nodes.LabelNode(nodes_pb2.LabelNodeRequest(node_id="node-a", set={"pool": "inference"}))
        assert dict(done.labels) == {"pool": "inference"}
        start = await agent.inbox.next_matching(lambda m: m.HasField("start"))
        assert start.start.model == "gpu-a"
        listed = await nodes.ListNodeOverrides(nodes_pb2.ListNodeOverridesRequest())
        assert [(o.node_id, dict(o.labels)) for o in listed.overrides] == [("node-a", {"pool": "inference"})]
        for closer in (chan.close, agent.close):
            await closer()


async def test_explain_gives_every_profile_per_node_and_status_lists_what_cannot_be_placed(tmp_path):
    models = [
        ModelSpec(
            name="big",
            profiles=[Profile(engine="simulator", gpus=4), Profile(engine="vllm", gpus=1)],
        )
    ]
    store = MemoryStore()
    leader = ControlPlane(config(tmp_path, "control-a", models), store, SECRET)
    standby = ControlPlane(config(tmp_path, "control-b", models), store, SECRET)
    async with running(leader), running(standby):
        await until(lambda: leader.controller.accepting)
        agent, _ = await register_with_leader(leader.address, "node-a")
        await until(lambda: "big" in leader.controller.placement_messages)
        chan = grpc.aio.insecure_channel(leader.address)
        placement = nodes_pb2_grpc.PlacementServiceStub(chan)
        got = await placement.ExplainPlacement(nodes_pb2.ExplainPlacementRequest(model="big"))
        assert (got.model, got.wanted, got.replicas, got.policy) == ("big", 1, 0, "pack")
        assert [(p.profile, p.description) for p in got.profiles] == [
            (1, "simulator, 4 GPUs"),
            (2, "vllm, 1 GPU"),
        ]
        assert [(v.node_id, v.fits, v.reason) for p in got.profiles for v in p.nodes] == [
            ("node-a", False, "2 free GPUs, profile needs 4"),
            ("node-a", False, "does not offer engine 'vllm' (offers simulator)"),
        ]
        assert "cannot be placed" in got.placement_message

        achan, stub = admin(leader.address)
        status = await stub.GetClusterStatus(admin_pb2.GetClusterStatusRequest())
        [problem] = status.placement_problems
        assert problem.startswith("big: 1 of 1 replica(s) cannot be placed") and "node-a:" in problem

        schan = grpc.aio.insecure_channel(standby.address)
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await nodes_pb2_grpc.PlacementServiceStub(schan).ExplainPlacement(
                nodes_pb2.ExplainPlacementRequest(model="big")
            )
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert leader.address in err.value.details()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await placement.ExplainPlacement(nodes_pb2.ExplainPlacementRequest(model="nope"))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        for closer in (chan.close, achan.close, schan.close, agent.close):
            await closer()


async def test_a_failed_replica_leaves_its_last_error_and_backoff_in_list_replicas(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a"), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")
        start = (await agent.inbox.next()).start
        await agent.status(
            replica_id=start.replica_id,
            model="demo",
            state=RS.REPLICA_STATE_FAILED,
            gpu_indices=list(start.gpu_indices),
            message="engine exited with status 1: CUDA out of memory",
        )
        await until(lambda: "demo" in plane.controller.backoffs)
        chan, stub = admin(plane.address)
        got = await stub.ListReplicas(admin_pb2.ListReplicasRequest(model="demo"))
        assert list(got.replicas) == []
        [failure] = got.failures
        assert (failure.model, failure.replica_id, failure.node_id, failure.failures) == (
            "demo",
            start.replica_id,
            "node-a",
            1,
        )
        assert failure.last_error == "engine exited with status 1: CUDA out of memory"
        # failure_backoff_seconds is 30 in these tests.
        assert 20 < failure.retry_in_seconds <= 30
        # The node stays ready: a crash-looping replica does not take it down.
        nodes = (await stub.ListNodes(admin_pb2.ListNodesRequest())).nodes
        assert [n.state for n in nodes] == ["ready"]
        for closer in (chan.close, agent.close):
            await closer()


async def test_a_node_back_after_it_was_lost_has_its_orphan_replica_stopped(tmp_path):
    plane = ControlPlane(config(tmp_path, "control-a", node_lost_seconds=0.5), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        a, _ = await register_with_leader(plane.address, "node-a")
        old = (await a.inbox.next()).start
        await a.status(**ready_status(old, "http://127.0.0.1:39980"))
        b, _ = await register_with_leader(plane.address, "node-b")
        await a.close()  # node-a's stream ends: unreachable, then lost
        new = (await b.inbox.next(within=5)).start
        assert new.model == "demo" and new.replica_id != old.replica_id
        await b.status(**ready_status(new, "http://127.0.0.1:39981"))

        # node-a returns, still running its old engine: it is an orphan now.
        still = agent_pb2.ReplicaStatus(**ready_status(old, "http://127.0.0.1:39980"))
        a, _ = await register_with_leader(plane.address, "node-a", [still])
        stop = await a.inbox.next_matching(lambda m: m.HasField("stop"))
        assert stop.stop.replica_id == old.replica_id and "orphan" in stop.stop.reason
        assert [r.id for r in plane.controller.replicas()] == [new.replica_id]
        assert await b.inbox.quiet(0.3), "the replacement keeps running"
        for closer in (a.close, b.close):
            await closer()


async def test_critical_model_added_to_a_full_node_evicts_an_opportunistic_replica_then_starts(tmp_path):
    one_gpu = Profile(engine="simulator", gpus=1)
    opp = ModelSpec(name="opp", capacity_class="opportunistic", min_replicas=2, profile=one_gpu)
    crit = ModelSpec(name="crit", capacity_class="critical", profile=one_gpu)
    plane = ControlPlane(config(tmp_path, "control-a", [opp]), MemoryStore(), SECRET)
    async with running(plane):
        await until(lambda: plane.controller.accepting)
        agent, _ = await register_with_leader(plane.address, "node-a")  # 2 GPUs
        starts = [(await agent.inbox.next()).start for _ in range(2)]
        for i, s in enumerate(starts):
            await agent.status(**ready_status(s, f"http://127.0.0.1:3997{i}"))
        await until(lambda: sum(r.ready for r in plane.controller.replicas()) == 2)

        await plane.models.put(crit, replace=False)  # a critical model arrives; no GPU is free
        stop = await agent.inbox.next_matching(lambda m: m.HasField("stop"))
        victim = next(s for s in starts if s.replica_id == stop.stop.replica_id)
        assert "evicted: critical model 'crit' needs room on node-a" in stop.stop.reason
        assert plane.metrics.evictions._value.get() == 1
        assert await agent.inbox.quiet(0.5), "nothing starts before the evicted engine has stopped"
        await agent.status(
            replica_id=victim.replica_id,
            model="opp",
            state=RS.REPLICA_STATE_STOPPED,
            gpu_indices=list(victim.gpu_indices),
        )
        start = (await agent.inbox.next_matching(lambda m: m.HasField("start"))).start
        assert (start.model, list(start.gpu_indices)) == ("crit", list(victim.gpu_indices))
        await agent.close()
