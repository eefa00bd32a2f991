"""Engine launchers: how a StartReplica becomes a command line.

One seam, :class:`EngineLauncher`, per engine kind the catalog names
("simulator", "vllm", ...). A launcher only plans: it returns the argv and
the environment additions for one replica on one port, and the supervisor
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
  every CUDA engine honours and the simulator may ignore.
- The engine key travels on the command line because that is how the
  simulator and vLLM take it; it is visible to local users through ``ps``.
  Keys are per replica (see ``llmgw.common.keys``), which bounds the harm.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from llmgw.common.errors import InvalidArgument

from .config import EngineSettings
from .replicas import ReplicaSpec

RESERVED_FLAGS = frozenset({"host", "port", "served-model-name", "api-key"})
_FLAG_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass(frozen=True)
class LaunchPlan:
    argv: tuple[str, ...]
    # Added to the agent's environment for this process only.
    env: Mapping[str, str] = field(default_factory=dict)


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


def engine_flags(defaults: Mapping[str, str], overrides: Mapping[str, str]) -> list[str]:
    """``--NAME VALUE`` for each arg, the profile's overriding the node's."""
    argv: list[str] = []
    for name, value in {**defaults, **overrides}.items():
        if not _FLAG_NAME.match(name):
            raise InvalidArgument(
                f"engine arg {name!r} is not a flag name; write it without leading dashes, "
                "e.g. 'max-model-len'"
            )
        if name in RESERVED_FLAGS:
            raise InvalidArgument(
                f"engine arg {name!r} is set by the agent for every replica; remove it from the profile"
            )
        argv.append(f"--{name}")
        if value != "":
            argv.append(value)
    return argv


def cuda_env(gpu_indices: Sequence[int]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indices)}


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
        argv = [
            *self._program,
            "--host", host,
            "--port", str(port),
            "--served-model-name", spec.served_name,
            "--api-key", spec.engine_key,
            *engine_flags(self._settings.args, spec.engine_args),
        ]  # fmt: skip
        return LaunchPlan(tuple(argv), cuda_env(spec.gpu_indices))


def launchers_from_config(
    engines: Mapping[str, EngineSettings], agent_version: str
) -> dict[str, EngineLauncher]:
    """One launcher per configured engine kind; an unknown kind is a config error."""
    known = {"simulator": SimulatorLauncher}
    launchers: dict[str, EngineLauncher] = {}
    for kind, settings in engines.items():
        factory = known.get(kind)
        if factory is None:
            raise InvalidArgument(
                f"engines.{kind}: this agent has no launcher for engine kind {kind!r}; "
                f"known kinds: {', '.join(sorted(known))}"
            )
        launchers[kind] = factory(settings, agent_version)
    return launchers
