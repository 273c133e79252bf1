from lazarus.v1 import agent_pb2 as _agent_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ForwardBatch(_message.Message):
    __slots__ = ("entries",)
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    entries: _containers.RepeatedCompositeFieldContainer[ForwardEntry]
    def __init__(self, entries: _Optional[_Iterable[_Union[ForwardEntry, _Mapping]]] = ...) -> None: ...

class ForwardEntry(_message.Message):
    __slots__ = ("session_id", "message", "end", "heartbeat", "heartbeat_ack")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_ACK_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    message: bytes
    end: SessionEnd
    heartbeat: _agent_pb2.Heartbeat
    heartbeat_ack: _agent_pb2.HeartbeatAck
    def __init__(self, session_id: _Optional[str] = ..., message: _Optional[bytes] = ..., end: _Optional[_Union[SessionEnd, _Mapping]] = ..., heartbeat: _Optional[_Union[_agent_pb2.Heartbeat, _Mapping]] = ..., heartbeat_ack: _Optional[_Union[_agent_pb2.HeartbeatAck, _Mapping]] = ...) -> None: ...

class SessionEnd(_message.Message):
    __slots__ = ("code", "reason")
    CODE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    code: int
    reason: str
    def __init__(self, code: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...
