"""The one codec between the wire (protobuf) and the domain types.

Specs go proto -> JSON-form dict -> `parse_spec`, so the gRPC and JSON forms share one
validator. Plans go domain -> JSON-form dict -> proto and back, so a plan printed from a
server answer is byte-identical to one resolved in-process.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import json_format

from cgsvc.errors import FieldViolation, ResolveError
from cgsvc.plan import Decision, Estimates, Plan, PlanWarning
from cgsvc.spec import LaunchSpec, parse_spec, spec_to_dict
from cgsvc.v1 import launch_spec_pb2, plan_pb2


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
    """Built field by field: json_format.ParseDict costs about 300 us per plan, this about 30."""
    return plan_pb2.Plan(
        policy_version=plan.policy_version, plan_hash=plan.plan_hash,
        attention_backend=plan_pb2.AttentionBackends(prefill=plan.attention_prefill, decode=plan.attention_decode),
        prefill=plan_pb2.PrefillPlan(backend=plan.prefill_backend, max_num_tokens=plan.prefill_max_num_tokens,
                                     num_tokens=plan.prefill_num_tokens),
        decode=plan_pb2.DecodePlan(backend=plan.decode_backend, max_bs=plan.decode_max_bs, bs=plan.decode_bs),
        kv_cache_dtype=plan.kv_cache_dtype, chunked_prefill_size=plan.chunked_prefill_size, locked=plan.locked,
        decisions=[plan_pb2.Decision(**d.to_dict()) for d in plan.decisions],
        warnings=[plan_pb2.PlanWarning(**w.to_dict()) for w in plan.warnings],
        estimates=plan_pb2.Estimates(**plan.estimates.to_dict()),
    )


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """The domain plan from its JSON form (as stored in the audit log)."""
    return Plan(
        policy_version=d["policy_version"], plan_hash=d["plan_hash"],
        attention_prefill=d["attention_backend"]["prefill"], attention_decode=d["attention_backend"]["decode"],
        prefill_backend=d["prefill"]["backend"], prefill_max_num_tokens=d["prefill"]["max_num_tokens"],
        prefill_num_tokens=tuple(d["prefill"]["num_tokens"]),
        decode_backend=d["decode"]["backend"], decode_max_bs=d["decode"]["max_bs"], decode_bs=tuple(d["decode"]["bs"]),
        kv_cache_dtype=d["kv_cache_dtype"], chunked_prefill_size=d["chunked_prefill_size"], locked=tuple(d["locked"]),
        decisions=tuple(Decision(**x) for x in d["decisions"]),
        warnings=tuple(PlanWarning(**w) for w in d["warnings"]),
        estimates=Estimates(**d["estimates"]),
    )


def plan_from_proto(msg: plan_pb2.Plan) -> Plan:
    """The domain plan carried by a Plan message (resource fields dropped)."""
    return Plan(
        policy_version=msg.policy_version, plan_hash=msg.plan_hash,
        attention_prefill=msg.attention_backend.prefill, attention_decode=msg.attention_backend.decode,
        prefill_backend=msg.prefill.backend, prefill_max_num_tokens=msg.prefill.max_num_tokens,
        prefill_num_tokens=tuple(msg.prefill.num_tokens),
        decode_backend=msg.decode.backend, decode_max_bs=msg.decode.max_bs, decode_bs=tuple(msg.decode.bs),
        kv_cache_dtype=msg.kv_cache_dtype, chunked_prefill_size=msg.chunked_prefill_size,
        locked=tuple(msg.locked),
        decisions=tuple(Decision(seq=d.seq, rule_id=d.rule_id, phase=d.phase, field=d.field,
                                 before=d.before, after=d.after, source=d.source, reason=d.reason,
                                 forced=d.forced) for d in msg.decisions),
        warnings=tuple(PlanWarning(w.rule_id, w.message) for w in msg.warnings),
        estimates=Estimates(graphs=msg.estimates.graphs,
                            capture_memory_bytes=msg.estimates.capture_memory_bytes,
                            capture_seconds=msg.estimates.capture_seconds),
    )


def plan_dict_from_proto_resource(msg: plan_pb2.Plan) -> dict[str, Any]:
    """A stored plan as JSON: the resource fields, then the plan's JSON form."""
    return {"name": msg.name, "create_time": msg.create_time.ToJsonString(), "audit_record": msg.audit_record,
            "spec": spec_dict_from_proto(msg.spec), **plan_from_proto(msg).to_dict()}
