"""Placement prefers nodes that already hold a model's weights (a tie-break, never over spread)."""

from __future__ import annotations

from types import MappingProxyType

from llmgw.control.decide.reconcile import StartReplica, plan
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.state.inventory import Engine, Gpu, Node, NodeState
from llmgw.control.state.weights import WeightsTable
from llmgw.v1 import agent_pb2

NOW = 1000.0
SOURCE = "hf://org/llama"


def model(min_replicas=1, weights=SOURCE) -> Model:
    args = MappingProxyType({"weights": weights} if weights else {})
    return Model(name="m", engine="simulator", gpus=1, min_replicas=min_replicas, args=args)


def node(nid, gpus=2) -> Node:
    return Node(
        nid,
        NodeState.READY,
        last_seen=NOW,
        gpus=tuple(Gpu(i) for i in range(gpus)),
        engines=(Engine("simulator"),),
    )


def starts(actions):
    return sorted(a.node for a in actions if isinstance(a, StartReplica))


def test_a_node_holding_the_weights_wins_over_a_better_packed_one():
    nodes = [node("a", gpus=1), node("b", gpus=4)]
    assert starts(plan(Catalog([model()]), nodes, [], NOW)) == ["a"], "without weights: packing picks a"
    holders = {SOURCE: frozenset({"b"})}
    assert starts(plan(Catalog([model()]), nodes, [], NOW, weights_holders=holders)) == ["b"]


def test_holding_the_weights_never_outweighs_spreading_replicas():
    nodes = [node("a", gpus=4), node("b", gpus=4)]
    holders = {SOURCE: frozenset({"b"})}
    assert starts(plan(Catalog([model(min_replicas=2)]), nodes, [], NOW, weights_holders=holders)) == [
        "a",
        "b",
    ]


def test_weights_of_another_model_or_a_model_without_weights_change_nothing():
    nodes = [node("a", gpus=1), node("b", gpus=4)]
    other = {"hf://org/other": frozenset({"b"})}
    assert starts(plan(Catalog([model()]), nodes, [], NOW, weights_holders=other)) == ["a"]
    assert starts(plan(Catalog([model(weights="")]), nodes, [], NOW, weights_holders=other)) == ["a"]


def test_only_ready_weights_count_as_held():
    table = WeightsTable()
    ready = agent_pb2.WeightsStatus(name="org/llama", source=SOURCE, state=agent_pb2.WEIGHTS_STATE_READY)
    fetching = agent_pb2.WeightsStatus(
        name="org/llama", source=SOURCE, state=agent_pb2.WEIGHTS_STATE_FETCHING
    )
    table.replace("a", [fetching])
    table.replace("b", [ready])
    assert table.holders() == {SOURCE: frozenset({"b"})}
    table.update("a", ready)
    assert table.holders() == {SOURCE: frozenset({"a", "b"})}
    table.forget("b", "org/llama")
    assert table.holders() == {SOURCE: frozenset({"a"})}
