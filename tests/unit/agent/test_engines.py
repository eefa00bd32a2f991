"""Launchers and GPU inventory: pure functions, no processes."""

from __future__ import annotations

import sys

import pytest

from llmgw.agent.config import EngineSettings, GpuGroup
from llmgw.agent.engines import SimulatorLauncher, launchers_from_config
from llmgw.agent.gpus import GIB, DeclaredGpus, cpu_cores, host_memory_bytes
from llmgw.agent.replicas import ReplicaSpec
from llmgw.common.errors import InvalidArgument


def spec(**fields) -> ReplicaSpec:
    base = dict(
        replica_id="r1",
        model="llama",
        engine="simulator",
        served_name="llama-8b",
        gpu_indices=(2, 0),
        engine_key="k-secret",
        engine_args={},
    )
    return ReplicaSpec(**{**base, **fields})


def test_simulator_launcher_runs_the_shipped_simulator_with_agent_owned_flags_first():
    launcher = SimulatorLauncher(EngineSettings(), agent_version="1.2.3")
    plan = launcher.plan(spec(), "127.0.0.1", 4321)
    assert plan.argv == (
        sys.executable, "-m", "llmgw.agent.simulator",
        "--host", "127.0.0.1", "--port", "4321",
        "--served-model-name", "llama-8b", "--api-key", "k-secret",
    )  # fmt: skip
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "2,0"}
    assert launcher.version == "1.2.3"


def test_profile_engine_args_override_node_defaults_and_empty_value_is_a_bare_flag():
    settings = EngineSettings(args={"ttft-ms": "30", "itl-ms": "5"}, command=["/opt/sim"])
    plan = SimulatorLauncher(settings, "1").plan(
        spec(engine_args={"ttft-ms": "90", "enforce-eager": ""}), "::1", 1
    )
    assert plan.argv[0] == "/opt/sim"
    flags = list(plan.argv[plan.argv.index("k-secret") + 1 :])
    assert flags == ["--ttft-ms", "90", "--itl-ms", "5", "--enforce-eager"]


@pytest.mark.parametrize("name", ["port", "api-key", "host", "served-model-name"])
def test_engine_args_may_not_override_the_flags_the_agent_owns(name):
    with pytest.raises(InvalidArgument, match="set by the agent"):
        SimulatorLauncher(EngineSettings(), "1").plan(spec(engine_args={name: "x"}), "h", 1)


def test_engine_arg_names_with_dashes_or_spaces_are_refused():
    with pytest.raises(InvalidArgument, match="not a flag name"):
        SimulatorLauncher(EngineSettings(), "1").plan(spec(engine_args={"--port": "1"}), "h", 1)


def test_configured_engine_version_is_what_register_reports():
    launcher = SimulatorLauncher(EngineSettings(version="sim-2.0"), "1.2.3")
    assert launcher.version == "sim-2.0"


def test_config_naming_an_engine_kind_without_a_launcher_is_refused():
    with pytest.raises(InvalidArgument, match="no launcher for engine kind 'vllm'"):
        launchers_from_config({"vllm": EngineSettings()}, "1")


def test_declared_gpus_are_numbered_across_groups_with_stable_node_scoped_uuids():
    groups = [GpuGroup(count=2, name="A", memory_gb=40), GpuGroup(count=1, name="B", memory_gb=0.5)]
    gpus = DeclaredGpus("node-x", groups).gpus()
    assert [(g.index, g.name) for g in gpus] == [(0, "A"), (1, "A"), (2, "B")]
    assert [g.uuid for g in gpus] == ["GPU-sim-node-x-0", "GPU-sim-node-x-1", "GPU-sim-node-x-2"]
    assert gpus[0].memory_total_bytes == 40 * GIB == gpus[0].memory_free_bytes
    assert gpus[2].memory_total_bytes == GIB // 2
    assert DeclaredGpus("node-x", groups).gpus() == gpus
    assert DeclaredGpus("node-y", groups).gpus()[0].uuid != gpus[0].uuid


def test_host_resources_are_read_from_the_os():
    assert host_memory_bytes() > 64 * 1024 * 1024
    assert 1 <= cpu_cores() <= 4096
