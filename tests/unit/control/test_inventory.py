"""Node states in the inventory: ready, unreachable at once or after silence, lost, back."""

from __future__ import annotations

from llmgw.control.config import ControlConfig
from llmgw.control.decide.reconcile import PlanSettings
from llmgw.control.state.inventory import Inventory, NodeState
from llmgw.v1 import agent_pb2

T0 = 1000.0


def reg(node="a") -> agent_pb2.Register:
    return agent_pb2.Register(node_id=node, gpus=[agent_pb2.Gpu(index=0)])


def state(inv: Inventory, node="a") -> NodeState:
    n = inv.get(node)
    assert n is not None
    return n.state


def test_a_stream_that_ends_makes_the_node_unreachable_at_once_not_after_the_timeout():
    inv = Inventory(node_timeout=3, node_lost=10)
    inv.register(reg(), T0)
    assert inv.disconnect("a", T0 + 0.1) is True
    assert state(inv) is NodeState.UNREACHABLE
    assert inv.get("a").unreachable_since == T0 + 0.1
    assert inv.disconnect("a", T0 + 0.2) is False, "a second end changes nothing"


def test_silence_past_the_timeout_makes_a_node_unreachable_and_a_heartbeat_keeps_it_ready():
    inv = Inventory(node_timeout=3, node_lost=10)
    inv.register(reg(), T0)
    inv.heartbeat("a", agent_pb2.Heartbeat(), T0 + 2)
    assert inv.expire(T0 + 4.9) == []
    assert state(inv) is NodeState.READY
    assert inv.expire(T0 + 5.1) == ["a"]
    assert state(inv) is NodeState.UNREACHABLE
    assert inv.get("a").unreachable_since == T0 + 5.1


def test_unreachable_past_node_lost_is_lost_and_a_register_brings_it_back():
    inv = Inventory(node_timeout=3, node_lost=10)
    inv.register(reg(), T0)
    inv.disconnect("a", T0)
    inv.expire(T0 + 9.9)
    assert state(inv) is NodeState.UNREACHABLE
    assert inv.expire(T0 + 10) == [], "only newly unreachable nodes are returned"
    assert state(inv) is NodeState.LOST
    assert not inv.get("a").ready
    assert inv.disconnect("a", T0 + 11) is False
    assert inv.get("a").unreachable_since == T0, "lost keeps when it stopped being ready"
    inv.register(reg(), T0 + 20)
    assert state(inv) is NodeState.READY and inv.get("a").unreachable_since is None


def test_expected_nodes_become_lost_too_when_they_never_reconnect():
    inv = Inventory(node_timeout=3, node_lost=10)
    inv.expect(["b"], T0)
    inv.expire(T0 + 10)
    assert state(inv, "b") is NodeState.LOST


def test_without_a_lost_threshold_a_node_stays_unreachable():
    inv = Inventory(node_timeout=3)
    inv.register(reg(), T0)
    inv.disconnect("a", T0)
    inv.expire(T0 + 1e6)
    assert state(inv) is NodeState.UNREACHABLE


def test_default_timings_detect_a_silent_node_within_3_seconds():
    cfg = ControlConfig(cluster_secret_file="/dev/null", tls={"plaintext": True})
    assert cfg.node_timeout_seconds <= 3
    # The heartbeat an agent is told to use leaves room for two missed beats.
    assert min(cfg.heartbeat_interval_seconds, cfg.node_timeout_seconds / 3) * 3 <= cfg.node_timeout_seconds
    assert 10 <= cfg.node_lost_seconds <= 15
    assert PlanSettings().node_lost_seconds == cfg.node_lost_seconds
