#!/usr/bin/env python3
"""Instructions per request of the router's in-process hot path, counted by callgrind.

On a shared, noisy machine, CPU time moves by 10-20% between runs a minute
apart (docs/benchmarks.md), so a change of a few per cent to the request
path cannot be read off ``router_wrk.py`` or even ``router_hotpath.py``'s
minimum over rounds. ``valgrind --tool=callgrind`` counts the instructions
the process executes instead: the same count for the same code and inputs,
whatever else the machine is doing. This runs ``router_hotpath.py
--untraced`` (the real app behind the real front, both transports fake: see
there) under callgrind twice, with ``--small`` and ``--large`` requests,
and divides the difference by the extra requests: startup, imports and
warm-up cancel out, what remains is one request's instructions, user space
only (the kernel's part of a real socket is the same for every router:
docs/benchmarks.md).

``--baseline REV`` also counts another revision's router (its sources on
``PYTHONPATH``, its wire compiled as ``make setup`` does; this checkout's
bench script drives both). Instructions are not time: a cache miss costs
more than an add. Confirm a change under wrk (``router_wrk.py``) before
calling it faster; use this to tell whether it is.

Usage: python bench/router_instructions.py [--variants app,bare] [--workloads non-streamed]
       [--small 1000] [--large 3000] [--baseline REV]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from router_peers import drop_worktree, worktree  # noqa: E402

HOTPATH = Path(__file__).with_name("router_hotpath.py")
COLLECTED = re.compile(r"Collected : (\d+)")


def instructions(requests: int, variant: str, workload: str, tree: Path | None, out: Path) -> int:
    """Instructions callgrind counted over one run of the hot path bench with ``requests`` requests."""
    argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable, str(HOTPATH)]
    argv += ["--requests", str(requests), "--rounds", "1", "--variants", variant, "--workloads", workload]
    argv += ["--untraced"]
    # One hash seed for every run: with a random one, set and dict layouts differ from run to run
    # and so do the counts (by up to 5% over 1,000 requests, seen here).
    env = dict(os.environ, PYTHONHASHSEED="0")
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(sorted(str(src) for src in tree.glob("*/*/src")))
    run = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
    found = COLLECTED.search(run.stderr)
    if run.returncode or found is None:
        tail = run.stdout[-1500:] + run.stderr[-1500:]
        raise RuntimeError(f"callgrind run failed ({run.returncode}):\n{tail}")
    return int(found.group(1))


def per_request(variant: str, workload: str, tree: Path | None, args: argparse.Namespace, at: Path) -> float:
    small = instructions(args.small, variant, workload, tree, at / "small.out")
    large = instructions(args.large, variant, workload, tree, at / "large.out")
    # The bench runs a quarter as many streams as it is asked for requests.
    extra = (args.large - args.small) // (4 if workload == "stream" else 1)
    return (large - small) / extra


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", default="app,bare", help="router_hotpath.py variants, comma-separated")
    ap.add_argument("--workloads", default="non-streamed", help="router_hotpath.py workloads, comma-sep.")
    ap.add_argument("--small", type=int, default=1000, help="requests of the shorter run")
    ap.add_argument("--large", type=int, default=3000, help="requests of the longer run")
    ap.add_argument("--baseline", help="also count the router of this git revision, as llmgw@REV")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is missing: apt-get install valgrind")
    scratch = Path(tempfile.mkdtemp(prefix="router-instructions-"))
    trees: list[tuple[str, Path | None]] = [("llmgw", None)]
    base = scratch / "baseline"
    if args.baseline:
        trees.append((f"llmgw@{args.baseline}", worktree(args.baseline, base)))
    try:
        print(f"instructions per request (callgrind, {args.large} - {args.small} requests)")
        for workload in args.workloads.split(","):
            for variant in args.variants.split(","):
                counts = {name: per_request(variant, workload, tree, args, scratch) for name, tree in trees}
                line = "  ".join(f"{name} {n:>10,.0f}" for name, n in counts.items())
                ratio = ""
                if args.baseline:
                    ours, theirs = counts["llmgw"], counts[f"llmgw@{args.baseline}"]
                    ratio = f"  ({ours / theirs:.3f}x)"
                print(f"  {workload:13s} {variant:18s} {line}{ratio}")
    finally:
        if args.baseline:
            drop_worktree(base)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
