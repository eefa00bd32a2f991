"""Write a tiny random-weight LoRA adapter for the tiny test model (scripts/make_tiny_model.py).

    <vllm venv>/bin/python scripts/make_tiny_lora.py MODEL_DIR OUT_DIR [--seed N]

The adapter is what peft's ``save_pretrained`` writes for a ``LoraConfig(r=8,
lora_alpha=16, target_modules=[q_proj, v_proj])`` on that model:
``adapter_config.json`` and ``adapter_model.safetensors`` with one
``lora_A`` (r x in) and ``lora_B`` (out x r) pair per targeted projection,
named ``base_model.model.model.layers.N.self_attn.X.lora_{A,B}.weight``.
It is written directly with torch and safetensors (both in the vLLM venv)
rather than through peft, which the venv does not have and which would
only add a download: the files are the same format. ``lora_B`` is random
too (peft starts it at zero, which would make the adapter a no-op), so an
answer through the adapter differs from the base model's. Deterministic
for a given seed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file

RANK = 8
TARGETS = ("q_proj", "v_proj")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    config = json.loads((args.model / "config.json").read_text())
    hidden = config["hidden_size"]
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads", heads)
    head_dim = config.get("head_dim") or hidden // heads
    out_dims = {"q_proj": heads * head_dim, "v_proj": kv_heads * head_dim}
    torch.manual_seed(args.seed)
    tensors = {}
    for layer in range(config["num_hidden_layers"]):
        for target in TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(RANK, hidden, dtype=torch.float32) * 0.1
            b = torch.randn(out_dims[target], RANK, dtype=torch.float32)
            tensors[f"{prefix}.lora_B.weight"] = b * 0.1
    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / "adapter_model.safetensors"))
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(args.model),
        "r": RANK,
        "lora_alpha": 2 * RANK,
        "lora_dropout": 0.0,
        "target_modules": list(TARGETS),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
    }
    (args.out / "adapter_config.json").write_text(json.dumps(adapter_config, indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
