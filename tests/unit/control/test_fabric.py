"""Fabric results: stored per pair in the store, and judged against their peers."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from llmgw.common.etcd import MemoryStore
from llmgw.control.controlplane import ControlPlane
from llmgw.control.decide.fabric import judge
from llmgw.control.store import fabric as fabric_store
from llmgw.control.store.fabric import FabricResults
from llmgw.v1 import agent_pb2, fabric_pb2, fabric_pb2_grpc

from .helpers import until
from .test_controlplane import SECRET, config, register_with_leader, running


def _r(a: str, b: str, bw: float, lat: float = 0.001, error: str = "") -> fabric_pb2.FabricResult:
    return fabric_pb2.FabricResult(
        node_a=a, node_b=b, bandwidth_bytes_per_second=bw, latency_seconds=lat, error=error
    )


def test_a_pair_far_below_its_peers_is_warned_and_the_others_are_not():
    judged = judge([_r("a", "b", 10e9), _r("a", "c", 9e9), _r("b", "c", 11e9), _r("c", "d", 1e9)])
    warnings = {(r.node_a, r.node_b): r.warning for r in judged}
    assert warnings[("c", "d")].startswith("bandwidth 10% of the median of 3 other pairs")
    assert [k for k, w in warnings.items() if w] == [("c", "d")]


def test_a_pair_with_far_higher_latency_is_warned():
    judged = judge([_r("a", "b", 1e9, 0.001), _r("a", "c", 1e9, 0.001), _r("b", "c", 1e9, 0.01)])
    assert "latency 10.0x" in judged[2].warning
    assert not judged[0].warning


def test_without_two_other_measured_pairs_nothing_is_judged():
    judged = judge([_r("a", "b", 10e9), _r("a", "c", 1e6), _r("b", "c", 0, error="node c: refused")])
    assert not any(r.warning for r in judged)


async def test_results_are_stored_once_per_pair_whichever_way_round():
    results = FabricResults(MemoryStore())
    await results.put(_r("b", "a", 1e9))
    await results.put(_r("a", "b", 2e9))
    await results.put(_r("a", "c", 3e9))
    stored = await results.list()
    assert [(r.node_a, r.node_b, r.bandwidth_bytes_per_second) for r in stored] == [
        ("a", "b", 2e9),
        ("a", "c", 3e9),
    ]


async def test_past_the_bound_the_oldest_results_are_deleted_and_the_newest_listed(monkeypatch):
    store = MemoryStore()
    results = FabricResults(store)
    monkeypatch.setattr(fabric_store, "MAX_RESULTS", 3)
    for i, pair in enumerate([("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")]):
        r = _r(*pair, 1e9)
        r.measured_at = 1000.0 + i
        await results.put(r)
    await store.put(f"{fabric_store.PREFIX}x/y", b"\xff not a result")
    # Over the bound (a test still running): the newest are listed, nothing is deleted yet.
    assert [r.node_a for r in await results.list()] == ["c", "e", "g"]
    assert len((await store.range(fabric_store.PREFIX)).entries) == 5
    # After a test: the unreadable one and the oldest go.
    assert await results.prune() == 2
    assert [e.key for e in (await store.range(fabric_store.PREFIX)).entries] == [
        f"{fabric_store.PREFIX}c/d",
        f"{fabric_store.PREFIX}e/f",
        f"{fabric_store.PREFIX}g/h",
    ]
    assert await results.prune() == 0


# -- FabricService on a real control plane, the agents scripted (tests/integration runs real ones) --


async def _answer_fabric(agent, seen: list, refuse_probe: bool = False) -> None:
    """Answer every fabric request ``agent`` gets, as an agent would; record them in ``seen``."""
    while True:
        msg = await agent.inbox.next_matching(
            lambda m: m.WhichOneof("msg") in ("fabric_listen", "fabric_probe"), 30
        )
        kind = msg.WhichOneof("msg")
        req = getattr(msg, kind)
        seen.append((agent.node_id, kind, req))
        reply = agent_pb2.AgentReply(request_id=req.request_id)
        if kind == "fabric_listen":
            reply.fabric.port = 40000 + len(seen)
        elif refuse_probe:
            reply.code, reply.error = (
                grpc.StatusCode.UNAVAILABLE.value[0],
                "cannot reach 127.0.0.1 for a fabric test",
            )
        else:
            reply.fabric.CopyFrom(
                agent_pb2.FabricMeasurement(
                    bandwidth_bytes_per_second=1e9, latency_seconds=1e-4, method="tcp", nccl="not run: test"
                )
            )
        await agent.call.write(agent_pb2.AgentMessage(reply=reply))


async def test_pairs_run_in_turn_with_a_fresh_token_each_and_a_failed_pair_is_stored_with_its_error(
    tmp_path, monkeypatch
):
    store = MemoryStore()
    # A pair of nodes long gone, measured before this test; the bound leaves room for 3 pairs.
    old = _r("gone-1", "gone-2", 1e9)
    old.measured_at = 1.0
    await FabricResults(store).put(old)
    monkeypatch.setattr(fabric_store, "MAX_RESULTS", 3)
    leader = ControlPlane(config(tmp_path, "control-a"), store, SECRET)
    async with running(leader):
        await until(lambda: leader.controller.accepting)
        agents = [(await register_with_leader(leader.address, n))[0] for n in ("node-a", "node-b", "node-c")]
        await until(lambda: len(leader.controller.nodes()) == 3)
        seen: list = []
        async with asyncio.TaskGroup() as tg:
            helpers = [tg.create_task(_answer_fabric(a, seen)) for a in agents[:2]]
            helpers.append(tg.create_task(_answer_fabric(agents[2], seen, refuse_probe=True)))
            channel = grpc.aio.insecure_channel(leader.address)
            stub = fabric_pb2_grpc.FabricServiceStub(channel)
            got = await stub.RunFabricTest(fabric_pb2.RunFabricTestRequest(bytes=1 << 20, pings=5))
            for h in helpers:
                h.cancel()
        pairs = {(r.node_a, r.node_b): r for r in got.results}
        assert sorted(pairs) == [("node-a", "node-b"), ("node-a", "node-c"), ("node-b", "node-c")]
        assert (
            pairs[("node-a", "node-b")].bandwidth_bytes_per_second == 1e9
            and not pairs[("node-a", "node-b")].error
        )
        assert pairs[("node-a", "node-c")].error == "node node-c: cannot reach 127.0.0.1 for a fabric test"
        assert pairs[("node-b", "node-c")].error.startswith("node node-c:")
        # A listens, then B probes A's address on A's port with A's token: one token per pair.
        listens = [(n, r) for n, k, r in seen if k == "fabric_listen"]
        probes = [(n, r) for n, k, r in seen if k == "fabric_probe"]
        assert [n for n, _ in listens] == ["node-a", "node-a", "node-b"]
        assert [n for n, _ in probes] == ["node-b", "node-c", "node-c"]
        for (_, listen), (_, probe) in zip(listens, probes, strict=True):
            assert probe.token == listen.token and len(listen.token) == 32
            assert probe.host == "127.0.0.1" and (probe.bytes, probe.pings) == (1 << 20, 5)
            assert listen.max_bytes == 1 << 20 and listen.max_pings == 5 and listen.timeout_seconds > 0
        assert len({r.token for _, r in listens}) == 3
        everything = await stub.ListFabricResults(fabric_pb2.ListFabricResultsRequest())
        assert ("gone-1", "gone-2") not in {(r.node_a, r.node_b) for r in everything.results}
        assert len((await store.range(fabric_store.PREFIX)).entries) == 3
        listed = await stub.ListFabricResults(fabric_pb2.ListFabricResultsRequest(node_id="node-c"))
        assert sorted((r.node_a, r.node_b) for r in listed.results) == [
            ("node-a", "node-c"),
            ("node-b", "node-c"),
        ]
        for bad, code, says in [
            (
                fabric_pb2.RunFabricTestRequest(nodes=["node-a"]),
                grpc.StatusCode.INVALID_ARGUMENT,
                "two nodes",
            ),
            (fabric_pb2.RunFabricTestRequest(nodes=["node-a", "x"]), grpc.StatusCode.NOT_FOUND, "x"),
            (fabric_pb2.RunFabricTestRequest(bytes=5 << 30), grpc.StatusCode.INVALID_ARGUMENT, "bytes"),
        ]:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.RunFabricTest(bad)
            assert err.value.code() == code and says in err.value.details()
        await channel.close()
        for a in agents:
            await a.close()
