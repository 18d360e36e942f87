import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuditRecordView(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    AUDIT_RECORD_VIEW_UNSPECIFIED: _ClassVar[AuditRecordView]
    AUDIT_RECORD_VIEW_BASIC: _ClassVar[AuditRecordView]
    AUDIT_RECORD_VIEW_FULL: _ClassVar[AuditRecordView]
AUDIT_RECORD_VIEW_UNSPECIFIED: AuditRecordView
AUDIT_RECORD_VIEW_BASIC: AuditRecordView
AUDIT_RECORD_VIEW_FULL: AuditRecordView

class AuditRecord(_message.Message):
    __slots__ = ("name", "sequence", "schema_version", "time", "principal", "peer", "method", "request_id", "trace_id", "spec_json", "spec_hash", "plan_json", "plan_hash", "rule_ids", "policy_version", "service_version", "outcome_code", "outcome_message", "launch_id", "plan_id", "prev_hash", "record_hash", "model", "gpu", "hashed_json", "policy")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    PLAN_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_HASH_FIELD_NUMBER: _ClassVar[int]
    RULE_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    SERVICE_VERSION_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_CODE_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    PREV_HASH_FIELD_NUMBER: _ClassVar[int]
    RECORD_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    HASHED_JSON_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    name: str
    sequence: int
    schema_version: int
    time: _timestamp_pb2.Timestamp
    principal: str
    peer: str
    method: str
    request_id: str
    trace_id: str
    spec_json: str
    spec_hash: str
    plan_json: str
    plan_hash: str
    rule_ids: _containers.RepeatedScalarFieldContainer[str]
    policy_version: str
    service_version: str
    outcome_code: int
    outcome_message: str
    launch_id: str
    plan_id: str
    prev_hash: str
    record_hash: str
    model: str
    gpu: str
    hashed_json: str
    policy: str
    def __init__(self, name: _Optional[str] = ..., sequence: _Optional[int] = ..., schema_version: _Optional[int] = ..., time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., principal: _Optional[str] = ..., peer: _Optional[str] = ..., method: _Optional[str] = ..., request_id: _Optional[str] = ..., trace_id: _Optional[str] = ..., spec_json: _Optional[str] = ..., spec_hash: _Optional[str] = ..., plan_json: _Optional[str] = ..., plan_hash: _Optional[str] = ..., rule_ids: _Optional[_Iterable[str]] = ..., policy_version: _Optional[str] = ..., service_version: _Optional[str] = ..., outcome_code: _Optional[int] = ..., outcome_message: _Optional[str] = ..., launch_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., prev_hash: _Optional[str] = ..., record_hash: _Optional[str] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., hashed_json: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class GetAuditRecordRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListAuditRecordsRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "filter", "order_by", "view")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    VIEW_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    filter: str
    order_by: str
    view: AuditRecordView
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[str] = ..., order_by: _Optional[str] = ..., view: _Optional[_Union[AuditRecordView, str]] = ...) -> None: ...

class ListAuditRecordsResponse(_message.Message):
    __slots__ = ("records", "next_page_token")
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    records: _containers.RepeatedCompositeFieldContainer[AuditRecord]
    next_page_token: str
    def __init__(self, records: _Optional[_Iterable[_Union[AuditRecord, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class VerifyAuditLogRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class VerifyAuditLogResponse(_message.Message):
    __slots__ = ("ok", "records_checked", "first_bad_sequence", "reason", "head_hash")
    OK_FIELD_NUMBER: _ClassVar[int]
    RECORDS_CHECKED_FIELD_NUMBER: _ClassVar[int]
    FIRST_BAD_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HEAD_HASH_FIELD_NUMBER: _ClassVar[int]
    ok: bool
    records_checked: int
    first_bad_sequence: int
    reason: str
    head_hash: str
    def __init__(self, ok: _Optional[bool] = ..., records_checked: _Optional[int] = ..., first_bad_sequence: _Optional[int] = ..., reason: _Optional[str] = ..., head_hash: _Optional[str] = ...) -> None: ...

class GetCheckpointRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Checkpoint(_message.Message):
    __slots__ = ("origin", "tree_size", "root_hash", "time", "key_id", "public_key", "signature")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    ROOT_HASH_FIELD_NUMBER: _ClassVar[int]
    TIME_FIELD_NUMBER: _ClassVar[int]
    KEY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    origin: str
    tree_size: int
    root_hash: str
    time: str
    key_id: str
    public_key: str
    signature: str
    def __init__(self, origin: _Optional[str] = ..., tree_size: _Optional[int] = ..., root_hash: _Optional[str] = ..., time: _Optional[str] = ..., key_id: _Optional[str] = ..., public_key: _Optional[str] = ..., signature: _Optional[str] = ...) -> None: ...

class GetInclusionProofRequest(_message.Message):
    __slots__ = ("name", "tree_size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    tree_size: int
    def __init__(self, name: _Optional[str] = ..., tree_size: _Optional[int] = ...) -> None: ...

class InclusionProof(_message.Message):
    __slots__ = ("leaf_index", "tree_size", "hashes", "record")
    LEAF_INDEX_FIELD_NUMBER: _ClassVar[int]
    TREE_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    leaf_index: int
    tree_size: int
    hashes: _containers.RepeatedScalarFieldContainer[str]
    record: AuditRecord
    def __init__(self, leaf_index: _Optional[int] = ..., tree_size: _Optional[int] = ..., hashes: _Optional[_Iterable[str]] = ..., record: _Optional[_Union[AuditRecord, _Mapping]] = ...) -> None: ...

class GetConsistencyProofRequest(_message.Message):
    __slots__ = ("first_size", "second_size")
    FIRST_SIZE_FIELD_NUMBER: _ClassVar[int]
    SECOND_SIZE_FIELD_NUMBER: _ClassVar[int]
    first_size: int
    second_size: int
    def __init__(self, first_size: _Optional[int] = ..., second_size: _Optional[int] = ...) -> None: ...

class ConsistencyProof(_message.Message):
    __slots__ = ("first_size", "second_size", "hashes")
    FIRST_SIZE_FIELD_NUMBER: _ClassVar[int]
    SECOND_SIZE_FIELD_NUMBER: _ClassVar[int]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    first_size: int
    second_size: int
    hashes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, first_size: _Optional[int] = ..., second_size: _Optional[int] = ..., hashes: _Optional[_Iterable[str]] = ...) -> None: ...
