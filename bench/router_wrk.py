#!/usr/bin/env python3
"""llmgw's router against vllm-router under wrk, in front of engines cheaper than either.

``bench/router_peers.py`` drives the routers with a Python load generator
in front of two ``llmgw-simulator`` processes; on the 2-core development
machine those take most of the CPU, so a router's own cost is hidden (its
direct runs reach 2,700-5,000 requests/s). Here every part but the router
is as cheap as it gets, so the router is the bottleneck:

- **load**: ``wrk`` (C, one thread by default: ``--wrk-threads``) with a
  Lua script that POSTs the chat completion body. For streams the script's
  ``response`` hook counts a stream as done only if it answered 200 and
  its body ends with ``data: [DONE]``; wrk gathers the chunked body itself.
  Install it with ``apt-get install wrk`` (Debian/Ubuntu); it is a
  benchmark tool, not a test dependency.
- **engines**: two ``bench/cheap_engine.py`` processes (a raw uvloop
  protocol with prebuilt answers: the simulator's 16-token completion and
  its 64-token stream in 16 writes).
- **systems** (``--systems``): ``llmgw`` (``llmgw-router`` standalone with
  the two as static backends, default settings, one process), ``llmgw-w2``
  (the same with ``--workers 2``), ``vllm-router`` 0.1.17 (``--policy
  round_robin``, in its venv under ``.llmgw/peers`` where router_peers.py's
  ``scripts/install_peers.sh`` puts it; installed there alone if missing), and with ``--baseline REV``
  ``llmgw@REV``: the router of a past revision, one process, its wire
  compiled as this checkout's is (:func:`router_peers.worktree`), for a
  change measured against its base in the same run.

Each round runs every workload (``non-streamed``, ``stream``) at every
``--concurrency`` (32 and 128) against every system, the systems' order
rotated per round so that the shared machine's drift lands on all alike;
each run is ``--warmup`` seconds unmeasured, then ``--seconds`` measured.
CPU is user + system time of a process tree from ``/proc`` over the
measured run: the router's (all its workers) per request, and the share of
a core the engines and wrk used, which shows whether anything but the
router was near its limit.

Printed: each run; then per workload and concurrency the median over
rounds of requests/s and router CPU per request (min-max), p50/p99 latency
from wrk; and for each llmgw system its ratios over vllm-router round by
round and their median. ``--json`` writes it all. Exit status 1 when any
answer was an error (a non-200, a socket error, a stream without
``[DONE]``).

Usage: python bench/router_wrk.py [--rounds 3] [--seconds 10] [--concurrency 32,128]
       [--systems llmgw,llmgw-w2,vllm-router] [--workloads non-streamed,stream] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import cpu_seconds, free_port, spawn, stop, wait_port  # noqa: E402
from router_peers import PEERS, body, drop_worktree, start_llmgw, start_vllm_router, worktree  # noqa: E402

SYSTEMS = ("llmgw", "llmgw-w2", "vllm-router")
WORKLOADS = {"non-streamed": (False, 16), "stream": (True, 64)}
WRK_MISSING = "wrk is not installed: apt-get install wrk (Debian/Ubuntu), or build it from github.com/wg/wrk"

# What scripts/install_peers.sh does for vllm-router alone (same venv, same version).
INSTALL_VLLM_ROUTER = 'python3 -m venv "$1" && "$1/bin/python" -m pip install -q "vllm-router==0.1.17"'
# The Lua script wrk runs; BODY and CHECK are filled in. The done hook prints one line of JSON.
LUA = """
wrk.method = "POST"
wrk.body = [==[BODY]==]
wrk.headers["Content-Type"] = "application/json"
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) ok = 0; bad = 0 end
CHECK
function done(summary, latency, requests)
  local good, wrong = 0, 0
  for _, t in ipairs(threads) do good = good + (t:get("ok") or 0); wrong = wrong + (t:get("bad") or 0) end
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,'
    .. '"timeout":%d,"p50_us":%d,"p99_us":%d,"ok":%d,"bad":%d}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(99), good, wrong))
end
"""
# Streams: a stream counts only if it answered 200 and ended with [DONE] (wrk hands over the whole body).
STREAM_CHECK = """
function response(status, headers, body)
  if status == 200 and string.find(body, "data: [DONE]", math.max(1, #body - 64), true) then
    ok = ok + 1
  else
    bad = bad + 1
  end
end
"""


@dataclass
class Target:
    name: str
    url: str
    pid: int


def lua_script(stream: bool, tokens: int, at: Path) -> Path:
    payload = body(tokens, stream)
    at.write_text(LUA.replace("BODY", payload).replace("CHECK", STREAM_CHECK if stream else ""))
    return at


def run_wrk(url: str, script: Path, concurrency: int, seconds: float, threads: int) -> tuple[dict, float]:
    """One wrk run: its JSON line (``ok`` filled in for whole answers too) and wrk's own CPU seconds."""
    argv = ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{seconds:g}s", "--timeout", "10s"]
    argv += ["-s", str(script), f"{url}/v1/chat/completions"]
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    line = next((ln for ln in out.splitlines() if ln.startswith("WRKJSON ")), None)
    if p.returncode or line is None:
        raise RuntimeError(f"wrk failed ({p.returncode}):\n{out[-2000:]}")
    r = json.loads(line.removeprefix("WRKJSON "))
    if "response(" not in script.read_text():
        r["ok"] = r["requests"] - r["status"]
        r["bad"] = r["status"]
    return r, usage.ru_utime + usage.ru_stime


def measure(target: Target, engines: list[int], script: Path, conc: int, args: argparse.Namespace) -> dict:
    run_wrk(target.url, script, conc, args.warmup, args.wrk_threads)
    router0, engines0 = cpu_seconds(target.pid), sum(cpu_seconds(p) for p in engines)
    started = time.monotonic()
    r, wrk_cpu = run_wrk(target.url, script, conc, args.seconds, args.wrk_threads)
    wall = time.monotonic() - started
    router = cpu_seconds(target.pid) - router0
    engine = sum(cpu_seconds(p) for p in engines) - engines0
    errors = r["bad"] + r["connect"] + r["read"] + r["write"] + r["timeout"]
    return {
        "rps": r["ok"] / wall,
        "cpu_ms": router * 1000 / r["ok"] if r["ok"] else float("nan"),
        "p50_ms": r["p50_us"] / 1000,
        "p99_ms": r["p99_us"] / 1000,
        "errors": errors,
        "router_cores": router / wall,
        "engine_cores": engine / wall,
        "wrk_cores": wrk_cpu / wall,
        "load1": os.getloadavg()[0],
    }


def start_engines(logs: Path, procs: list[subprocess.Popen]) -> list[str]:
    urls = []
    for i in range(2):
        port = free_port()
        argv = [sys.executable, str(Path(__file__).with_name("cheap_engine.py")), "--port", str(port)]
        p = spawn(argv, log=logs / f"engine{i}.log")
        procs.append(p)
        wait_port(port, p)
        urls.append(f"http://127.0.0.1:{port}")
    return urls


def start(name: str, engines: list[str], logs: Path, procs: list[subprocess.Popen]) -> Target:
    if name == "vllm-router":
        s = start_vllm_router(engines, logs, procs)
    else:
        extra = ("--workers", "2") if name == "llmgw-w2" else ()
        s = start_llmgw(engines, logs, procs, name=name, extra=extra)
    if name == "llmgw-w2":
        wait_workers(s.pid, 2)
    return Target(s.name, s.urls[0], s.pid)


def wait_workers(pid: int, n: int, timeout: float = 60) -> None:
    """Until the supervisor ``pid`` has ``n`` children (its workers)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if len(children) >= n:
            return
        time.sleep(0.1)
    raise TimeoutError(f"router {pid} did not start {n} workers in {timeout:.0f} s")


def loadavg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def line(r: dict) -> str:
    return (
        f"{r['rps']:7.0f} req/s cpu {r['cpu_ms']:.3f} ms/req, cores router {r['router_cores']:.2f} "
        f"engines {r['engine_cores']:.2f} wrk {r['wrk_cores']:.2f}, load {r['load1']:.1f}, "
        f"errors {r['errors']}"
    )


def summarize(runs: list[dict]) -> dict:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    keys = ("rps", "cpu_ms", "p50_ms", "p99_ms", "router_cores", "engine_cores", "wrk_cores")
    row = {k: med(k) for k in keys}
    row.update(
        rps_min=min(r["rps"] for r in runs),
        rps_max=max(r["rps"] for r in runs),
        cpu_min=min(r["cpu_ms"] for r in runs),
        cpu_max=max(r["cpu_ms"] for r in runs),
        errors=sum(r["errors"] for r in runs),
    )
    return row


def report(per: dict[tuple[str, int, str], list[dict]], args: argparse.Namespace, names: list[str]) -> dict:
    summary: dict[str, dict] = {}
    for label in args.workloads:
        for conc in args.concurrency:
            print(f"\n{label}, c={conc} (medians over rounds; cores: CPU used / wall time)")
            print(
                f"  {'system':16} {'req/s':>7} {'(min-max)':>13} {'cpu ms/req':>10} {'(min-max)':>13} "
                f"{'p50 ms':>7} {'p99 ms':>7} {'router':>6} {'engines':>7} {'wrk':>5} {'errors':>6}"
            )
            for name in names:
                row = summarize(per[(label, conc, name)])
                summary[f"{label}/c{conc}/{name}"] = row
                print(
                    f"  {name:16} {row['rps']:7.0f} {row['rps_min']:6.0f}-{row['rps_max']:<6.0f} "
                    f"{row['cpu_ms']:10.3f} {row['cpu_min']:6.3f}-{row['cpu_max']:<6.3f} "
                    f"{row['p50_ms']:7.2f} {row['p99_ms']:7.2f} {row['router_cores']:6.2f} "
                    f"{row['engine_cores']:7.2f} {row['wrk_cores']:5.2f} {row['errors']:6d}"
                )
            if "vllm-router" in names:
                for name in [n for n in names if n.startswith("llmgw")]:
                    summary[f"{label}/c{conc}/{name}/ratios"] = ratios(
                        per[(label, conc, name)], per[(label, conc, "vllm-router")], name
                    )
    return summary


def ratios(ours: list[dict], theirs: list[dict], name: str) -> dict:
    """``name``'s req/s and CPU per request over vllm-router's, round by round, and their medians."""
    rps = [a["rps"] / b["rps"] for a, b in zip(ours, theirs, strict=True)]
    cpu = [a["cpu_ms"] / b["cpu_ms"] for a, b in zip(ours, theirs, strict=True)]
    print(
        f"  {name} / vllm-router: req/s {statistics.median(rps):.2f}x (rounds "
        f"{' '.join(f'{r:.2f}' for r in rps)}), CPU/req {statistics.median(cpu):.2f}x (rounds "
        f"{' '.join(f'{c:.2f}' for c in cpu)})"
    )
    return {"rps": rps, "cpu": cpu}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=8, help="measured seconds per run (whole: wrk's)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured seconds before each run")
    ap.add_argument("--concurrency", default="32,128", help="comma-separated connection counts")
    ap.add_argument("--wrk-threads", type=int, default=1)
    ap.add_argument("--systems", default=",".join(SYSTEMS), help=f"comma-separated subset of {SYSTEMS}")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma-separated of {tuple(WORKLOADS)}")
    ap.add_argument("--baseline", help="also run the router of this git revision (one process), as llmgw@REV")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",") if c]
    args.workloads = [w for w in args.workloads.split(",") if w]
    names = [s for s in args.systems.split(",") if s]
    if set(names) - set(SYSTEMS) or set(args.workloads) - set(WORKLOADS):
        ap.error(f"choose systems from {SYSTEMS} and workloads from {tuple(WORKLOADS)}")
    if shutil.which("wrk") is None:
        print(WRK_MISSING, file=sys.stderr)
        return 2
    if "vllm-router" in names and not (PEERS / "vllm-router" / "bin" / "vllm-router").exists():
        # install_peers.sh also installs LiteLLM (minutes), which this benchmark does not run.
        subprocess.run(["bash", "-c", INSTALL_VLLM_ROUTER, "install", str(PEERS / "vllm-router")], check=True)

    procs: list[subprocess.Popen] = []
    with tempfile.TemporaryDirectory(prefix="llmgw-wrk-") as tmp:
        logs = Path(tmp)
        try:
            engines = start_engines(logs, procs)
            engine_pids = [p.pid for p in procs]
            targets = [start(n, engines, logs, procs) for n in names]
            if args.baseline:
                tree = worktree(args.baseline, logs / "baseline")
                name = f"llmgw@{args.baseline}"
                s = start_llmgw(engines, logs, procs, name=name, tree=tree)
                targets.insert(1, Target(name, s.urls[0], s.pid))
                names.insert(1, name)
            scripts = {w: lua_script(*WORKLOADS[w], logs / f"{w}.lua") for w in args.workloads}
            print(
                f"router under wrk: 2 cheap engines, c={args.concurrency}, {args.seconds} s x "
                f"{args.rounds} rounds per system, workload and concurrency, cpus={os.cpu_count()}, "
                f"load average {loadavg()}",
                flush=True,
            )
            per: dict[tuple[str, int, str], list[dict]] = {}
            for round_no in range(args.rounds):
                turn = round_no % len(targets)
                order = targets[turn:] + targets[:turn]
                for label in args.workloads:
                    for conc in args.concurrency:
                        for t in order:
                            r = measure(t, engine_pids, scripts[label], conc, args)
                            per.setdefault((label, conc, t.name), []).append(r)
                            print(
                                f"  round {round_no + 1} {label:12} c={conc:<4} {t.name:16} {line(r)}",
                                flush=True,
                            )
            summary = report(per, args, names)
            print(f"\nload average at the end: {loadavg()}")
            if args.json:
                Path(args.json).write_text(json.dumps({"args": vars(args), "summary": summary}, indent=1))
            return 1 if any(row.get("errors") for row in summary.values()) else 0
        finally:
            stop(procs)
            if args.baseline:
                drop_worktree(logs / "baseline")


if __name__ == "__main__":
    sys.exit(main())
