"""The agent's types in and out of ``llmgw.v1`` messages, in one place.

Only the connection speaks protobuf; it calls these functions at the edge
of the stream. ``Register`` and ``Heartbeat`` are built from snapshots taken
when the message is built, so each one is whole on its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from llmgw.v1 import agent_pb2 as pb

from .adapters import AdapterRef, LoraSpec
from .engines import BuildInfo
from .gpus import Driver, Gpu
from .replicas import ReplicaSpec, ReplicaState, ReplicaStatus
from .weights import WeightsEntry, WeightsState

_STATES = {
    ReplicaState.STARTING: pb.REPLICA_STATE_STARTING,
    ReplicaState.READY: pb.REPLICA_STATE_READY,
    ReplicaState.FAILED: pb.REPLICA_STATE_FAILED,
    ReplicaState.STOPPING: pb.REPLICA_STATE_STOPPING,
    ReplicaState.STOPPED: pb.REPLICA_STATE_STOPPED,
}

_WEIGHTS_STATES = {
    WeightsState.FETCHING: pb.WEIGHTS_STATE_FETCHING,
    WeightsState.READY: pb.WEIGHTS_STATE_READY,
    WeightsState.FAILED: pb.WEIGHTS_STATE_FAILED,
}


@dataclass(frozen=True)
class NodeInfo:
    """What Register says about the node besides its GPUs and replicas."""

    node_id: str
    address: str  # where routers reach this node's engines
    version: str
    memory_bytes: int
    cpu_cores: int
    labels: Mapping[str, str] = field(default_factory=dict)
    builds: Sequence[BuildInfo] = ()
    driver: Driver = Driver()


def gpu_message(gpu: Gpu) -> pb.Gpu:
    return pb.Gpu(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        memory_total_bytes=gpu.memory_total_bytes,
        memory_free_bytes=gpu.memory_free_bytes,
        power_watts=gpu.power_watts,
        compute_capability=gpu.compute_capability,
    )


def status_message(status: ReplicaStatus) -> pb.ReplicaStatus:
    return pb.ReplicaStatus(
        replica_id=status.replica_id,
        model=status.model,
        state=_STATES[status.state],
        url=status.url,
        message=status.message,
        pid=status.pid,
        gpu_indices=list(status.gpu_indices),
        served_name=status.served_name,
        engine=status.engine,
        adapters=sorted(status.adapters),
    )


def weights_message(entry: WeightsEntry) -> pb.WeightsStatus:
    return pb.WeightsStatus(
        name=entry.name,
        source=entry.source,
        state=_WEIGHTS_STATES[entry.state],
        path=entry.path,
        size_bytes=entry.size_bytes,
        fetched_bytes=entry.fetched_bytes,
        total_bytes=entry.total_bytes,
        message=entry.message,
        in_place=entry.in_place,
    )


def weights(entry: WeightsEntry) -> pb.AgentMessage:
    return pb.AgentMessage(weights=weights_message(entry))


def register(
    node: NodeInfo,
    gpus: Sequence[Gpu],
    replicas: Iterable[ReplicaStatus],
    weights: Sequence[pb.WeightsStatus] = (),
) -> pb.AgentMessage:
    return pb.AgentMessage(
        register=pb.Register(
            node_id=node.node_id,
            address=node.address,
            labels=dict(node.labels),
            gpus=[gpu_message(g) for g in gpus],
            engines=[
                pb.EngineInfo(kind=b.kind, version=b.version, build=b.build, program=b.program, cuda=b.cuda)
                for b in node.builds
            ],
            driver_version=node.driver.version,
            cuda_version=node.driver.cuda,
            version=node.version,
            memory_bytes=node.memory_bytes,
            cpu_cores=node.cpu_cores,
            replicas=[status_message(r) for r in replicas],
            weights=list(weights),
        )
    )


def heartbeat(
    replicas: Iterable[ReplicaStatus], gpus: Sequence[Gpu], weights: Sequence[pb.WeightsStatus] = ()
) -> pb.AgentMessage:
    return pb.AgentMessage(
        heartbeat=pb.Heartbeat(
            replicas=[status_message(r) for r in replicas],
            gpus=[gpu_message(g) for g in gpus],
            weights=list(weights),
        )
    )


def status(status: ReplicaStatus) -> pb.AgentMessage:
    return pb.AgentMessage(status=status_message(status))


def spec_from_start(cmd: pb.StartReplica) -> ReplicaSpec:
    return ReplicaSpec(
        replica_id=cmd.replica_id,
        model=cmd.model,
        engine=cmd.engine,
        # A control plane that leaves the served name out means the model's.
        served_name=cmd.served_name or cmd.model,
        gpu_indices=tuple(cmd.gpu_indices),
        engine_key=cmd.engine_key,
        engine_args=dict(cmd.engine_args),
        lora=LoraSpec(
            max_loras=max(1, cmd.lora.max_loras),
            max_rank=max(1, cmd.lora.max_lora_rank),
            adapters=adapters_from(cmd.lora.adapters),
        )
        if cmd.HasField("lora")
        else None,
        build=cmd.build,
    )


def adapters_from(adapters: Iterable[pb.Adapter]) -> tuple[AdapterRef, ...]:
    return tuple(AdapterRef(a.name, a.source) for a in adapters if a.name and a.source)
