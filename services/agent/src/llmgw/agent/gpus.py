"""What this node has to offer: its GPUs, host memory and CPU cores.

GPUs come through one seam, :class:`GpuSource`, because where they come from
differs by fleet: NVML on a machine with a driver (a later implementation),
the configuration file on a simulated or CPU-only fleet
(:class:`DeclaredGpus`, the only one today). The agent asks the source again
for every heartbeat, so a source that measures free memory reports it live.

Guarantees of :class:`DeclaredGpus`:

- indices run 0..n-1 over the declared groups in order, the numbering
  ``CUDA_VISIBLE_DEVICES`` and ``StartReplica.gpu_indices`` use;
- a GPU's uuid is stable for a node across agent restarts
  (``GPU-sim-<node>-<index>``) and distinct between nodes, so the control
  plane can tell a restarted node from a new one;
- free memory is reported as the total: nothing measures a declared GPU.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from .config import GpuGroup

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int


class GpuSource(Protocol):
    """Where a node's GPUs are read from."""

    def gpus(self) -> list[Gpu]: ...


class DeclaredGpus:
    """GPUs as the configuration declares them (simulated or CPU fleets)."""

    def __init__(self, node_id: str, groups: Sequence[GpuGroup]):
        gpus: list[Gpu] = []
        for group in groups:
            memory = int(group.memory_gb * GIB)
            for _ in range(group.count):
                index = len(gpus)
                gpus.append(Gpu(index, f"GPU-sim-{node_id}-{index}", group.name, memory, memory))
        self._gpus = tuple(gpus)

    def gpus(self) -> list[Gpu]:
        return list(self._gpus)


def host_memory_bytes() -> int:
    """Physical memory of the host, as the kernel counts it."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the whole host)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
