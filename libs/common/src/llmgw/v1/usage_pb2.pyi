from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UsageReport(_message.Message):
    __slots__ = ("router_id", "interval_seconds", "endpoints", "models", "urgent", "traffic")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    URGENT_FIELD_NUMBER: _ClassVar[int]
    TRAFFIC_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    interval_seconds: float
    endpoints: _containers.RepeatedCompositeFieldContainer[EndpointLoad]
    models: _containers.RepeatedCompositeFieldContainer[ModelDemand]
    urgent: bool
    traffic: _containers.RepeatedCompositeFieldContainer[ModelTraffic]
    def __init__(self, router_id: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., endpoints: _Optional[_Iterable[_Union[EndpointLoad, _Mapping]]] = ..., models: _Optional[_Iterable[_Union[ModelDemand, _Mapping]]] = ..., urgent: _Optional[bool] = ..., traffic: _Optional[_Iterable[_Union[ModelTraffic, _Mapping]]] = ...) -> None: ...

class ModelTraffic(_message.Message):
    __slots__ = ("model", "requests", "client_errors", "server_errors")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ERRORS_FIELD_NUMBER: _ClassVar[int]
    SERVER_ERRORS_FIELD_NUMBER: _ClassVar[int]
    model: str
    requests: int
    client_errors: int
    server_errors: int
    def __init__(self, model: _Optional[str] = ..., requests: _Optional[int] = ..., client_errors: _Optional[int] = ..., server_errors: _Optional[int] = ...) -> None: ...

class EndpointLoad(_message.Message):
    __slots__ = ("endpoint_id", "model", "in_flight", "engine_running", "engine_waiting", "engine_sampled")
    ENDPOINT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    ENGINE_RUNNING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_WAITING_FIELD_NUMBER: _ClassVar[int]
    ENGINE_SAMPLED_FIELD_NUMBER: _ClassVar[int]
    endpoint_id: str
    model: str
    in_flight: int
    engine_running: float
    engine_waiting: float
    engine_sampled: bool
    def __init__(self, endpoint_id: _Optional[str] = ..., model: _Optional[str] = ..., in_flight: _Optional[int] = ..., engine_running: _Optional[float] = ..., engine_waiting: _Optional[float] = ..., engine_sampled: _Optional[bool] = ...) -> None: ...

class ModelDemand(_message.Message):
    __slots__ = ("model", "idle_seconds", "pending")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    IDLE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    PENDING_FIELD_NUMBER: _ClassVar[int]
    model: str
    idle_seconds: float
    pending: int
    def __init__(self, model: _Optional[str] = ..., idle_seconds: _Optional[float] = ..., pending: _Optional[int] = ...) -> None: ...

class UsageReply(_message.Message):
    __slots__ = ("accepted", "leader_address")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    leader_address: str
    def __init__(self, accepted: _Optional[bool] = ..., leader_address: _Optional[str] = ...) -> None: ...
