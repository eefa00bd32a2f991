"""Process plumbing shared by the router benchmarks: ports, processes, /proc readings.

Every benchmark process runs in its own session (process group) so that
:func:`stop` can end it with everything it started (LiteLLM's workers, a
launcher's child) by its group id, never by name. CPU and memory are read
from ``/proc`` for a whole process tree, since a router may be a launcher
with a worker below it: ``utime + stime`` of each live process (threads
included), and the ``cutime + cstime`` its exited children left behind.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening on {port}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise TimeoutError(f"{proc.args[0]} is not listening on {port} after {timeout:.0f} s")


def spawn(argv: list[str], *, log: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``argv`` in a session of its own; its output goes to ``log`` (or nowhere)."""
    out = open(log, "wb") if log else subprocess.DEVNULL  # noqa: SIM115  (the child holds it)
    try:
        return subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env={**os.environ, **(env or {})},
        )
    finally:
        if log:
            out.close()


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group, then SIGKILL what is left after 10 s."""
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()


def simulator(port: int, *, itl_ms: float = 0, ttft_ms: float = 0, max_num_seqs: int = 4096) -> list[str]:
    """argv of an unkeyed simulator serving model ``bench`` as fast as the knobs allow.

    Its natural reply is long (``--output-tokens 100000``), so a request's
    ``max_tokens`` alone sets how many tokens it gets.
    """
    return [
        str(BIN / "llmgw-simulator"),
        "--port",
        str(port),
        "--served-model-name",
        "bench",
        "--ttft-ms",
        str(ttft_ms),
        "--itl-ms",
        str(itl_ms),
        "--max-num-seqs",
        str(max_num_seqs),
        "--output-tokens",
        "100000",
        "--max-model-len",
        "1000000",
    ]


def loadgen(
    urls: list[str],
    body: str,
    *,
    concurrency: int,
    seconds: float,
    warmup: float = 1.0,
    headers: list[str] | None = None,
    stream: bool = False,
    watch: int = 0,
) -> dict:
    """One closed-loop round of ``bench/loadgen.py``, in a process of its own; its JSON result.

    A streamed answer counts only if it ended with ``[DONE]``. With ``watch``, the
    result holds ``cpu_ms_per_request``: that PID's tree CPU over the round per request.
    """
    argv = [sys.executable, str(Path(__file__).with_name("loadgen.py")), "--body", body]
    argv += [a for u in urls for a in ("--url", u)]
    argv += [a for h in headers or () for a in ("--header", h)]
    argv += ["--concurrency", str(concurrency), "--warmup", str(warmup), "--seconds", str(seconds)]
    if stream:
        argv += ["--expect", "[DONE]"]
    if watch:
        argv += ["--watch", str(watch)]
    result = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    cpu = sum(result["cpu_seconds"].values()) if watch else float("nan")
    result["cpu_ms_per_request"] = cpu * 1000 / result["requests"] if result["requests"] else float("nan")
    return result


def _stat(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; fields after its ")" are plain.
    return raw[raw.rfind(b")") + 2 :].decode().split()


def tree(pid: int) -> list[int]:
    """``pid`` and every live descendant."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        todo.extend(children.get(p, ()))
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by ``pid``'s process tree (user + system, reaped children included)."""
    ticks = 0
    for p in tree(pid):
        fields = _stat(p)
        if fields is not None:
            # After the name: state=0 ppid=1 ... utime=11 stime=12 cutime=13 cstime=14.
            ticks += sum(int(fields[i]) for i in (11, 12, 13, 14))
    return ticks / CLOCK_TICKS


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid``'s process tree."""
    total = 0
    for p in tree(pid):
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE_BYTES
        except (OSError, IndexError, ValueError):
            pass
    return total
