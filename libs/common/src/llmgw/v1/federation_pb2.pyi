from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListPeersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPeersResponse(_message.Message):
    __slots__ = ("peers", "check_interval_seconds", "hop_limit")
    PEERS_FIELD_NUMBER: _ClassVar[int]
    CHECK_INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    HOP_LIMIT_FIELD_NUMBER: _ClassVar[int]
    peers: _containers.RepeatedCompositeFieldContainer[PeerInfo]
    check_interval_seconds: float
    hop_limit: int
    def __init__(self, peers: _Optional[_Iterable[_Union[PeerInfo, _Mapping]]] = ..., check_interval_seconds: _Optional[float] = ..., hop_limit: _Optional[int] = ...) -> None: ...

class PeerInfo(_message.Message):
    __slots__ = ("name", "url", "health", "last_check", "error", "offered", "clashes", "missing", "models", "send_tags")
    NAME_FIELD_NUMBER: _ClassVar[int]
    URL_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    LAST_CHECK_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    OFFERED_FIELD_NUMBER: _ClassVar[int]
    CLASHES_FIELD_NUMBER: _ClassVar[int]
    MISSING_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    SEND_TAGS_FIELD_NUMBER: _ClassVar[int]
    name: str
    url: str
    health: str
    last_check: float
    error: str
    offered: _containers.RepeatedScalarFieldContainer[str]
    clashes: _containers.RepeatedScalarFieldContainer[str]
    missing: _containers.RepeatedScalarFieldContainer[str]
    models: _containers.RepeatedScalarFieldContainer[str]
    send_tags: bool
    def __init__(self, name: _Optional[str] = ..., url: _Optional[str] = ..., health: _Optional[str] = ..., last_check: _Optional[float] = ..., error: _Optional[str] = ..., offered: _Optional[_Iterable[str]] = ..., clashes: _Optional[_Iterable[str]] = ..., missing: _Optional[_Iterable[str]] = ..., models: _Optional[_Iterable[str]] = ..., send_tags: _Optional[bool] = ...) -> None: ...

class AddPeerRequest(_message.Message):
    __slots__ = ("document", "author", "reason")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    document: str
    author: str
    reason: str
    def __init__(self, document: _Optional[str] = ..., author: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RemovePeerRequest(_message.Message):
    __slots__ = ("name", "author", "reason")
    NAME_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    name: str
    author: str
    reason: str
    def __init__(self, name: _Optional[str] = ..., author: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class PeerChange(_message.Message):
    __slots__ = ("settings_version",)
    SETTINGS_VERSION_FIELD_NUMBER: _ClassVar[int]
    settings_version: int
    def __init__(self, settings_version: _Optional[int] = ...) -> None: ...
