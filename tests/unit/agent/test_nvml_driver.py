"""NVML against a real driver: runs only where ``pynvml`` (nvidia-ml-py) loads and a GPU answers.

Elsewhere it is skipped, and the declared path and the NVML seam are
covered by test_engines with a fake module.
"""

from __future__ import annotations

import pytest

from llmgw.agent.gpus import Driver, NvmlGpus, node_driver


def test_a_real_driver_reports_every_gpu_with_memory_and_a_power_limit():
    pynvml = pytest.importorskip("pynvml")
    try:
        source = NvmlGpus(pynvml)
    except Exception as err:  # the module without a driver
        pytest.skip(f"no NVIDIA driver answers here: {err}")
    gpus = source.gpus()
    if not gpus:
        pytest.skip("the driver reports no GPU")
    assert [g.index for g in gpus] == list(range(len(gpus)))
    for g in gpus:
        assert g.uuid.startswith("GPU-") and g.name
        assert 0 < g.memory_free_bytes <= g.memory_total_bytes
        # Data-centre boards report an enforced limit; 0 only where NVML says not supported.
        assert g.power_watts == 0 or 50 <= g.power_watts <= 2000


def test_a_real_driver_measures_utilisation_and_power_draw_for_the_metrics():
    pynvml = pytest.importorskip("pynvml")
    try:
        source = NvmlGpus(pynvml)
    except Exception as err:  # the module without a driver
        pytest.skip(f"no NVIDIA driver answers here: {err}")
    usage = source.usage()
    if not usage:
        pytest.skip("the driver reports no GPU")
    assert sorted(usage) == [g.index for g in source.gpus()]
    for u in usage.values():
        assert u.utilization_ratio is None or 0 <= u.utilization_ratio <= 1
        assert u.power_watts is None or 0 < u.power_watts <= 2000


def test_a_real_driver_reports_its_version_cuda_version_and_each_gpus_compute_capability():
    pynvml = pytest.importorskip("pynvml")
    try:
        source = NvmlGpus(pynvml)
    except Exception as err:
        pytest.skip(f"no NVIDIA driver answers here: {err}")
    if not source.gpus():
        pytest.skip("the driver reports no GPU")
    driver = node_driver(source, Driver("declared", "1.0"))
    assert driver.version and driver.version != "declared"  # "550.54.15"
    major, minor = (int(p) for p in driver.cuda.split("."))
    assert major >= 10 and 0 <= minor < 100
    for g in source.gpus():
        cc_major, _ = (int(p) for p in g.compute_capability.split("."))
        assert 3 <= cc_major <= 20
