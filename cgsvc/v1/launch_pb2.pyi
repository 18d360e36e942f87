import datetime

from cgsvc.v1 import launch_spec_pb2 as _launch_spec_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class LaunchWorkload(_message.Message):
    __slots__ = ("input_len", "output_len", "requests", "concurrency", "seed")
    INPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_LEN_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    input_len: int
    output_len: int
    requests: int
    concurrency: int
    seed: int
    def __init__(self, input_len: _Optional[int] = ..., output_len: _Optional[int] = ..., requests: _Optional[int] = ..., concurrency: _Optional[int] = ..., seed: _Optional[int] = ...) -> None: ...

class EngineSettings(_message.Message):
    __slots__ = ("dtype", "kv_cache_mb", "cpu_decode")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_MB_FIELD_NUMBER: _ClassVar[int]
    CPU_DECODE_FIELD_NUMBER: _ClassVar[int]
    dtype: str
    kv_cache_mb: float
    cpu_decode: str
    def __init__(self, dtype: _Optional[str] = ..., kv_cache_mb: _Optional[float] = ..., cpu_decode: _Optional[str] = ...) -> None: ...

class PlanFidelity(_message.Message):
    __slots__ = ("field", "requested", "effective", "status", "reason")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_FIELD_NUMBER: _ClassVar[int]
    EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    field: str
    requested: str
    effective: str
    status: str
    reason: str
    def __init__(self, field: _Optional[str] = ..., requested: _Optional[str] = ..., effective: _Optional[str] = ..., status: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class LaunchReport(_message.Message):
    __slots__ = ("ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p50", "tpot_ms_p99", "throughput_tok_s", "output_tokens", "prefill_requested", "prefill_effective", "decode_requested", "decode_effective", "attention_prefill_effective", "attention_decode_effective", "capture_seconds", "capture_bytes", "kv_bytes_per_token", "substitutions", "plan_fidelity", "dtype", "dtype_reason", "kv_cache_budget_bytes", "kv_cache_budget_reason")
    TTFT_MS_P50_FIELD_NUMBER: _ClassVar[int]
    TTFT_MS_P99_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_P50_FIELD_NUMBER: _ClassVar[int]
    TPOT_MS_P99_FIELD_NUMBER: _ClassVar[int]
    THROUGHPUT_TOK_S_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PREFILL_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    PREFILL_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    DECODE_REQUESTED_FIELD_NUMBER: _ClassVar[int]
    DECODE_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_PREFILL_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    ATTENTION_DECODE_EFFECTIVE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_BYTES_PER_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SUBSTITUTIONS_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIDELITY_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_REASON_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BUDGET_BYTES_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_BUDGET_REASON_FIELD_NUMBER: _ClassVar[int]
    ttft_ms_p50: float
    ttft_ms_p99: float
    tpot_ms_p50: float
    tpot_ms_p99: float
    throughput_tok_s: float
    output_tokens: int
    prefill_requested: str
    prefill_effective: str
    decode_requested: str
    decode_effective: str
    attention_prefill_effective: str
    attention_decode_effective: str
    capture_seconds: float
    capture_bytes: int
    kv_bytes_per_token: int
    substitutions: _containers.RepeatedScalarFieldContainer[str]
    plan_fidelity: _containers.RepeatedCompositeFieldContainer[PlanFidelity]
    dtype: str
    dtype_reason: str
    kv_cache_budget_bytes: int
    kv_cache_budget_reason: str
    def __init__(self, ttft_ms_p50: _Optional[float] = ..., ttft_ms_p99: _Optional[float] = ..., tpot_ms_p50: _Optional[float] = ..., tpot_ms_p99: _Optional[float] = ..., throughput_tok_s: _Optional[float] = ..., output_tokens: _Optional[int] = ..., prefill_requested: _Optional[str] = ..., prefill_effective: _Optional[str] = ..., decode_requested: _Optional[str] = ..., decode_effective: _Optional[str] = ..., attention_prefill_effective: _Optional[str] = ..., attention_decode_effective: _Optional[str] = ..., capture_seconds: _Optional[float] = ..., capture_bytes: _Optional[int] = ..., kv_bytes_per_token: _Optional[int] = ..., substitutions: _Optional[_Iterable[str]] = ..., plan_fidelity: _Optional[_Iterable[_Union[PlanFidelity, _Mapping]]] = ..., dtype: _Optional[str] = ..., dtype_reason: _Optional[str] = ..., kv_cache_budget_bytes: _Optional[int] = ..., kv_cache_budget_reason: _Optional[str] = ...) -> None: ...

class Launch(_message.Message):
    __slots__ = ("name", "plan", "state", "workload", "model_path", "tp", "dispatcher", "create_time", "update_time", "tokens_done", "tokens_total", "error", "report", "report_json", "plan_audit_record", "audit_records", "principal", "devices", "placement", "request_id", "owner", "prompt_tokens_done", "prompt_tokens_total", "engine", "capture_done", "capture_total", "rerun_of", "labels", "experiment")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    TP_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    TOKENS_DONE_FIELD_NUMBER: _ClassVar[int]
    TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    REPORT_FIELD_NUMBER: _ClassVar[int]
    REPORT_JSON_FIELD_NUMBER: _ClassVar[int]
    PLAN_AUDIT_RECORD_FIELD_NUMBER: _ClassVar[int]
    AUDIT_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_DONE_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_DONE_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_TOTAL_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    EXPERIMENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    plan: str
    state: str
    workload: LaunchWorkload
    model_path: str
    tp: int
    dispatcher: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    tokens_done: int
    tokens_total: int
    error: str
    report: LaunchReport
    report_json: str
    plan_audit_record: str
    audit_records: _containers.RepeatedScalarFieldContainer[str]
    principal: str
    devices: _containers.RepeatedScalarFieldContainer[str]
    placement: str
    request_id: str
    owner: str
    prompt_tokens_done: int
    prompt_tokens_total: int
    engine: EngineSettings
    capture_done: int
    capture_total: int
    rerun_of: str
    labels: _containers.ScalarMap[str, str]
    experiment: str
    def __init__(self, name: _Optional[str] = ..., plan: _Optional[str] = ..., state: _Optional[str] = ..., workload: _Optional[_Union[LaunchWorkload, _Mapping]] = ..., model_path: _Optional[str] = ..., tp: _Optional[int] = ..., dispatcher: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., tokens_done: _Optional[int] = ..., tokens_total: _Optional[int] = ..., error: _Optional[str] = ..., report: _Optional[_Union[LaunchReport, _Mapping]] = ..., report_json: _Optional[str] = ..., plan_audit_record: _Optional[str] = ..., audit_records: _Optional[_Iterable[str]] = ..., principal: _Optional[str] = ..., devices: _Optional[_Iterable[str]] = ..., placement: _Optional[str] = ..., request_id: _Optional[str] = ..., owner: _Optional[str] = ..., prompt_tokens_done: _Optional[int] = ..., prompt_tokens_total: _Optional[int] = ..., engine: _Optional[_Union[EngineSettings, _Mapping]] = ..., capture_done: _Optional[int] = ..., capture_total: _Optional[int] = ..., rerun_of: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., experiment: _Optional[str] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("name", "host", "start_time", "seconds_since_renewal", "lapsed", "active_launches", "answering", "version", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    START_TIME_FIELD_NUMBER: _ClassVar[int]
    SECONDS_SINCE_RENEWAL_FIELD_NUMBER: _ClassVar[int]
    LAPSED_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    ANSWERING_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    host: str
    start_time: _timestamp_pb2.Timestamp
    seconds_since_renewal: float
    lapsed: bool
    active_launches: int
    answering: bool
    version: str
    address: str
    def __init__(self, name: _Optional[str] = ..., host: _Optional[str] = ..., start_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., seconds_since_renewal: _Optional[float] = ..., lapsed: _Optional[bool] = ..., active_launches: _Optional[int] = ..., answering: _Optional[bool] = ..., version: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class ListReplicasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas", "lease_seconds")
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    LEASE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    lease_seconds: float
    def __init__(self, replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ..., lease_seconds: _Optional[float] = ...) -> None: ...

class CreateLaunchRequest(_message.Message):
    __slots__ = ("spec", "plan", "rerun_of", "workload", "model_path", "request_id", "dispatcher", "wait_for_resources", "policy", "validate_only", "engine", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SPEC_FIELD_NUMBER: _ClassVar[int]
    PLAN_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_RESOURCES_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    spec: _launch_spec_pb2.LaunchSpec
    plan: str
    rerun_of: str
    workload: LaunchWorkload
    model_path: str
    request_id: str
    dispatcher: str
    wait_for_resources: bool
    policy: str
    validate_only: bool
    engine: EngineSettings
    labels: _containers.ScalarMap[str, str]
    def __init__(self, spec: _Optional[_Union[_launch_spec_pb2.LaunchSpec, _Mapping]] = ..., plan: _Optional[str] = ..., rerun_of: _Optional[str] = ..., workload: _Optional[_Union[LaunchWorkload, _Mapping]] = ..., model_path: _Optional[str] = ..., request_id: _Optional[str] = ..., dispatcher: _Optional[str] = ..., wait_for_resources: _Optional[bool] = ..., policy: _Optional[str] = ..., validate_only: _Optional[bool] = ..., engine: _Optional[_Union[EngineSettings, _Mapping]] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Operation(_message.Message):
    __slots__ = ("name", "done", "metadata", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DONE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    done: bool
    metadata: Launch
    error_code: int
    error_message: str
    def __init__(self, name: _Optional[str] = ..., done: _Optional[bool] = ..., metadata: _Optional[_Union[Launch, _Mapping]] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ...) -> None: ...

class GetLaunchRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListLaunchesRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "filter", "order_by")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    ORDER_BY_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    filter: str
    order_by: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[str] = ..., order_by: _Optional[str] = ...) -> None: ...

class ListLaunchesResponse(_message.Message):
    __slots__ = ("launches", "next_page_token")
    LAUNCHES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    launches: _containers.RepeatedCompositeFieldContainer[Launch]
    next_page_token: str
    def __init__(self, launches: _Optional[_Iterable[_Union[Launch, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class UpdateLaunchRequest(_message.Message):
    __slots__ = ("launch", "update_mask")
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    launch: Launch
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, launch: _Optional[_Union[Launch, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class CancelLaunchRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class WatchLaunchRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class LaunchEvent(_message.Message):
    __slots__ = ("kind", "launch")
    KIND_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    kind: str
    launch: Launch
    def __init__(self, kind: _Optional[str] = ..., launch: _Optional[_Union[Launch, _Mapping]] = ...) -> None: ...

class GetLaunchLogsRequest(_message.Message):
    __slots__ = ("name", "rank", "tail_lines", "after_offsets")
    class AfterOffsetsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    AFTER_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    name: str
    rank: int
    tail_lines: int
    after_offsets: _containers.ScalarMap[str, int]
    def __init__(self, name: _Optional[str] = ..., rank: _Optional[int] = ..., tail_lines: _Optional[int] = ..., after_offsets: _Optional[_Mapping[str, int]] = ...) -> None: ...

class RankLog(_message.Message):
    __slots__ = ("name", "text", "end_offset", "size")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    SIZE_FIELD_NUMBER: _ClassVar[int]
    name: str
    text: str
    end_offset: int
    size: int
    def __init__(self, name: _Optional[str] = ..., text: _Optional[str] = ..., end_offset: _Optional[int] = ..., size: _Optional[int] = ...) -> None: ...

class LaunchLogs(_message.Message):
    __slots__ = ("logs", "state")
    LOGS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    logs: _containers.RepeatedCompositeFieldContainer[RankLog]
    state: str
    def __init__(self, logs: _Optional[_Iterable[_Union[RankLog, _Mapping]]] = ..., state: _Optional[str] = ...) -> None: ...
