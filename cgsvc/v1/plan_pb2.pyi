import datetime

from cgsvc.v1 import launch_spec_pb2 as _launch_spec_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Plan(_message.Message):
    __slots__ = ("name", "policy_version", "plan_hash", "attention_backend", "prefill", "decode", "kv_cache_dtype", "chunked_prefill_size", "locked", "decisions", "warnings", "estimates", "policy", "create_time", "spec", "audit_record")
    NAME_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_BACKEND_FIELD_NUMBER: _ClassVar[int]
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    CHUNKED_PREFILL_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCKED_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    WARNINGS_FIELD_NUMBER: _ClassVar[int]
    ESTIMATES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    AUDIT_RECORD_FIELD_NUMBER: _ClassVar[int]
    name: str
    policy_version: str
    plan_hash: str
    attention_backend: AttentionBackends
    prefill: PrefillPlan
    decode: DecodePlan
    kv_cache_dtype: str
    chunked_prefill_size: int
    locked: _containers.RepeatedScalarFieldContainer[str]
    decisions: _containers.RepeatedCompositeFieldContainer[Decision]
    warnings: _containers.RepeatedCompositeFieldContainer[PlanWarning]
    estimates: Estimates
    policy: str
    create_time: _timestamp_pb2.Timestamp
    spec: _launch_spec_pb2.LaunchSpec
    audit_record: str
    def __init__(self, name: _Optional[str] = ..., policy_version: _Optional[str] = ..., plan_hash: _Optional[str] = ..., attention_backend: _Optional[_Union[AttentionBackends, _Mapping]] = ..., prefill: _Optional[_Union[PrefillPlan, _Mapping]] = ..., decode: _Optional[_Union[DecodePlan, _Mapping]] = ..., kv_cache_dtype: _Optional[str] = ..., chunked_prefill_size: _Optional[int] = ..., locked: _Optional[_Iterable[str]] = ..., decisions: _Optional[_Iterable[_Union[Decision, _Mapping]]] = ..., warnings: _Optional[_Iterable[_Union[PlanWarning, _Mapping]]] = ..., estimates: _Optional[_Union[Estimates, _Mapping]] = ..., policy: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., spec: _Optional[_Union[_launch_spec_pb2.LaunchSpec, _Mapping]] = ..., audit_record: _Optional[str] = ...) -> None: ...

class AttentionBackends(_message.Message):
    __slots__ = ("prefill", "decode")
    PREFILL_FIELD_NUMBER: _ClassVar[int]
    DECODE_FIELD_NUMBER: _ClassVar[int]
    prefill: str
    decode: str
    def __init__(self, prefill: _Optional[str] = ..., decode: _Optional[str] = ...) -> None: ...

class PrefillPlan(_message.Message):
    __slots__ = ("backend", "max_num_tokens", "num_tokens")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    max_num_tokens: int
    num_tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, backend: _Optional[str] = ..., max_num_tokens: _Optional[int] = ..., num_tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DecodePlan(_message.Message):
    __slots__ = ("backend", "max_bs", "bs")
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    MAX_BS_FIELD_NUMBER: _ClassVar[int]
    BS_FIELD_NUMBER: _ClassVar[int]
    backend: str
    max_bs: int
    bs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, backend: _Optional[str] = ..., max_bs: _Optional[int] = ..., bs: _Optional[_Iterable[int]] = ...) -> None: ...

class Decision(_message.Message):
    __slots__ = ("seq", "rule_id", "phase", "field", "before", "after", "source", "reason", "forced")
    SEQ_FIELD_NUMBER: _ClassVar[int]
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    FIELD_FIELD_NUMBER: _ClassVar[int]
    BEFORE_FIELD_NUMBER: _ClassVar[int]
    AFTER_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    FORCED_FIELD_NUMBER: _ClassVar[int]
    seq: int
    rule_id: str
    phase: str
    field: str
    before: str
    after: str
    source: str
    reason: str
    forced: bool
    def __init__(self, seq: _Optional[int] = ..., rule_id: _Optional[str] = ..., phase: _Optional[str] = ..., field: _Optional[str] = ..., before: _Optional[str] = ..., after: _Optional[str] = ..., source: _Optional[str] = ..., reason: _Optional[str] = ..., forced: _Optional[bool] = ...) -> None: ...

class PlanWarning(_message.Message):
    __slots__ = ("rule_id", "message")
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    rule_id: str
    message: str
    def __init__(self, rule_id: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class Estimates(_message.Message):
    __slots__ = ("graphs", "capture_memory_bytes", "capture_seconds")
    GRAPHS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    graphs: int
    capture_memory_bytes: int
    capture_seconds: float
    def __init__(self, graphs: _Optional[int] = ..., capture_memory_bytes: _Optional[int] = ..., capture_seconds: _Optional[float] = ...) -> None: ...
