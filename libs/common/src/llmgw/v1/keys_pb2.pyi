from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from llmgw.v1 import endpoints_pb2 as _endpoints_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApiKey(_message.Message):
    __slots__ = ("id", "name", "owner", "prefix", "hash", "models", "requests_per_minute", "tokens_per_minute", "created", "expires")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    owner: str
    prefix: str
    hash: str
    models: _containers.RepeatedScalarFieldContainer[str]
    requests_per_minute: int
    tokens_per_minute: int
    created: int
    expires: int
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., owner: _Optional[str] = ..., prefix: _Optional[str] = ..., hash: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ..., created: _Optional[int] = ..., expires: _Optional[int] = ...) -> None: ...

class CreateKeyRequest(_message.Message):
    __slots__ = ("name", "owner", "models", "requests_per_minute", "tokens_per_minute", "ttl_seconds")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODELS_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    name: str
    owner: str
    models: _containers.RepeatedScalarFieldContainer[str]
    requests_per_minute: int
    tokens_per_minute: int
    ttl_seconds: int
    def __init__(self, name: _Optional[str] = ..., owner: _Optional[str] = ..., models: _Optional[_Iterable[str]] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ..., ttl_seconds: _Optional[int] = ...) -> None: ...

class CreateKeyResponse(_message.Message):
    __slots__ = ("key", "secret")
    KEY_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    key: ApiKey
    secret: str
    def __init__(self, key: _Optional[_Union[ApiKey, _Mapping]] = ..., secret: _Optional[str] = ...) -> None: ...

class ListKeysRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListKeysResponse(_message.Message):
    __slots__ = ("keys",)
    KEYS_FIELD_NUMBER: _ClassVar[int]
    keys: _containers.RepeatedCompositeFieldContainer[ApiKey]
    def __init__(self, keys: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ...) -> None: ...

class RevokeKeyRequest(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class RevokeKeyResponse(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: ApiKey
    def __init__(self, key: _Optional[_Union[ApiKey, _Mapping]] = ...) -> None: ...

class KeyUpdate(_message.Message):
    __slots__ = ("revision", "snapshot", "upserts", "removals")
    REVISION_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    UPSERTS_FIELD_NUMBER: _ClassVar[int]
    REMOVALS_FIELD_NUMBER: _ClassVar[int]
    revision: int
    snapshot: bool
    upserts: _containers.RepeatedCompositeFieldContainer[ApiKey]
    removals: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, revision: _Optional[int] = ..., snapshot: _Optional[bool] = ..., upserts: _Optional[_Iterable[_Union[ApiKey, _Mapping]]] = ..., removals: _Optional[_Iterable[str]] = ...) -> None: ...

class KeyUsage(_message.Message):
    __slots__ = ("key_id", "requests", "tokens")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    requests: int
    tokens: int
    def __init__(self, key_id: _Optional[str] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class QuotaReport(_message.Message):
    __slots__ = ("router_id", "usage", "incarnation", "sequence", "owner_usage")
    ROUTER_ID_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    OWNER_USAGE_FIELD_NUMBER: _ClassVar[int]
    router_id: str
    usage: _containers.RepeatedCompositeFieldContainer[KeyUsage]
    incarnation: str
    sequence: int
    owner_usage: _containers.RepeatedCompositeFieldContainer[OwnerModelUsage]
    def __init__(self, router_id: _Optional[str] = ..., usage: _Optional[_Iterable[_Union[KeyUsage, _Mapping]]] = ..., incarnation: _Optional[str] = ..., sequence: _Optional[int] = ..., owner_usage: _Optional[_Iterable[_Union[OwnerModelUsage, _Mapping]]] = ...) -> None: ...

class OwnerModelUsage(_message.Message):
    __slots__ = ("owner", "model", "requests", "tokens")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    owner: str
    model: str
    requests: int
    tokens: int
    def __init__(self, owner: _Optional[str] = ..., model: _Optional[str] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class KeyBudget(_message.Message):
    __slots__ = ("key_id", "requests", "tokens")
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    key_id: str
    requests: float
    tokens: float
    def __init__(self, key_id: _Optional[str] = ..., requests: _Optional[float] = ..., tokens: _Optional[float] = ...) -> None: ...

class QuotaView(_message.Message):
    __slots__ = ("budgets", "routers", "leader_address", "leader", "owners")
    BUDGETS_FIELD_NUMBER: _ClassVar[int]
    ROUTERS_FIELD_NUMBER: _ClassVar[int]
    LEADER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    OWNERS_FIELD_NUMBER: _ClassVar[int]
    budgets: _containers.RepeatedCompositeFieldContainer[KeyBudget]
    routers: int
    leader_address: str
    leader: bool
    owners: _containers.RepeatedCompositeFieldContainer[OwnerLimits]
    def __init__(self, budgets: _Optional[_Iterable[_Union[KeyBudget, _Mapping]]] = ..., routers: _Optional[int] = ..., leader_address: _Optional[str] = ..., leader: _Optional[bool] = ..., owners: _Optional[_Iterable[_Union[OwnerLimits, _Mapping]]] = ...) -> None: ...

class OwnerLimits(_message.Message):
    __slots__ = ("owner", "requests_per_minute", "tokens_per_minute")
    OWNER_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_PER_MINUTE_FIELD_NUMBER: _ClassVar[int]
    owner: str
    requests_per_minute: int
    tokens_per_minute: int
    def __init__(self, owner: _Optional[str] = ..., requests_per_minute: _Optional[int] = ..., tokens_per_minute: _Optional[int] = ...) -> None: ...
