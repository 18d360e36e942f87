"""Fuzz the live server: random well-typed protos and raw bytes; no INTERNAL, server stays up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cgsvc_client.client import Client
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgsvc.v1 import audit_pb2, plan_service_pb2
from tests.e2e.server import ServerProcess

SETTINGS = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck), database=None)
INT32 = st.integers(-(2**31), 2**31 - 1)
WORDS = st.sampled_from(["GB300", "H200", "cpu", "nvidia/Kimi-K2.6-NVFP4", "Qwen/Qwen3-8B", "full", "disabled",
                         "breakable", "tc_piecewise", "trtllm_mla", "fa3", "fp8_e4m3", "deepep", "normal", ""])


def message_strategy(desc: Descriptor, depth: int = 0) -> st.SearchStrategy[dict[str, Any]]:
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for f in desc.fields:
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 4 or f.message_type.full_name.startswith("google."):
                continue
            value: st.SearchStrategy[Any] = message_strategy(f.message_type, depth + 1)
        elif f.type == FieldDescriptor.TYPE_BOOL:
            value = st.booleans()
        elif f.type in (FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_INT64):
            value = INT32
        elif f.type == FieldDescriptor.TYPE_BYTES:
            continue
        elif f.type == FieldDescriptor.TYPE_ENUM:  # its values, and numbers no value has (proto3 keeps them)
            value = st.sampled_from([v.number for v in f.enum_type.values]) | INT32
        else:
            value = WORDS | st.text(max_size=20)
        if f.is_repeated:
            value = st.lists(value, max_size=5)
        fields[f.name] = value
    return st.fixed_dictionaries({}, optional=fields)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, grpc.Channel]]:
    with ServerProcess(Path(tmp_path_factory.mktemp("fuzz"))) as srv, grpc.insecure_channel(srv.address) as ch:
        yield srv, ch


def check(call: Any, payload: bytes) -> None:
    try:
        call(payload, timeout=10)
    except grpc.RpcError as err:
        assert err.code() not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), err.details()


@SETTINGS
@given(message_strategy(plan_service_pb2.ResolvePlanRequest.DESCRIPTOR))
def test_fuzz_resolve_plan_protos(live: tuple[ServerProcess, grpc.Channel], data: dict[str, Any]) -> None:
    msg = json_format.ParseDict(data, plan_service_pb2.ResolvePlanRequest())
    check(live[1].unary_unary("/cgsvc.v1.PlanService/ResolvePlan"), msg.SerializeToString())


@SETTINGS
@given(st.sampled_from(["/cgsvc.v1.PlanService/ResolvePlan", "/cgsvc.v1.PlanService/GetPlan",
                        "/cgsvc.v1.PlanService/ListPlans", "/cgsvc.v1.AuditService/ListAuditRecords",
                        "/cgsvc.v1.AuditService/GetAuditRecord"]), st.binary(max_size=300))
def test_fuzz_raw_bytes(live: tuple[ServerProcess, grpc.Channel], method: str, payload: bytes) -> None:
    check(live[1].unary_unary(method), payload)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(message_strategy(audit_pb2.ListAuditRecordsRequest.DESCRIPTOR))
def test_fuzz_list_requests(live: tuple[ServerProcess, grpc.Channel], data: dict[str, Any]) -> None:
    msg = json_format.ParseDict(data, audit_pb2.ListAuditRecordsRequest())
    check(live[1].unary_unary("/cgsvc.v1.AuditService/ListAuditRecords"), msg.SerializeToString())


def test_server_alive_and_chain_intact_after_fuzz(live: tuple[ServerProcess, grpc.Channel]) -> None:
    srv, _ = live
    assert srv.alive()
    with Client(srv.address) as c:
        v = c.verify_audit_log()
        assert v.ok and v.records_checked > 1000
