from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WatchRequest(_message.Message):
    __slots__ = ("known_revision", "client_id")
    KNOWN_REVISION_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    known_revision: int
    client_id: str
    def __init__(self, known_revision: _Optional[int] = ..., client_id: _Optional[str] = ...) -> None: ...

class Endpoint(_message.Message):
    __slots__ = ("id", "model", "url", "served_name", "node", "engine", "weight", "priority", "adapters")
    ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    SERVED_NAME_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    id: str
    model: str
    url: str
    served_name: str
    node: str
    engine: str
    weight: int
    priority: int
    adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, id: _Optional[str] = ..., model: _Optional[str] = ..., url: _Optional[str] = ..., served_name: _Optional[str] = ..., node: _Optional[str] = ..., engine: _Optional[str] = ..., weight: _Optional[int] = ..., priority: _Optional[int] = ..., adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class EndpointUpdate(_message.Message):
    __slots__ = ("revision", "snapshot", "upserts", "removals")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    REMOVALS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    snapshot: bool
    upserts: _containers.RepeatedCompositeFieldContainer[Endpoint]
    removals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., snapshot: _Optional[bool] = ..., upserts: _Optional[_Iterable[_Union[Endpoint, _Mapping]]] = ..., removals: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "aliases", "owned_by", "created", "fallbacks", "canary", "external", "on_demand", "adapters", "apis")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    FALLBACKS_FIELD_NUMBER: _ClassVar[int]
    CANARY_FIELD_NUMBER: _ClassVar[int]
    EXTERNAL_FIELD_NUMBER: _ClassVar[int]
    ON_DEMAND_FIELD_NUMBER: _ClassVar[int]
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    APIS_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    owned_by: str
    created: int
    fallbacks: _containers.RepeatedScalarFieldContainer[str]
    canary: CanaryInfo
    external: ExternalInfo
    on_demand: bool
    adapters: _containers.RepeatedScalarFieldContainer[str]
    apis: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., owned_by: _Optional[str] = ..., created: _Optional[int] = ..., fallbacks: _Optional[_Iterable[str]] = ..., canary: _Optional[_Union[CanaryInfo, _Mapping]] = ..., external: _Optional[_Union[ExternalInfo, _Mapping]] = ..., on_demand: _Optional[bool] = ..., adapters: _Optional[_Iterable[str]] = ..., apis: _Optional[_Iterable[str]] = ...) -> None: ...

class CanaryInfo(_message.Message):
    __slots__ = ("model", "percent")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PERCENT_FIELD_NUMBER: _ClassVar[int]
    model: str
    percent: float
    def __init__(self, model: _Optional[str] = ..., percent: _Optional[float] = ...) -> None: ...

class ExternalInfo(_message.Message):
    __slots__ = ("url", "api", "model", "api_key_file", "peer", "origin_cluster", "hop_limit")
    URL_FIELD_NUMBER: _ClassVar[int]
    API_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    API_KEY_FILE_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    ORIGIN_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    HOP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    url: str
    api: str
    model: str
    api_key_file: str
    peer: str
    origin_cluster: str
    hop_limit: int
    def __init__(self, url: _Optional[str] = ..., api: _Optional[str] = ..., model: _Optional[str] = ..., api_key_file: _Optional[str] = ..., peer: _Optional[str] = ..., origin_cluster: _Optional[str] = ..., hop_limit: _Optional[int] = ...) -> None: ...

class CatalogUpdate(_message.Message):
    __slots__ = ("revision", "snapshot", "upserts", "removals")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    REMOVALS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    snapshot: bool
    upserts: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    removals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., snapshot: _Optional[bool] = ..., upserts: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ..., removals: _Optional[_Iterable[str]] = ...) -> None: ...
