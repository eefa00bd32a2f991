from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RenewCertificateRequest(_message.Message):
    __slots__ = ("csr_pem",)
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    csr_pem: str
    def __init__(self, csr_pem: _Optional[str] = ...) -> None: ...

class RenewCertificateResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem", "serial", "not_after")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: str
    ca_pem: str
    serial: str
    not_after: int
    def __init__(self, certificate_pem: _Optional[str] = ..., ca_pem: _Optional[str] = ..., serial: _Optional[str] = ..., not_after: _Optional[int] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("token", "csr_pem")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    CSR_PEM_FIELD_NUMBER: _ClassVar[int]
    token: str
    csr_pem: str
    def __init__(self, token: _Optional[str] = ..., csr_pem: _Optional[str] = ...) -> None: ...

class JoinResponse(_message.Message):
    __slots__ = ("certificate_pem", "ca_pem", "node_id", "hosts", "serial")
    CERTIFICATE_PEM_FIELD_NUMBER: _ClassVar[int]
    CA_PEM_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    certificate_pem: str
    ca_pem: str
    node_id: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    serial: str
    def __init__(self, certificate_pem: _Optional[str] = ..., ca_pem: _Optional[str] = ..., node_id: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., serial: _Optional[str] = ...) -> None: ...

class JoinUse(_message.Message):
    __slots__ = ("node_id", "serial", "at", "peer")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    serial: str
    at: int
    peer: str
    def __init__(self, node_id: _Optional[str] = ..., serial: _Optional[str] = ..., at: _Optional[int] = ..., peer: _Optional[str] = ...) -> None: ...

class JoinToken(_message.Message):
    __slots__ = ("id", "description", "created", "expires", "max_uses", "uses", "revoked", "node_id", "replace", "hosts", "used_by", "hash", "state")
    ID_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    USES_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    USED_BY_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    description: str
    created: int
    expires: int
    max_uses: int
    uses: int
    revoked: bool
    node_id: str
    replace: bool
    hosts: _containers.RepeatedScalarFieldContainer[str]
    used_by: _containers.RepeatedCompositeFieldContainer[JoinUse]
    hash: str
    state: str
    def __init__(self, id: _Optional[str] = ..., description: _Optional[str] = ..., created: _Optional[int] = ..., expires: _Optional[int] = ..., max_uses: _Optional[int] = ..., uses: _Optional[int] = ..., revoked: _Optional[bool] = ..., node_id: _Optional[str] = ..., replace: _Optional[bool] = ..., hosts: _Optional[_Iterable[str]] = ..., used_by: _Optional[_Iterable[_Union[JoinUse, _Mapping]]] = ..., hash: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class CreateJoinTokenRequest(_message.Message):
    __slots__ = ("ttl_seconds", "max_uses", "description", "node_id", "replace", "hosts")
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_USES_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REPLACE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    ttl_seconds: int
    max_uses: int
    description: str
    node_id: str
    replace: bool
    hosts: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, ttl_seconds: _Optional[int] = ..., max_uses: _Optional[int] = ..., description: _Optional[str] = ..., node_id: _Optional[str] = ..., replace: _Optional[bool] = ..., hosts: _Optional[_Iterable[str]] = ...) -> None: ...

class CreateJoinTokenResponse(_message.Message):
    __slots__ = ("token", "secret", "ca_cert_hash", "join_address")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    CA_CERT_HASH_FIELD_NUMBER: _ClassVar[int]
    JOIN_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    token: JoinToken
    secret: str
    ca_cert_hash: str
    join_address: str
    def __init__(self, token: _Optional[_Union[JoinToken, _Mapping]] = ..., secret: _Optional[str] = ..., ca_cert_hash: _Optional[str] = ..., join_address: _Optional[str] = ...) -> None: ...

class ListJoinTokensRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListJoinTokensResponse(_message.Message):
    __slots__ = ("tokens",)
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedCompositeFieldContainer[JoinToken]
    def __init__(self, tokens: _Optional[_Iterable[_Union[JoinToken, _Mapping]]] = ...) -> None: ...

class RevokeJoinTokenRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class Revocation(_message.Message):
    __slots__ = ("serial", "role", "name", "revoked_at", "reason")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REVOKED_AT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    serial: str
    role: str
    name: str
    revoked_at: int
    reason: str
    def __init__(self, serial: _Optional[str] = ..., role: _Optional[str] = ..., name: _Optional[str] = ..., revoked_at: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class RevokeCertificateRequest(_message.Message):
    __slots__ = ("serial", "role", "name", "reason")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    serial: str
    role: str
    name: str
    reason: str
    def __init__(self, serial: _Optional[str] = ..., role: _Optional[str] = ..., name: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ListRevocationsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListRevocationsResponse(_message.Message):
    __slots__ = ("revocations",)
    REVOCATIONS_FIELD_NUMBER: _ClassVar[int]
    revocations: _containers.RepeatedCompositeFieldContainer[Revocation]
    def __init__(self, revocations: _Optional[_Iterable[_Union[Revocation, _Mapping]]] = ...) -> None: ...

class IssuedCertificate(_message.Message):
    __slots__ = ("serial", "role", "name", "hosts", "not_before", "not_after", "token_id", "revoked", "renewed")
    SERIAL_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    NOT_BEFORE_FIELD_NUMBER: _ClassVar[int]
    NOT_AFTER_FIELD_NUMBER: _ClassVar[int]
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    REVOKED_FIELD_NUMBER: _ClassVar[int]
    RENEWED_FIELD_NUMBER: _ClassVar[int]
    serial: str
    role: str
    name: str
    hosts: _containers.RepeatedScalarFieldContainer[str]
    not_before: int
    not_after: int
    token_id: str
    revoked: bool
    renewed: str
    def __init__(self, serial: _Optional[str] = ..., role: _Optional[str] = ..., name: _Optional[str] = ..., hosts: _Optional[_Iterable[str]] = ..., not_before: _Optional[int] = ..., not_after: _Optional[int] = ..., token_id: _Optional[str] = ..., revoked: _Optional[bool] = ..., renewed: _Optional[str] = ...) -> None: ...

class ListIssuedCertificatesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListIssuedCertificatesResponse(_message.Message):
    __slots__ = ("certificates",)
    CERTIFICATES_FIELD_NUMBER: _ClassVar[int]
    certificates: _containers.RepeatedCompositeFieldContainer[IssuedCertificate]
    def __init__(self, certificates: _Optional[_Iterable[_Union[IssuedCertificate, _Mapping]]] = ...) -> None: ...
