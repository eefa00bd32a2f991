"""The agent's Prometheus metrics: its engines' CPU and memory, and its GPUs.

Served on ``metrics_listen`` (host:port, ``GET /metrics``; empty, the
default: not served), like the control plane's port of the same name
(:mod:`llmgw.common.metricsport` serves both).
Off by default because the agent runs on every GPU machine and a new
listening port there should be the operator's choice. A collector reads
everything when Prometheus scrapes, so nothing runs between scrapes and
nothing can drift from what the agent reports.

Series (units in names; every one carries ``node``):

- ``llmgw_agent_engine_cpu_seconds_total{replica,model,engine}``: CPU time
  (user + system) of the engine's process group, the processes alive now
  plus the children its leader has reaped: an engine's workers (vLLM's
  engine core, tokenizer processes) count with it.
- ``llmgw_agent_engine_memory_bytes{replica,model,engine}``: resident memory
  of the same processes, summed.
- ``llmgw_agent_engine_processes{replica,model,engine}``: how many there are.
- ``llmgw_agent_replicas{state}``: replicas by state, every state present.
- ``llmgw_agent_gpu_info{gpu,uuid,name,source}``: 1 per GPU; ``source`` is
  ``nvml`` or ``declared``, so a dashboard can tell measured from declared.
- ``llmgw_agent_gpu_memory_total_bytes{gpu}`` and
  ``llmgw_agent_gpu_power_limit_watts{gpu}``: from NVML, or declared.
- Only where NVML answers (nothing measures a declared GPU, and a made-up
  zero would read as an idle GPU): ``llmgw_agent_gpu_memory_used_bytes{gpu}``,
  ``llmgw_agent_gpu_utilization_ratio{gpu}`` (0 to 1) and
  ``llmgw_agent_gpu_power_watts{gpu}`` (the draw now).

Process figures come from ``/proc`` (Linux): a process that ends while it
is read is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from .gpus import Gpu, GpuUsage
from .replicas import ReplicaState, ReplicaStatus

TICKS = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class ProcessFigures:
    cpu_seconds: float
    memory_bytes: int
    processes: int


class Replicas(Protocol):
    def snapshot(self) -> list[ReplicaStatus]: ...


class Gpus(Protocol):
    def gpus(self) -> list[Gpu]: ...
    def usage(self) -> dict[int, GpuUsage]: ...


def _stat(pid_dir: Path) -> tuple[int, float, float, int] | None:
    """(process group, own CPU seconds, reaped children's CPU seconds, resident bytes) or None."""
    try:
        stat = (pid_dir / "stat").read_text()
        statm = (pid_dir / "statm").read_text()
    except OSError:  # ended meanwhile
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after it.
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] in ("Z", "X"):  # a zombie holds no memory and runs no more
        return None
    pgrp = int(fields[2])
    own = (int(fields[11]) + int(fields[12])) / TICKS
    reaped = (int(fields[13]) + int(fields[14])) / TICKS
    return pgrp, own, reaped, int(statm.split()[1]) * PAGE


def process_groups(leaders: Sequence[int], proc: Path = Path("/proc")) -> dict[int, ProcessFigures]:
    """CPU, memory and process count of each process group led by one of ``leaders``."""
    wanted = {pid for pid in leaders if pid > 0}
    if not wanted:
        return {}
    totals: dict[int, list[float]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        read = _stat(entry)
        if read is None or read[0] not in wanted:
            continue
        pgrp, own, reaped, rss = read
        t = totals.setdefault(pgrp, [0.0, 0, 0])
        t[0] += own + (reaped if int(entry.name) == pgrp else 0.0)
        t[1] += rss
        t[2] += 1
    return {pgrp: ProcessFigures(t[0], int(t[1]), int(t[2])) for pgrp, t in totals.items()}


class AgentCollector(Collector):
    def __init__(
        self, node_id: str, replicas: Replicas, gpus: Gpus, gpu_source: str, proc: Path = Path("/proc")
    ):
        self._node = node_id
        self._replicas = replicas
        self._gpus = gpus
        self._source = gpu_source
        self._proc = proc

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        node = self._node
        yield from self._engines(node)
        yield from self._gpu_series(node)

    def _engines(self, node: str) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["node", "replica", "model", "engine"]
        cpu = CounterMetricFamily(
            "llmgw_agent_engine_cpu_seconds",
            "CPU time of each engine's process group (user + system), its reaped children included.",
            labels=labels,
        )
        memory = GaugeMetricFamily(
            "llmgw_agent_engine_memory_bytes", "Resident memory of each engine's processes.", labels=labels
        )
        count = GaugeMetricFamily(
            "llmgw_agent_engine_processes", "Processes in each engine's process group.", labels=labels
        )
        states = GaugeMetricFamily(
            "llmgw_agent_replicas", "Replicas on this node by state.", labels=["node", "state"]
        )
        replicas = self._replicas.snapshot()
        by_state = dict.fromkeys((s.name.lower() for s in ReplicaState), 0)
        for r in replicas:
            by_state[r.state.name.lower()] += 1
        for state, n in by_state.items():
            states.add_metric([node, state], n)
        running = [
            r for r in replicas if r.pid > 0 and r.state not in (ReplicaState.STOPPED, ReplicaState.FAILED)
        ]
        figures = process_groups([r.pid for r in running], self._proc)
        for r in running:
            f = figures.get(r.pid)
            if f is None:
                continue
            values = [node, r.replica_id, r.model, r.engine]
            cpu.add_metric(values, f.cpu_seconds)
            memory.add_metric(values, f.memory_bytes)
            count.add_metric(values, f.processes)
        yield from (cpu, memory, count, states)

    def _gpu_series(self, node: str) -> Iterator[GaugeMetricFamily]:
        info = GaugeMetricFamily(
            "llmgw_agent_gpu_info",
            "1 per GPU; source: nvml (measured) or declared (the agent's configuration).",
            labels=["node", "gpu", "uuid", "name", "source"],
        )
        total = GaugeMetricFamily(
            "llmgw_agent_gpu_memory_total_bytes", "Memory of each GPU.", labels=["node", "gpu"]
        )
        limit = GaugeMetricFamily(
            "llmgw_agent_gpu_power_limit_watts",
            "The most each GPU may draw: NVML's enforced limit, or the declared watts.",
            labels=["node", "gpu"],
        )
        used = GaugeMetricFamily(
            "llmgw_agent_gpu_memory_used_bytes", "GPU memory in use (NVML only).", labels=["node", "gpu"]
        )
        util = GaugeMetricFamily(
            "llmgw_agent_gpu_utilization_ratio",
            "Fraction of the last sample period a kernel ran on each GPU (NVML only).",
            labels=["node", "gpu"],
        )
        power = GaugeMetricFamily(
            "llmgw_agent_gpu_power_watts", "Power each GPU draws now (NVML only).", labels=["node", "gpu"]
        )
        usage = self._gpus.usage()
        for g in self._gpus.gpus():
            index = str(g.index)
            info.add_metric([node, index, g.uuid, g.name, self._source], 1)
            total.add_metric([node, index], g.memory_total_bytes)
            limit.add_metric([node, index], g.power_watts)
            u = usage.get(g.index)
            if u is None:
                continue
            used.add_metric([node, index], g.memory_total_bytes - g.memory_free_bytes)
            if u.utilization_ratio is not None:
                util.add_metric([node, index], u.utilization_ratio)
            if u.power_watts is not None:
                power.add_metric([node, index], u.power_watts)
        yield from (info, total, limit, used, util, power)
