from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class GetSettingsRequest(_message.Message):
    __slots__ = ("version",)
    VERSION_FIELD_NUMBER: _ClassVar[int]
    version: int
    def __init__(self, version: _Optional[int] = ...) -> None: ...

class PutSettingsRequest(_message.Message):
    __slots__ = ("document", "if_version", "author", "reason")
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    document: str
    if_version: int
    author: str
    reason: str
    def __init__(self, document: _Optional[str] = ..., if_version: _Optional[int] = ..., author: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RollbackSettingsRequest(_message.Message):
    __slots__ = ("version", "if_version", "author", "reason")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IF_VERSION_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    version: int
    if_version: int
    author: str
    reason: str
    def __init__(self, version: _Optional[int] = ..., if_version: _Optional[int] = ..., author: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class SettingsVersion(_message.Message):
    __slots__ = ("version", "document", "effective", "author", "created_at", "reason", "changed", "in_force", "load_error", "restart_pending")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    DOCUMENT_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    AUTHOR_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    IN_FORCE_FIELD_NUMBER: _ClassVar[int]
    LOAD_ERROR_FIELD_NUMBER: _ClassVar[int]
    RESTART_PENDING_FIELD_NUMBER: _ClassVar[int]
    version: int
    document: str
    effective: str
    author: str
    created_at: float
    reason: str
    changed: _containers.RepeatedScalarFieldContainer[str]
    in_force: bool
    load_error: str
    restart_pending: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[int] = ..., document: _Optional[str] = ..., effective: _Optional[str] = ..., author: _Optional[str] = ..., created_at: _Optional[float] = ..., reason: _Optional[str] = ..., changed: _Optional[_Iterable[str]] = ..., in_force: _Optional[bool] = ..., load_error: _Optional[str] = ..., restart_pending: _Optional[_Iterable[str]] = ...) -> None: ...

class ListSettingsVersionsRequest(_message.Message):
    __slots__ = ("limit",)
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    limit: int
    def __init__(self, limit: _Optional[int] = ...) -> None: ...

class ListSettingsVersionsResponse(_message.Message):
    __slots__ = ("versions",)
    VERSIONS_FIELD_NUMBER: _ClassVar[int]
    versions: _containers.RepeatedCompositeFieldContainer[SettingsVersion]
    def __init__(self, versions: _Optional[_Iterable[_Union[SettingsVersion, _Mapping]]] = ...) -> None: ...
