from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ReplicaState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    REPLICA_STATE_UNSPECIFIED: _ClassVar[ReplicaState]
    REPLICA_STATE_STARTING: _ClassVar[ReplicaState]
    REPLICA_STATE_READY: _ClassVar[ReplicaState]
    REPLICA_STATE_FAILED: _ClassVar[ReplicaState]
    REPLICA_STATE_STOPPING: _ClassVar[ReplicaState]
    REPLICA_STATE_STOPPED: _ClassVar[ReplicaState]

class WeightsState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WEIGHTS_STATE_UNSPECIFIED: _ClassVar[WeightsState]
    WEIGHTS_STATE_FETCHING: _ClassVar[WeightsState]
    WEIGHTS_STATE_READY: _ClassVar[WeightsState]
    WEIGHTS_STATE_FAILED: _ClassVar[WeightsState]
REPLICA_STATE_UNSPECIFIED: ReplicaState
REPLICA_STATE_STARTING: ReplicaState
REPLICA_STATE_READY: ReplicaState
REPLICA_STATE_FAILED: ReplicaState
REPLICA_STATE_STOPPING: ReplicaState
REPLICA_STATE_STOPPED: ReplicaState
WEIGHTS_STATE_UNSPECIFIED: WeightsState
WEIGHTS_STATE_FETCHING: WeightsState
WEIGHTS_STATE_READY: WeightsState
WEIGHTS_STATE_FAILED: WeightsState

class AgentMessage(_message.Message):
    __slots__ = ("register", "heartbeat", "status", "reply", "weights")
    REGISTER_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REPLY_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    register: Register
    heartbeat: Heartbeat
    status: ReplicaStatus
    reply: AgentReply
    weights: WeightsStatus
    def __init__(self, register: _Optional[_Union[Register, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., status: _Optional[_Union[ReplicaStatus, _Mapping]] = ..., reply: _Optional[_Union[AgentReply, _Mapping]] = ..., weights: _Optional[_Union[WeightsStatus, _Mapping]] = ...) -> None: ...

class ControlMessage(_message.Message):
    __slots__ = ("registered", "redirect", "start", "stop", "get_logs", "fetch_weights", "remove_weights", "set_adapters", "upgrade_agent", "fabric_listen", "fabric_probe")
    REGISTERED_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    GET_LOGS_FIELD_NUMBER: _ClassVar[int]
    FETCH_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    REMOVE_WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    SET_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    UPGRADE_AGENT_FIELD_NUMBER: _ClassVar[int]
    FABRIC_LISTEN_FIELD_NUMBER: _ClassVar[int]
    FABRIC_PROBE_FIELD_NUMBER: _ClassVar[int]
    registered: Registered
    redirect: Redirect
    start: StartReplica
    stop: StopReplica
    get_logs: GetLogs
    fetch_weights: FetchWeights
    remove_weights: RemoveWeights
    set_adapters: SetAdapters
    upgrade_agent: UpgradeAgent
    fabric_listen: FabricListen
    fabric_probe: FabricProbe
    def __init__(self, registered: _Optional[_Union[Registered, _Mapping]] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., start: _Optional[_Union[StartReplica, _Mapping]] = ..., stop: _Optional[_Union[StopReplica, _Mapping]] = ..., get_logs: _Optional[_Union[GetLogs, _Mapping]] = ..., fetch_weights: _Optional[_Union[FetchWeights, _Mapping]] = ..., remove_weights: _Optional[_Union[RemoveWeights, _Mapping]] = ..., set_adapters: _Optional[_Union[SetAdapters, _Mapping]] = ..., upgrade_agent: _Optional[_Union[UpgradeAgent, _Mapping]] = ..., fabric_listen: _Optional[_Union[FabricListen, _Mapping]] = ..., fabric_probe: _Optional[_Union[FabricProbe, _Mapping]] = ...) -> None: ...

class Gpu(_message.Message):
    __slots__ = ("index", "uuid", "name", "memory_total_bytes", "memory_free_bytes", "power_watts", "compute_capability")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_FREE_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_CAPABILITY_FIELD_NUMBER: _ClassVar[int]
    index: int
    uuid: str
    name: str
    memory_total_bytes: int
    memory_free_bytes: int
    power_watts: float
    compute_capability: str
    def __init__(self, index: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., memory_free_bytes: _Optional[int] = ..., power_watts: _Optional[float] = ..., compute_capability: _Optional[str] = ...) -> None: ...

class EngineInfo(_message.Message):
    __slots__ = ("kind", "version", "build", "program", "cuda")
    KIND_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    PROGRAM_FIELD_NUMBER: _ClassVar[int]
    CUDA_FIELD_NUMBER: _ClassVar[int]
    kind: str
    version: str
    build: str
    program: str
    cuda: str
    def __init__(self, kind: _Optional[str] = ..., version: _Optional[str] = ..., build: _Optional[str] = ..., program: _Optional[str] = ..., cuda: _Optional[str] = ...) -> None: ...

class Register(_message.Message):
    __slots__ = ("node_id", "address", "labels", "gpus", "engines", "version", "memory_bytes", "cpu_cores", "replicas", "weights", "driver_version", "cuda_version")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    CUDA_VERSION_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    address: str
    labels: _containers.ScalarMap[str, str]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    engines: _containers.RepeatedCompositeFieldContainer[EngineInfo]
    version: str
    memory_bytes: int
    cpu_cores: int
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    weights: _containers.RepeatedCompositeFieldContainer[WeightsStatus]
    driver_version: str
    cuda_version: str
    def __init__(self, node_id: _Optional[str] = ..., address: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., engines: _Optional[_Iterable[_Union[EngineInfo, _Mapping]]] = ..., version: _Optional[str] = ..., memory_bytes: _Optional[int] = ..., cpu_cores: _Optional[int] = ..., replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., weights: _Optional[_Iterable[_Union[WeightsStatus, _Mapping]]] = ..., driver_version: _Optional[str] = ..., cuda_version: _Optional[str] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ("replicas", "gpus", "weights")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[ReplicaStatus]
    gpus: _containers.RepeatedCompositeFieldContainer[Gpu]
    weights: _containers.RepeatedCompositeFieldContainer[WeightsStatus]
    def __init__(self, replicas: _Optional[_Iterable[_Union[ReplicaStatus, _Mapping]]] = ..., gpus: _Optional[_Iterable[_Union[Gpu, _Mapping]]] = ..., weights: _Optional[_Iterable[_Union[WeightsStatus, _Mapping]]] = ...) -> None: ...

class ReplicaStatus(_message.Message):
    __slots__ = ("replica_id", "model", "state", "url", "message", "pid", "gpu_indices", "served_name", "engine", "adapters")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    SERVED_NAME_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    state: ReplicaState
    url: str
    message: str
    pid: int
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    served_name: str
    engine: str
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., state: _Optional[_Union[ReplicaState, str]] = ..., url: _Optional[str] = ..., message: _Optional[str] = ..., pid: _Optional[int] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., served_name: _Optional[str] = ..., engine: _Optional[str] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class Registered(_message.Message):
    __slots__ = ("control_id", "heartbeat_interval_seconds")
    CONTROL_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    control_id: str
    heartbeat_interval_seconds: float
    def __init__(self, control_id: _Optional[str] = ..., heartbeat_interval_seconds: _Optional[float] = ...) -> None: ...

class Redirect(_message.Message):
    __slots__ = ("leader_address",)
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    leader_address: str
    def __init__(self, leader_address: _Optional[str] = ...) -> None: ...

class StartReplica(_message.Message):
    __slots__ = ("replica_id", "model", "engine", "served_name", "gpu_indices", "engine_key", "engine_args", "lora", "build")
    class EngineArgsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    SERVED_NAME_FIELD_NUMBER: _ClassVar[int]
    GPU_INDICES_FIELD_NUMBER: _ClassVar[int]
    ENGINE_KEY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_ARGS_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    BUILD_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    model: str
    engine: str
    served_name: str
    gpu_indices: _containers.RepeatedScalarFieldContainer[int]
    engine_key: str
    engine_args: _containers.ScalarMap[str, str]
    lora: LoraSettings
    build: str
    def __init__(self, replica_id: _Optional[str] = ..., model: _Optional[str] = ..., engine: _Optional[str] = ..., served_name: _Optional[str] = ..., gpu_indices: _Optional[_Iterable[int]] = ..., engine_key: _Optional[str] = ..., engine_args: _Optional[_Mapping[str, str]] = ..., lora: _Optional[_Union[LoraSettings, _Mapping]] = ..., build: _Optional[str] = ...) -> None: ...

class Adapter(_message.Message):
    __slots__ = ("name", "source")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class LoraSettings(_message.Message):
    __slots__ = ("max_loras", "max_lora_rank", "adapters")
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    max_loras: int
    max_lora_rank: int
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    def __init__(self, max_loras: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ...) -> None: ...

class SetAdapters(_message.Message):
    __slots__ = ("replica_id", "adapters")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    adapters: _containers.RepeatedCompositeFieldContainer[Adapter]
    def __init__(self, replica_id: _Optional[str] = ..., adapters: _Optional[_Iterable[_Union[Adapter, _Mapping]]] = ...) -> None: ...

class StopReplica(_message.Message):
    __slots__ = ("replica_id", "reason", "grace_seconds")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GRACE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    reason: str
    grace_seconds: float
    def __init__(self, replica_id: _Optional[str] = ..., reason: _Optional[str] = ..., grace_seconds: _Optional[float] = ...) -> None: ...

class GetLogs(_message.Message):
    __slots__ = ("request_id", "replica_id", "lines")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    replica_id: str
    lines: int
    def __init__(self, request_id: _Optional[str] = ..., replica_id: _Optional[str] = ..., lines: _Optional[int] = ...) -> None: ...

class FetchWeights(_message.Message):
    __slots__ = ("request_id", "name", "source")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    source: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ..., source: _Optional[str] = ...) -> None: ...

class UpgradeAgent(_message.Message):
    __slots__ = ("request_id", "version", "command")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    version: str
    command: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., version: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ...) -> None: ...

class RemoveWeights(_message.Message):
    __slots__ = ("request_id", "name")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    name: str
    def __init__(self, request_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class AgentReply(_message.Message):
    __slots__ = ("request_id", "code", "error", "lines", "weights", "fabric")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    FABRIC_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: int
    error: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    weights: WeightsStatus
    fabric: FabricMeasurement
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[int] = ..., error: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ..., weights: _Optional[_Union[WeightsStatus, _Mapping]] = ..., fabric: _Optional[_Union[FabricMeasurement, _Mapping]] = ...) -> None: ...

class WeightsStatus(_message.Message):
    __slots__ = ("name", "source", "state", "path", "size_bytes", "fetched_bytes", "total_bytes", "message", "in_place")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    FETCHED_BYTES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    IN_PLACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    source: str
    state: WeightsState
    path: str
    size_bytes: int
    fetched_bytes: int
    total_bytes: int
    message: str
    in_place: bool
    def __init__(self, name: _Optional[str] = ..., source: _Optional[str] = ..., state: _Optional[_Union[WeightsState, str]] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., fetched_bytes: _Optional[int] = ..., total_bytes: _Optional[int] = ..., message: _Optional[str] = ..., in_place: _Optional[bool] = ...) -> None: ...

class FabricListen(_message.Message):
    __slots__ = ("request_id", "token", "max_bytes", "max_pings", "timeout_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_PINGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    token: bytes
    max_bytes: int
    max_pings: int
    timeout_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., token: _Optional[bytes] = ..., max_bytes: _Optional[int] = ..., max_pings: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class FabricProbe(_message.Message):
    __slots__ = ("request_id", "host", "port", "token", "bytes", "pings", "timeout_seconds")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    host: str
    port: int
    token: bytes
    bytes: int
    pings: int
    timeout_seconds: float
    def __init__(self, request_id: _Optional[str] = ..., host: _Optional[str] = ..., port: _Optional[int] = ..., token: _Optional[bytes] = ..., bytes: _Optional[int] = ..., pings: _Optional[int] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class FabricMeasurement(_message.Message):
    __slots__ = ("port", "bandwidth_bytes_per_second", "latency_seconds", "bytes", "pings", "method", "nccl")
    PORT_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    port: int
    bandwidth_bytes_per_second: float
    latency_seconds: float
    bytes: int
    pings: int
    method: str
    nccl: str
    def __init__(self, port: _Optional[int] = ..., bandwidth_bytes_per_second: _Optional[float] = ..., latency_seconds: _Optional[float] = ..., bytes: _Optional[int] = ..., pings: _Optional[int] = ..., method: _Optional[str] = ..., nccl: _Optional[str] = ...) -> None: ...
