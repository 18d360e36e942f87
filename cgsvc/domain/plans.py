"""Resolve and record: the one way a plan comes into being.

A spec is resolved (memoised: the resolver is pure and the policy fixed for the life of the
process) and the outcome — plan or refusal — is appended to the audit log, committed before
anyone is answered. PlanService.ResolvePlan and LaunchService.CreateLaunch both call
`Plans.resolve_and_record`; neither calls the other.
"""

from __future__ import annotations

import asyncio
import functools
import json
from dataclasses import dataclass
from typing import Any

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.records import AuditEntry
from cgsvc.audit.store import PlanListing, StoredPlan
from cgsvc.catalog import ANYWHERE, ModelRoots
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.ids import new_id
from cgsvc.plan import Plan, canonical_json, rule_ids
from cgsvc.resolve import DEFAULT_POLICY, resolve
from cgsvc.spec import parse_spec, spec_to_dict

RESOLVE_METHOD = "/cgsvc.v1.PlanService/ResolvePlan"


@dataclass(frozen=True)
class Caller:
    """Who asks, from where, and the request's ids (for the audit record)."""

    principal: str
    peer: str = ""
    request_id: str = ""
    trace_id: str = ""


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: answers are cached per resolution
class Resolution:
    plan: Plan
    plan_json: str
    rule_ids: tuple[str, ...]
    spec: dict[str, Any]  # the spec in its canonical spelling (closed sets as the catalog spells them)
    audit_fields: dict[str, Any]  # the spec's audit fields (masked canonical JSON, model, GPU), made once
    listing: PlanListing  # what the record that creates a plan of it adds to itself


# The longest canonical spec JSON the resolution memo keeps (a real one is a few hundred bytes).
MEMO_SPEC_JSON = 16384


@functools.lru_cache(maxsize=4096)
def _resolve_canonical(spec_key: str, policy: str = DEFAULT_POLICY, roots: ModelRoots = ANYWHERE) -> Resolution:
    parsed = parse_spec(json.loads(spec_key))
    plan = resolve(parsed, policy, roots)
    canonical = spec_to_dict(parsed)
    return Resolution(plan, canonical_json(plan.to_dict()), tuple(rule_ids(plan)), canonical, Auditor.spec_fields(canonical),
                      PlanListing(plan.prefill_backend, plan.decode_backend, plan.attention_prefill,
                                  plan.attention_decode))


def resolve_spec(spec: dict[str, Any], policy: str = DEFAULT_POLICY, spec_key: str = "",
                 roots: ModelRoots = ANYWHERE) -> Resolution:
    """Resolve under a policy, memoised by the canonical spec (`spec_key`: canonical_json(spec)
    when the caller has it already). Specs naming a model.path are not memoised (the file may
    change; `roots` confines where it may lie), nor specs over MEMO_SPEC_JSON characters (a memo
    of a caller's giant specs is a memory leak)."""
    key = spec_key or canonical_json(spec)
    policy = (policy or DEFAULT_POLICY).strip().lower()
    if (isinstance(spec.get("model"), dict) and "path" in spec["model"]) or len(key) > MEMO_SPEC_JSON:
        return _resolve_canonical.__wrapped__(key, policy, roots)
    return _resolve_canonical(key, policy)


@dataclass(frozen=True)
class Recorded:
    """A recorded plan. `replay` is the stored plan when an earlier request with the same
    request_id made it (the answer is then that plan)."""

    resolution: Resolution
    plan_id: str  # "" for validate_only
    audit_record: str  # "auditRecords/N"
    time: str
    replay: StoredPlan | None = None


class Plans:
    def __init__(self, auditor: Auditor, model_roots: ModelRoots = ANYWHERE) -> None:
        """`model_roots`: where callers' checkpoint paths may lie (the server's --model-roots)."""
        self.auditor = auditor
        self.model_roots = model_roots
        self.store = auditor.store

    async def resolve_and_record(self, spec: dict[str, Any], caller: Caller, validate_only: bool = False,
                                 idempotency_key: str = "", method: str = RESOLVE_METHOD,
                                 policy: str = DEFAULT_POLICY, spec_key: str = "") -> Recorded:
        """Resolve the spec under `policy` and append the outcome; a refusal is appended, then raised.
        `spec_key` is canonical_json(spec), when the caller has it already."""
        policy = (policy or DEFAULT_POLICY).strip().lower()

        def entry(code: str, message: str, **extra: Any) -> AuditEntry:
            return self.auditor.entry(method, caller.principal, caller.peer, caller.request_id, caller.trace_id,
                                      spec, code, message, policy=policy, **extra)

        def resolved_entry(resolution: Resolution, code: str, message: str, **extra: Any) -> AuditEntry:
            return self.auditor.entry(method, caller.principal, caller.peer, caller.request_id, caller.trace_id,
                                      None, code, message, policy=policy, **resolution.audit_fields, **extra)

        try:
            resolution = resolve_spec(spec, policy, spec_key, self.model_roots)
        except ServiceError as err:
            await self.auditor.append(entry(err.code, err.message, rule_ids=(err.rule_id,) if err.rule_id else ()))
            raise
        plan = resolution.plan
        plan_id = "" if validate_only else new_id()
        # recorded with the spec in its canonical spelling
        e = resolved_entry(resolution, "OK", "validate_only" if validate_only else "", plan_json=resolution.plan_json,
                           plan_hash=plan.plan_hash, rule_ids=resolution.rule_ids, plan_id=plan_id)
        result = await self.auditor.append(e, None if validate_only else resolution.listing,
                                           "" if validate_only else idempotency_key)
        if result.conflict:
            raise ServiceError.invalid([FieldViolation("request_id", result.record.outcome_message)])
        replay = None
        if result.replay_of is not None:
            replay = await asyncio.to_thread(self.store.get_plan, result.replay_of.plan_id)
        return Recorded(resolution, plan_id, result.record.name, result.record.time, replay)

    async def get(self, plan_id: str) -> StoredPlan:
        stored = await asyncio.to_thread(self.store.get_plan, plan_id)
        if stored is None:
            raise ServiceError("NOT_FOUND", f"plans/{plan_id} does not exist")
        return stored
