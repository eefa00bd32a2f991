from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from llmgw.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetReplicaLogsRequest(_message.Message):
    __slots__ = ("replica_id", "lines", "node_id")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    lines: int
    node_id: str
    def __init__(self, replica_id: _Optional[str] = ..., lines: _Optional[int] = ..., node_id: _Optional[str] = ...) -> None: ...

class ReplicaLogs(_message.Message):
    __slots__ = ("replica_id", "node_id", "lines")
    REPLICA_ID_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    LINES_FIELD_NUMBER: _ClassVar[int]
    replica_id: str
    node_id: str
    lines: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, replica_id: _Optional[str] = ..., node_id: _Optional[str] = ..., lines: _Optional[_Iterable[str]] = ...) -> None: ...

class ListWeightsRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class NodeWeights(_message.Message):
    __slots__ = ("node_id", "disk_bytes", "weights")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    DISK_BYTES_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    disk_bytes: int
    weights: _containers.RepeatedCompositeFieldContainer[_agent_pb2.WeightsStatus]
    def __init__(self, node_id: _Optional[str] = ..., disk_bytes: _Optional[int] = ..., weights: _Optional[_Iterable[_Union[_agent_pb2.WeightsStatus, _Mapping]]] = ...) -> None: ...

class ListWeightsResponse(_message.Message):
    __slots__ = ("nodes",)
    NODES_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeWeights]
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeWeights, _Mapping]]] = ...) -> None: ...

class FetchWeightsRequest(_message.Message):
    __slots__ = ("node_id", "source", "name")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    source: str
    name: str
    def __init__(self, node_id: _Optional[str] = ..., source: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class RemoveWeightsRequest(_message.Message):
    __slots__ = ("node_id", "name")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    name: str
    def __init__(self, node_id: _Optional[str] = ..., name: _Optional[str] = ...) -> None: ...

class UpgradeAgentRequest(_message.Message):
    __slots__ = ("node_id", "version", "command", "timeout_seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    version: str
    command: _containers.RepeatedScalarFieldContainer[str]
    timeout_seconds: float
    def __init__(self, node_id: _Optional[str] = ..., version: _Optional[str] = ..., command: _Optional[_Iterable[str]] = ..., timeout_seconds: _Optional[float] = ...) -> None: ...

class UpgradeAgentResponse(_message.Message):
    __slots__ = ("node_id", "previous_version", "version", "adopted", "seconds")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_VERSION_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADOPTED_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    previous_version: str
    version: str
    adopted: _containers.RepeatedScalarFieldContainer[str]
    seconds: float
    def __init__(self, node_id: _Optional[str] = ..., previous_version: _Optional[str] = ..., version: _Optional[str] = ..., adopted: _Optional[_Iterable[str]] = ..., seconds: _Optional[float] = ...) -> None: ...
