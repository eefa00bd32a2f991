"""Load checks: whether a model's weights can run on its profiles, asked before it is written.

A model whose weights cannot run would otherwise be placed, fail on every
node it is tried on, and back off for ever. So adding a model, or changing
its weights, profiles or adapters, first runs :meth:`LoadCheck.check`
(``RuntimeModels.put`` calls it before its transaction, as the Go seeds'
``SetCheck`` did), which refuses with FAILED_PRECONDITION and every reason
at once when:

- **Architecture**: the ``architectures`` in the weights' ``config.json``
  has none the profile's engine supports. vLLM's list is its own model
  registry's, kept in ``architectures/vllm.txt`` (``scripts/
  engine_architectures.py`` writes it from an installed vLLM); the
  simulator runs anything; for other engines the list is unknown and the
  check says it could not check.
- **Size**: parameters x dtype (counted from the safetensors headers, in
  the dtype the profile's ``dtype`` arg asks for, else ``config.json``'s
  ``torch_dtype``, else as stored) plus the KV cache of one sequence of
  ``max-model-len`` tokens (vLLM refuses to start without room for one)
  is more than the profile's memory: ``gpus x gpu_memory_gb x
  gpu-memory-utilization`` (the arg, default 0.9), or ``memory_gb`` for a
  ``cpu_only`` profile. A profile with no ``gpu_memory_gb`` has no size to
  check against, and the check says so.
- **Missing**: a weights or adapter path that does not exist on this
  control plane's host (when ``paths`` is true: set it false where the
  control plane does not see the nodes' model storage), or an adapter
  directory without ``adapter_config.json``.

A model with several profiles is refused only when *no* profile can run
it. Where a check cannot be made (an ``hf://`` source that is not in this
host's hub cache: the check never uses the network; an engine whose list
is unknown), it is not a refusal: the returned notes say what was not
checked, and the caller logs them. Models that use none of this (no
weights: the simulator's demo models) pass untouched.

This is the one module of :mod:`.spec` that reads files: the weights'
``config.json`` and safetensors headers (a few KiB each), never the
tensors. The caller runs it in a thread.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.common.errors import FailedPrecondition

from . import architectures
from .model import Adapter, ModelSpec, Profile

GB = 1024**3
# Engine kind -> architectures it runs; None: any.
_ANY: frozenset[str] | None = None
DTYPE_BYTES = {
    "float32": 4, "F32": 4, "float": 4,
    "float16": 2, "F16": 2, "half": 2,
    "bfloat16": 2, "BF16": 2,
    "float8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I8": 1, "U8": 1, "int8": 1,
    "F64": 8, "I64": 8, "I32": 4, "I16": 2, "BOOL": 1,
}  # fmt: skip
MAX_HEADER_BYTES = 100 * 1024 * 1024
_HUB = re.compile(r"^hf://([A-Za-z0-9][A-Za-z0-9_.-]*)/([A-Za-z0-9][A-Za-z0-9_.-]*)(?:@(.+))?$")


def default_architectures() -> dict[str, frozenset[str] | None]:
    return {"simulator": _ANY, "vllm": architectures.VLLM}


@dataclass(frozen=True)
class Weights:
    """What the check learned of one set of weights."""

    path: Path
    architectures: tuple[str, ...]
    config: Mapping[str, object]
    parameters: int
    stored_bytes: int


class LoadCheck:
    def __init__(
        self,
        architectures: Mapping[str, frozenset[str] | None] | None = None,
        hub_cache: Path | None = None,
        paths: bool = True,
    ):
        self._architectures = dict(architectures) if architectures is not None else default_architectures()
        self._hub_cache = hub_cache or _default_hub_cache()
        self._paths = paths

    def check(self, spec: ModelSpec, previous: ModelSpec | None = None) -> list[str]:
        """Notes on what could not be checked; raises FailedPrecondition when the model cannot run."""
        problems: list[str] = []
        notes: list[str] = []
        if previous is None or _runs_differently(spec, previous):
            self._check_profiles(spec, problems, notes)
        known = {a.name: a.source for a in previous.adapters} if previous is not None else {}
        for adapter in spec.adapters:
            if known.get(adapter.name) != adapter.source:
                self._check_adapter(adapter, problems, notes)
        if problems:
            raise FailedPrecondition(
                f"model {spec.name!r} cannot run as declared, so nothing was written:\n  "
                + "\n  ".join(problems)
            )
        return notes

    # -- base weights -----------------------------------------------------------

    def _check_profiles(self, spec: ModelSpec, problems: list[str], notes: list[str]) -> None:
        why: list[str] = []
        for i, profile in enumerate(spec.profiles):
            source = profile.args.get("weights") or profile.args.get("model") or spec.weights.source
            if not source:
                return  # no weights named: the engine's own (the simulator), nothing to check
            reason = self._profile(i, profile, source, notes)
            if reason is None:
                return  # one profile that can run it is enough
            why.append(reason)
        problems.extend(why)

    def _profile(self, index: int, profile: Profile, source: str, notes: list[str]) -> str | None:
        """Why profile ``index`` cannot run ``source``; None when it can (or cannot be checked)."""
        where = f"profile {index} ({profile.engine})"
        weights, missing = self._locate(source, notes)
        if missing:
            return f"{where}: {missing}"
        if weights is None:
            return None
        supported = self._architectures.get(profile.engine, frozenset())
        if supported is not _ANY:
            if not supported:
                notes.append(
                    f"{where}: the architectures engine {profile.engine!r} runs are not known here; "
                    "not checked"
                )
            elif weights.architectures and not supported.intersection(weights.architectures):
                return (
                    f"{where}: {source} is a {', '.join(weights.architectures)}, which {profile.engine} "
                    "does not support (config.json architectures); give another engine or other weights"
                )
        return self._fits(where, profile, source, weights, notes)

    def _fits(self, where: str, profile: Profile, source: str, w: Weights, notes: list[str]) -> str | None:
        need_weights = (
            w.parameters * _dtype_bytes(profile.args.get("dtype", "auto"), w) if w.parameters else 0
        )
        if not need_weights:
            need_weights = w.stored_bytes
        need = need_weights + _kv_bytes(w.config, profile.args)
        if profile.cpu_only:
            budget = profile.memory_gb * GB
            what = f"memory_gb {profile.memory_gb:g}"
        elif profile.gpu_memory_gb:
            share = float(profile.args.get("gpu-memory-utilization", "0.9") or 0.9)
            budget = profile.gpus * profile.gpu_memory_gb * GB * share
            what = (
                f"{profile.gpus} GPU(s) x {profile.gpu_memory_gb:g} GB x {share:g} (gpu-memory-utilization)"
            )
        else:
            notes.append(f"{where}: no gpu_memory_gb declared, so whether {source} fits was not checked")
            return None
        if need > budget:
            return (
                f"{where}: {source} needs about {need / GB:.1f} GiB ({w.parameters:,} parameters, "
                f"{need_weights / GB:.1f} GiB of weights plus the KV cache of one max-length sequence), "
                f"more than {what} = {budget / GB:.1f} GiB; give more GPUs or memory, a smaller dtype "
                "or max-model-len, or smaller weights"
            )
        return None

    def _locate(self, source: str, notes: list[str]) -> tuple[Weights | None, str]:
        """(the weights, '') when readable; (None, why) when refused; (None, '') when not checkable."""
        hub = _HUB.match(source)
        if hub is not None:
            path = self._hub_snapshot(hub.group(1), hub.group(2), hub.group(3) or "main")
            if path is None:
                notes.append(f"{source} is not in this host's hub cache ({self._hub_cache}); not checked")
                return None, ""
        elif os.path.isabs(source):
            path = Path(source)
            if not path.exists():
                if self._paths:
                    return None, f"weights path {source} does not exist (on the control plane's host)"
                notes.append(f"{source} is not on this host; not checked")
                return None, ""
        else:
            notes.append(f"{source} is neither a path nor hf://; the engine resolves it, not checked")
            return None, ""
        return read_weights(path), ""

    def _hub_snapshot(self, org: str, name: str, revision: str) -> Path | None:
        repo = self._hub_cache / f"models--{org}--{name}"
        ref = repo / "refs" / revision
        commit = ref.read_text().strip() if ref.is_file() else revision
        snapshot = repo / "snapshots" / commit
        return snapshot if snapshot.is_dir() else None

    # -- adapters ---------------------------------------------------------------

    def _check_adapter(self, adapter: Adapter, problems: list[str], notes: list[str]) -> None:
        hub = _HUB.match(adapter.source)
        if hub is not None:
            path = self._hub_snapshot(hub.group(1), hub.group(2), hub.group(3) or "main")
            if path is None:
                notes.append(
                    f"adapter {adapter.name}: {adapter.source} is not in this host's hub cache; not checked"
                )
                return
        else:
            path = Path(adapter.source)
            if not path.exists():
                if self._paths:
                    problems.append(
                        f"adapter {adapter.name}: {adapter.source} does not exist "
                        "(on the control plane's host)"
                    )
                else:
                    notes.append(f"adapter {adapter.name}: {adapter.source} is not on this host; not checked")
                return
        if not (path / "adapter_config.json").is_file():
            problems.append(
                f"adapter {adapter.name}: {adapter.source} has no adapter_config.json, "
                "so it is not a LoRA adapter"
            )


def _runs_differently(spec: ModelSpec, previous: ModelSpec) -> bool:
    return spec.weights != previous.weights or spec.profiles != previous.profiles


def _default_hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def read_weights(path: Path) -> Weights:
    """config.json and the safetensors headers under ``path`` (a directory)."""
    config: dict[str, object] = {}
    try:
        loaded = json.loads((path / "config.json").read_text())
        if isinstance(loaded, dict):
            config = loaded
    except (OSError, ValueError):
        pass
    archs = config.get("architectures")
    parameters, stored = 0, 0
    for f in sorted(path.glob("*.safetensors")) if path.is_dir() else []:
        p, s = _safetensors(f)
        parameters += p
        stored += s
    return Weights(
        path,
        tuple(a for a in archs if isinstance(a, str)) if isinstance(archs, list) else (),
        config,
        parameters,
        stored,
    )


def _safetensors(path: Path) -> tuple[int, int]:
    """(parameters, bytes) from one file's header; (0, file size) when it does not parse."""
    try:
        with open(path, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            if length > MAX_HEADER_BYTES:
                raise ValueError("header too large")
            header = json.loads(f.read(length))
        parameters = stored = 0
        for name, t in header.items():
            if name == "__metadata__":
                continue
            parameters += math.prod(t["shape"])
            stored += t["data_offsets"][1] - t["data_offsets"][0]
        return parameters, stored
    except (OSError, ValueError, KeyError, TypeError, struct.error):
        try:
            return 0, path.stat().st_size
        except OSError:
            return 0, 0


def _dtype_bytes(dtype: str, w: Weights) -> float:
    if dtype and dtype != "auto" and dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    torch_dtype = w.config.get("torch_dtype") or w.config.get("dtype")
    if isinstance(torch_dtype, str) and torch_dtype in DTYPE_BYTES:
        return DTYPE_BYTES[torch_dtype]
    return w.stored_bytes / w.parameters if w.parameters else 2


def _kv_bytes(config: Mapping[str, object], args: Mapping[str, str]) -> int:
    """The KV cache of one sequence of max-model-len tokens (0 when config.json does not say)."""

    def num(key: str, default: int = 0) -> int:
        v = config.get(key, default)
        return int(v) if isinstance(v, int | float) else default

    layers, heads = num("num_hidden_layers"), num("num_attention_heads")
    if not layers or not heads:
        return 0
    kv_heads = num("num_key_value_heads", heads)
    head_dim = num("head_dim") or num("hidden_size") // heads
    try:
        tokens = int(args.get("max-model-len", "") or num("max_position_embeddings", 2048))
    except ValueError:
        tokens = num("max_position_embeddings", 2048)
    dtype = config.get("torch_dtype")
    width = DTYPE_BYTES.get(dtype, 2) if isinstance(dtype, str) else 2
    return 2 * layers * kv_heads * head_dim * width * tokens
