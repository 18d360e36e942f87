import datetime

from cgsvc.v1 import launch_pb2 as _launch_pb2
from google.protobuf import field_mask_pb2 as _field_mask_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class UpdateExperimentRequest(_message.Message):
    __slots__ = ("experiment", "update_mask")
    EXPERIMENT_FIELD_NUMBER: _ClassVar[int]
    UPDATE_MASK_FIELD_NUMBER: _ClassVar[int]
    experiment: Experiment
    update_mask: _field_mask_pb2.FieldMask
    def __init__(self, experiment: _Optional[_Union[Experiment, _Mapping]] = ..., update_mask: _Optional[_Union[_field_mask_pb2.FieldMask, _Mapping]] = ...) -> None: ...

class CancelExperimentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class CreateExperimentRequest(_message.Message):
    __slots__ = ("plans", "workload", "model_path", "repeats", "dispatcher", "engine", "rerun_of", "request_id", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    PLANS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedScalarFieldContainer[str]
    workload: _launch_pb2.LaunchWorkload
    model_path: str
    repeats: int
    dispatcher: str
    engine: _launch_pb2.EngineSettings
    rerun_of: str
    request_id: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, plans: _Optional[_Iterable[str]] = ..., workload: _Optional[_Union[_launch_pb2.LaunchWorkload, _Mapping]] = ..., model_path: _Optional[str] = ..., repeats: _Optional[int] = ..., dispatcher: _Optional[str] = ..., engine: _Optional[_Union[_launch_pb2.EngineSettings, _Mapping]] = ..., rerun_of: _Optional[str] = ..., request_id: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class ExperimentRun(_message.Message):
    __slots__ = ("arm", "repeat", "launch", "state")
    ARM_FIELD_NUMBER: _ClassVar[int]
    REPEAT_FIELD_NUMBER: _ClassVar[int]
    LAUNCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    arm: str
    repeat: int
    launch: str
    state: str
    def __init__(self, arm: _Optional[str] = ..., repeat: _Optional[int] = ..., launch: _Optional[str] = ..., state: _Optional[str] = ...) -> None: ...

class Experiment(_message.Message):
    __slots__ = ("name", "state", "plans", "workload", "model_path", "repeats", "dispatcher", "runs", "error", "result", "verdict", "create_time", "update_time", "audit_records", "principal", "cancel_requested_by", "engine", "rerun_of", "labels")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PLANS_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    MODEL_PATH_FIELD_NUMBER: _ClassVar[int]
    REPEATS_FIELD_NUMBER: _ClassVar[int]
    DISPATCHER_FIELD_NUMBER: _ClassVar[int]
    RUNS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CREATE_TIME_FIELD_NUMBER: _ClassVar[int]
    UPDATE_TIME_FIELD_NUMBER: _ClassVar[int]
    AUDIT_RECORDS_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    CANCEL_REQUESTED_BY_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    RERUN_OF_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    name: str
    state: str
    plans: _containers.RepeatedScalarFieldContainer[str]
    workload: _launch_pb2.LaunchWorkload
    model_path: str
    repeats: int
    dispatcher: str
    runs: _containers.RepeatedCompositeFieldContainer[ExperimentRun]
    error: str
    result: _struct_pb2.Struct
    verdict: str
    create_time: _timestamp_pb2.Timestamp
    update_time: _timestamp_pb2.Timestamp
    audit_records: _containers.RepeatedScalarFieldContainer[str]
    principal: str
    cancel_requested_by: str
    engine: _launch_pb2.EngineSettings
    rerun_of: str
    labels: _containers.ScalarMap[str, str]
    def __init__(self, name: _Optional[str] = ..., state: _Optional[str] = ..., plans: _Optional[_Iterable[str]] = ..., workload: _Optional[_Union[_launch_pb2.LaunchWorkload, _Mapping]] = ..., model_path: _Optional[str] = ..., repeats: _Optional[int] = ..., dispatcher: _Optional[str] = ..., runs: _Optional[_Iterable[_Union[ExperimentRun, _Mapping]]] = ..., error: _Optional[str] = ..., result: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., verdict: _Optional[str] = ..., create_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., update_time: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., audit_records: _Optional[_Iterable[str]] = ..., principal: _Optional[str] = ..., cancel_requested_by: _Optional[str] = ..., engine: _Optional[_Union[_launch_pb2.EngineSettings, _Mapping]] = ..., rerun_of: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ...) -> None: ...

class GetExperimentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListExperimentsRequest(_message.Message):
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

class ListExperimentsResponse(_message.Message):
    __slots__ = ("experiments", "next_page_token")
    EXPERIMENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    experiments: _containers.RepeatedCompositeFieldContainer[Experiment]
    next_page_token: str
    def __init__(self, experiments: _Optional[_Iterable[_Union[Experiment, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class WatchExperimentRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...
