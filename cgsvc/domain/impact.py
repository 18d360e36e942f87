"""Policy impact: what a candidate policy would change across the audit history, before it ships.

Every distinct launch spec in the ResolvePlan and CreateLaunch records (refusals included)
is re-resolved under a candidate policy and compared with a baseline: another policy, resolved
alike, or ("recorded") what the log holds for the spec under the candidate's own policy, so that
a change to a policy's rules is weighed against what its earlier versions resolved. The
database groups the records by spec hash and streams the groups; the specs are resolved in
batches, so memory grows with the answer (the specs that change), not with the log. Reads
only: nothing is appended.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cgsvc import codec
from cgsvc.audit.records import AuditRecord
from cgsvc.audit.store import AuditStore, SpecGroup
from cgsvc.catalog import ANYWHERE, ModelRoots
from cgsvc.domain.launches import CREATE_METHOD
from cgsvc.domain.plans import RESOLVE_METHOD
from cgsvc.errors import CODE_NAMES, FieldViolation, ServiceError
from cgsvc.plan import Plan, canonical_json, compare
from cgsvc.resolve import DEFAULT_POLICY, get_policy, policy_version, resolve
from cgsvc.spec import parse_spec

METHODS = (RESOLVE_METHOD, CREATE_METHOD)
BATCH = 500
RECORDED = "recorded"  # the baseline of what the log holds, under the candidate's policy


@dataclass(frozen=True)
class Outcome:
    """A spec resolved under one policy: its plan, or why it was refused."""

    plan: Plan | None
    error: ServiceError | None

    @classmethod
    def of(cls, spec_json: str, policy: str, roots: ModelRoots = ANYWHERE) -> Outcome:
        try:
            return cls(resolve(parse_spec(json.loads(spec_json)), policy, roots), None)
        except ServiceError as err:
            return cls(None, err)
        except ValueError as err:  # a record whose spec no longer parses
            return cls(None, ServiceError.invalid([FieldViolation("spec", str(err))]))

    @classmethod
    def recorded(cls, record: AuditRecord) -> Outcome | None:
        """What a record says its spec resolved to: its plan, or its refusal; None for a record
        of neither (an accepted request written before records held plans)."""
        if record.plan_json:
            return cls(codec.plan_from_dict(json.loads(record.plan_json)), None)
        if record.outcome_code:
            rule = record.rule_ids[0] if record.rule_ids else None
            return cls(None, ServiceError(CODE_NAMES.get(record.outcome_code, str(record.outcome_code)),
                                          record.outcome_message, rule_id=rule))
        return None


def _refusal(group: dict[str, Any], err: ServiceError) -> dict[str, Any]:
    return {**group, "code": err.code, "message": err.message, "rule_id": err.rule_id or "",
            "fields": [v.field for v in err.violations]}


def policy_impact(store: AuditStore, candidate: str, baseline: str = DEFAULT_POLICY, filter_text: str = "",
                  progress: Callable[[int, int], None] | None = None,
                  roots: ModelRoots = ANYWHERE) -> dict[str, Any]:
    """The impact in the JSON shape of docs/policies.md (`{"baseline", "candidate", ...}`).
    `roots`: where a recorded spec's model.path may be read (a server's --model-roots: a
    refused path is not read for an impact either)."""
    if not candidate:
        raise ServiceError.invalid([FieldViolation("candidate", "required: the policy to evaluate "
                                                                "(cgsvc-cli policies lists them)")])
    cand = get_policy(candidate, "candidate")
    recorded = baseline == RECORDED
    if recorded:  # the candidate's own records: what this policy resolved before, at its earlier versions
        history = f'{filter_text} AND policy = "{cand.name}"' if filter_text.strip() else f'policy = "{cand.name}"'
        base_ref = {"name": RECORDED, "version": ""}
    else:
        try:
            base = get_policy(baseline or DEFAULT_POLICY, "baseline")
        except ServiceError as err:
            raise ServiceError.invalid([FieldViolation("baseline", f"{err.violations[0].description}, or "
                                                                   f"{RECORDED} (the plans the log holds)")]) from None
        history, base_ref = filter_text, {"name": base.name, "version": policy_version(base.name)}
    out: dict[str, Any] = {
        "baseline": base_ref, "candidate": {"name": cand.name, "version": policy_version(cand.name)},
        "filter": filter_text, "specs_examined": 0, "records_examined": 0, "changed": [], "newly_refused": [],
        "newly_accepted": [], "unchanged": 0, "baseline_unknown": 0,
        "recorded_under": [{"policy": p, "version": v, "records": n}
                           for p, v, n in store.policy_counts(METHODS, history)],
    }

    def flush(groups: list[SpecGroup]) -> None:
        wanted = [g.first for g in groups] + ([g.last_planned or g.last for g in groups] if recorded else [])
        records = store.records_by_sequence(wanted)
        for g in groups:
            rec = records.get(g.first)
            if rec is None:
                continue
            out["specs_examined"] += 1
            out["records_examined"] += g.records
            group = {"spec_hash": g.spec_hash, "model": rec.model, "gpu": rec.gpu, "records": g.records,
                     "example_record": rec.name}
            if recorded:
                latest = records.get(g.last_planned or g.last)
                was = Outcome.recorded(latest) if latest is not None else None
                if was is None:
                    out["baseline_unknown"] += 1
                    continue
                a = was
            else:
                a = Outcome.of(rec.spec_json, base.name, roots)
            b = Outcome.of(rec.spec_json, cand.name, roots)
            if a.plan is not None and b.plan is not None:
                cmp = compare(a.plan, b.plan)
                if cmp.same:
                    out["unchanged"] += 1
                else:
                    out["changed"].append({
                        **group, "changes": [{"field": f, "baseline": x, "candidate": y,
                                              "baseline_rules": a.plan.deciders(f),
                                              "candidate_rules": b.plan.deciders(f)} for f, x, y in cmp.changes],
                        "rules": {"baseline_only": list(cmp.only_a), "candidate_only": list(cmp.only_b)}})
            elif a.plan is not None and b.error is not None:
                out["newly_refused"].append(_refusal(group, b.error))
            elif a.error is not None and b.plan is not None:
                out["newly_accepted"].append(_refusal(group, a.error))
            else:
                out["unchanged"] += 1  # refused under both
        if progress is not None:
            progress(out["specs_examined"], out["records_examined"])

    pending: list[SpecGroup] = []
    for group in store.spec_groups(METHODS, history, latest=recorded):
        pending.append(group)
        if len(pending) >= BATCH:
            flush(pending)
            pending = []
    flush(pending)
    out["by_field"] = by_field(out["changed"])
    for key in ("changed", "newly_refused", "newly_accepted"):
        out[f"{key}_total"] = len(out[key])
    return out


def by_field(changed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The changes of every changed spec summed by (field, baseline value, candidate value): specs,
    records, each side's distinct rule trails and two examples; most records first."""
    groups: dict[tuple[str, str, str], dict[str, Any]] = {}
    for spec in changed:
        for ch in spec["changes"]:
            key = (ch["field"], canonical_json(ch["baseline"]), canonical_json(ch["candidate"]))
            g = groups.setdefault(key, {"field": ch["field"], "baseline": ch["baseline"],
                                        "candidate": ch["candidate"], "specs": 0, "records": 0,
                                        "baseline_rules": {}, "candidate_rules": {}, "examples": []})
            g["specs"] += 1
            g["records"] += spec["records"]
            g["baseline_rules"][" > ".join(ch["baseline_rules"] or ["-"])] = None
            g["candidate_rules"][" > ".join(ch["candidate_rules"] or ["-"])] = None
            if len(g["examples"]) < 2:
                g["examples"].append({"model": spec["model"], "gpu": spec["gpu"], "record": spec["example_record"]})
    return [{**g, "baseline_rules": list(g["baseline_rules"]), "candidate_rules": list(g["candidate_rules"])}
            for g in sorted(groups.values(), key=lambda g: -g["records"])]
