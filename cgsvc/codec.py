"""The one codec between the wire (protobuf) and the domain types.

Specs go proto -> JSON-form dict -> `parse_spec`, so the gRPC and JSON forms share one
validator. Plans go domain -> JSON-form dict -> proto and back, so a plan printed from a
server answer is byte-identical to one resolved in-process.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from cgsvc.errors import FieldViolation, ResolveError
from cgsvc.plan import Plan
from cgsvc.spec import LaunchSpec, parse_spec, spec_to_dict
from cgsvc.v1 import launch_spec_pb2, plan_pb2

# Server-only resource fields of Plan, absent from the JSON form of DESIGN.md.
PLAN_RESOURCE_FIELDS = ("name", "create_time", "spec", "audit_record")


def spec_to_proto(spec: LaunchSpec) -> launch_spec_pb2.LaunchSpec:
    return json_format.ParseDict(spec_to_dict(spec), launch_spec_pb2.LaunchSpec())


def spec_dict_from_proto(msg: launch_spec_pb2.LaunchSpec) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


def spec_from_proto(msg: launch_spec_pb2.LaunchSpec) -> LaunchSpec:
    return parse_spec(spec_dict_from_proto(msg))


def spec_proto_from_dict(data: Any) -> launch_spec_pb2.LaunchSpec:
    """A spec dict as a proto, for sending; validation errors name the field like parse_spec does."""
    parse_spec(data)  # the full validator first: it names every bad field
    try:
        return json_format.ParseDict(data, launch_spec_pb2.LaunchSpec())
    except json_format.ParseError as exc:  # pragma: no cover - parse_spec rejects first
        raise ResolveError.invalid([FieldViolation("spec", str(exc))]) from None


def plan_to_proto(plan: Plan) -> plan_pb2.Plan:
    return json_format.ParseDict(plan.to_dict(), plan_pb2.Plan())


def plan_dict_from_proto(msg: plan_pb2.Plan, resource_fields: bool = False) -> dict[str, Any]:
    """The JSON form of a plan message; with resource_fields, also name/create_time/spec/audit_record."""
    out = json_format.MessageToDict(msg, preserving_proto_field_name=True,
                                    always_print_fields_with_no_presence=True)
    est = out.get("estimates", {})
    est["capture_memory_bytes"] = int(est.get("capture_memory_bytes", 0))  # int64 is a string in proto JSON
    est["capture_seconds"] = float(est.get("capture_seconds", 0.0))
    if not resource_fields:
        for name in PLAN_RESOURCE_FIELDS:
            out.pop(name, None)
    return out
