from google.protobuf import descriptor_pb2 as _descriptor_pb2
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Optional as _Optional

DESCRIPTOR: _descriptor.FileDescriptor
ERRORS_FIELD_NUMBER: _ClassVar[int]
errors: _descriptor.FieldDescriptor

class MethodError(_message.Message):
    __slots__ = ("code", "when")
    CODE_FIELD_NUMBER: _ClassVar[int]
    WHEN_FIELD_NUMBER: _ClassVar[int]
    code: str
    when: str
    def __init__(self, code: _Optional[str] = ..., when: _Optional[str] = ...) -> None: ...
