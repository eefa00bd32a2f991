"""Shared ComfyUI environments in the catalog: the hidden entry, its members, and their demand."""

from __future__ import annotations

import pytest

from llmgw.common.errors import InvalidArgument
from llmgw.control.decide.autoscale import decide
from llmgw.control.leader.publisher import model_info
from llmgw.control.leader.scaler import _canonical
from llmgw.control.spec.catalog import GB, Catalog
from llmgw.control.spec.model import ModelSpec
from llmgw.control.state.usage import UsageBook
from llmgw.v1 import usage_pb2


def comfy(name: str, ckpt: str, env: str = "studio", **extra) -> ModelSpec:
    profile = {"engine": "comfyui", "gpus": 1, "gpu_memory_gb": extra.pop("gpu_gb", 10)}
    return ModelSpec.model_validate(
        {
            "name": name,
            "profile": profile,
            "weights": {"source": f"/w/{name}/{ckpt}"},
            "scaling": {"min": extra.pop("min", 0), "idle_timeout_seconds": extra.pop("idle", 60)},
            "comfyui": {"environment": env, **extra},
        }
    )


def test_two_models_of_one_environment_get_a_hidden_entry_carrying_everything_they_need():
    c = Catalog.from_specs(
        [
            comfy("flux", "flux.safetensors", gpu_gb=40, idle=600, custom_nodes=["/n/flux"]),
            comfy("sf3d", "sf3d.safetensors", gpu_gb=24, idle=60, custom_nodes=["/n/3d", "/n/flux"]),
        ]
    )
    entry = c.get("comfyui-env-studio")
    assert entry is not None and entry.hidden and entry.members == ("flux", "sf3d")
    [needs] = entry.profiles
    assert needs.gpu_memory_bytes == 40 * GB, "the most memory any member needs"
    assert dict(needs.args) == {"checkpoints": "/w/flux,/w/sf3d", "custom-nodes": "/n/flux,/n/3d"}
    assert entry.min_replicas == 0, "on demand"
    assert entry.spec is not None and entry.spec.scaling.idle_timeout_seconds == 600, (
        "the longest idle timeout"
    )
    for name in ("flux", "sf3d"):
        member = c.get(name)
        assert member is not None
        assert (member.min_replicas, member.max_replicas, member.served_by) == (0, 0, "comfyui-env-studio")
    assert c.resolve("comfyui-env-studio") is entry


def test_one_model_alone_in_its_environment_runs_its_own_replicas():
    c = Catalog.from_specs(
        [comfy("flux", "flux.safetensors", min=1), comfy("other", "o.safetensors", env="x")]
    )
    assert c.names == ["flux", "other"]
    flux = c.get("flux")
    assert flux is not None and flux.served_by == "" and flux.min_replicas == 1
    assert dict(flux.profiles[0].args) == {"checkpoints": "/w/flux"}


def test_members_loading_checkpoints_of_one_file_name_are_refused():
    with pytest.raises(InvalidArgument, match="both load a checkpoint named 'model.safetensors'"):
        Catalog.from_specs([comfy("a", "model.safetensors"), comfy("b", "model.safetensors")])


def test_a_model_named_like_an_environment_entry_clashes():
    taken = ModelSpec.model_validate({"name": "comfyui-env-studio", "profile": {"engine": "simulator"}})
    with pytest.raises(InvalidArgument, match="comfyui-env-studio"):
        Catalog.from_specs([comfy("a", "a.safetensors"), comfy("b", "b.safetensors"), taken])


def test_a_members_requests_are_demand_for_the_entry_and_wake_it():
    c = Catalog.from_specs([comfy("a", "a.safetensors"), comfy("b", "b.safetensors")])
    book = UsageBook()
    report = usage_pb2.UsageReport(router_id="r", interval_seconds=1.0)
    report.models.add(model="a", idle_seconds=0.0, pending=1)
    book.update(report, 100.0)
    demand = book.demand(_canonical(c), 100.0)
    assert demand is not None and demand["comfyui-env-studio"].pending == 1
    decision = decide(c, demand, {}, {}, 100.0)
    assert decision.desired["comfyui-env-studio"] == 1, "a member's held request wakes the shared replica"
    assert "a" not in decision.desired and "b" not in decision.desired, "members are never scaled"


def test_routers_are_told_each_members_checkpoint_and_the_entry_is_hidden():
    c = Catalog.from_specs([comfy("a", "a.safetensors"), comfy("b", "b.safetensors", checkpoint="bee.ckpt")])
    a, b, entry = (model_info(c.get(n), 0) for n in ("a", "b", "comfyui-env-studio"))  # type: ignore[arg-type]
    assert (a.comfyui.checkpoint, a.comfyui.served_by, a.comfyui.workflow) == (
        "a.safetensors",
        "comfyui-env-studio",
        "txt2img",
    )
    assert b.comfyui.checkpoint == "bee.ckpt"
    assert a.on_demand and list(a.apis) == ["images"]
    assert entry.hidden and not a.hidden


def test_a_workflow_file_is_read_on_the_control_plane_and_a_bad_one_published_empty(tmp_path):
    good = tmp_path / "wf.json"
    good.write_text('{"1": {"class_type": "SaveImage", "inputs": {}}}')
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    for path, expect in ((good, '{"1":{"class_type":"SaveImage","inputs":{}}}'), (bad, "")):
        spec = comfy("a", "a.safetensors", env="", workflow=str(path))
        info = model_info(Catalog.from_specs([spec]).get("a"), 0)  # type: ignore[arg-type]
        assert info.comfyui.workflow == expect


@pytest.mark.parametrize(
    ("doc", "problem"),
    [
        ({"profile": {"engine": "comfyui"}, "weights": {"source": "/w/a.safetensors"}}, "go together"),
        ({"profile": {"engine": "comfyui"}, "comfyui": {}, "weights": {"source": "hf://o/n"}}, "checkpoint"),
        ({"profile": {"engine": "comfyui"}, "comfyui": {"workflow": "mine"}}, "built-in"),
        ({"profile": {"engine": "vllm"}, "comfyui": {"checkpoint": "a.ckpt"}}, "go together"),
        ({"external": {"url": "http://x", "api": "comfyui"}, "comfyui": {}}, "checkpoint"),
    ],
)
def test_inconsistent_comfyui_documents_are_refused_with_what_to_fix(doc, problem):
    with pytest.raises(ValueError, match=problem):
        ModelSpec.model_validate({"name": "m", **doc})


def test_a_catalog_rebuilt_from_its_own_models_derives_its_environments_afresh():
    c = Catalog.from_specs([comfy("a", "a.safetensors"), comfy("b", "b.safetensors", min=1)])
    again = Catalog(list(c))
    assert again.names == c.names, "the entry is derived again, not duplicated"
    alone = Catalog([m for m in c if m.name != "a"])
    b = alone.get("b")
    assert alone.names == ["b"] and b is not None
    assert (b.served_by, b.min_replicas) == ("", 1), "left alone, b runs its own replicas again"
