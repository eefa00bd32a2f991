"""Launchers and GPU inventory: pure functions, no processes."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest

from llmgw.agent.adapters import AdapterRef, LoraSpec
from llmgw.agent.config import EngineBuild, EngineSettings, GpuGroup
from llmgw.agent.engines import (
    BuildInfo,
    LlamaCppLauncher,
    SglangLauncher,
    SimulatorLauncher,
    VllmLauncher,
    build_key,
    describe_builds,
    launchers_from_config,
)
from llmgw.agent.gpus import (
    GIB,
    DeclaredGpus,
    Driver,
    NvmlGpus,
    cpu_cores,
    discover_gpus,
    host_memory_bytes,
    node_driver,
)
from llmgw.agent.messages import gpu_message
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
        "--served-model-name", "llama-8b",
    )  # fmt: skip
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "2,0", "VLLM_API_KEY": "k-secret"}, "the key: never argv"
    assert launcher.version == "1.2.3"


def test_profile_engine_args_override_node_defaults_and_empty_value_is_a_bare_flag():
    settings = EngineSettings(args={"ttft-ms": "30", "itl-ms": "5"}, command=["/opt/sim"])
    plan = SimulatorLauncher(settings, "1").plan(
        spec(engine_args={"ttft-ms": "90", "enforce-eager": ""}), "::1", 1
    )
    assert plan.argv[0] == "/opt/sim"
    flags = list(plan.argv[plan.argv.index("llama-8b") + 1 :])
    assert flags == ["--ttft-ms", "90", "--itl-ms", "5", "--enforce-eager"]


def test_the_simulator_is_given_the_weights_as_vllms_model_flag_and_the_revision_as_its_own():
    settings = EngineSettings(args={"model": "/node/default", "itl-ms": "5"})
    plan = SimulatorLauncher(settings, "1").plan(
        spec(engine_args={"weights": "/cache/hub/org--tiny@v2", "revision": "v2"}), "h", 1
    )
    flags = list(plan.argv[plan.argv.index("llama-8b") + 1 :])
    assert flags == ["--model", "/cache/hub/org--tiny@v2", "--itl-ms", "5", "--revision", "v2"]
    # Without weights in the start command, the node's default (or nothing) as before.
    plan = SimulatorLauncher(settings, "1").plan(spec(), "h", 1)
    assert list(plan.argv[plan.argv.index("llama-8b") + 1 :]) == ["--model", "/node/default", "--itl-ms", "5"]


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
    with pytest.raises(InvalidArgument, match="no launcher for engine kind 'tgi'"):
        launchers_from_config({"tgi": EngineSettings()}, "1")


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


def fake_python(tmp_path, prints: str = "0.32.0", code: int = 0) -> str:
    """An executable standing in for an engine environment's python."""
    p = tmp_path / "python"
    p.write_text(f"#!/bin/sh\necho {prints}\nexit {code}\n")
    p.chmod(0o755)
    return str(p)


def test_vllm_launcher_fills_the_template_with_weights_tp_from_gpu_count_and_profile_flags(tmp_path):
    python = fake_python(tmp_path)
    launcher = VllmLauncher(EngineSettings(python=python, args={"dtype": "bfloat16"}), "1")
    assert launcher.version == "0.32.0", "the version is asked of the engine's own python"
    plan = launcher.plan(
        spec(engine="vllm", engine_args={"weights": "/w/tiny", "enforce-eager": "", "max-model-len": "256"}),
        "127.0.0.1",
        8001,
    )
    assert plan.argv == (
        python, "-m", "vllm.entrypoints.openai.api_server",
        "--model", "/w/tiny", "--served-model-name", "llama-8b",
        "--host", "127.0.0.1", "--port", "8001",
        "--tensor-parallel-size", "2",
        "--dtype", "bfloat16", "--enforce-eager", "--max-model-len", "256",
    )  # fmt: skip
    assert plan.env == {"CUDA_VISIBLE_DEVICES": "2,0", "VLLM_API_KEY": "k-secret"}


def test_vllm_weights_fall_back_to_the_model_arg_then_the_catalog_name_and_cpu_only_hides_gpus(tmp_path):
    launcher = VllmLauncher(EngineSettings(python=fake_python(tmp_path)), "1")
    plan = launcher.plan(spec(gpu_indices=(), engine_args={"model": "org/tiny"}), "h", 1)
    assert plan.argv[plan.argv.index("--model") + 1] == "org/tiny"
    assert plan.argv.count("--model") == 1
    assert plan.argv[plan.argv.index("--tensor-parallel-size") + 1] == "1"
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "", "a CPU-only replica must see no GPU"
    plan = launcher.plan(spec(), "h", 1)
    assert plan.argv[plan.argv.index("--model") + 1] == "llama"
    with pytest.raises(InvalidArgument, match="set by the agent"):
        launcher.plan(spec(engine_args={"tensor-parallel-size": "8"}), "h", 1)


def test_sglang_and_llamacpp_launchers_spell_their_own_flags(tmp_path):
    sglang = SglangLauncher(EngineSettings(python=fake_python(tmp_path)), "1")
    plan = sglang.plan(spec(engine_args={"weights": "/w"}), "h", 9)
    argv = plan.argv
    assert argv[1] == "-c" and "sglang.launch_server" in argv[2] and "k-secret" not in " ".join(argv)
    assert plan.env["LLMGW_ENGINE_KEY"] == "k-secret"
    assert argv[argv.index("--model-path") + 1] == "/w" and argv[argv.index("--tp-size") + 1] == "2"
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 4567 (abcdef)' >&2\n")
    binary.chmod(0o755)
    llama = LlamaCppLauncher(EngineSettings(binary=str(binary)), "1")
    assert llama.version == "4567 (abcdef)"
    plan = llama.plan(spec(engine_args={"weights": "/w/m.gguf", "n-gpu-layers": "99"}), "h", 9)
    assert plan.argv == (
        str(binary), "-m", "/w/m.gguf", "--alias", "llama-8b", "--host", "h", "--port", "9",
        "--n-gpu-layers", "99",
    )  # fmt: skip
    assert plan.env["LLAMA_ARG_API_KEY"] == "k-secret"


def test_engines_whose_install_is_missing_or_broken_are_not_offered(tmp_path):
    launchers = launchers_from_config(
        {
            "simulator": EngineSettings(),
            "vllm": EngineSettings(python=str(tmp_path / "no-such-python")),
            "sglang": EngineSettings(python=fake_python(tmp_path, "No module named sglang", 1)),
            "llamacpp": EngineSettings(),
        },
        "1",
    )
    assert sorted(launchers) == ["simulator"]
    ok = launchers_from_config({"vllm": EngineSettings(python=fake_python(tmp_path))}, "1")
    assert ok["vllm"].version == "0.32.0"


class FakeNvml:
    """Stands in for the pynvml module (the seam NvmlGpus takes)."""

    def __init__(self, fail_init: bool = False):
        self.fail_init = fail_init
        self.free = 30 * GIB

    def nvmlInit(self):  # noqa: N802
        if self.fail_init:
            raise RuntimeError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self):  # noqa: N802
        return 2

    def nvmlDeviceGetHandleByIndex(self, i):  # noqa: N802
        return i

    def nvmlDeviceGetMemoryInfo(self, h):  # noqa: N802
        return SimpleNamespace(total=80 * GIB, free=self.free)

    def nvmlDeviceGetName(self, h):  # noqa: N802
        return b"NVIDIA H200"

    def nvmlDeviceGetUUID(self, h):  # noqa: N802
        return f"GPU-real-{h}"

    def nvmlDeviceGetEnforcedPowerLimit(self, h):  # noqa: N802 - milliwatts; board 1 does not say
        if h == 1:
            raise RuntimeError("NVMLError_NotSupported")
        return 700_000

    def nvmlDeviceGetCudaComputeCapability(self, h):  # noqa: N802
        return (9, 0)

    def nvmlSystemGetDriverVersion(self):  # noqa: N802
        return b"550.54.15"

    def nvmlSystemGetCudaDriverVersion(self):  # noqa: N802
        return 12040


def test_the_driver_and_compute_capability_come_from_nvml_else_from_the_config():
    declared = Driver("535.0", "12.2")
    nvml = discover_gpus("n", [GpuGroup(count=1)], nvml=FakeNvml())
    assert node_driver(nvml, declared) == Driver("550.54.15", "12.4")
    assert [g.compute_capability for g in nvml.gpus()] == ["9.0", "9.0"]
    sim = discover_gpus("n", [GpuGroup(count=1, compute_capability="8.0")], nvml=FakeNvml(fail_init=True))
    assert node_driver(sim, declared) == declared
    assert gpu_message(sim.gpus()[0]).compute_capability == "8.0"


def test_each_build_of_a_kind_is_a_launcher_of_its_own_and_is_reported_with_its_program_and_cuda(tmp_path):
    engines = {
        "simulator": EngineSettings(
            version="1.0",
            cuda="12.4",
            builds=[
                EngineBuild(name="next", version="2.0", command=["/opt/sim2/bin/sim"], cuda="12.8"),
            ],
        ),
        "vllm": EngineSettings(
            python=fake_python(tmp_path), builds=[EngineBuild(name="gone", python=str(tmp_path / "none"))]
        ),
    }
    launchers = launchers_from_config(engines, "0.1")
    assert sorted(launchers) == ["simulator", "simulator@next", "vllm"]  # "gone" is not installed
    assert launchers[build_key("simulator", "next")].plan(spec(), "h", 1).argv[0] == "/opt/sim2/bin/sim"
    assert describe_builds(engines, launchers) == [
        BuildInfo("simulator", "", "1.0", sys.executable, "12.4"),
        BuildInfo("simulator", "next", "2.0", "/opt/sim2/bin/sim", "12.8"),
        BuildInfo("vllm", "", "0.32.0", engines["vllm"].python, ""),
    ]
    with pytest.raises(ValueError, match="repeat a name"):
        EngineSettings(builds=[EngineBuild(name="a"), EngineBuild(name="a")])


def test_gpu_power_is_nvmls_enforced_limit_else_the_declared_draw():
    gpus = discover_gpus("n", [GpuGroup(count=1)], nvml=FakeNvml()).gpus()
    assert [g.power_watts for g in gpus] == [700.0, 0.0]
    declared = DeclaredGpus("n", [GpuGroup(count=2, power_watts=350), GpuGroup(count=1)]).gpus()
    assert [g.power_watts for g in declared] == [350.0, 350.0, 0.0]
    assert gpu_message(declared[0]).power_watts == 350.0


def test_nvml_gpus_are_read_live_from_the_driver():
    nvml = FakeNvml()
    source = discover_gpus("n", [GpuGroup(count=1)], nvml=nvml)
    assert isinstance(source, NvmlGpus)
    gpus = source.gpus()
    assert [(g.index, g.uuid, g.name) for g in gpus] == [
        (0, "GPU-real-0", "NVIDIA H200"),
        (1, "GPU-real-1", "NVIDIA H200"),
    ]
    nvml.free = 10 * GIB
    assert source.gpus()[0].memory_free_bytes == 10 * GIB


def test_without_pynvml_or_a_driver_the_declared_gpus_are_used(monkeypatch):
    declared = [GpuGroup(count=3, name="Sim")]
    source = discover_gpus("n", declared, nvml=FakeNvml(fail_init=True))
    assert isinstance(source, DeclaredGpus) and len(source.gpus()) == 3
    # The module itself absent: a None entry in sys.modules makes the import fail.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    source = discover_gpus("n", declared)
    assert isinstance(source, DeclaredGpus) and [g.name for g in source.gpus()] == ["Sim"] * 3


LORA = LoraSpec(
    max_loras=3, max_rank=32, adapters=(AdapterRef("sql", "/lora/sql"), AdapterRef("fr", "/lora/fr"))
)


def test_lora_switches_on_each_engines_flags_and_runtime_updating(tmp_path):
    vllm = VllmLauncher(EngineSettings(python=fake_python(tmp_path)), "1")
    plan = vllm.plan(spec(engine="vllm", lora=LORA), "h", 1)
    tail = plan.argv[plan.argv.index("--enable-lora") :]
    assert tail == (
        "--enable-lora", "--max-loras", "3", "--max-lora-rank", "32",
        "--lora-modules", "sql=/lora/sql", "fr=/lora/fr",
    )  # fmt: skip
    assert plan.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert "--enable-lora" not in vllm.plan(spec(engine="vllm"), "h", 1).argv
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm.plan(spec(engine="vllm"), "h", 1).env
    with pytest.raises(InvalidArgument, match="set by the agent"):
        vllm.plan(spec(engine_args={"max-loras": "8"}), "h", 1)
    sim = SimulatorLauncher(EngineSettings(), agent_version="1").plan(spec(lora=LORA), "h", 1)
    assert "--enable-lora" in sim.argv and sim.env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    sglang = SglangLauncher(EngineSettings(python=fake_python(tmp_path)), "1").plan(spec(lora=LORA), "h", 1)
    assert sglang.argv[sglang.argv.index("--enable-lora") :] == (
        "--enable-lora", "--max-loras-per-batch", "3", "--max-lora-rank", "32",
        "--lora-paths", "sql=/lora/sql", "fr=/lora/fr",
    )  # fmt: skip
    binary = tmp_path / "llama-server"
    binary.write_text("#!/bin/sh\necho 'version: 1 (a)' >&2\n")
    binary.chmod(0o755)
    with pytest.raises(InvalidArgument, match="LoRA"):
        LlamaCppLauncher(EngineSettings(binary=str(binary)), "1").plan(spec(lora=LORA), "h", 1)


def test_comfyui_launcher_writes_every_folder_into_comfyuis_model_paths_file(tmp_path):
    import yaml

    from llmgw.agent.engines import ComfyUILauncher

    main_py = tmp_path / "ComfyUI" / "main.py"
    main_py.parent.mkdir()
    main_py.write_text("")
    (main_py.parent / "comfyui_version.py").write_text('__version__ = "0.3.60"\n')
    python = tmp_path / "python"
    python.write_text("")
    launcher = ComfyUILauncher(
        EngineSettings(python=str(python), binary=str(main_py), args={"steps": "2"}), "1"
    )
    assert launcher.version == "0.3.60", "read from its checkout"
    args = {"checkpoints": "/w/a,/w/b", "custom-nodes": "/n/x", "preview-method": "none"}
    plan = launcher.plan(spec(engine="comfyui", gpu_indices=(), engine_args=args), "127.0.0.1", 8188)
    assert plan.argv == (
        str(python), str(main_py),
        "--listen", "127.0.0.1", "--port", "8188",
        "--extra-model-paths-config", "extra_model_paths.yaml", "--cpu",
        "--steps", "2", "--preview-method", "none",
    )  # fmt: skip
    paths = yaml.safe_load(plan.files["extra_model_paths.yaml"])
    assert paths == {"llmgw": {"checkpoints": "/w/a\n/w/b", "custom_nodes": "/n/x"}}
    assert plan.env["LLMGW_ENGINE_KEY"] == "k-secret", "the key: never argv"
    with_gpu = launcher.plan(spec(engine="comfyui", engine_args={"checkpoints": "/w/a"}), "::1", 1)
    assert "--cpu" not in with_gpu.argv and with_gpu.env["CUDA_VISIBLE_DEVICES"] == "2,0"
    with pytest.raises(InvalidArgument, match="agent"):
        launcher.plan(spec(engine="comfyui", engine_args={"port": "1"}), "::1", 1)
    with pytest.raises(InvalidArgument, match="absolute"):
        launcher.plan(spec(engine="comfyui", engine_args={"checkpoints": "relative/dir"}), "::1", 1)


def test_comfyui_without_its_install_is_not_offered(tmp_path):
    from llmgw.agent.engines import launchers_from_config

    offered = launchers_from_config(
        {"comfyui": EngineSettings(python="/nope/python", binary="/nope/main.py")}, "1"
    )
    assert offered == {}
