"""Adoption: which engines a restarted agent finds still running, and what it clears.

An agent that exits (or is killed) leaves its engines serving, each with a
``replica.json`` record (:mod:`.statefile`) in its replica directory.
:func:`engines_to_adopt` reads those directories once, before the first
Register, and decides: an engine whose record names a process that is still
the one spawned (pid, start time, boot id; see :mod:`.processes`) is to be
taken over as the same replica. Every other directory is removed, after
SIGKILL to what is left of a group whose leader is gone, so a dead engine's
workers free their GPUs.

This module only reads the disk and clears it. Taking over is
:meth:`.Supervisor.adopt`'s: it probes each engine (READY at once when
``/health`` answers, else STARTING with what is left of its start timeout)
and supervises it like any other from then on (stopped through its group;
its exit, seen by polling ``/proc`` since it is not the agent's child, makes
it FAILED). The control plane decides the rest: a reported replica it has
no record of is an orphan and it sends StopReplica.

An adopted replica's spec has no engine key (the record keeps a
fingerprint only), so until a StartReplica brings the key back
(:meth:`.Supervisor.start` checks it against the fingerprint), its probes
use ``/health`` alone, which vLLM, SGLang, llama.cpp and the simulator all
serve without the key.
"""

from __future__ import annotations

import logging
import shutil
import signal
from collections.abc import Container
from pathlib import Path

from . import statefile
from .processes import boot_id, group_alive, process_start_ticks, same_process, signal_group

log = logging.getLogger("llmgw.agent.adoption")


def engines_to_adopt(replicas_dir: Path, known: Container[str] = ()) -> list[statefile.EngineRecord]:
    """The records of engines still running from this boot, by replica id; every other dir is removed.

    Directories named in ``known`` (replicas the agent already runs) are
    left alone.
    """
    if not replicas_dir.is_dir():
        return []
    this_boot = boot_id()
    found: list[statefile.EngineRecord] = []
    for d in sorted(p for p in replicas_dir.iterdir() if p.is_dir()):
        if d.name in known:
            continue
        record = statefile.read(d)
        if record is None or record.boot_id != this_boot:
            log.info("replica dir %s: no engine from this boot to adopt; removing it", d)
            shutil.rmtree(d, ignore_errors=True)
            continue
        if not same_process(record.pid, record.start_ticks):
            if process_start_ticks(record.pid) is None and group_alive(record.pid):
                # The leader is gone and nobody took its pid; the group's
                # leftovers (an engine's workers) still hold its GPUs.
                signal_group(record.pid, signal.SIGKILL)
            log.info("replica %s: engine pid %d is gone; removing its dir", record.replica_id, record.pid)
            shutil.rmtree(d, ignore_errors=True)
            continue
        found.append(record)
    return found
