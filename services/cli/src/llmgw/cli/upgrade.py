"""``llmgw nodes upgrade --version V --command PATH [NODE ...]``: roll agents to a new version.

The rollout is this command's: one node at a time, in the order given (all
nodes the leader knows, by id, when none is named), each through
``NodeAdminService.UpgradeAgent``, which returns once that node's new agent
is back healthy with every engine adopted (see the control plane's
api/upgrades.py). The first node that fails stops the rollout: the nodes
after it are not touched, and the command exits 1 naming the node, the
reason, what was upgraded and what was not attempted. Running it again
resumes: nodes already at the version answer at once.
"""

from __future__ import annotations

import shlex
from argparse import Namespace

import grpc

from llmgw.v1 import admin_pb2, admin_pb2_grpc, nodeadmin_pb2, nodeadmin_pb2_grpc

from .connection import AdminError, Target, channel

# The CLI waits a little longer than the control plane does for one node.
MARGIN_SECONDS = 90.0


def upgrade(args: Namespace) -> str:
    if not args.version:
        raise AdminError("nodes upgrade needs --version: the version the new agent reports")
    command = shlex.split(args.agent_command or "")
    if not command:
        raise AdminError(
            "nodes upgrade needs --command: the new agent's program on each node, an absolute path "
            "(such as /opt/llmgw/0.9.0/bin/llmgw-agent)"
        )
    target = Target.from_args(args)
    named = [n for n in (args.node, *args.labels) if n]
    done: list[str] = []
    with channel(target) as ch:
        if named:
            nodes = named
        else:
            listed = target.call(
                "nodes upgrade", admin_pb2_grpc.AdminServiceStub(ch).ListNodes, admin_pb2.ListNodesRequest()
            )
            nodes = sorted(n.node_id for n in listed.nodes)
        if not nodes:
            raise AdminError("nodes upgrade: the leader knows no node")
        stub = nodeadmin_pb2_grpc.NodeAdminServiceStub(ch)
        for i, node in enumerate(nodes):
            request = nodeadmin_pb2.UpgradeAgentRequest(
                node_id=node, version=args.version, command=command, timeout_seconds=args.timeout
            )
            try:
                msg = stub.UpgradeAgent(
                    request, timeout=args.timeout + MARGIN_SECONDS, metadata=target.metadata
                )
            except grpc.RpcError as err:
                details = err.details() or ""
                # The control plane's own DEADLINE_EXCEEDED names the node and why; the CLI's does not.
                reason = (
                    details
                    if details.startswith(f"node {node}")
                    else str(target.error(err, f"upgrade of {node}"))
                )
                left = ", ".join(nodes[i + 1 :]) or "none"
                raise AdminError(
                    f"rollout stopped at node {node}: {reason}\n"
                    f"  upgraded: {', '.join(done) or 'none'}\n  not attempted: {left}"
                ) from None
            if msg.seconds == 0 and msg.previous_version == msg.version:
                line = f"{node}: already at {msg.version}"
            else:
                line = (
                    f"{node}: {msg.previous_version or '?'} -> {msg.version} in {msg.seconds:.1f}s, "
                    f"{len(msg.adopted)} engine(s) adopted with the same PIDs"
                )
            done.append(node)
            print(line, flush=True)
    return f"rollout done: {len(done)} node(s) at {args.version}"
