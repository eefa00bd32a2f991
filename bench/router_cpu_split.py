#!/usr/bin/env python3
"""Where a router's CPU per whole answer goes: user time against system time, under wrk.

``bench/router_wrk.py`` gives each router's CPU per request; this splits it
into user space (the router's own code: for llmgw, its Python) and the
kernel (the socket calls and loopback TCP an answer costs any proxy), from
``/proc/PID/task/*/stat`` summed over the process's threads, so that an
optimisation can be aimed at the half where the difference is. Beside
llmgw's router and vllm-router it runs ``floor`` (``bench/floor_proxy.py``:
the same relay as callbacks with nothing else to do), the floor a Python
router on uvloop and llhttp stands on.

Same parts as ``router_wrk.py``: two ``cheap_engine.py`` engines, wrk with
its Lua script, the non-streamed chat completion, one connection count;
the systems interleaved, the order rotated per round. ``llmgw-rr`` is
llmgw's router with ``balancer: round-robin``, vllm-router's policy here,
in place of its default (affinity, two choices by load). ``--baseline REV``
adds the router of another revision (``llmgw@REV``); ``--python PATH`` this
checkout's router run by another interpreter (``llmgw[3.11.2 static]``: how
much of the router's cost is the CPython build's, see docs/benchmarks.md).

Usage: python bench/router_cpu_split.py [--rounds 2] [--seconds 5] [--concurrency 32]
       [--systems vllm-router,llmgw,floor] [--baseline REV] [--python PATH]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import free_port, spawn, stop, wait_port  # noqa: E402
from router_peers import drop_worktree, interpreter, start_llmgw, start_vllm_router, worktree  # noqa: E402
from router_wrk import WRK_MISSING, lua_script, run_wrk, start_engines  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def ticks(pid: int) -> tuple[int, int]:
    """User and system clock ticks of every thread of ``pid``."""
    user = system = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        user += int(fields[11])
        system += int(fields[12])
    return user, system


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--systems", default="vllm-router,llmgw,floor")
    ap.add_argument("--baseline", help="also run the router of this git revision, as llmgw@REV")
    ap.add_argument(
        "--python",
        help="also run this checkout's router on this interpreter (one with the router's dependencies "
        "installed, e.g. another venv's bin/python), as llmgw[NAME], NAME its version and build",
    )
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit(WRK_MISSING)
    names = [n for n in args.systems.split(",") if n]
    logs = Path(tempfile.mkdtemp(prefix="cpu-split-"))
    procs: list = []
    tree = None
    try:
        engines = start_engines(logs, procs)
        targets: dict[str, tuple[str, int]] = {}
        for name in names:
            if name == "vllm-router":
                s = start_vllm_router(engines, logs, procs)
            elif name == "llmgw":
                s = start_llmgw(engines, logs, procs)
            elif name == "llmgw-rr":
                # The balancing vllm-router runs here (round_robin), in place of llmgw's default.
                config = logs / "round-robin.yaml"
                config.write_text("balancer: round-robin\n")
                s = start_llmgw(engines, logs, procs, name=name, extra=("--config", str(config)))
            elif name == "floor":
                port = free_port()
                argv = [sys.executable, str(Path(__file__).with_name("floor_proxy.py")), str(port), *engines]
                p = spawn(argv, log=logs / "floor.log")
                procs.append(p)
                wait_port(port, p)
                targets[name] = (f"http://127.0.0.1:{port}", p.pid)
                continue
            else:
                raise SystemExit(f"unknown system {name!r}: vllm-router, llmgw, llmgw-rr, floor")
            targets[name] = (s.urls[0], s.pid)
        if args.baseline:
            name = f"llmgw@{args.baseline}"
            tree = worktree(args.baseline, logs / "baseline")
            s = start_llmgw(engines, logs, procs, name=name, tree=tree)
            targets[name] = (s.urls[0], s.pid)
            names.append(name)
        if args.python:
            name = f"llmgw[{interpreter(args.python)}]"
            s = start_llmgw(engines, logs, procs, name=name, python=args.python)
            targets[name] = (s.urls[0], s.pid)
            names.append(name)
        script = lua_script(False, 16, logs / "whole.lua")
        print(f"{'system':22} {'req/s':>8} {'user us/req':>12} {'system us/req':>14}  errors")
        for r in range(args.rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                url, pid = targets[name]
                run_wrk(url, script, args.concurrency, 1, 1)  # warm-up
                user0, sys0 = ticks(pid)
                started = time.monotonic()
                result, _ = run_wrk(url, script, args.concurrency, args.seconds, 1)
                user1, sys1 = ticks(pid)
                wall = time.monotonic() - started
                n = result["ok"] or 1
                errors = (
                    result["bad"] + result["connect"] + result["read"] + result["write"] + result["timeout"]
                )
                print(
                    f"{name:22} {result['ok'] / wall:8.0f} {(user1 - user0) / TICK / n * 1e6:12.1f} "
                    f"{(sys1 - sys0) / TICK / n * 1e6:14.1f}  {errors}",
                    flush=True,
                )
    finally:
        stop(procs)
        if tree is not None:
            drop_worktree(tree)
    return 0


if __name__ == "__main__":
    sys.exit(main())
