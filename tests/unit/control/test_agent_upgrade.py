"""The control plane's side of one node's upgrade: when the new agent counts as back healthy.

``AgentUpgrade`` over a fleet whose node changes as a real hand-over
changes it (the old agent's stream ends, the new one registers), and a
relay that records what was sent to the agent. The same over real
processes: tests/integration/test_builds_and_upgrade.py.
"""

from __future__ import annotations

import dataclasses

import grpc
import pytest

from llmgw.common.errors import FailedPrecondition, InvalidArgument
from llmgw.control.api.upgrades import AgentUpgrade, NotBack, not_back
from llmgw.control.state.inventory import Node, NodeState, ReportedReplica
from llmgw.v1 import agent_pb2, nodeadmin_pb2

READY = agent_pb2.REPLICA_STATE_READY
STARTING = agent_pb2.REPLICA_STATE_STARTING


def node(version: str = "1.0", state: NodeState = NodeState.READY, **pids: int) -> Node:
    reps = {rid: ReportedReplica(rid, "m", READY, pid=pid) for rid, pid in pids.items()}
    return Node("n1", state, 0.0, version=version, replicas=reps)


def test_not_back_until_the_new_version_registered_with_every_engine_ready_under_its_old_pid():
    pids = {"r1": 100, "r2": 200}
    assert "no agent has registered" in not_back(
        node(state=NodeState.UNREACHABLE, r1=100, r2=200), "2.0", pids
    )
    assert "registered as version '1.0', not '2.0'" in not_back(node("1.0", r1=100, r2=200), "2.0", pids)
    assert "replica r2 (engine pid 200) is not reported" in not_back(node("2.0", r1=100), "2.0", pids)
    assert "runs engine pid 201, not 200: its engine was restarted" in not_back(
        node("2.0", r1=100, r2=201), "2.0", pids
    )
    starting = node("2.0", r1=100, r2=200)
    starting = dataclasses.replace(
        starting, replicas={**starting.replicas, "r2": ReportedReplica("r2", "m", STARTING, pid=200)}
    )
    assert not_back(starting, "2.0", pids) == "replica r2 is starting, not ready"
    assert not_back(node("2.0", r1=100, r2=200), "2.0", pids) == ""
    assert not_back(None, "2.0", pids) == "the node is no longer known to the leader"


class Fleet:
    def __init__(self, now: Node):
        self.now = now
        self.after_handover: list[Node] = []

    def nodes(self) -> list[Node]:
        if self.after_handover:
            self.now = self.after_handover.pop(0)
        return [self.now]


def request(**kw) -> nodeadmin_pb2.UpgradeAgentRequest:
    kw.setdefault("node_id", "n1")
    kw.setdefault("version", "2.0")
    kw.setdefault("command", ["/opt/llmgw/2.0/bin/llmgw-agent"])
    return nodeadmin_pb2.UpgradeAgentRequest(**kw)


async def test_the_agent_is_asked_once_and_the_answer_waits_for_the_new_agent_with_the_same_engines():
    fleet = Fleet(node("1.0", r1=100))
    sent: list[agent_pb2.ControlMessage] = []

    async def ask(node_id, build):
        sent.append(build("req-1"))
        # What follows a hand-over: the stream ends, then the new agent registers.
        fleet.after_handover = [node("1.0", NodeState.UNREACHABLE, r1=100), node("2.0", r1=100)]
        return agent_pb2.AgentReply(request_id="req-1")

    done = await AgentUpgrade(fleet, ask).run(request())
    assert [m.upgrade_agent.command for m in sent] == [["/opt/llmgw/2.0/bin/llmgw-agent"]]
    assert (done.previous_version, done.version, list(done.adopted)) == ("1.0", "2.0", ["r1"])
    # Already there: answered at once, nothing sent.
    again = await AgentUpgrade(fleet, ask).run(request())
    assert again.seconds == 0 and len(sent) == 1


async def test_a_new_agent_not_back_in_time_is_a_deadline_with_what_is_missing():
    fleet = Fleet(node("1.0", r1=100))

    async def ask(node_id, build):
        fleet.after_handover = [node("1.0", NodeState.UNREACHABLE, r1=100)]
        return agent_pb2.AgentReply()

    with pytest.raises(NotBack, match="within 0.3s: no agent has registered since the hand-over") as err:
        await AgentUpgrade(fleet, ask).run(request(timeout_seconds=0.3))
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_a_node_that_is_not_ready_or_a_request_without_a_program_is_refused_before_asking():
    async def ask(node_id, build):
        raise AssertionError("nothing may be sent")

    with pytest.raises(FailedPrecondition, match="is unreachable: its agent must be connected"):
        await AgentUpgrade(Fleet(node(state=NodeState.UNREACHABLE)), ask).run(request())
    with pytest.raises(InvalidArgument, match="absolute path"):
        await AgentUpgrade(Fleet(node()), ask).run(request(command=["llmgw-agent"]))
    with pytest.raises(InvalidArgument, match="timeout_seconds"):
        await AgentUpgrade(Fleet(node()), ask).run(request(timeout_seconds=601))
