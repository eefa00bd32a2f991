"""What each node's weights cache holds, as its agent last reported it.

Soft state, like the inventory: rebuilt from Register and Heartbeat
snapshots within a heartbeat after a change of leader, updated between
heartbeats by WeightsStatus messages (fetch progress), never written to
etcd. Kept apart from the inventory on purpose: placement needs only
:meth:`WeightsTable.holders` (which nodes hold a source, ready to use), and
the admin API the rest. The tie-break the decision applies to placement's
choice with them is :func:`~llmgw.control.decide.placement.prefer_holders`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llmgw.v1 import agent_pb2

_READY = agent_pb2.WEIGHTS_STATE_READY


class WeightsTable:
    """Node id -> weights name -> WeightsStatus. Single event loop."""

    def __init__(self) -> None:
        self._nodes: dict[str, dict[str, agent_pb2.WeightsStatus]] = {}

    def replace(self, node_id: str, statuses: Iterable[agent_pb2.WeightsStatus]) -> None:
        """A snapshot from Register or Heartbeat: the node holds exactly these."""
        self._nodes[node_id] = {s.name: s for s in statuses}

    def update(self, node_id: str, status: agent_pb2.WeightsStatus) -> None:
        self._nodes.setdefault(node_id, {})[status.name] = status

    def forget(self, node_id: str, name: str) -> None:
        self._nodes.get(node_id, {}).pop(name, None)

    def clear(self) -> None:
        self._nodes.clear()

    def of(self, node_id: str) -> list[agent_pb2.WeightsStatus]:
        return sorted(self._nodes.get(node_id, {}).values(), key=lambda s: s.name)

    def node_ids(self) -> list[str]:
        return sorted(self._nodes)

    def holders(self) -> Mapping[str, frozenset[str]]:
        """Source -> the nodes that hold it ready to use (what placement prefers)."""
        out: dict[str, set[str]] = {}
        for node_id, entries in self._nodes.items():
            for s in entries.values():
                if s.state == _READY:
                    out.setdefault(s.source, set()).add(node_id)
        return {source: frozenset(nodes) for source, nodes in out.items()}
