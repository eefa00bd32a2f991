from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from llmgw.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class PutModelRequest(_message.Message):
    __slots__ = ("document", "if_revision")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    IF_REVISION_FIELD_NUMBER: _ClassVar[int]
    document: str
    if_revision: int
    def __init__(self, document: _Optional[str] = ..., if_revision: _Optional[int] = ...) -> None: ...

class ModelDocument(_message.Message):
    __slots__ = ("name", "document", "origin", "revision")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    REVISION_FIELD_NUMBER: _ClassVar[int]
    name: str
    document: str
    origin: str
    revision: int
    def __init__(self, name: _Optional[str] = ..., document: _Optional[str] = ..., origin: _Optional[str] = ..., revision: _Optional[int] = ...) -> None: ...

class RemoveModelRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class RemoveModelResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetClusterStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterStatus(_message.Message):
    __slots__ = ("cluster", "control_id", "leader", "leader_id", "leader_address", "nodes", "models", "replicas", "ready_replicas", "endpoint_revision", "placement_problems", "settings_version", "restart_pending")
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    CONTROL_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINT_REVISION_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_PROBLEMS_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESTART_PENDING_FIELD_NUMBER: _ClassVar[int]
    cluster: str
    control_id: str
    leader: bool
    leader_id: str
    leader_address: str
    nodes: int
    models: int
    replicas: int
    ready_replicas: int
    endpoint_revision: int
    placement_problems: _containers.RepeatedScalarFieldContainer[str]
    settings_version: int
    restart_pending: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, cluster: _Optional[str] = ..., control_id: _Optional[str] = ..., leader: _Optional[bool] = ..., leader_id: _Optional[str] = ..., leader_address: _Optional[str] = ..., nodes: _Optional[int] = ..., models: _Optional[int] = ..., replicas: _Optional[int] = ..., ready_replicas: _Optional[int] = ..., endpoint_revision: _Optional[int] = ..., placement_problems: _Optional[_Iterable[str]] = ..., settings_version: _Optional[int] = ..., restart_pending: _Optional[_Iterable[str]] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ModelStatus(_message.Message):
    __slots__ = ("name", "aliases", "engine", "gpus", "min_replicas", "replicas", "ready_replicas", "placement_message", "origin", "capacity_class", "max_replicas", "fallbacks", "canary", "canary_percent", "desired_replicas", "scaling_reason", "rollout", "eval_gate")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MIN_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    MAX_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    CANARY_PERCENT_FIELD_NUMBER: _ClassVar[int]
    DESIRED_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    SCALING_REASON_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    EVAL_GATE_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    engine: str
    gpus: int
    min_replicas: int
    replicas: int
    ready_replicas: int
    placement_message: str
    origin: str
    capacity_class: str
    max_replicas: int
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    canary: str
    canary_percent: float
    desired_replicas: int
    scaling_reason: str
    rollout: str
    eval_gate: str
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., engine: _Optional[str] = ..., gpus: _Optional[int] = ..., min_replicas: _Optional[int] = ..., replicas: _Optional[int] = ..., ready_replicas: _Optional[int] = ..., placement_message: _Optional[str] = ..., origin: _Optional[str] = ..., capacity_class: _Optional[str] = ..., max_replicas: _Optional[int] = ..., fallbacks: _Optional[_Iterable[str]] = ..., canary: _Optional[str] = ..., canary_percent: _Optional[float] = ..., desired_replicas: _Optional[int] = ..., scaling_reason: _Optional[str] = ..., rollout: _Optional[str] = ..., eval_gate: _Optional[str] = ...) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelStatus]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelStatus, _Mapping]]] = ...) -> None: ...

class ListNodesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeStatus(_message.Message):
    __slots__ = ("node_id", "address", "state", "gpus", "used_gpu_indices", "labels", "engines", "last_seen_seconds_ago", "held", "hold_reason", "memory_bytes", "cpu_cores", "version", "driver_version", "cuda_version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    USED_GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLD_REASON_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    state: str
    gpus: _containers.RepeatedCompositeFieldContainer[_agent_pb2.Gpu]
    used_gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    labels: _containers.ScalarMap[str, str]
    engines: _containers.RepeatedCompositeFieldContainer[_agent_pb2.EngineInfo]
    last_seen_seconds_ago: float
    held: bool
    hold_reason: str
    memory_bytes: int
    cpu_cores: float
    version: str
    driver_version: str
    cuda_version: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., state: _Optional[str] = ..., gpus: _Optional[_Iterable[_Union[_agent_pb2.Gpu, _Mapping]]] = ..., used_gpu_indices: _Optional[_Iterable[int]] = ..., labels: _Optional[_Mapping[str, str]] = ..., engines: _Optional[_Iterable[_Union[_agent_pb2.EngineInfo, _Mapping]]] = ..., last_seen_seconds_ago: _Optional[float] = ..., held: _Optional[bool] = ..., hold_reason: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpu_cores: _Optional[float] = ..., version: _Optional[str] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class ListNodesResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeStatus]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeStatus, _Mapping]]] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class ReplicaInfo(_message.Message):
    __slots__ = ("replica_id", "model", "node_id", "state", "url", "gpu_indices", "message", "engine")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    node_id: str
    state: _agent_pb2.ReplicaState
    url: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    message: str
    engine: str
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., node_id: _Optional[str] = ..., state: _Optional[_Union[_agent_pb2.ReplicaState, str]] = ..., url: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., message: _Optional[str] = ..., engine: _Optional[str] = ...) -> None: ...

class ReplicaFailure(_message.Message):
    __slots__ = ("model", "replica_id", "node_id", "failures", "retry_in_seconds", "last_error")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    RETRY_IN_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    model: str
    replica_id: str
    node_id: str
    failures: int
    retry_in_seconds: float
    last_error: str
    def __init__(self, model: _Optional[str] = ..., replica_id: _Optional[str] = ..., node_id: _Optional[str] = ..., failures: _Optional[int] = ..., retry_in_seconds: _Optional[float] = ..., last_error: _Optional[str] = ...) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas", "failures")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaInfo]
    failures: _containers.RepeatedCompositeFieldContainer[ReplicaFailure]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaInfo, _Mapping]]] = ..., failures: _Optional[_Iterable[_Union[ReplicaFailure, _Mapping]]] = ...) -> None: ...

class ListRoutersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RouterStatus(_message.Message):
    __slots__ = ("router_id", "last_report_seconds_ago", "interval_seconds", "in_flight", "pending", "requests", "client_errors", "server_errors", "requests_per_second", "client_errors_per_second", "server_errors_per_second", "window_seconds")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_REPORT_SECONDS_AGO_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ERRORS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SERVER_ERRORS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    last_report_seconds_ago: float
    interval_seconds: float
    in_flight: int
    pending: int
    requests: int
    client_errors: int
    server_errors: int
    requests_per_second: float
    client_errors_per_second: float
    server_errors_per_second: float
    window_seconds: float
    def __init__(self, router_id: _Optional[str] = ..., last_report_seconds_ago: _Optional[float] = ..., interval_seconds: _Optional[float] = ..., in_flight: _Optional[int] = ..., pending: _Optional[int] = ..., requests: _Optional[int] = ..., client_errors: _Optional[int] = ..., server_errors: _Optional[int] = ..., requests_per_second: _Optional[float] = ..., client_errors_per_second: _Optional[float] = ..., server_errors_per_second: _Optional[float] = ..., window_seconds: _Optional[float] = ...) -> None: ...

class ModelTrafficStatus(_message.Message):
    __slots__ = ("model", "load", "pending", "requests_per_second", "client_errors_per_second", "server_errors_per_second")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ERRORS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    SERVER_ERRORS_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    model: str
    load: float
    pending: int
    requests_per_second: float
    client_errors_per_second: float
    server_errors_per_second: float
    def __init__(self, model: _Optional[str] = ..., load: _Optional[float] = ..., pending: _Optional[int] = ..., requests_per_second: _Optional[float] = ..., client_errors_per_second: _Optional[float] = ..., server_errors_per_second: _Optional[float] = ...) -> None: ...

class ListRoutersResponse(_message.Message):
    __slots__ = ("routers", "models", "window_seconds")
    ROUTERS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    routers: _containers.RepeatedCompositeFieldContainer[RouterStatus]
    models: _containers.RepeatedCompositeFieldContainer[ModelTrafficStatus]
    window_seconds: float
    def __init__(self, routers: _Optional[_Iterable[_Union[RouterStatus, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[ModelTrafficStatus, _Mapping]]] = ..., window_seconds: _Optional[float] = ...) -> None: ...
