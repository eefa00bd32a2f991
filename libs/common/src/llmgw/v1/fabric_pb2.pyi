from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunFabricTestRequest(_message.Message):
    __slots__ = ("nodes", "bytes", "pings")
    NODES_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedScalarFieldContainer[str]
    bytes: int
    pings: int
    def __init__(self, nodes: _Optional[_Iterable[str]] = ..., bytes: _Optional[int] = ..., pings: _Optional[int] = ...) -> None: ...

class FabricResult(_message.Message):
    __slots__ = ("node_a", "node_b", "bandwidth_bytes_per_second", "latency_seconds", "bytes", "pings", "method", "nccl", "measured_at", "error", "warning")
    NODE_A_FIELD_NUMBER: _ClassVar[int]
    NODE_B_FIELD_NUMBER: _ClassVar[int]
    BANDWIDTH_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    LATENCY_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    PINGS_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    NCCL_FIELD_NUMBER: _ClassVar[int]
    MEASURED_AT_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    WARNING_FIELD_NUMBER: _ClassVar[int]
    node_a: str
    node_b: str
    bandwidth_bytes_per_second: float
    latency_seconds: float
    bytes: int
    pings: int
    method: str
    nccl: str
    measured_at: float
    error: str
    warning: str
    def __init__(self, node_a: _Optional[str] = ..., node_b: _Optional[str] = ..., bandwidth_bytes_per_second: _Optional[float] = ..., latency_seconds: _Optional[float] = ..., bytes: _Optional[int] = ..., pings: _Optional[int] = ..., method: _Optional[str] = ..., nccl: _Optional[str] = ..., measured_at: _Optional[float] = ..., error: _Optional[str] = ..., warning: _Optional[str] = ...) -> None: ...

class RunFabricTestResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FabricResult]
    def __init__(self, results: _Optional[_Iterable[_Union[FabricResult, _Mapping]]] = ...) -> None: ...

class ListFabricResultsRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class ListFabricResultsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[FabricResult]
    def __init__(self, results: _Optional[_Iterable[_Union[FabricResult, _Mapping]]] = ...) -> None: ...
