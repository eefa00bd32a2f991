"""What this node has to offer: its GPUs, host memory and CPU cores.

GPUs come through one seam, :class:`GpuSource`, because where they come from
differs by fleet: NVML on a machine with a driver (:class:`NvmlGpus`), the
configuration file on a simulated or CPU-only fleet (:class:`DeclaredGpus`).
:func:`discover_gpus` picks: NVML when the ``pynvml`` module (package
``nvidia-ml-py``, optional, imported lazily) loads and the driver answers
with at least one GPU, else the declared GPUs. The agent asks the source
again for every heartbeat, so NVML's free memory is reported live; an NVML
call that fails later reports the last good reading rather than no GPUs.

Guarantees of :class:`DeclaredGpus`:

- indices run 0..n-1 over the declared groups in order, the numbering
  ``CUDA_VISIBLE_DEVICES`` and ``StartReplica.gpu_indices`` use;
- a GPU's uuid is stable for a node across agent restarts
  (``GPU-sim-<node>-<index>``) and distinct between nodes, so the control
  plane can tell a restarted node from a new one;
- free memory is reported as the total: nothing measures a declared GPU.

Power: each GPU reports the watts a power budget counts for it (the
control plane keeps each facility domain within its budget, see
placement): NVML's *enforced power limit*, the most the board may draw,
rather than its draw now, which swings with load and would let placement
fill a domain that trips its breaker at the next peak; a declared GPU
reports its group's ``power_watts``.

Driver (:func:`node_driver`): the NVIDIA driver's version and the newest
CUDA version it supports, from NVML where the GPUs come from NVML, else as
the configuration declares them (``driver:``), and each GPU's compute
capability likewise. The control plane keeps an engine build made for a
newer CUDA than the driver supports off the node (placement).
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, cast

from .config import GpuGroup

log = logging.getLogger("llmgw.agent.gpus")

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    # NVML's enforced power limit, or the declared draw; 0: not known.
    power_watts: float = 0.0
    # CUDA compute capability ("9.0"); "": not known.
    compute_capability: str = ""


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver: its version, and the newest CUDA version it supports ("" each: not known)."""

    version: str = ""
    cuda: str = ""


@dataclass(frozen=True)
class GpuUsage:
    """What NVML measures of one GPU now (the agent's metrics); None: the board does not say."""

    utilization_ratio: float | None
    power_watts: float | None


class GpuSource(Protocol):
    """Where a node's GPUs are read from."""

    def gpus(self) -> list[Gpu]: ...

    def usage(self) -> dict[int, GpuUsage]:
        """Measured utilisation and draw by GPU index; empty where nothing measures them."""
        ...


class DeclaredGpus:
    """GPUs as the configuration declares them (simulated or CPU fleets)."""

    def __init__(self, node_id: str, groups: Sequence[GpuGroup]):
        gpus: list[Gpu] = []
        for group in groups:
            memory = int(group.memory_gb * GIB)
            for _ in range(group.count):
                index = len(gpus)
                gpus.append(
                    Gpu(
                        index,
                        f"GPU-sim-{node_id}-{index}",
                        group.name,
                        memory,
                        memory,
                        group.power_watts,
                        group.compute_capability,
                    )
                )
        self._gpus = tuple(gpus)

    def gpus(self) -> list[Gpu]:
        return list(self._gpus)

    def usage(self) -> dict[int, GpuUsage]:
        """Nothing: nothing measures a declared GPU."""
        return {}


class Nvml(Protocol):
    """The part of NVML (``pynvml``) this module calls; tests hand in their own."""

    def nvmlInit(self) -> None: ...  # noqa: N802 - NVML's names
    def nvmlDeviceGetCount(self) -> int: ...  # noqa: N802
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...  # noqa: N802
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # noqa: N802
    def nvmlDeviceGetName(self, handle: Any) -> str | bytes: ...  # noqa: N802
    def nvmlDeviceGetUUID(self, handle: Any) -> str | bytes: ...  # noqa: N802
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # noqa: N802 - milliwatts
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...  # noqa: N802
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...  # noqa: N802
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...  # noqa: N802 - 12040 is CUDA 12.4
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # noqa: N802 - .gpu in percent
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # noqa: N802 - milliwatts


class NvmlGpus:
    """GPUs as the NVIDIA driver reports them, through NVML (``pynvml``).

    Construction initialises NVML and takes a first reading; it raises
    whatever the import or the driver raises, which :func:`discover_gpus`
    turns into the fallback.
    """

    def __init__(self, nvml: Nvml | None = None):
        self._nvml = nvml if nvml is not None else cast(Nvml, importlib.import_module("pynvml"))
        self._nvml.nvmlInit()
        self._last = self._read()

    def _read(self) -> list[Gpu]:
        nvml = self._nvml
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            uuid = nvml.nvmlDeviceGetUUID(h)
            gpus.append(
                Gpu(
                    i,
                    _text(uuid),
                    _text(name),
                    int(mem.total),
                    int(mem.free),
                    self._power(h),
                    self._capability(h),
                )
            )
        return gpus

    def _capability(self, handle: Any) -> str:
        try:
            major, minor = self._nvml.nvmlDeviceGetCudaComputeCapability(handle)
        except Exception:  # an old driver or binding: not reported
            return ""
        return f"{major}.{minor}"

    def driver(self) -> Driver:
        """The driver's version and CUDA version; "" for what NVML does not tell."""
        try:
            version = _text(self._nvml.nvmlSystemGetDriverVersion())
        except Exception:
            version = ""
        try:
            cuda = cuda_text(int(self._nvml.nvmlSystemGetCudaDriverVersion()))
        except Exception:
            cuda = ""
        return Driver(version, cuda)

    def _power(self, handle: Any) -> float:
        """The enforced power limit in watts (what a budget must allow for); 0 where not supported."""
        try:
            return self._nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0
        except Exception:  # NVMLError_NotSupported on some boards: not counted
            return 0.0

    def usage(self) -> dict[int, GpuUsage]:
        """Utilisation and power draw per GPU index, read now (the metrics' scrape)."""
        nvml = self._nvml
        try:
            handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        except Exception as err:  # a driver hiccup: no figures this scrape
            log.warning("NVML reading failed: %s", err)
            return {}
        return {i: self._usage(h) for i, h in enumerate(handles)}

    def _usage(self, h: Any) -> GpuUsage:
        nvml = self._nvml
        return GpuUsage(
            _try(lambda: nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100.0),
            _try(lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
        )

    def gpus(self) -> list[Gpu]:
        try:
            self._last = self._read()
        except Exception as err:  # a driver hiccup must not empty the node
            log.warning("NVML reading failed; reporting the last one: %s", err)
        return list(self._last)


def cuda_text(version: int) -> str:
    """NVML's CUDA version number as text: 12040 -> "12.4"."""
    return f"{version // 1000}.{version % 1000 // 10}"


def node_driver(source: GpuSource, declared: Driver) -> Driver:
    """NVML's driver where the GPUs come from NVML (each field it does not tell: the declared one)."""
    if not isinstance(source, NvmlGpus):
        return declared
    found = source.driver()
    return Driver(found.version or declared.version, found.cuda or declared.cuda)


def _try(read: Callable[[], float]) -> float | None:
    try:
        return float(read())
    except Exception:  # NVMLError_NotSupported and the like: the board does not say
        return None


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def discover_gpus(node_id: str, declared: Sequence[GpuGroup], nvml: Nvml | None = None) -> GpuSource:
    """NVML's GPUs where a driver answers with some; the declared ones otherwise."""
    try:
        source = NvmlGpus(nvml)
    except Exception as err:  # no module, no driver, no device: all mean "not here"
        log.info("no GPUs through NVML (%s); using the %d declared", err, sum(g.count for g in declared))
        return DeclaredGpus(node_id, declared)
    if not source.gpus():
        return DeclaredGpus(node_id, declared)
    return source


def host_memory_bytes() -> int:
    """Physical memory of the host, as the kernel counts it."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
