#!/usr/bin/env python3
"""llmgw's router against its peers, in front of the same two simulators, in one run.

Systems (``--systems``, default all):

- ``direct``: no router; the load generator spreads its connections over
  the two simulators itself (the ceiling).
- ``llmgw``: ``llmgw-router`` standalone with the two as static backends
  (``--backend bench=URL``), its default settings (affinity balancer,
  engine /metrics polling on).
- ``vllm-router``: vLLM's Rust router (pip ``vllm-router``) with
  ``--worker-urls`` and ``--policy round_robin``, its cheapest policy (its
  default, ``cache_aware``, keeps a prefix tree and costs several times more
  CPU per request here).
- ``litellm``: LiteLLM's proxy (``litellm[proxy]``) with the two as
  deployments of one model, a master key, and
  ``LITELLM_LOCAL_MODEL_COST_MAP=True`` (no network at start).
- ``llmgw@REV`` (with ``--baseline REV``): the router as it was at git
  revision ``REV``, checked out into a temporary worktree, its router's
  wire compiled there as ``make setup`` compiles it (where ``REV`` has
  ``services/router/setup.py``), and run with its sources first on
  ``PYTHONPATH``, the same way as ``llmgw``: a change measured against its
  base side by side, in the same run.

The peers are installed into their own venvs under ``.llmgw/peers`` by
``scripts/install_peers.sh`` (called here; it does nothing once they are
there), never into the project's ``.venv``.

Workloads: ``non-streamed`` chat completions of ``--tokens`` (16) tokens, and
``stream`` chat completions of ``--stream-tokens`` (64) tokens, one SSE
event per token. The simulators answer at once (no time to first token, no
inter-token latency), so the figures are the HTTP path's own cost.

Each round runs every workload against every system, the systems in an
order rotated each round, ``--seconds`` measured after ``--warmup``, so
the shared machine's noise lands on all of them alike. The load generator
(``bench/loadgen.py``, a process of its own) keeps ``--concurrency``
keep-alive connections busy and reads the router's CPU time (user +
system of its whole process tree, from /proc) over the measured window.

Printed per workload and system: the median over rounds of requests/s,
p50/p99 latency, p50 time to first byte, router CPU per request, with the
min-max of req/s and CPU over rounds, and req/s against direct. A JSON copy
goes to ``--json``. Exit status 1 when any system answered an error.

Usage: python bench/router_peers.py [--rounds 3] [--seconds 5] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import BIN, ROOT, free_port, loadgen, simulator, spawn, stop, wait_port  # noqa: E402

SYSTEMS = ("direct", "llmgw", "vllm-router", "litellm")
PEERS = ROOT / ".llmgw" / "peers"
MASTER_KEY = "sk-llmgw-bench"


@dataclass
class System:
    name: str
    urls: list[str]
    pid: int = 0  # the router process whose tree's CPU is measured; 0 for direct
    headers: list[str] = field(default_factory=list)


def start_llmgw(
    sims: list[str],
    logs: Path,
    procs: list[subprocess.Popen],
    *,
    name: str = "llmgw",
    tree: Path | None = None,
    extra: tuple[str, ...] = (),
    python: str | None = None,
) -> System:
    """The router from this checkout, or from ``tree`` (a worktree of another revision), with ``extra``
    arguments (``--workers 2``); run by ``python`` (an interpreter with the router's dependencies
    installed, e.g. another venv's) rather than this venv's when given."""
    port = free_port()
    command = [python, "-m", "llmgw.router.main"] if python else [str(BIN / "llmgw-router")]
    argv = [*command, "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *extra]
    argv += [a for s in sims for a in ("--backend", f"bench={s}")]
    env = None
    if tree is not None or python:
        # services/*/src and libs/*/src: the namespace package llmgw is found there first (another
        # interpreter's venv may have no llmgw, or another checkout's).
        sources = (tree or ROOT).glob("*/*/src")
        env = {"PYTHONPATH": os.pathsep.join(sorted(str(src) for src in sources))}
    p = spawn(argv, log=logs / f"{name}.log", env=env)
    procs.append(p)
    wait_port(port, p)
    return System(name, [f"http://127.0.0.1:{port}"], p.pid)


def interpreter(python: str) -> str:
    """``python``'s version and how its CPython was built: ``3.11.2 static`` (libpython linked into
    the executable) or ``3.11.7 shared`` (calls through libpython's shared library)."""
    # Debian's python3.11 is linked statically though its sysconfig says shared: the maps tell.
    probe = (
        "import platform; "
        "shared = any('libpython' in line for line in open('/proc/self/maps')); "
        "print(platform.python_version(), 'shared' if shared else 'static')"
    )
    return subprocess.run([python, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()


def worktree(rev: str, at: Path) -> Path:
    """A checkout of ``rev`` at ``at`` (removed by :func:`drop_worktree`), its router's wire compiled
    as ``make setup`` compiles this checkout's (where ``rev`` has services/router/setup.py), so that a
    baseline is measured as it is deployed."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(at), rev], check=True)
    if (at / "services/router/setup.py").exists():
        subprocess.run(
            [sys.executable, "setup.py", "-q", "build_ext", "--inplace"],
            cwd=at / "services/router",
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return at


def drop_worktree(at: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(at)], check=False)


def start_vllm_router(sims: list[str], logs: Path, procs: list[subprocess.Popen]) -> System:
    port = free_port()
    argv = [str(PEERS / "vllm-router" / "bin" / "vllm-router"), "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--worker-urls", *sims, "--policy", "round_robin", "--log-level", "warning"]
    # Its metrics listener has a fixed default port; a free one lets two runs coexist.
    argv += ["--prometheus-port", str(free_port())]
    p = spawn(argv, log=logs / "vllm-router.log")
    procs.append(p)
    wait_port(port, p)
    return System("vllm-router", [f"http://127.0.0.1:{port}"], p.pid)


def start_litellm(sims: list[str], logs: Path, procs: list[subprocess.Popen]) -> System:
    port = free_port()
    config = logs / "litellm.yaml"
    deployments = "".join(
        f"  - model_name: bench\n    litellm_params:\n      model: openai/bench\n"
        f"      api_base: {s}/v1\n      api_key: unused\n"
        for s in sims
    )
    config.write_text(
        f"model_list:\n{deployments}"
        f"general_settings:\n  master_key: {MASTER_KEY}\n"
        "litellm_settings:\n  telemetry: false\n  set_verbose: false\n"
    )
    argv = [str(PEERS / "litellm" / "bin" / "litellm"), "--config", str(config)]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"]
    env = {"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR", "NO_DOCS": "True"}
    p = spawn(argv, log=logs / "litellm.log", env=env)
    procs.append(p)
    wait_port(port, p, timeout=180)
    return System("litellm", [f"http://127.0.0.1:{port}"], p.pid, [f"Authorization: Bearer {MASTER_KEY}"])


def body(tokens: int, stream: bool) -> str:
    return json.dumps(
        {
            "model": "bench",
            "messages": [{"role": "user", "content": "measure the router"}],
            "max_tokens": tokens,
            "stream": stream,
        }
    )


def load(system: System, payload: str, stream: bool, args: argparse.Namespace, seconds: float) -> dict:
    return loadgen(
        system.urls,
        payload,
        concurrency=args.concurrency,
        seconds=seconds,
        warmup=args.warmup,
        headers=system.headers,
        stream=stream,
        watch=system.pid,
    )


def summarize(results: list[dict]) -> dict:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in results)

    return {
        "rps": med("rps"),
        "rps_min": min(r["rps"] for r in results),
        "rps_max": max(r["rps"] for r in results),
        "p50_ms": med("p50_ms"),
        "p99_ms": med("p99_ms"),
        "ttfb_p50_ms": med("ttfb_p50_ms"),
        "cpu_ms": med("cpu_ms_per_request"),
        "cpu_ms_min": min(r["cpu_ms_per_request"] for r in results),
        "cpu_ms_max": max(r["cpu_ms_per_request"] for r in results),
        "errors": sum(r["errors"] for r in results),
        "error_samples": sorted({e for r in results for e in r["error_samples"]})[:5],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=5.0, help="measured seconds per system and round")
    ap.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=16, help="output tokens of a non-streamed request")
    ap.add_argument("--stream-tokens", type=int, default=64, help="output tokens (events) of a stream")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    ap.add_argument(
        "--litellm-seconds",
        type=float,
        default=15,
        help="measured seconds for litellm (a few requests a second, each taking seconds under this load)",
    )
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--baseline", help="also run the router of this git revision, as llmgw@REV")
    args = ap.parse_args()
    names = [s for s in args.systems.split(",") if s]
    unknown = set(names) - set(SYSTEMS)
    if unknown:
        ap.error(f"unknown systems {sorted(unknown)}; choose from {SYSTEMS}")

    if {"vllm-router", "litellm"} & set(names):
        subprocess.run([str(ROOT / "scripts" / "install_peers.sh"), str(PEERS)], check=True)

    workloads = [("non-streamed", False, args.tokens), ("stream", True, args.stream_tokens)]
    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-peers-") as tmp:
        logs = Path(tmp)
        try:
            sims = []
            for i in range(2):
                port = free_port()
                p = spawn(simulator(port), log=logs / f"sim{i}.log")
                procs.append(p)
                wait_port(port, p)
                sims.append(f"http://127.0.0.1:{port}")
            starters = {"llmgw": start_llmgw, "vllm-router": start_vllm_router, "litellm": start_litellm}
            systems = [
                System("direct", sims) if n == "direct" else starters[n](sims, logs, procs) for n in names
            ]
            if args.baseline:
                tree = worktree(args.baseline, logs / "baseline")
                name = f"llmgw@{args.baseline}"
                systems.insert(1, start_llmgw(sims, logs, procs, name=name, tree=tree))
            print(
                f"router peers: 2 simulators, {args.concurrency} connections, {args.seconds:g} s x "
                f"{args.rounds} rounds per system and workload, cpus={os.cpu_count()}",
                flush=True,
            )
            per: dict[tuple[str, str], list[dict]] = {}
            for round_no in range(args.rounds):
                turn = round_no % len(systems)
                order = systems[turn:] + systems[:turn]
                for label, stream, tokens in workloads:
                    payload = body(tokens, stream)
                    for system in order:
                        seconds = args.litellm_seconds if system.name == "litellm" else 0
                        result = load(system, payload, stream, args, seconds or args.seconds)
                        per.setdefault((label, system.name), []).append(result)
                        print(
                            f"  round {round_no + 1} {label:12} {system.name:16} {result['rps']:8.0f} req/s "
                            f"cpu {result['cpu_ms_per_request']:.3f} ms/req errors {result['errors']}",
                            flush=True,
                        )
            summary = report(per, workloads, [s.name for s in systems])
            if args.json:
                Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary}, indent=1))
            return 1 if any(row["errors"] for row in summary.values()) else 0
        finally:
            stop(procs)
            time.sleep(0.1)
            if args.baseline:
                drop_worktree(logs / "baseline")


def report(per: dict[tuple[str, str], list[dict]], workloads: list, names: list[str]) -> dict[str, dict]:
    summary: dict[str, dict] = {}
    for label, _, tokens in workloads:
        print(f"\n{label} ({tokens} tokens)")
        print(
            f"  {'system':16} {'req/s':>7} {'(min-max)':>13} {'x direct':>8} {'p50 ms':>7} {'p99 ms':>7} "
            f"{'ttfb50':>7} {'cpu ms/req':>10} {'(min-max)':>13} {'errors':>6}"
        )
        direct = summarize(per[(label, "direct")])["rps"] if (label, "direct") in per else float("nan")
        for name in names:
            row = summarize(per[(label, name)])
            summary[f"{label}/{name}"] = row
            spread = f"{row['rps_min']:.0f}-{row['rps_max']:.0f}"
            cpu_spread = f"{row['cpu_ms_min']:.3f}-{row['cpu_ms_max']:.3f}" if name != "direct" else ""
            cpu = f"{row['cpu_ms']:10.3f}" if name != "direct" else f"{'':10}"
            print(
                f"  {name:16} {row['rps']:7.0f} {spread:>13} {row['rps'] / direct:8.3f} {row['p50_ms']:7.2f} "
                f"{row['p99_ms']:7.2f} {row['ttfb_p50_ms']:7.2f} {cpu} {cpu_spread:>13} {row['errors']:6d}"
            )
            for sample in row["error_samples"]:
                print(f"    error: {sample}")
        for other in [n for n in names if n not in ("direct", "llmgw")]:
            if "llmgw" in names:
                ratios(per[(label, "llmgw")], per[(label, other)], other)
    return summary


def ratios(ours: list[dict], theirs: list[dict], name: str) -> None:
    """llmgw's req/s and CPU per request over ``name``'s, round by round (each pair ran minutes apart
    at most, so the machine's drift over a run cancels) and their median."""
    rps = [a["rps"] / b["rps"] for a, b in zip(ours, theirs, strict=True)]
    cpu = [a["cpu_ms_per_request"] / b["cpu_ms_per_request"] for a, b in zip(ours, theirs, strict=True)]
    each = " ".join(f"{r:.2f}" for r in rps), " ".join(f"{c:.2f}" for c in cpu)
    print(
        f"  llmgw / {name}: req/s {statistics.median(rps):.2f}x (rounds {each[0]}), "
        f"CPU/req {statistics.median(cpu):.2f}x (rounds {each[1]})"
    )


if __name__ == "__main__":
    sys.exit(main())
