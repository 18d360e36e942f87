"""PlanService, AuditService and DiagnosticsService: thin shells around the resolver and store.

Every ResolvePlan — accepted, refused, malformed or denied — is appended to the audit log
and committed before the answer leaves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, timestamp_pb2

from cgsvc import __version__, codec
from cgsvc.audit import filters
from cgsvc.audit.records import AuditEntry, AuditRecord, mask_secrets
from cgsvc.audit.store import (
    AppendResult,
    AuditStore,
    PageTokenError,
    PendingAppend,
    PlanRow,
    StoredPlan,
)
from cgsvc.audit.writer import AuditWriter
from cgsvc.errors import CODE_NUMBERS, ResolveError
from cgsvc.plan import Plan, canonical_json
from cgsvc.resolve import policy_version, resolve
from cgsvc.server import metrics
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.status import invalid
from cgsvc.spec import parse_spec
from cgsvc.v1 import audit_pb2, diagnostics_pb2, plan_pb2, plan_service_pb2

RESOLVE_METHOD = "/cgsvc.v1.PlanService/ResolvePlan"
# Methods whose every call is audited, malformed ones included.
AUDITED_METHODS = {RESOLVE_METHOD, "/cgsvc.v1.LaunchService/CreateLaunch", "/cgsvc.v1.LaunchService/CancelLaunch"}


def timestamp(text: str) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromJsonString(text)
    return ts


def parse_name(name: str, collection: str, field: str = "name") -> str:
    prefix = f"{collection}/"
    if not name.startswith(prefix) or len(name) == len(prefix) or "/" in name[len(prefix):]:
        raise invalid(field, f"must look like {collection}/ID, got {name!r}")
    return name[len(prefix):]


async def list_page(lister: Callable[[str, int, str], tuple[list[Any], str]], request: Any) -> tuple[list[Any], str]:
    """Run a store listing for a List request; bad filters and page tokens name their field."""
    try:
        return await asyncio.to_thread(lister, request.filter, request.page_size, request.page_token)
    except filters.FilterError as exc:
        raise invalid("filter", str(exc)) from None
    except PageTokenError as exc:
        raise invalid("page_token" if "page_token" in str(exc) else "page_size", str(exc)) from None


class Auditor:
    """Builds audit entries for requests and appends them through the group-commit writer."""

    def __init__(self, store: AuditStore, writer: AuditWriter) -> None:
        self.store = store
        self.writer = writer

    async def append(self, entry: AuditEntry, plan: PlanRow | None = None, request_id: str = "") -> AppendResult:
        # Shielded: a caller that cancels (deadline, disconnect) does not unqueue its record.
        return await asyncio.shield(asyncio.wrap_future(self.writer.submit(PendingAppend(entry, plan, request_id))))

    @staticmethod
    def spec_fields(spec_dict: dict[str, Any] | None) -> dict[str, Any]:
        """Audit fields of a spec (JSON form): its masked canonical JSON, model and GPU."""
        if spec_dict is None:
            return {}
        spec = mask_secrets(spec_dict)
        model = spec.get("model", {})
        return {"spec_json": canonical_json(spec), "model": str(model.get("name") or model.get("path") or ""),
                "gpu": str(spec.get("hardware", {}).get("gpu", ""))}

    def entry(self, method: str, principal: str, peer: str, request_id: str, trace_id: str,
              spec_dict: dict[str, Any] | None, code: str, message: str, **extra: Any) -> AuditEntry:
        return AuditEntry(principal=principal, peer=peer, method=method, request_id=request_id,
                          trace_id=trace_id, policy_version=policy_version(), service_version=__version__,
                          outcome_code=CODE_NUMBERS[code], outcome_message=message,
                          **self.spec_fields(spec_dict), **extra)

    async def rejected(self, method: str, principal: str, peer: str, request: Any, code: str, message: str) -> None:
        """Audit a request the pipeline turned away: every denial, and malformed audited methods."""
        if code == "INVALID_ARGUMENT" and method not in AUDITED_METHODS:
            return
        spec = codec.spec_dict_from_proto(request.spec) \
            if isinstance(request, plan_service_pb2.ResolvePlanRequest) else None
        request_id = getattr(request, "request_id", "") if request is not None else ""
        await self.append(self.entry(method, principal, peer, request_id, "", spec, code, message))


@dataclass(frozen=True)
class Resolution:
    plan: Plan
    plan_json: str
    rule_ids: tuple[str, ...]


@functools.lru_cache(maxsize=4096)
def _resolve_canonical(spec_key: str) -> Resolution:
    plan = resolve(parse_spec(json.loads(spec_key)))
    rule_ids = tuple(dict.fromkeys([d.rule_id for d in plan.decisions] + [w.rule_id for w in plan.warnings]))
    return Resolution(plan, canonical_json(plan.to_dict()), rule_ids)


def resolve_spec(spec: dict[str, Any]) -> Resolution:
    """Resolve, memoised by the canonical spec: the resolver is pure and the policy fixed for the
    life of the process. Specs naming a model.path are not memoised (the file may change)."""
    key = canonical_json(spec)
    if isinstance(spec.get("model"), dict) and "path" in spec["model"]:
        return _resolve_canonical.__wrapped__(key)
    return _resolve_canonical(key)


def stored_plan_proto(stored: StoredPlan) -> plan_pb2.Plan:
    msg = codec.plan_to_proto(codec.plan_from_dict(json.loads(stored.row.plan_json)))
    msg.name = f"plans/{stored.row.plan_id}"
    msg.create_time.CopyFrom(timestamp(stored.create_time))
    json_format.ParseDict(json.loads(stored.row.spec_json), msg.spec)
    msg.audit_record = f"auditRecords/{stored.sequence}"
    return msg


class PlanService:
    def __init__(self, auditor: Auditor) -> None:
        self.auditor = auditor
        self.store = auditor.store

    async def ResolvePlan(self, request: plan_service_pb2.ResolvePlanRequest,  # noqa: N802 - gRPC name
                          rc: RequestContext) -> plan_pb2.Plan:
        spec_dict = codec.spec_dict_from_proto(request.spec)

        def entry(code: str, message: str, **extra: Any) -> AuditEntry:
            return self.auditor.entry(RESOLVE_METHOD, rc.principal.name, rc.peer, rc.request_id, rc.trace_id,
                                      spec_dict, code, message, **extra)

        try:
            resolution = resolve_spec(spec_dict)
        except ResolveError as err:
            rules = (err.rule_id,) if err.rule_id else ()
            await self.auditor.append(entry(err.code, err.message, rule_ids=rules))
            raise
        plan, plan_json, rule_ids = resolution.plan, resolution.plan_json, resolution.rule_ids
        plan_id = "" if request.validate_only else uuid.uuid4().hex[:20]
        e = entry("OK", "validate_only" if request.validate_only else "", plan_json=plan_json,
                  plan_hash=plan.plan_hash, rule_ids=rule_ids, plan_id=plan_id)
        row = None if request.validate_only else PlanRow(
            plan_id=plan_id, model=e.model, gpu=e.gpu, prefill_backend=plan.prefill_backend,
            decode_backend=plan.decode_backend, attention_prefill=plan.attention_prefill,
            attention_decode=plan.attention_decode, policy_version=plan.policy_version,
            plan_hash=plan.plan_hash, spec_json=e.spec_json, plan_json=plan_json)
        result = await self.auditor.append(e, row, "" if request.validate_only else request.request_id)
        if result.conflict:
            raise invalid("request_id", result.record.outcome_message)
        metrics.PLANS_TOTAL.labels(plan.prefill_backend, plan.decode_backend).inc()
        if result.replay_of is not None:
            stored = await asyncio.to_thread(self.store.get_plan, result.replay_of.plan_id)
            if stored is not None:
                return stored_plan_proto(stored)
        msg = codec.plan_to_proto(plan)
        msg.spec.CopyFrom(request.spec)
        msg.audit_record = result.record.name
        if plan_id:
            msg.name = f"plans/{plan_id}"
            msg.create_time.CopyFrom(timestamp(result.record.time))
        return msg

    async def GetPlan(self, request: plan_service_pb2.GetPlanRequest,  # noqa: N802
                      rc: RequestContext) -> plan_pb2.Plan:
        plan_id = parse_name(request.name, "plans")
        stored = await asyncio.to_thread(self.store.get_plan, plan_id)
        if stored is None:
            raise ResolveError("NOT_FOUND", f"{request.name} does not exist")
        return stored_plan_proto(stored)

    async def ListPlans(self, request: plan_service_pb2.ListPlansRequest,  # noqa: N802
                        rc: RequestContext) -> plan_service_pb2.ListPlansResponse:
        rows, token = await list_page(self.store.list_plans, request)
        return plan_service_pb2.ListPlansResponse(plans=[stored_plan_proto(r) for r in rows], next_page_token=token)


def record_proto(rec: AuditRecord) -> audit_pb2.AuditRecord:
    return audit_pb2.AuditRecord(
        name=rec.name, sequence=rec.sequence, schema_version=rec.schema_version, time=timestamp(rec.time),
        principal=rec.principal, peer=rec.peer, method=rec.method, request_id=rec.request_id,
        trace_id=rec.trace_id, spec_json=rec.spec_json, spec_hash=rec.spec_hash, plan_json=rec.plan_json,
        plan_hash=rec.plan_hash, rule_ids=list(rec.rule_ids), policy_version=rec.policy_version,
        service_version=rec.service_version, outcome_code=rec.outcome_code,
        outcome_message=rec.outcome_message, launch_id=rec.launch_id, plan_id=rec.plan_id,
        prev_hash=rec.prev_hash, record_hash=rec.record_hash)


class AuditService:
    def __init__(self, store: AuditStore) -> None:
        self.store = store

    async def GetAuditRecord(self, request: audit_pb2.GetAuditRecordRequest,  # noqa: N802
                             rc: RequestContext) -> audit_pb2.AuditRecord:
        raw = parse_name(request.name, "auditRecords")
        if not raw.isdigit():
            raise invalid("name", f"the ID of auditRecords/ID is a sequence number, got {raw!r}")
        rec = await asyncio.to_thread(self.store.get_record, int(raw))
        if rec is None:
            raise ResolveError("NOT_FOUND", f"{request.name} does not exist")
        return record_proto(rec)

    async def ListAuditRecords(self, request: audit_pb2.ListAuditRecordsRequest,  # noqa: N802
                               rc: RequestContext) -> audit_pb2.ListAuditRecordsResponse:
        recs, token = await list_page(self.store.list_records, request)
        return audit_pb2.ListAuditRecordsResponse(records=[record_proto(r) for r in recs], next_page_token=token)

    async def VerifyAuditLog(self, request: audit_pb2.VerifyAuditLogRequest,  # noqa: N802
                             rc: RequestContext) -> audit_pb2.VerifyAuditLogResponse:
        v = await asyncio.to_thread(self.store.verify)
        return audit_pb2.VerifyAuditLogResponse(ok=v.ok, records_checked=v.records_checked,
                                                first_bad_sequence=v.first_bad_sequence, reason=v.reason,
                                                head_hash=v.head_hash)


class DiagnosticsService:
    async def Echo(self, request: diagnostics_pb2.EchoRequest,  # noqa: N802
                   rc: RequestContext) -> diagnostics_pb2.EchoResponse:
        return diagnostics_pb2.EchoResponse(payload=request.payload)
