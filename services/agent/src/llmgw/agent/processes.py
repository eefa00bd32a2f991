"""The operating-system side of running engines: ports, process groups, logs.

Small functions with one job each, used by :mod:`.lifecycle` (one engine's
launch, watch and stop) and :mod:`.adoption` (engines left by a previous agent).

Ports: :func:`pick_port` binds port 0, reads the number and releases it, so
the engine can bind it. Another process can take the port in between (the
classic free-port race); :func:`port_held` lets the caller tell, after an
engine died at start, whether that is what happened.

Process groups: every engine leads its own group (``start_new_session``),
so its pid is its group id. A group counts as alive while any member
exists, zombies included: a member orphaned by its leader is reaped by
init, and stopping waits for that, so "gone" means the kernel has nobody
left under that id.

Processes are plain ``subprocess.Popen`` rather than asyncio subprocesses,
because asyncio's subprocess transport kills its child when it is closed,
and engines must be able to outlive the agent.

Adopted engines (left running by an agent that died) are not the new
agent's children, so it cannot ``waitpid`` them: :class:`AdoptedProcess`
answers ``poll()`` from ``/proc`` instead. A pid alone could have been
reused by an unrelated process since the state file was written, so a
process counts as the engine only while its start time (field 22 of
``/proc/<pid>/stat``, in clock ticks since boot) and the kernel's boot id
match what was recorded at spawn; a zombie counts as gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Protocol

log = logging.getLogger("llmgw.agent.processes")

LOG_TAIL_LINES = 20


def boot_id() -> str:
    """This boot's id (``/proc/sys/kernel/random/boot_id``), "" where there is none."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name, or None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold spaces or parentheses.
    return raw[raw.rindex(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None when no such process."""
    fields = _stat_fields(pid)
    # fields[0] is the state (field 3), so the start time (field 22) is fields[19].
    return int(fields[19]) if fields is not None else None


def same_process(pid: int, start_ticks: int) -> bool:
    """Whether ``pid`` is still the process that started at ``start_ticks`` and not a zombie."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X") and int(fields[19]) == start_ticks


def group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid``, zombies included, read from ``/proc``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        # fields[2] is the process group (field 5).
        if fields is not None and int(fields[2]) == pgid:
            members.append(int(entry.name))
    return members


class AdoptedProcess:
    """An engine this agent did not start: the subset of ``Popen`` the lifecycle uses.

    ``poll()`` is None while the engine runs and -1 once it is gone;
    ``returncode`` stays None, because only the engine's parent (the agent
    that died, then init) could learn the real exit status.
    """

    returncode: int | None = None

    def __init__(self, pid: int, start_ticks: int):
        self.pid = pid
        self.start_ticks = start_ticks

    def poll(self) -> int | None:
        # After an exec hand-over (upgrade.py) the engines are still this
        # process's children: reap one that exited, or its zombie would keep
        # its process group alive forever.
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, os.WNOHANG)
        return None if same_process(self.pid, self.start_ticks) else -1


def http_base(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def pick_port(host: str) -> int:
    """A port free on ``host`` right now (see the module docstring for the race)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_held(host: str, port: int) -> bool:
    """Whether someone listens on ``port`` (SO_REUSEADDR: TIME_WAIT does not count)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
        return False


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode(errors="replace")
    except OSError as err:
        return f"(engine log {path} unreadable: {err.strerror})"
    return "\n".join(text.splitlines()[-lines:])


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited with code {returncode}"


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        # The id now belongs to someone else's group: ours is gone.
        return False
    return True


def signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # nobody left to signal, which is what we wanted


KILL_WAIT_SECONDS = 5.0
GROUP_POLL_SECONDS = 0.05


class _Process(Protocol):
    pid: int

    def poll(self) -> int | None: ...


async def terminate_group(proc: _Process, grace: float, label: str) -> None:
    """SIGTERM the group ``proc`` leads, wait ``grace``, SIGKILL; return once nobody is left."""
    pgid = proc.pid
    signal_group(pgid, signal.SIGTERM)
    if await _group_gone(proc, grace):
        return
    log.warning("%s still running %.1fs after SIGTERM; sending SIGKILL", label, grace)
    signal_group(pgid, signal.SIGKILL)
    if not await _group_gone(proc, KILL_WAIT_SECONDS):
        log.error("%s: process group %d survived SIGKILL", label, pgid)


async def _group_gone(proc: _Process, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while True:
        # poll() reaps the leader; a zombie would keep the group alive.
        if proc.poll() is not None and not group_alive(proc.pid):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(GROUP_POLL_SECONDS)
