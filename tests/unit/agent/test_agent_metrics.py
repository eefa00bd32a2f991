"""The agent's /metrics: engines' CPU and memory from /proc, GPUs declared or through NVML."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from llmgw.agent.config import GpuGroup
from llmgw.agent.gpus import DeclaredGpus, NvmlGpus
from llmgw.agent.metrics import AgentCollector, process_groups
from llmgw.agent.replicas import ReplicaState, ReplicaStatus
from llmgw.common.metricsport import serving

from .test_engines import FakeNvml

# A parent that spins and starts a child that holds 64 MiB: both in one new process group.
ENGINE = (
    "import subprocess, sys, time\n"
    "child = subprocess.Popen([sys.executable, '-c', "
    "'import time; b = bytearray(64 << 20); b[::4096] = b\"x\" * len(b[::4096]); time.sleep(60)'])\n"
    "end = time.time() + 60\n"
    "while time.time() < end: pass\n"
)


class Replicas:
    def __init__(self, statuses):
        self.statuses = statuses

    def snapshot(self):
        return list(self.statuses)


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    from prometheus_client import generate_latest

    out = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _engine() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", ENGINE], start_new_session=True)


def test_an_engines_cpu_and_memory_count_its_whole_process_group():
    proc = _engine()
    try:
        deadline = time.monotonic() + 20
        while True:
            f = process_groups([proc.pid]).get(proc.pid)
            if f and f.processes == 2 and f.memory_bytes > 64 << 20 and f.cpu_seconds > 0.2:
                break
            assert time.monotonic() < deadline, f"engine figures never grew: {f}"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    # The child dies asynchronously; once gone (or a zombie), the group counts nothing.
    deadline = time.monotonic() + 10
    while process_groups([proc.pid]):
        assert time.monotonic() < deadline, process_groups([proc.pid])
        time.sleep(0.05)


def test_declared_gpus_export_what_is_declared_and_nothing_measured():
    proc = _engine()
    try:
        replicas = Replicas(
            [
                ReplicaStatus("r-1", "demo", ReplicaState.READY, pid=proc.pid, engine="simulator"),
                ReplicaStatus("r-2", "demo", ReplicaState.STOPPED, pid=0, engine="simulator"),
            ]
        )
        gpus = DeclaredGpus("n1", [GpuGroup(count=2, name="Sim", memory_gb=80, power_watts=700)])
        registry = CollectorRegistry()
        registry.register(AgentCollector("n1", replicas, gpus, "declared"))
        deadline = time.monotonic() + 20
        while True:
            s = _samples(registry)
            key = (("engine", "simulator"), ("model", "demo"), ("node", "n1"), ("replica", "r-1"))
            if s.get(("llmgw_agent_engine_memory_bytes", key), 0) > 64 << 20:
                break
            assert time.monotonic() < deadline, s
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert s[("llmgw_agent_engine_cpu_seconds_total", key)] > 0
    assert s[("llmgw_agent_engine_processes", key)] == 2
    assert s[("llmgw_agent_replicas", (("node", "n1"), ("state", "ready")))] == 1
    assert s[("llmgw_agent_replicas", (("node", "n1"), ("state", "stopped")))] == 1
    assert s[("llmgw_agent_replicas", (("node", "n1"), ("state", "failed")))] == 0
    gpu0 = (("gpu", "0"), ("node", "n1"))
    assert s[("llmgw_agent_gpu_memory_total_bytes", gpu0)] == 80 * 1024**3
    assert s[("llmgw_agent_gpu_power_limit_watts", gpu0)] == 700
    info = [k for k in s if k[0] == "llmgw_agent_gpu_info"]
    assert len(info) == 2 and all(("source", "declared") in k[1] for k in info)
    measured = (
        "llmgw_agent_gpu_memory_used_bytes",
        "llmgw_agent_gpu_utilization_ratio",
        "llmgw_agent_gpu_power_watts",
    )
    assert not [k for k in s if k[0] in measured]


class MeasuringNvml(FakeNvml):
    def nvmlDeviceGetUtilizationRates(self, h):  # noqa: N802
        return SimpleNamespace(gpu=37, memory=10)

    def nvmlDeviceGetPowerUsage(self, h):  # noqa: N802 - milliwatts; board 1 does not say
        if h == 1:
            raise RuntimeError("NVMLError_NotSupported")
        return 412_500


def test_nvml_gpus_export_utilisation_memory_used_and_power_draw():
    nvml = MeasuringNvml()
    nvml.free = 30 * 1024**3
    registry = CollectorRegistry()
    registry.register(AgentCollector("n1", Replicas([]), NvmlGpus(nvml), "nvml"))
    s = _samples(registry)
    gpu0, gpu1 = (("gpu", "0"), ("node", "n1")), (("gpu", "1"), ("node", "n1"))
    assert s[("llmgw_agent_gpu_utilization_ratio", gpu0)] == 0.37
    assert s[("llmgw_agent_gpu_memory_used_bytes", gpu0)] == 50 * 1024**3
    assert s[("llmgw_agent_gpu_power_watts", gpu0)] == 412.5
    assert ("llmgw_agent_gpu_power_watts", gpu1) not in s
    assert s[("llmgw_agent_gpu_utilization_ratio", gpu1)] == 0.37


async def test_the_agents_series_are_served_on_its_metrics_port():
    registry = CollectorRegistry()
    registry.register(AgentCollector("n1", Replicas([]), DeclaredGpus("n1", [GpuGroup()]), "declared"))
    async with serving("127.0.0.1:0", registry) as port, aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/metrics") as r:
            assert r.status == 200
            assert "llmgw_agent_gpu_info" in await r.text()
