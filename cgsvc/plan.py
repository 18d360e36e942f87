"""The resolved plan and its parts: PhasePlan-like sections, Decision, PlanWarning, Estimates.

`Plan.to_dict()` is the JSON form of docs/plan.md, in its field order; `canonical_json` is
the byte form that `plan_hash` covers and that the audit log stores.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any


def canonical_json(value: Any) -> str:
    """Compact JSON with sorted keys: the form every hash in cgsvc is taken over."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Decision:
    """One step of resolution, naming the rule that took it."""

    seq: int
    rule_id: str
    phase: str  # "prefill", "decode" or "" for plan-wide fields
    field: str  # the plan key, e.g. "prefill.backend"
    before: str
    after: str
    source: str
    reason: str
    forced: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"seq": self.seq, "rule_id": self.rule_id, "phase": self.phase,
                "field": self.field, "before": self.before, "after": self.after,
                "source": self.source, "reason": self.reason, "forced": self.forced}


@dataclass(frozen=True)
class PlanWarning:
    rule_id: str
    message: str

    def to_dict(self) -> dict[str, Any]:
        return {"rule_id": self.rule_id, "message": self.message}


@dataclass(frozen=True)
class Estimates:
    graphs: int
    capture_memory_bytes: int
    capture_seconds: float

    def to_dict(self) -> dict[str, Any]:
        return {"graphs": self.graphs, "capture_memory_bytes": self.capture_memory_bytes,
                "capture_seconds": self.capture_seconds}


@dataclass(frozen=True)
class Plan:
    policy: str  # the policy's name: "cgsvc", "sglang-0.5.17", ...
    policy_version: str
    plan_hash: str
    attention_prefill: str
    attention_decode: str
    prefill_backend: str
    prefill_max_num_tokens: int
    prefill_num_tokens: tuple[int, ...]
    decode_backend: str
    decode_max_bs: int
    decode_bs: tuple[int, ...]
    kv_cache_dtype: str
    chunked_prefill_size: int
    locked: tuple[str, ...]
    decisions: tuple[Decision, ...]
    warnings: tuple[PlanWarning, ...]
    estimates: Estimates

    def body(self) -> dict[str, Any]:
        """The plan without its hash: what plan_hash is computed over."""
        return {
            "policy": self.policy,
            "policy_version": self.policy_version,
            "attention_backend": {"prefill": self.attention_prefill, "decode": self.attention_decode},
            "prefill": {"backend": self.prefill_backend, "max_num_tokens": self.prefill_max_num_tokens,
                        "num_tokens": list(self.prefill_num_tokens)},
            "decode": {"backend": self.decode_backend, "max_bs": self.decode_max_bs,
                       "bs": list(self.decode_bs)},
            "kv_cache_dtype": self.kv_cache_dtype,
            "chunked_prefill_size": self.chunked_prefill_size,
            "locked": list(self.locked),
            "decisions": [d.to_dict() for d in self.decisions],
            "warnings": [w.to_dict() for w in self.warnings],
            "estimates": self.estimates.to_dict(),
        }

    def to_dict(self) -> dict[str, Any]:
        """The JSON form of docs/plan.md, in its field order."""
        body = self.body()
        return {"policy": self.policy, "policy_version": self.policy_version, "plan_hash": self.plan_hash,
                **{k: v for k, v in body.items() if k not in ("policy", "policy_version")}}

    def decisions_for(self, field: str) -> list[Decision]:
        """The decisions that shaped one plan field (e.g. "prefill.backend")."""
        return [d for d in self.decisions if d.field == field]

    def deciders(self, field: str) -> list[str]:
        """The rules that decided a compared field, in order ("*" marks a forced decision: a
        lock kept the value); for "warnings", the warnings' rules."""
        if field == "warnings":
            return [w.rule_id for w in self.warnings]
        return [d.rule_id + ("*" if d.forced else "") for d in self.decisions_for(field)]


# The plan fields a comparison looks at (decisions and estimates follow from them).
COMPARED_FIELDS = ("attention_backend.prefill", "attention_backend.decode", "prefill.backend",
                   "prefill.max_num_tokens", "prefill.num_tokens", "decode.backend", "decode.max_bs", "decode.bs",
                   "kv_cache_dtype", "chunked_prefill_size", "warnings")


def plan_fields(plan: Plan) -> dict[str, Any]:
    """The compared fields of a plan, as JSON values."""
    return {"attention_backend.prefill": plan.attention_prefill, "attention_backend.decode": plan.attention_decode,
            "prefill.backend": plan.prefill_backend, "prefill.max_num_tokens": plan.prefill_max_num_tokens,
            "prefill.num_tokens": list(plan.prefill_num_tokens), "decode.backend": plan.decode_backend,
            "decode.max_bs": plan.decode_max_bs, "decode.bs": list(plan.decode_bs),
            "kv_cache_dtype": plan.kv_cache_dtype, "chunked_prefill_size": plan.chunked_prefill_size,
            "warnings": sorted(w.rule_id for w in plan.warnings)}


def rule_ids(plan: Plan) -> list[str]:
    """The rules that made a decision or a warning, in the order they first did."""
    return list(dict.fromkeys([d.rule_id for d in plan.decisions] + [w.rule_id for w in plan.warnings]))


@dataclass(frozen=True)
class Comparison:
    """How plan b differs from plan a: changed fields (field, a, b) and the rules only one used."""

    changes: tuple[tuple[str, Any, Any], ...]
    only_a: tuple[str, ...]
    only_b: tuple[str, ...]

    @property
    def same(self) -> bool:
        return not self.changes


def compare(a: Plan, b: Plan) -> Comparison:
    fa, fb = plan_fields(a), plan_fields(b)
    ra, rb = rule_ids(a), rule_ids(b)
    return Comparison(changes=tuple((f, fa[f], fb[f]) for f in COMPARED_FIELDS if fa[f] != fb[f]),
                      only_a=tuple(r for r in ra if r not in rb), only_b=tuple(r for r in rb if r not in ra))
