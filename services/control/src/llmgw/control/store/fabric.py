"""Fabric test results, kept in etcd: ``fabric/<node_a>/<node_b>``, one per pair.

Decisions: a result is a measurement, not a setting, so it has no history:
a new test of a pair replaces the old result. It lives in etcd rather than
in the leader's memory so every control plane lists it and it outlives the
leader (a fabric test moves gigabytes; nobody should have to run it again
after a failover to see its figures). The pair's key is its two node ids in
sorted order, so A-B and B-A are one pair. Stored values are the
FabricResult protobuf; one that does not parse is skipped with a warning.

Bound: at most :data:`MAX_RESULTS` are kept (a full mesh of 64 nodes, the
most one test measures). Nodes come and go, and a pair's result stays
until that pair is measured again, so after a test the oldest results
beyond the bound are deleted (:meth:`FabricResults.prune`, by
``measured_at``; unreadable ones first), and a listing that finds more
(a test still running) shows the newest. Results of departed nodes are
otherwise kept: a node that is away is not known to be gone for good, and
its figures are still the last word on its links.
"""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError

from llmgw.common.etcd import Delete, Put, Store, batches
from llmgw.v1 import fabric_pb2

log = logging.getLogger("llmgw.control.store.fabric")

PREFIX = "fabric/"
MAX_RESULTS = 64 * 63 // 2


def pair(a: str, b: str) -> tuple[str, str]:
    first, second = sorted((a, b))
    return first, second


class FabricResults:
    def __init__(self, store: Store):
        self._store = store

    async def put(self, result: fabric_pb2.FabricResult) -> None:
        a, b = pair(result.node_a, result.node_b)
        stored = fabric_pb2.FabricResult()
        stored.CopyFrom(result)
        stored.node_a, stored.node_b, stored.warning = a, b, ""
        await self._store.commit([], [Put(f"{PREFIX}{a}/{b}", stored.SerializeToString())])

    async def list(self) -> list[fabric_pb2.FabricResult]:
        """The newest :data:`MAX_RESULTS` results, by pair; unreadable ones skipped with a warning."""
        out = []
        for key, r in await _stored(self._store):
            if r is None:
                log.warning("skipping the stored fabric result %s: it does not parse", key)
            else:
                out.append(r)
        if len(out) > MAX_RESULTS:
            out = sorted(out, key=lambda r: r.measured_at)[-MAX_RESULTS:]
        return sorted(out, key=lambda r: (r.node_a, r.node_b))

    async def prune(self) -> int:
        """Delete all but the :data:`MAX_RESULTS` newest results; how many were deleted."""
        keep = MAX_RESULTS
        stored = await _stored(self._store)
        if len(stored) <= keep:
            return 0
        # Unreadable ones first, then by when they were measured.
        stored.sort(key=lambda kr: -1.0 if kr[1] is None else kr[1].measured_at)
        gone = [Delete(key) for key, _ in stored[: len(stored) - keep]]
        for batch in batches(gone):
            await self._store.commit([], batch)
        log.info("deleted the %d oldest fabric result(s); %d kept", len(gone), keep)
        return len(gone)


async def _stored(store: Store) -> list[tuple[str, fabric_pb2.FabricResult | None]]:
    """Every stored result by key; None for one that does not parse."""
    result = await store.range(PREFIX)
    out: list[tuple[str, fabric_pb2.FabricResult | None]] = []
    for e in result.entries:
        try:
            out.append((e.key, fabric_pb2.FabricResult.FromString(e.value)))
        except DecodeError:
            out.append((e.key, None))
    return out
