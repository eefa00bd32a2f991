"""Fabric test results, kept in etcd: ``fabric/<node_a>/<node_b>``, one per pair.

Decisions: a result is a measurement, not a setting, so it has no history:
a new test of a pair replaces the old result. It lives in etcd rather than
in the leader's memory so every control plane lists it and it outlives the
leader (a fabric test moves gigabytes; nobody should have to run it again
after a failover to see its figures). The pair's key is its two node ids in
sorted order, so A-B and B-A are one pair. Stored values are the
FabricResult protobuf; one that does not parse is skipped with a warning.
At most :data:`MAX_RESULTS` are listed (a full mesh of 64 nodes).
"""

from __future__ import annotations

import logging

from google.protobuf.message import DecodeError

from llmgw.common.etcd import Put, Store
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
        result = await self._store.range(PREFIX)
        out = []
        for e in result.entries[:MAX_RESULTS]:
            try:
                out.append(fabric_pb2.FabricResult.FromString(e.value))
            except DecodeError as err:
                log.warning("skipping the stored fabric result %s: %s", e.key, err)
        return sorted(out, key=lambda r: (r.node_a, r.node_b))
