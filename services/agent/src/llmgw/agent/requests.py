"""Operator requests the control plane relays to this node: a replica's log, weights, an upgrade,
fabric tests.

Each GetLogs, FetchWeights, RemoveWeights or UpgradeAgent is answered with exactly one
AgentReply carrying the same request_id, OK or a gRPC status code and a
message that says what to fix (the control plane hands both to the
operator unchanged). Nothing here blocks the event loop for long: the log
is read from its end, and deleting weights runs in a thread. An accepted
UpgradeAgent (:mod:`.upgrade`) asks for the hand-over in the same event-loop
step as its answer is returned, so the connection queues the answer before
the stream's end.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

import grpc

from llmgw.common.errors import InvalidArgument, LlmgwError, NotFound
from llmgw.v1 import agent_pb2 as pb

from . import messages
from .fabric import FabricTests, probe
from .upgrade import Upgrader
from .weights import WeightsCache

MAX_LOG_LINES = 10_000
DEFAULT_LOG_LINES = 100
# Read at most this much of a log's end: 10,000 long lines fit, a runaway log does not load whole.
MAX_LOG_BYTES = 8 * 1024 * 1024


class ReplicaFiles(Protocol):
    """What requests need of the supervisor."""

    def log_path(self, replica_id: str) -> Path | None: ...

    def uses_weights(self, source: str) -> bool: ...


def last_lines(path: Path, n: int) -> list[str]:
    """The last ``n`` lines of ``path``, reading backwards in blocks from its end."""
    block = 64 * 1024
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell()
        pos, data = end, b""
        while pos > 0 and data.count(b"\n") <= n and end - pos < MAX_LOG_BYTES:
            step = min(block, pos)
            pos -= step
            f.seek(pos)
            data = f.read(step) + data
    lines = data.decode(errors="replace").splitlines()
    if pos > 0 and lines:
        lines = lines[1:]  # the first one is cut
    return lines[-n:] if n else []


class NodeRequests:
    def __init__(
        self,
        replicas: ReplicaFiles,
        weights: WeightsCache,
        upgrader: Upgrader | None = None,
        fabric: FabricTests | None = None,
        nccl: str = "",
    ):
        self._replicas = replicas
        self._weights = weights
        self._upgrader = upgrader
        self._fabric = fabric
        # Whether NCCL's tests could run here (fabric.nccl_status), said with each probe.
        self._nccl = nccl

    def weights_snapshot(self) -> list[pb.WeightsStatus]:
        return [messages.weights_message(e) for e in self._weights.snapshot()]

    async def answer(self, msg: pb.ControlMessage) -> pb.AgentMessage:
        kind = msg.WhichOneof("msg")
        request = getattr(msg, kind)
        reply = pb.AgentReply(request_id=request.request_id)
        try:
            if kind == "get_logs":
                reply.lines.extend(self._logs(request))
            elif kind == "fetch_weights":
                entry = self._weights.fetch(request.source, request.name)
                reply.weights.CopyFrom(messages.weights_message(entry))
            elif kind == "remove_weights":
                entry = await self._weights.remove(request.name, self._replicas.uses_weights)
                reply.weights.CopyFrom(messages.weights_message(entry))
            elif kind == "upgrade_agent" and self._upgrader is not None:
                handover = await self._upgrader.check(request.version, list(request.command))
                # No await from here until the caller queues the answer (see the docstring).
                self._upgrader.hand_over(handover)
            elif kind == "fabric_listen" and self._fabric is not None:
                port = await self._fabric.listen(
                    request.token, request.max_bytes, request.max_pings, request.timeout_seconds
                )
                reply.fabric.port = port
            elif kind == "fabric_probe":
                m = await probe(
                    request.host,
                    request.port,
                    request.token,
                    request.bytes,
                    request.pings,
                    request.timeout_seconds,
                )
                reply.fabric.CopyFrom(
                    pb.FabricMeasurement(
                        bandwidth_bytes_per_second=m.bandwidth_bytes_per_second,
                        latency_seconds=m.latency_seconds,
                        bytes=m.bytes,
                        pings=m.pings,
                        method="tcp",
                        nccl=self._nccl,
                    )
                )
            else:
                raise InvalidArgument(f"this agent does not answer {kind!r}")
        except LlmgwError as err:
            reply.code, reply.error = err.code.value[0], str(err)
        except OSError as err:
            reply.code = grpc.StatusCode.INTERNAL.value[0]
            reply.error = f"{type(err).__name__}: {err}"
        return pb.AgentMessage(reply=reply)

    def _logs(self, request: pb.GetLogs) -> list[str]:
        n = request.lines or DEFAULT_LOG_LINES
        if not 0 < n <= MAX_LOG_LINES:
            raise InvalidArgument(f"lines must be between 1 and {MAX_LOG_LINES}, not {n}")
        path = self._replicas.log_path(request.replica_id)
        if path is None or not path.exists():
            raise NotFound(f"replica {request.replica_id!r} has no engine log on this node")
        return last_lines(path, n)
