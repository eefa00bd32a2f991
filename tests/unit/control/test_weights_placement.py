"""Placement prefers nodes that already hold a model's weights (a tie-break, never over spread),
and the weights a replica is started with are the model document's (source at its revision)."""

from __future__ import annotations

from types import MappingProxyType

import pytest
from pydantic import ValidationError

from llmgw.control.decide.reconcile import StartReplica, plan
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
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


def spec_model(weights: dict, args: dict | None = None, engine: str = "vllm") -> Model:
    spec = ModelSpec.model_validate(
        {
            "name": "m",
            "min_replicas": 1,
            "weights": weights,
            "profile": {"engine": engine, "gpus": 1, "args": args or {}},
        }
    )
    return Model.from_spec(spec)


def test_the_model_documents_weights_and_revision_are_what_a_replica_is_started_with():
    def args(weights: dict, profile: dict | None = None) -> dict:
        return dict(spec_model(weights, profile).profiles[0].args)

    # A hub source is pinned at the revision: the agent fetches exactly that.
    assert args({"source": SOURCE, "revision": "v2"}) == {"weights": SOURCE + "@v2"}
    assert args({"source": SOURCE + "@v2"}) == {"weights": SOURCE + "@v2"}
    assert args({"source": SOURCE}) == {"weights": SOURCE}
    # A local path is the engine's as it is; a bare hub id goes with vLLM's --revision.
    assert args({"source": "/models/llama", "revision": "v2"}) == {"weights": "/models/llama"}
    assert args({"source": "org/llama", "revision": "v2"}) == {"weights": "org/llama", "revision": "v2"}
    # A profile's own weights win, still pinned by the revision; no source: nothing added.
    assert args({"source": SOURCE, "revision": "v2"}, {"model": "hf://org/gguf"}) == {
        "model": "hf://org/gguf@v2"
    }
    assert args({"source": SOURCE}, {"weights": "/m/q4.gguf"}) == {"weights": "/m/q4.gguf"}
    assert args({"revision": "v2"}) == {}
    # Changing the revision changes what the new replicas load, not only the version label.
    v1, v2 = (
        spec_model({"source": SOURCE, "revision": "v1"}),
        spec_model({"source": SOURCE, "revision": "v2"}),
    )
    assert v1.version != v2.version and v1.profiles[0].args != v2.profiles[0].args


def test_a_source_pinned_twice_with_different_revisions_is_refused():
    with pytest.raises(ValidationError, match="give the revision in one place"):
        spec_model({"source": SOURCE + "@v1", "revision": "v2"})
    with pytest.raises(ValidationError, match=r"hf://ORG/NAME\[@REVISION\]"):
        spec_model({"source": "hf://not a repo"})


def test_placement_prefers_the_nodes_holding_the_revision_the_model_asks_for():
    nodes = [node("a", gpus=1), node("b", gpus=4), node("c", gpus=4)]
    v2 = spec_model({"source": SOURCE, "revision": "v2"}, engine="simulator")
    holders = {SOURCE + "@v1": frozenset({"b"}), SOURCE + "@v2": frozenset({"c"})}
    assert starts(plan(Catalog([v2]), nodes, [], NOW, weights_holders=holders)) == ["c"]
    v1 = spec_model({"source": SOURCE, "revision": "v1"}, engine="simulator")
    assert starts(plan(Catalog([v1]), nodes, [], NOW, weights_holders=holders)) == ["b"]
