from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class EchoRequest(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class EchoResponse(_message.Message):
    __slots__ = ("payload",)
    PAYLOAD_FIELD_NUMBER: _ClassVar[int]
    payload: bytes
    def __init__(self, payload: _Optional[bytes] = ...) -> None: ...

class GetServerInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("version", "replica", "host", "store", "event_loop", "dispatchers", "log_key_id", "start_time", "caller")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    REPLICA_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    EVENT_LOOP_FIELD_NUMBER: _ClassVar[int]
    DISPATCHERS_FIELD_NUMBER: _ClassVar[int]
    LOG_KEY_ID_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    CALLER_FIELD_NUMBER: _ClassVar[int]
    version: str
    replica: str
    host: str
    store: str
    event_loop: str
    dispatchers: _containers.RepeatedScalarFieldContainer[str]
    log_key_id: str
    start_time: str
    caller: Caller
    def __init__(self, version: _Optional[str] = ..., replica: _Optional[str] = ..., host: _Optional[str] = ..., store: _Optional[str] = ..., event_loop: _Optional[str] = ..., dispatchers: _Optional[_Iterable[str]] = ..., log_key_id: _Optional[str] = ..., start_time: _Optional[str] = ..., caller: _Optional[_Union[Caller, _Mapping]] = ...) -> None: ...

class Caller(_message.Message):
    __slots__ = ("principal", "roles", "credential", "token_expires", "may_call")
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    ROLES_FIELD_NUMBER: _ClassVar[int]
    CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    TOKEN_EXPIRES_FIELD_NUMBER: _ClassVar[int]
    MAY_CALL_FIELD_NUMBER: _ClassVar[int]
    principal: str
    roles: _containers.RepeatedScalarFieldContainer[str]
    credential: str
    token_expires: str
    may_call: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, principal: _Optional[str] = ..., roles: _Optional[_Iterable[str]] = ..., credential: _Optional[str] = ..., token_expires: _Optional[str] = ..., may_call: _Optional[_Iterable[str]] = ...) -> None: ...
