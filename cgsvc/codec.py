"""The one codec between the wire (protobuf) and the domain types.

Specs go proto -> JSON-form dict -> `parse_spec`, so the gRPC and JSON forms share one
validator. Plans go domain -> JSON-form dict -> proto and back, so a plan printed from a
server answer is byte-identical to one resolved in-process. Stored plans, audit records and
launches (with the worker report they carry) become their resource messages here too: this
is the only module that maps between protobuf and domain types.
"""

from __future__ import annotations

import calendar
import functools
import json
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from google.protobuf import json_format, timestamp_pb2
from google.protobuf.descriptor import FieldDescriptor

from cgsvc.audit.checkpoint import Checkpoint
from cgsvc.audit.filters import labels_of
from cgsvc.audit.records import AuditRecord
from cgsvc.contract import ContractError, EngineSettings, WorkerReport
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.plan import Decision, Estimates, Plan, PlanWarning, canonical_json
from cgsvc.resolve import DEFAULT_POLICY, policy_version
from cgsvc.resolve.engine import Policy
from cgsvc.spec import LaunchSpec, parse_spec, spec_to_dict
from cgsvc.v1 import (
    audit_pb2,
    experiment_pb2,
    launch_pb2,
    launch_spec_pb2,
    plan_pb2,
    plan_service_pb2,
)

if TYPE_CHECKING:  # the stores (and SQLAlchemy) stay out of the CLI's start-up
    from cgsvc.audit.store import StoredPlan
    from cgsvc.launch.store import ExperimentRow, LaunchRow


def spec_to_proto(spec: LaunchSpec) -> launch_spec_pb2.LaunchSpec:
    return json_format.ParseDict(spec_to_dict(spec), launch_spec_pb2.LaunchSpec())


def spec_dict_from_proto(msg: launch_spec_pb2.LaunchSpec) -> dict[str, Any]:
    return json_format.MessageToDict(msg, preserving_proto_field_name=True)


@functools.lru_cache(maxsize=2048)
def _spec_json_of_bytes(raw: bytes) -> str:
    return canonical_json(spec_dict_from_proto(launch_spec_pb2.LaunchSpec.FromString(raw)))


# Specs memoised by their wire bytes are at most this long (a real one is under 300 bytes): a
# caller sending thousands of distinct 4 MB specs must not fill the memo with gigabytes.
MEMO_SPEC_BYTES = 8192


def spec_json_from_proto(msg: launch_spec_pb2.LaunchSpec) -> str:
    """The spec's JSON form as canonical JSON, memoised by its wire bytes: an orchestrator sends
    the same few specs again and again, and MessageToDict cost more than resolving a memoised
    spec. Parse it (json.loads) for a dict of the caller's own."""
    raw = msg.SerializeToString(deterministic=True)
    if len(raw) > MEMO_SPEC_BYTES:
        return _spec_json_of_bytes.__wrapped__(raw)
    return _spec_json_of_bytes(raw)


def spec_from_proto(msg: launch_spec_pb2.LaunchSpec) -> LaunchSpec:
    return parse_spec(spec_dict_from_proto(msg))


def spec_proto_from_dict(data: Any) -> launch_spec_pb2.LaunchSpec:
    """A spec dict as a proto, for sending; validation errors name the field like parse_spec does."""
    parse_spec(data)  # the full validator first: it names every bad field
    try:
        return json_format.ParseDict(data, launch_spec_pb2.LaunchSpec())
    except json_format.ParseError as exc:  # pragma: no cover - parse_spec rejects first
        raise ServiceError.invalid([FieldViolation("spec", str(exc))]) from None


def spec_proto_from_canonical(data: dict[str, Any]) -> launch_spec_pb2.LaunchSpec:
    """A spec already parsed (its canonical dict) as a proto."""
    return json_format.ParseDict(data, launch_spec_pb2.LaunchSpec())


def plan_to_proto(plan: Plan) -> plan_pb2.Plan:
    """Built field by field: json_format.ParseDict costs about 300 us per plan, this about 30."""
    return plan_pb2.Plan(
        policy=plan.policy, policy_version=plan.policy_version, plan_hash=plan.plan_hash,
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
        policy=d.get("policy", "cgsvc"),  # plans recorded before named policies were cgsvc's
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
        policy=msg.policy or "cgsvc", policy_version=msg.policy_version, plan_hash=msg.plan_hash,
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


# ---------------------------------------------------------------------------- resources


def timestamp(text: str) -> timestamp_pb2.Timestamp:
    """The store's RFC 3339 UTC text (YYYY-MM-DDTHH:MM:SS.ffffffZ) as a Timestamp; parsed by hand
    on the hot path (FromJsonString was a visible share of a ResolvePlan), generally otherwise."""
    if len(text) == 27 and text[10] == "T" and text[-1] == "Z":
        seconds = calendar.timegm((int(text[0:4]), int(text[5:7]), int(text[8:10]), int(text[11:13]),
                                   int(text[14:16]), int(text[17:19]), 0, 0, 0))
        return timestamp_pb2.Timestamp(seconds=seconds, nanos=int(text[20:26]) * 1000)
    ts = timestamp_pb2.Timestamp()
    ts.FromJsonString(text)
    return ts


def stored_plan_proto(stored: StoredPlan) -> plan_pb2.Plan:
    msg = plan_to_proto(plan_from_dict(json.loads(stored.row.plan_json)))
    msg.name = f"plans/{stored.row.plan_id}"
    msg.create_time.CopyFrom(timestamp(stored.create_time))
    json_format.ParseDict(json.loads(stored.row.spec_json), msg.spec)
    msg.audit_record = f"auditRecords/{stored.sequence}"
    return msg


def record_proto(rec: AuditRecord, basic: bool = False) -> audit_pb2.AuditRecord:
    """A record as the API answers it; `basic` (AUDIT_RECORD_VIEW_BASIC): without its plan's JSON
    and the hashed bytes."""
    return audit_pb2.AuditRecord(
        name=rec.name, sequence=rec.sequence, schema_version=rec.schema_version, time=timestamp(rec.time),
        principal=rec.principal, peer=rec.peer, method=rec.method, request_id=rec.request_id,
        trace_id=rec.trace_id, spec_json=rec.spec_json, spec_hash=rec.spec_hash, plan_json=rec.plan_json,
        plan_hash=rec.plan_hash, rule_ids=list(rec.rule_ids), policy_version=rec.policy_version,
        service_version=rec.service_version, outcome_code=rec.outcome_code,
        outcome_message=rec.outcome_message, launch_id=rec.launch_id, plan_id=rec.plan_id,
        prev_hash=rec.prev_hash, record_hash=rec.record_hash, model=rec.model, gpu=rec.gpu, policy=rec.policy,
        hashed_json="" if basic else canonical_json(rec.hashed_fields()))


def checkpoint_from_proto(msg: audit_pb2.Checkpoint) -> Checkpoint:
    return Checkpoint(origin=msg.origin, tree_size=msg.tree_size, root_hash=msg.root_hash, time=msg.time,
                      key_id=msg.key_id, public_key=msg.public_key, signature=msg.signature)


def measured(report: launch_pb2.LaunchReport, field: str) -> float | None:
    """A launch report's measure, or None where it measured none (an optional field left unset:
    TPOT of requests that ended at their first token)."""
    if report.DESCRIPTOR.fields_by_name[field].has_presence and not report.HasField(field):
        return None
    return float(getattr(report, field))


def report_summary(report_json: str) -> launch_pb2.LaunchReport:
    """The summary of a launch's stored worker report (empty unless it succeeded)."""
    if not report_json:
        return launch_pb2.LaunchReport()
    try:
        report = WorkerReport.from_dict(json.loads(report_json))
    except (ContractError, ValueError):
        return launch_pb2.LaunchReport()
    if not report.ok:
        return launch_pb2.LaunchReport()
    modes, att = report.modes, report.attention
    subs = [f"{f.field}: {json.dumps(f.requested)} -> {json.dumps(f.effective)} ({f.reason})"
            for f in report.plan_fidelity if f.status == "substituted"]
    return launch_pb2.LaunchReport(
        ttft_ms_p50=report.ttft_ms.p50 or 0.0, ttft_ms_p99=report.ttft_ms.p99 or 0.0, tpot_ms_p50=report.tpot_ms.p50,
        tpot_ms_p99=report.tpot_ms.p99, throughput_tok_s=report.throughput_tok_s,
        output_tokens=report.output_tokens,
        prefill_requested=modes["prefill"].requested, prefill_effective=modes["prefill"].effective,
        decode_requested=modes["decode"].requested, decode_effective=modes["decode"].effective,
        attention_prefill_effective=att["prefill"].effective, attention_decode_effective=att["decode"].effective,
        capture_seconds=modes["prefill"].capture_seconds + modes["decode"].capture_seconds,
        capture_bytes=modes["prefill"].capture_bytes + modes["decode"].capture_bytes,
        kv_bytes_per_token=report.kv_bytes_per_token, substitutions=subs, dtype=report.dtype,
        dtype_reason=report.dtype_reason, kv_cache_budget_bytes=report.kv_budget_bytes,
        kv_cache_budget_reason=report.kv_budget_reason,
        plan_fidelity=[launch_pb2.PlanFidelity(field=f.field, requested=json.dumps(f.requested),
                                               effective=json.dumps(f.effective), status=f.status, reason=f.reason)
                       for f in report.plan_fidelity])


def launch_proto(row: LaunchRow, records: list[str] | None = None, plan_audit_record: str = "") -> launch_pb2.Launch:
    return launch_pb2.Launch(
        name=f"launches/{row.launch_id}", plan=f"plans/{row.plan_id}", state=row.state,
        workload=launch_pb2.LaunchWorkload(**asdict(row.workload)), model_path=row.model_path, tp=row.tp,
        dispatcher=row.dispatcher, create_time=timestamp(row.create_time), update_time=timestamp(row.update_time),
        tokens_done=row.tokens_done, tokens_total=row.tokens_total, prompt_tokens_done=row.prompt_tokens_done,
        prompt_tokens_total=row.prompt_tokens_total, capture_done=row.capture_done,
        capture_total=row.capture_total, error=row.error,
        report=report_summary(row.report_json), report_json=row.report_json, audit_records=records or [],
        principal=row.principal, plan_audit_record=plan_audit_record, devices=list(row.devices),
        placement=row.placement, request_id=row.request_id, owner=f"replicas/{row.owner}" if row.owner else "",
        engine=engine_proto(row.engine), rerun_of=f"launches/{row.rerun_of}" if row.rerun_of else "",
        labels=labels_of(row.labels), experiment=f"experiments/{row.experiment}" if row.experiment else "")


def engine_proto(engine: EngineSettings) -> launch_pb2.EngineSettings:
    return launch_pb2.EngineSettings(**asdict(engine))


# ---------------------------------------------------------------------------- policies


def policy_info(policy: Policy) -> plan_service_pb2.PolicyInfo:
    return plan_service_pb2.PolicyInfo(name=policy.name, version=policy_version(policy.name), summary=policy.summary,
                                       rules=len(policy.rules), doc=policy.doc, default=policy.name == DEFAULT_POLICY)


def model_infos() -> list[plan_service_pb2.ModelInfo]:
    """The model catalog as ListModels answers it, in the catalog file's order."""
    from cgsvc import catalog

    table = catalog.models()
    out = []
    for name, aliases in catalog.model_aliases().items():
        m = table[name]
        out.append(plan_service_pb2.ModelInfo(
            name=name, aliases=aliases, architecture=m.architecture, text_architecture=m.text_architecture,
            mla=m.is_mla, dsa=m.is_dsa, moe=m.is_moe, multimodal=m.is_multimodal,
            quantization=m.quantization or "", kv_cache_dtype=m.kv_cache_dtype or "", num_layers=m.num_layers,
            hidden_size=m.hidden_size, num_attention_heads=m.num_attention_heads))
    return out


_INT64_TYPES = frozenset((FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_UINT64, FieldDescriptor.TYPE_SINT64,
                          FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64))


def int64_as_numbers(msg: Any, d: dict[str, Any]) -> dict[str, Any]:
    """`d`, MessageToDict's form of `msg` (proto field names), with every 64-bit integer as a JSON
    number where the proto3 mapping writes a string ("prompt_tokens_done": "24"): a script
    reading a launch compares numbers. Nested messages too; `d` is changed and returned."""
    for f in msg.DESCRIPTOR.fields:
        if f.name not in d:
            continue
        repeated = f.is_repeated
        if f.type in _INT64_TYPES:
            d[f.name] = [int(x) for x in d[f.name]] if repeated else int(d[f.name])
        elif f.type == FieldDescriptor.TYPE_MESSAGE and not f.message_type.GetOptions().map_entry:
            for sub, sub_d in (zip(getattr(msg, f.name), d[f.name], strict=True) if repeated
                               else [(getattr(msg, f.name), d[f.name])]):
                if isinstance(sub_d, dict):  # a Timestamp or Struct is not an object of its fields
                    int64_as_numbers(sub, sub_d)
    return d


def impact_proto(impact: dict[str, Any]) -> plan_service_pb2.PolicyImpact:
    """The impact dict of cgsvc.domain.impact as its message (the field names are the same)."""
    return json_format.ParseDict(impact, plan_service_pb2.PolicyImpact())


def impact_dict(msg: plan_service_pb2.PolicyImpact) -> dict[str, Any]:
    """The message back in the JSON shape of docs/policies.md: counts as numbers, every list present."""
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for key in ("specs_examined", "records_examined", "unchanged", "changed_total", "newly_refused_total",
                "newly_accepted_total", "baseline_unknown"):
        d[key] = int(d.get(key, 0))
    for key in ("changed", "newly_refused", "newly_accepted", "recorded_under", "by_field"):
        for item in d.get(key, []):
            item["records"] = int(item.get("records", 0))
    for item in d.get("changed", []):
        for change in item.get("changes", []):
            change["baseline"], change["candidate"] = _ints(change.get("baseline")), _ints(change.get("candidate"))
    for field in d.get("by_field", []):
        field["specs"] = int(field.get("specs", 0))
        field["baseline"], field["candidate"] = _ints(field.get("baseline")), _ints(field.get("candidate"))
    return d


def _ints(value: Any) -> Any:
    """A Value's numbers back to integers (plan fields hold only integers; a Value holds doubles)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_ints(v) for v in value]
    return value


# ---------------------------------------------------------------------------- experiments


def experiment_proto(row: ExperimentRow) -> experiment_pb2.Experiment:
    req = row.request
    msg = experiment_pb2.Experiment(
        name=f"experiments/{row.experiment_id}", state=row.state, plans=req["plans"],
        workload=launch_pb2.LaunchWorkload(**req["workload"]), model_path=req["model_path"], repeats=req["repeats"],
        dispatcher=req["dispatcher"], runs=[experiment_pb2.ExperimentRun(**r) for r in row.runs], error=row.error,
        verdict=str(row.result.get("verdict", "")), audit_records=list(row.audit_records), principal=row.principal,
        cancel_requested_by=row.cancel_requested_by, engine=engine_proto(EngineSettings.read(req.get("engine", {}))),
        rerun_of=f"experiments/{row.rerun_of}" if row.rerun_of else "", labels=labels_of(row.labels))
    msg.result.update(row.result)
    if row.create_time:
        msg.create_time.CopyFrom(timestamp(row.create_time))
        msg.update_time.CopyFrom(timestamp(row.update_time))
    return msg


def experiment_dict(msg: experiment_pb2.Experiment) -> dict[str, Any]:
    """An experiment as JSON: counts as integers (a Struct carries every number as a double)."""
    d = json_format.MessageToDict(msg, preserving_proto_field_name=True, always_print_fields_with_no_presence=True)
    for arm in d.get("result", {}).get("arms", {}).values():
        for metric in ("ttft_ms", "tpot_ms"):
            if isinstance(arm.get(metric), dict) and arm[metric].get("n") is not None:
                arm[metric]["n"] = int(arm[metric]["n"])
    return d
