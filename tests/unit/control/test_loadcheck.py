"""The load check: weights that cannot run, or adapters that do not exist, are refused before a write."""

from __future__ import annotations

import json
import struct

import pytest

from llmgw.common.errors import FailedPrecondition
from llmgw.common.etcd import MemoryStore
from llmgw.control.spec.loadcheck import LoadCheck, read_weights
from llmgw.control.spec.model import ModelSpec
from llmgw.control.store.models import RuntimeModels

# A 1B-parameter llama in bfloat16: 2 GiB of weights.
CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "torch_dtype": "bfloat16",
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "hidden_size": 2048,
    "max_position_embeddings": 8192,
}


def weights(tmp_path, name="w", parameters=1024**3, config=CONFIG):
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(config))
    # A safetensors header only: the check reads headers, never tensors.
    header = json.dumps({"w": {"dtype": "BF16", "shape": [parameters], "data_offsets": [0, 2 * parameters]}})
    (d / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header.encode())
    return d


def spec(source, engine="vllm", gpu_memory_gb=8.0, gpus=1, adapters=(), **args):
    return ModelSpec.model_validate(
        {
            "name": "m",
            "profile": {"engine": engine, "gpus": gpus, "gpu_memory_gb": gpu_memory_gb, "args": args},
            "weights": {"source": str(source)},
            "adapters": [{"name": n, "source": str(s)} for n, s in adapters],
        }
    )


def test_headers_give_parameters_and_bytes(tmp_path):
    w = read_weights(weights(tmp_path))
    assert w.parameters == 1024**3 and w.stored_bytes == 2 * 1024**3
    assert w.architectures == ("LlamaForCausalLM",)


def test_weights_that_fit_pass_and_too_large_ones_are_refused_with_the_numbers(tmp_path):
    check = LoadCheck()
    src = weights(tmp_path)
    assert check.check(spec(src, gpu_memory_gb=8)) == []
    with pytest.raises(FailedPrecondition) as err:
        check.check(spec(src, gpu_memory_gb=2))
    assert "needs about" in str(err.value) and "GiB" in str(err.value)
    # float32 doubles the weights: 4 GiB plus KV is more than 8 x 0.5.
    with pytest.raises(FailedPrecondition):
        check.check(spec(src, gpu_memory_gb=8, dtype="float32", **{"gpu-memory-utilization": "0.5"}))
    # A shorter context needs less KV cache: 2 GiB + 16 MiB fits in 2.5 x 0.9.
    assert check.check(spec(src, gpu_memory_gb=2.5, **{"max-model-len": "256"})) == []


def test_an_architecture_the_engine_does_not_run_is_refused(tmp_path):
    src = weights(tmp_path, config={**CONFIG, "architectures": ["NotARealModelForCausalLM"]})
    with pytest.raises(FailedPrecondition) as err:
        LoadCheck().check(spec(src))
    assert "NotARealModelForCausalLM" in str(err.value)
    assert LoadCheck().check(spec(src, engine="simulator")) == [], "the simulator runs anything"


def test_what_cannot_be_checked_is_a_note_not_a_refusal(tmp_path):
    check = LoadCheck(hub_cache=tmp_path / "empty-cache")
    notes = check.check(spec("hf://acme/never-fetched"))
    assert notes and "not in this host's hub cache" in notes[0]
    assert "not checked" in check.check(spec(weights(tmp_path), gpu_memory_gb=0))[0]
    assert LoadCheck().check(spec(weights(tmp_path, "x"), engine="sglang"))[0].endswith("not checked")


def test_a_hub_source_in_the_local_cache_is_checked(tmp_path):
    repo = tmp_path / "hub" / "models--acme--big"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    (repo / "snapshots").mkdir()
    weights(repo / "snapshots", "abc123")
    with pytest.raises(FailedPrecondition):
        LoadCheck(hub_cache=tmp_path / "hub").check(spec("hf://acme/big", gpu_memory_gb=1))


def test_missing_paths_and_non_adapters_are_refused_unless_paths_are_not_checked_here(tmp_path):
    src = weights(tmp_path)
    not_adapter = tmp_path / "plain"
    not_adapter.mkdir()
    with pytest.raises(FailedPrecondition) as err:
        LoadCheck().check(spec(src, adapters=[("gone", tmp_path / "nope"), ("plain", not_adapter)]))
    assert "gone" in str(err.value) and "adapter_config.json" in str(err.value), "every reason at once"
    with pytest.raises(FailedPrecondition):
        LoadCheck().check(spec(tmp_path / "no-weights"))
    notes = LoadCheck(paths=False).check(
        spec(tmp_path / "no-weights", adapters=[("gone", tmp_path / "nope")])
    )
    assert len(notes) == 2


def test_an_unchanged_model_is_not_checked_again(tmp_path):
    before = spec(tmp_path / "gone-now")
    after = ModelSpec.model_validate({**before.model_dump(), "scaling": {"min": 2}})
    assert LoadCheck().check(after, previous=before) == []


async def test_a_refused_model_leaves_etcd_unchanged(tmp_path):
    store = MemoryStore()
    models = RuntimeModels(store, [], check=LoadCheck().check)
    before = await store.range("")
    with pytest.raises(FailedPrecondition):
        await models.put(spec(weights(tmp_path), gpu_memory_gb=1), replace=False)
    after = await store.range("")
    assert after.entries == before.entries and after.revision == before.revision
