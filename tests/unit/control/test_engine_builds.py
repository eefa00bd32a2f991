"""Engine builds per node: a profile's engine_version range, the driver's CUDA, the build a replica runs.

Pure: ``plan()`` and ``Fleet.verdicts`` called directly on nodes built here.
"""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from llmgw.control.decide.placement import Fleet
from llmgw.control.decide.reconcile import CannotPlace, StartReplica, plan
from llmgw.control.spec.builds import parse_range
from llmgw.control.spec.catalog import Catalog, Model
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.inventory import Engine, Gpu, Node, NodeState
from llmgw.control.store.replicas import ReplicaRecord

NOW = 1000.0


def model(engine_version: str = "", engine: str = "vllm") -> Model:
    profile = {"engine": engine, "gpus": 1}
    if engine_version:
        profile["engine_version"] = engine_version
    return Model.from_spec(ModelSpec.model_validate({"name": "m", "profile": profile}))


def node(nid: str, *builds: Engine, cuda: str = "") -> Node:
    return Node(
        id=nid,
        state=NodeState.READY,
        last_seen=NOW,
        gpus=(Gpu(0, f"GPU-{nid}-0", "H100", 80 << 30, 80 << 30),),
        engines=builds,
        cuda_version=cuda,
    )


def starts(actions) -> list[StartReplica]:
    return [a for a in actions if isinstance(a, StartReplica)]


def test_a_profile_requiring_a_version_range_is_placed_only_on_a_node_with_a_matching_build():
    nodes = [node("a", Engine("vllm", "0.7.3")), node("b", Engine("vllm", "0.8.5"))]
    (start,) = starts(plan(Catalog([model(">=0.8,<0.9")]), nodes, [], NOW))
    assert start.node == "b"
    verdicts = dict(Fleet({n.id: n for n in nodes}, []).verdicts(model(">=0.8,<0.9").profiles[0]))
    assert verdicts["a"] == "no build of vllm matches: vllm 0.7.3 is outside <0.9,>=0.8"
    assert verdicts["b"] == "fits (GPUs 0)"


def test_no_matching_build_anywhere_says_why_per_node():
    nodes = [node("a", Engine("vllm", "0.7.3")), node("b", Engine("vllm", "b4567"))]
    actions = plan(Catalog([model("==0.9.*")]), nodes, [], NOW)
    assert not starts(actions)
    (cannot,) = [a for a in actions if isinstance(a, CannotPlace)]
    assert "a: no build of vllm matches: vllm 0.7.3 is outside ==0.9.*" in cannot.reasons
    assert "b: no build of vllm matches: vllm b4567 is not a PEP 440 version, so not in ==0.9.*" in (
        cannot.reasons
    )


def test_the_main_build_is_used_when_it_matches_else_the_newest_matching_one_is_named_in_the_start():
    n = node(
        "a",
        Engine("vllm", "0.8.1"),
        Engine("vllm", "0.9.1", build="v091"),
        Engine("vllm", "1.0.0", build="v1"),
    )
    (start,) = starts(plan(Catalog([model()]), [n], [], NOW))
    assert start.build == ""  # the kind's main build
    (start,) = starts(plan(Catalog([model(">=0.9")]), [n], [], NOW))
    assert start.build == "v1"
    (start,) = starts(plan(Catalog([model(">=0.9,<1")]), [n], [], NOW))
    assert start.build == "v091"
    rec = ReplicaRecord("m-1", "m", "a", (0,), "vllm", "m", NOW, build="v091")
    assert ReplicaRecord.from_json(rec.to_json()) == rec


def test_a_build_for_a_newer_cuda_than_the_driver_supports_is_not_used():
    n = node(
        "a",
        Engine("vllm", "0.9.1", cuda="12.8"),
        Engine("vllm", "0.9.0", build="cu124", cuda="12.4"),
        cuda="12.4",
    )
    (start,) = starts(plan(Catalog([model()]), [n], [], NOW))
    assert start.build == "cu124"
    old = dataclasses.replace(n, engines=(Engine("vllm", "0.9.1", cuda="12.8"),))
    verdicts = dict(Fleet({"a": old}, []).verdicts(model().profiles[0]))
    assert verdicts["a"] == (
        "no build of vllm matches: vllm 0.9.1 is built for CUDA 12.8, the driver supports CUDA 12.4"
    )
    # Unknown on either side: not a reason to refuse.
    unknown = dataclasses.replace(old, cuda_version="")
    assert starts(plan(Catalog([model()]), [unknown], [], NOW))


def test_an_invalid_version_range_is_refused_with_what_one_looks_like():
    with pytest.raises(ValidationError, match="is not a version range: write PEP 440 specifiers"):
        model("0.8")
    with pytest.raises(ValueError, match="longer than"):
        parse_range(">=" + "1" * 200)
    assert model(">=0.8").profiles[0].describe() == "vllm>=0.8, 1 GPU"
