from google.api import annotations_pb2 as _annotations_pb2
from llmgw.v1 import errors_pb2 as _errors_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HoldNodeRequest(_message.Message):
    __slots__ = ("node_id", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ReleaseNodeRequest(_message.Message):
    __slots__ = ("node_id",)
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    def __init__(self, node_id: _Optional[str] = ...) -> None: ...

class LabelNodeRequest(_message.Message):
    __slots__ = ("node_id", "set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    set: _containers.ScalarMap[str, str]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_id: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class NodeOverride(_message.Message):
    __slots__ = ("node_id", "held", "hold_reason", "held_since", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HELD_FIELD_NUMBER: _ClassVar[int]
    HOLD_REASON_FIELD_NUMBER: _ClassVar[int]
    HELD_SINCE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    held: bool
    hold_reason: str
    held_since: float
    labels: _containers.ScalarMap[str, str]
    def __init__(self, node_id: _Optional[str] = ..., held: _Optional[bool] = ..., hold_reason: _Optional[str] = ..., held_since: _Optional[float] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ListNodeOverridesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListNodeOverridesResponse(_message.Message):
    __slots__ = ("overrides",)
    OVERRIDES_FIELD_NUMBER: _ClassVar[int]
    overrides: _containers.RepeatedCompositeFieldContainer[NodeOverride]
    def __init__(self, overrides: _Optional[_Iterable[_Union[NodeOverride, _Mapping]]] = ...) -> None: ...

class ExplainPlacementRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class NodeVerdict(_message.Message):
    __slots__ = ("node_id", "fits", "reason")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    FITS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    fits: bool
    reason: str
    def __init__(self, node_id: _Optional[str] = ..., fits: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ProfileVerdicts(_message.Message):
    __slots__ = ("profile", "description", "nodes")
    PROFILE_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    profile: int
    description: str
    nodes: _containers.RepeatedCompositeFieldContainer[NodeVerdict]
    def __init__(self, profile: _Optional[int] = ..., description: _Optional[str] = ..., nodes: _Optional[_Iterable[_Union[NodeVerdict, _Mapping]]] = ...) -> None: ...

class PlacementExplanation(_message.Message):
    __slots__ = ("model", "capacity_class", "wanted", "replicas", "ready_replicas", "placement_message", "policy", "profiles", "owner", "quotas", "federation", "rollout", "eval_gate")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_CLASS_FIELD_NUMBER: _ClassVar[int]
    WANTED_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    READY_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    PROFILES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    FEDERATION_FIELD_NUMBER: _ClassVar[int]
    ROLLOUT_FIELD_NUMBER: _ClassVar[int]
    EVAL_GATE_FIELD_NUMBER: _ClassVar[int]
    model: str
    capacity_class: str
    wanted: int
    replicas: int
    ready_replicas: int
    placement_message: str
    policy: str
    profiles: _containers.RepeatedCompositeFieldContainer[ProfileVerdicts]
    owner: str
    quotas: _containers.RepeatedScalarFieldContainer[str]
    federation: str
    rollout: str
    eval_gate: str
    def __init__(self, model: _Optional[str] = ..., capacity_class: _Optional[str] = ..., wanted: _Optional[int] = ..., replicas: _Optional[int] = ..., ready_replicas: _Optional[int] = ..., placement_message: _Optional[str] = ..., policy: _Optional[str] = ..., profiles: _Optional[_Iterable[_Union[ProfileVerdicts, _Mapping]]] = ..., owner: _Optional[str] = ..., quotas: _Optional[_Iterable[str]] = ..., federation: _Optional[str] = ..., rollout: _Optional[str] = ..., eval_gate: _Optional[str] = ...) -> None: ...

class HoldDomainRequest(_message.Message):
    __slots__ = ("label", "value", "reason", "drain")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    label: str
    value: str
    reason: str
    drain: bool
    def __init__(self, label: _Optional[str] = ..., value: _Optional[str] = ..., reason: _Optional[str] = ..., drain: _Optional[bool] = ...) -> None: ...

class ReleaseDomainRequest(_message.Message):
    __slots__ = ("label", "value")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    label: str
    value: str
    def __init__(self, label: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...

class DomainHold(_message.Message):
    __slots__ = ("label", "value", "reason", "drain", "held_since", "nodes")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    HELD_SINCE_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    label: str
    value: str
    reason: str
    drain: bool
    held_since: float
    nodes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, label: _Optional[str] = ..., value: _Optional[str] = ..., reason: _Optional[str] = ..., drain: _Optional[bool] = ..., held_since: _Optional[float] = ..., nodes: _Optional[_Iterable[str]] = ...) -> None: ...

class ListDomainHoldsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListDomainHoldsResponse(_message.Message):
    __slots__ = ("holds",)
    HOLDS_FIELD_NUMBER: _ClassVar[int]
    holds: _containers.RepeatedCompositeFieldContainer[DomainHold]
    def __init__(self, holds: _Optional[_Iterable[_Union[DomainHold, _Mapping]]] = ...) -> None: ...
