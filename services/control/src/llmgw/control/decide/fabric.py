"""Which fabric test results are far below their peers. Pure.

A pair is judged against the *other* measured pairs (never itself, so one
bad link cannot drag its own yardstick down): its bandwidth below
:data:`BANDWIDTH_FRACTION` of their median, or its latency above
:data:`LATENCY_FACTOR` times theirs, is a warning worded for the operator.
With fewer than :data:`MIN_PEERS` other measured pairs there is no
yardstick and nothing is said. A pair that failed is not judged (its error
says enough) and is no one's peer.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from llmgw.v1 import fabric_pb2

BANDWIDTH_FRACTION = 0.5
LATENCY_FACTOR = 3.0
MIN_PEERS = 2


def judge(results: Sequence[fabric_pb2.FabricResult]) -> list[fabric_pb2.FabricResult]:
    """Copies of ``results`` with ``warning`` set where a pair is far off its peers."""
    measured = [r for r in results if not r.error and r.bandwidth_bytes_per_second > 0]
    out = []
    for r in results:
        judged = fabric_pb2.FabricResult()
        judged.CopyFrom(r)
        judged.warning = ""
        if not r.error and r.bandwidth_bytes_per_second > 0:
            peers = [p for p in measured if (p.node_a, p.node_b) != (r.node_a, r.node_b)]
            judged.warning = _warning(r, peers)
        out.append(judged)
    return out


def _warning(r: fabric_pb2.FabricResult, peers: Sequence[fabric_pb2.FabricResult]) -> str:
    if len(peers) < MIN_PEERS:
        return ""
    said = []
    bandwidth = statistics.median(p.bandwidth_bytes_per_second for p in peers)
    if r.bandwidth_bytes_per_second < BANDWIDTH_FRACTION * bandwidth:
        said.append(
            f"bandwidth {r.bandwidth_bytes_per_second / bandwidth:.0%} of the median of "
            f"{len(peers)} other pairs"
        )
    latency = statistics.median(p.latency_seconds for p in peers)
    if latency > 0 and r.latency_seconds > LATENCY_FACTOR * latency:
        said.append(f"latency {r.latency_seconds / latency:.1f}x the median of {len(peers)} other pairs")
    return "; ".join(said)
