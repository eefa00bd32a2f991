from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListOwnerUsageRequest(_message.Message):
    __slots__ = ("owner", "period_seconds")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PERIOD_SECONDS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    period_seconds: float
    def __init__(self, owner: _Optional[str] = ..., period_seconds: _Optional[float] = ...) -> None: ...

class ModelRequests(_message.Message):
    __slots__ = ("model", "requests", "tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    requests: int
    tokens: int
    def __init__(self, model: _Optional[str] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class ModelUsage(_message.Message):
    __slots__ = ("model", "replicas", "gpus", "gpu_hours")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    model: str
    replicas: int
    gpus: int
    gpu_hours: float
    def __init__(self, model: _Optional[str] = ..., replicas: _Optional[int] = ..., gpus: _Optional[int] = ..., gpu_hours: _Optional[float] = ...) -> None: ...

class OwnerUsage(_message.Message):
    __slots__ = ("owner", "replicas", "gpus", "gpu_memory_bytes", "gpu_hours", "quota_replicas", "quota_gpus", "quota_gpu_memory_gb", "quota_requests_per_minute", "quota_tokens_per_minute", "models", "requests", "tokens", "requested")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    GPU_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPU_HOURS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_GPUS_FIELD_NUMBER: _ClassVar[int]
    QUOTA_GPU_MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    QUOTA_REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    QUOTA_TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    owner: str
    replicas: int
    gpus: int
    gpu_memory_bytes: int
    gpu_hours: float
    quota_replicas: int
    quota_gpus: int
    quota_gpu_memory_gb: float
    quota_requests_per_minute: int
    quota_tokens_per_minute: int
    models: _containers.RepeatedCompositeFieldContainer[ModelUsage]
    requests: int
    tokens: int
    requested: _containers.RepeatedCompositeFieldContainer[ModelRequests]
    def __init__(self, owner: _Optional[str] = ..., replicas: _Optional[int] = ..., gpus: _Optional[int] = ..., gpu_memory_bytes: _Optional[int] = ..., gpu_hours: _Optional[float] = ..., quota_replicas: _Optional[int] = ..., quota_gpus: _Optional[int] = ..., quota_gpu_memory_gb: _Optional[float] = ..., quota_requests_per_minute: _Optional[int] = ..., quota_tokens_per_minute: _Optional[int] = ..., models: _Optional[_Iterable[_Union[ModelUsage, _Mapping]]] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ..., requested: _Optional[_Iterable[_Union[ModelRequests, _Mapping]]] = ...) -> None: ...

class ListOwnerUsageResponse(_message.Message):
    __slots__ = ("owners", "since", "requests_since")
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_SINCE_FIELD_NUMBER: _ClassVar[int]
    owners: _containers.RepeatedCompositeFieldContainer[OwnerUsage]
    since: float
    requests_since: float
    def __init__(self, owners: _Optional[_Iterable[_Union[OwnerUsage, _Mapping]]] = ..., since: _Optional[float] = ..., requests_since: _Optional[float] = ...) -> None: ...
