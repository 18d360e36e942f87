from cgsvc.v1 import launch_spec_pb2 as _launch_spec_pb2
from cgsvc.v1 import plan_pb2 as _plan_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResolvePlanRequest(_message.Message):
    __slots__ = ("spec", "validate_only", "request_id", "policy")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    spec: _launch_spec_pb2.LaunchSpec
    validate_only: bool
    request_id: str
    policy: str
    def __init__(self, spec: _Optional[_Union[_launch_spec_pb2.LaunchSpec, _Mapping]] = ..., validate_only: _Optional[bool] = ..., request_id: _Optional[str] = ..., policy: _Optional[str] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListPlansRequest(_message.Message):
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

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_plan_pb2.Plan]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[_plan_pb2.Plan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PolicyInfo(_message.Message):
    __slots__ = ("name", "version", "summary", "rules", "doc", "default")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    DOC_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    summary: str
    rules: int
    doc: str
    default: bool
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., summary: _Optional[str] = ..., rules: _Optional[int] = ..., doc: _Optional[str] = ..., default: _Optional[bool] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("policies",)
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[PolicyInfo]
    def __init__(self, policies: _Optional[_Iterable[_Union[PolicyInfo, _Mapping]]] = ...) -> None: ...

class ModelInfo(_message.Message):
    __slots__ = ("name", "aliases", "architecture", "text_architecture", "mla", "dsa", "moe", "multimodal", "quantization", "kv_cache_dtype", "num_layers", "hidden_size", "num_attention_heads")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ALIASES_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    TEXT_ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MLA_FIELD_NUMBER: _ClassVar[int]
    DSA_FIELD_NUMBER: _ClassVar[int]
    MOE_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_FIELD_NUMBER: _ClassVar[int]
    QUANTIZATION_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_DTYPE_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    HIDDEN_SIZE_FIELD_NUMBER: _ClassVar[int]
    NUM_ATTENTION_HEADS_FIELD_NUMBER: _ClassVar[int]
    name: str
    aliases: _containers.RepeatedScalarFieldContainer[str]
    architecture: str
    text_architecture: str
    mla: bool
    dsa: bool
    moe: bool
    multimodal: bool
    quantization: str
    kv_cache_dtype: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    def __init__(self, name: _Optional[str] = ..., aliases: _Optional[_Iterable[str]] = ..., architecture: _Optional[str] = ..., text_architecture: _Optional[str] = ..., mla: _Optional[bool] = ..., dsa: _Optional[bool] = ..., moe: _Optional[bool] = ..., multimodal: _Optional[bool] = ..., quantization: _Optional[str] = ..., kv_cache_dtype: _Optional[str] = ..., num_layers: _Optional[int] = ..., hidden_size: _Optional[int] = ..., num_attention_heads: _Optional[int] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListModelsResponse(_message.Message):
    __slots__ = ("models",)
    MODELS_FIELD_NUMBER: _ClassVar[int]
    models: _containers.RepeatedCompositeFieldContainer[ModelInfo]
    def __init__(self, models: _Optional[_Iterable[_Union[ModelInfo, _Mapping]]] = ...) -> None: ...

class ComputePolicyImpactRequest(_message.Message):
    __slots__ = ("candidate", "baseline", "filter")
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    candidate: str
    baseline: str
    filter: str
    def __init__(self, candidate: _Optional[str] = ..., baseline: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class PolicyRef(_message.Message):
    __slots__ = ("name", "version")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ...) -> None: ...

class FieldChange(_message.Message):
    __slots__ = ("field", "baseline", "candidate", "baseline_rules", "candidate_rules")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    BASELINE_RULES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_RULES_FIELD_NUMBER: _ClassVar[int]
    field: str
    baseline: _struct_pb2.Value
    candidate: _struct_pb2.Value
    baseline_rules: _containers.RepeatedScalarFieldContainer[str]
    candidate_rules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, field: _Optional[str] = ..., baseline: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., candidate: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., baseline_rules: _Optional[_Iterable[str]] = ..., candidate_rules: _Optional[_Iterable[str]] = ...) -> None: ...

class RuleChanges(_message.Message):
    __slots__ = ("baseline_only", "candidate_only")
    BASELINE_ONLY_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    baseline_only: _containers.RepeatedScalarFieldContainer[str]
    candidate_only: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, baseline_only: _Optional[_Iterable[str]] = ..., candidate_only: _Optional[_Iterable[str]] = ...) -> None: ...

class ChangedSpec(_message.Message):
    __slots__ = ("spec_hash", "model", "gpu", "records", "changes", "rules", "example_record")
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CHANGES_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_RECORD_FIELD_NUMBER: _ClassVar[int]
    spec_hash: str
    model: str
    gpu: str
    records: int
    changes: _containers.RepeatedCompositeFieldContainer[FieldChange]
    rules: RuleChanges
    example_record: str
    def __init__(self, spec_hash: _Optional[str] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., records: _Optional[int] = ..., changes: _Optional[_Iterable[_Union[FieldChange, _Mapping]]] = ..., rules: _Optional[_Union[RuleChanges, _Mapping]] = ..., example_record: _Optional[str] = ...) -> None: ...

class RefusalChange(_message.Message):
    __slots__ = ("spec_hash", "model", "gpu", "records", "code", "message", "rule_id", "example_record", "fields")
    SPEC_HASH_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    RULE_ID_FIELD_NUMBER: _ClassVar[int]
    EXAMPLE_RECORD_FIELD_NUMBER: _ClassVar[int]
    FIELDS_FIELD_NUMBER: _ClassVar[int]
    spec_hash: str
    model: str
    gpu: str
    records: int
    code: str
    message: str
    rule_id: str
    example_record: str
    fields: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, spec_hash: _Optional[str] = ..., model: _Optional[str] = ..., gpu: _Optional[str] = ..., records: _Optional[int] = ..., code: _Optional[str] = ..., message: _Optional[str] = ..., rule_id: _Optional[str] = ..., example_record: _Optional[str] = ..., fields: _Optional[_Iterable[str]] = ...) -> None: ...

class RecordedUnder(_message.Message):
    __slots__ = ("policy", "version", "records")
    POLICY_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    policy: str
    version: str
    records: int
    def __init__(self, policy: _Optional[str] = ..., version: _Optional[str] = ..., records: _Optional[int] = ...) -> None: ...

class PolicyImpact(_message.Message):
    __slots__ = ("baseline", "candidate", "specs_examined", "records_examined", "changed", "newly_refused", "newly_accepted", "unchanged", "recorded_under", "filter", "by_field", "changed_total", "newly_refused_total", "newly_accepted_total", "baseline_unknown")
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    SPECS_EXAMINED_FIELD_NUMBER: _ClassVar[int]
    RECORDS_EXAMINED_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    NEWLY_REFUSED_FIELD_NUMBER: _ClassVar[int]
    NEWLY_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    RECORDED_UNDER_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_FIELD_NUMBER: _ClassVar[int]
    CHANGED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NEWLY_REFUSED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    NEWLY_ACCEPTED_TOTAL_FIELD_NUMBER: _ClassVar[int]
    BASELINE_UNKNOWN_FIELD_NUMBER: _ClassVar[int]
    baseline: PolicyRef
    candidate: PolicyRef
    specs_examined: int
    records_examined: int
    changed: _containers.RepeatedCompositeFieldContainer[ChangedSpec]
    newly_refused: _containers.RepeatedCompositeFieldContainer[RefusalChange]
    newly_accepted: _containers.RepeatedCompositeFieldContainer[RefusalChange]
    unchanged: int
    recorded_under: _containers.RepeatedCompositeFieldContainer[RecordedUnder]
    filter: str
    by_field: _containers.RepeatedCompositeFieldContainer[FieldImpact]
    changed_total: int
    newly_refused_total: int
    newly_accepted_total: int
    baseline_unknown: int
    def __init__(self, baseline: _Optional[_Union[PolicyRef, _Mapping]] = ..., candidate: _Optional[_Union[PolicyRef, _Mapping]] = ..., specs_examined: _Optional[int] = ..., records_examined: _Optional[int] = ..., changed: _Optional[_Iterable[_Union[ChangedSpec, _Mapping]]] = ..., newly_refused: _Optional[_Iterable[_Union[RefusalChange, _Mapping]]] = ..., newly_accepted: _Optional[_Iterable[_Union[RefusalChange, _Mapping]]] = ..., unchanged: _Optional[int] = ..., recorded_under: _Optional[_Iterable[_Union[RecordedUnder, _Mapping]]] = ..., filter: _Optional[str] = ..., by_field: _Optional[_Iterable[_Union[FieldImpact, _Mapping]]] = ..., changed_total: _Optional[int] = ..., newly_refused_total: _Optional[int] = ..., newly_accepted_total: _Optional[int] = ..., baseline_unknown: _Optional[int] = ...) -> None: ...

class FieldImpact(_message.Message):
    __slots__ = ("field", "baseline", "candidate", "specs", "records", "baseline_rules", "candidate_rules", "examples")
    FIELD_FIELD_NUMBER: _ClassVar[int]
    BASELINE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    BASELINE_RULES_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_RULES_FIELD_NUMBER: _ClassVar[int]
    EXAMPLES_FIELD_NUMBER: _ClassVar[int]
    field: str
    baseline: _struct_pb2.Value
    candidate: _struct_pb2.Value
    specs: int
    records: int
    baseline_rules: _containers.RepeatedScalarFieldContainer[str]
    candidate_rules: _containers.RepeatedScalarFieldContainer[str]
    examples: _containers.RepeatedCompositeFieldContainer[ImpactExample]
    def __init__(self, field: _Optional[str] = ..., baseline: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., candidate: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., specs: _Optional[int] = ..., records: _Optional[int] = ..., baseline_rules: _Optional[_Iterable[str]] = ..., candidate_rules: _Optional[_Iterable[str]] = ..., examples: _Optional[_Iterable[_Union[ImpactExample, _Mapping]]] = ...) -> None: ...

class ImpactExample(_message.Message):
    __slots__ = ("model", "gpu", "record")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    model: str
    gpu: str
    record: str
    def __init__(self, model: _Optional[str] = ..., gpu: _Optional[str] = ..., record: _Optional[str] = ...) -> None: ...
