"""Fabric results: stored per pair in the store, and judged against their peers."""

from __future__ import annotations

from llmgw.common.etcd import MemoryStore
from llmgw.control.decide.fabric import judge
from llmgw.control.store.fabric import FabricResults
from llmgw.v1 import fabric_pb2


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
