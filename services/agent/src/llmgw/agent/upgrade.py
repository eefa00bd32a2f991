"""Hand-over to another version of the agent (``llmgw nodes upgrade``).

How a new version is named and delivered (the decision, also in
docs/operations.md): the operator stages the new release on the node first
(a new virtualenv, a package, an image layer) and names it by its program,
an absolute path such as ``/opt/llmgw/0.9.0/bin/llmgw-agent``, and by the
version that program reports. The control plane only relays the request
(``UpgradeAgent`` on the agent's stream); nothing is downloaded through it.

Before anything changes, :meth:`Upgrader.check` refuses a request whose
program

- is not under one of the directories the node's own config allows
  (``upgrade.allowed_dirs``; none: the node takes no upgrade from the control
  plane at all), after symlinks are resolved, so a control plane, even a
  compromised admin, cannot make a node run a program its operator did not
  stage there;
- is not an executable file;
- does not print the requested version when run with ``--version`` within
  ``upgrade.check_timeout_seconds`` (a half-copied release, the wrong one).

Then the agent answers (OK), and :meth:`Upgrader.hand_over` ends the agent
the way a graceful stop does except that no engine is stopped whatever
``stop_engines_on_exit`` says: the stream is half-closed after what is
queued (the answer goes out first: it is queued in the same event-loop step
that asks for the hand-over, and the stream's end marker only after), the
supervision tasks end, and the engines keep serving in their own process
groups with their state files (:mod:`.statefile`). The entry point then
execs the new program with the agent's own arguments (``exec``: same pid,
so a service manager sees nothing) or exits with :data:`HANDOVER_EXIT_CODE`
for the service manager to start the release it points at (``exit``). The
new agent adopts every engine before its first Register (:mod:`.adoption`),
with the same node certificate and node id, so the control plane's identity
checks hold across the hand-over unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.common.errors import FailedPrecondition, InvalidArgument

from .config import UpgradeSettings

log = logging.getLogger("llmgw.agent.upgrade")

# Exit status of an agent that handed over by exiting (EX_TEMPFAIL): "start me again".
HANDOVER_EXIT_CODE = 75
MAX_ARGS = 32
MAX_ARG_CHARS = 4096
MAX_VERSION_CHARS = 64
# What `--version` may print before it is cut off.
MAX_VERSION_OUTPUT = 4096


@dataclass(frozen=True)
class Handover:
    """What the entry point does once the agent has stopped: exec ``command`` or exit."""

    version: str
    command: tuple[str, ...]
    mode: str  # "exec" or "exit"


class Upgrader:
    def __init__(self, settings: UpgradeSettings, on_handover: Callable[[], None]):
        self._settings = settings
        self._on_handover = on_handover
        self.handover: Handover | None = None

    async def check(self, version: str, command: Sequence[str]) -> Handover:
        """The hand-over to ``command`` at ``version``, or why not (InvalidArgument, FailedPrecondition)."""
        if self.handover is not None:
            raise FailedPrecondition(f"already handing over to version {self.handover.version}")
        if not version or len(version) > MAX_VERSION_CHARS or not version.isprintable():
            raise InvalidArgument(f"version must be 1-{MAX_VERSION_CHARS} printable characters")
        too_long = any(len(a) > MAX_ARG_CHARS or "\0" in a for a in command)
        if not command or len(command) > MAX_ARGS or too_long:
            raise InvalidArgument(
                f"command must be 1-{MAX_ARGS} arguments of at most {MAX_ARG_CHARS} characters, "
                "the new agent's program first"
            )
        staged(command[0], self._settings.allowed_dirs)
        said = await self._reported_version(command)
        if said != version:
            raise FailedPrecondition(
                f"{command[0]} --version reports {said or 'nothing'!r}, not {version!r}: "
                "is the right release staged there?"
            )
        return Handover(version, tuple(command), self._settings.handover)

    async def _reported_version(self, command: Sequence[str]) -> str:
        """The last word ``COMMAND --version`` prints (``llmgw-agent 0.9.0`` -> ``0.9.0``)."""
        timeout = self._settings.check_timeout_seconds
        proc = await asyncio.create_subprocess_exec(
            *command,
            "--version",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with asyncio.timeout(timeout):
                out, _ = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise FailedPrecondition(f"{command[0]} --version did not answer within {timeout:g}s") from None
        if proc.returncode != 0:
            raise FailedPrecondition(f"{command[0]} --version exited with code {proc.returncode}")
        words = out[:MAX_VERSION_OUTPUT].decode(errors="replace").split()
        return words[-1] if words else ""

    def hand_over(self, handover: Handover) -> None:
        """Stop the agent for ``handover`` (engines stay); the entry point runs it."""
        log.warning(
            "handing over to agent version %s: %s (%s)",
            handover.version,
            " ".join(handover.command),
            handover.mode,
        )
        self.handover = handover
        self._on_handover()


def staged(program: str, allowed: Sequence[str]) -> Path:
    """``program`` resolved, once it is an executable file under one of ``allowed``; else why not."""
    if not allowed:
        raise FailedPrecondition(
            "this node takes no upgrade from the control plane: its agent config has no "
            "upgrade.allowed_dirs (the directories new agent releases are staged in)"
        )
    path = Path(program)
    if not path.is_absolute():
        raise InvalidArgument(f"the new agent's program {program!r} is not an absolute path")
    real = path.resolve()
    if not any(real.is_relative_to(Path(d).resolve()) for d in allowed):
        raise FailedPrecondition(
            f"{program} ({real}) is outside upgrade.allowed_dirs ({', '.join(allowed)}); "
            "stage the release there or add its directory to the node's agent config"
        )
    if not real.is_file() or not os.access(real, os.X_OK):
        raise FailedPrecondition(f"{program} is not an executable file on this node")
    return real
