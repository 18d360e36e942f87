from cgsvc.v1 import launch_spec_pb2 as _launch_spec_pb2
from cgsvc.v1 import plan_pb2 as _plan_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ResolvePlanRequest(_message.Message):
    __slots__ = ("spec", "validate_only", "request_id")
    SPEC_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    spec: _launch_spec_pb2.LaunchSpec
    validate_only: bool
    request_id: str
    def __init__(self, spec: _Optional[_Union[_launch_spec_pb2.LaunchSpec, _Mapping]] = ..., validate_only: _Optional[bool] = ..., request_id: _Optional[str] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ListPlansRequest(_message.Message):
    __slots__ = ("page_size", "page_token", "filter")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    FILTER_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    filter: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., filter: _Optional[str] = ...) -> None: ...

class ListPlansResponse(_message.Message):
    __slots__ = ("plans", "next_page_token")
    PLANS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    plans: _containers.RepeatedCompositeFieldContainer[_plan_pb2.Plan]
    next_page_token: str
    def __init__(self, plans: _Optional[_Iterable[_Union[_plan_pb2.Plan, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
