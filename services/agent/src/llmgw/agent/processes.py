"""The operating-system side of running engines: ports, process groups, logs.

Small functions with one job each, used by the supervisor.

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
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path

LOG_TAIL_LINES = 20


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
