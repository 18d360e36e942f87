"""The rule engine: runs the ordered rule table over a draft plan, enforcing locks.

Rules (see `policy.py`) only say *when* they fire and *what* they would write. The engine
decides what happens: it refuses writes outside a rule's declared `writes`, keeps locked
keys (recording a `forced` decision for a soft rule, refusing the spec for a hard one),
and records a Decision for every write and every deliberate no-op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from cgsvc.catalog import GpuInfo, ModelFacts
from cgsvc.contract import PLAN_FIELDS
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.plan import Decision, PlanWarning
from cgsvc.spec import LaunchSpec

Value = str | int | tuple[int, ...] | None

# Plan keys a rule may write: every field of a plan. The phase is the part before the dot, if it names one.
KEYS = PLAN_FIELDS


def phase_of(key: str) -> str:
    head, _, rest = key.partition(".")
    if head in ("prefill", "decode"):
        return head
    if head == "attention_backend":
        return rest
    return ""


def show(value: Value) -> str:
    """A value as decisions display it: names and numbers as text, lists in brackets."""
    if value is None:
        return ""
    if isinstance(value, tuple):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


class Stage(IntEnum):
    """Pipeline stages, in order. Attention precedes every graph stage by construction."""

    DEFAULTS = 1
    ATTENTION = 2
    PREFILL_CASCADE = 3
    LATE = 4
    SIZES = 5
    WARNINGS = 6


SOURCES = ("default", "model", "hardware", "backend_exception", "compatibility", "user", "clamp")


@dataclass(frozen=True)
class Rule:
    """One policy rule.

    `when(ctx)` says whether it fires; `effect(ctx)` gives the values it would write (a
    subset of `writes`). A hard rule with no effect is a pure check: when it fires, the
    spec is refused. A rule with `warning` adds a plan warning instead of writing.
    """

    id: str
    stage: Stage
    source: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    when: Callable[[Context], bool]
    reason: str
    effect: Callable[[Context], Mapping[str, Value]] | None = None
    hard: bool = False
    warning: Callable[[Context], str] | None = None

    def describe(self) -> dict[str, Any]:
        """The declarative part of the rule, as listed by `cgsvc-cli rules` and hashed into the policy version."""
        return {"id": self.id, "stage": self.stage.name.lower(), "source": self.source,
                "hardness": "hard" if self.hard else "soft", "reads": list(self.reads),
                "writes": list(self.writes), "reason": self.reason}


@dataclass(frozen=True)
class Policy:
    """A named rule table on this engine: `cgsvc` (the default) or an engine profile.

    `rules` are in evaluation order. `check` names the spec fields this policy cannot
    express (an engine release without a flag); `sources` are the modules, relative to
    `cgsvc/resolve/`, whose text goes into the policy's version.
    """

    name: str
    summary: str
    rules: tuple[Rule, ...]
    sources: tuple[str, ...]
    doc: str
    check: Callable[[LaunchSpec], list[FieldViolation]] | None = None

    def rule(self, rule_id: str) -> Rule | None:
        return next((r for r in self.rules if r.id == rule_id), None)


@dataclass
class Context:
    """Everything a rule may read: the spec, derived facts, and the draft plan so far."""

    spec: LaunchSpec
    model: ModelFacts
    gpu: GpuInfo
    memory_mib: int
    tp: int
    pp: int
    dp: int
    attn_cp: int
    dcp: int
    dp_attention: bool
    values: dict[str, Value] = field(default_factory=dict)
    locked: set[str] = field(default_factory=set)
    decisions: list[Decision] = field(default_factory=list)
    warnings: list[PlanWarning] = field(default_factory=list)

    def __getitem__(self, key: str) -> Any:
        return self.values.get(key)

    # Readable shorthands for the rule table.
    @property
    def features(self) -> Any:
        return self.spec.features

    @property
    def prefill(self) -> Any:
        return self.values.get("prefill.backend")

    @property
    def decode(self) -> Any:
        return self.values.get("decode.backend")

    @property
    def attn_prefill(self) -> Any:
        return self.values.get("attention_backend.prefill")

    @property
    def attn_decode(self) -> Any:
        return self.values.get("attention_backend.decode")

    @property
    def multimodal(self) -> bool:
        """Multimodal in effect: the model has a vision tower and the caller did not turn it off."""
        return self.model.is_multimodal and self.spec.features.enable_multimodal is not False

    def unset(self, values: Mapping[str, Value]) -> dict[str, Value]:
        """The subset of values whose keys have no value yet (for first-match rules)."""
        return {k: v for k, v in values.items() if self.values.get(k) is None}

    def record(self, rule_id: str, key: str, before: Value, after: Value, source: str,
               reason: str, forced: bool = False) -> None:
        self.decisions.append(Decision(
            seq=len(self.decisions) + 1, rule_id=rule_id, phase=phase_of(key), field=key,
            before=show(before), after=show(after), source=source, reason=reason, forced=forced))

    def set_user(self, rule_id: str, key: str, value: Value, reason: str) -> None:
        """Set and lock a key from an explicit user source."""
        self.record(rule_id, key, self.values.get(key), value, "user", reason)
        self.values[key] = value
        self.locked.add(key)


def apply(rule: Rule, ctx: Context) -> None:
    """Fire one rule whose `when` holds: warn, refuse, write or record a forced decision."""
    if rule.warning is not None:
        ctx.warnings.append(PlanWarning(rule.id, rule.warning(ctx)))
        return
    if rule.effect is None:  # a pure check: only hard rules have none
        raise ServiceError.refused_by_rule(rule.id, list(rule.writes), rule.reason)
    effect = rule.effect(ctx)
    undeclared = set(effect) - set(rule.writes)
    if undeclared:
        raise AssertionError(f"rule {rule.id} wrote undeclared keys {sorted(undeclared)}")
    if rule.hard:
        blocked = [k for k, v in effect.items() if k in ctx.locked and ctx.values.get(k) != v]
        if blocked:
            raise ServiceError.refused_by_rule(rule.id, blocked, rule.reason)
    for key, value in effect.items():
        before = ctx.values.get(key)
        if key in ctx.locked:
            if before != value:
                ctx.record(rule.id, key, before, before, rule.source,
                           f"{rule.reason}; would set {show(value)}, kept the explicit "
                           f"{show(before)}", forced=True)
            continue
        ctx.values[key] = value
        ctx.record(rule.id, key, before, value, rule.source, rule.reason)


def run(rules: tuple[Rule, ...], ctx: Context) -> None:
    """Run the table in stage order (stable within a stage)."""
    for rule in rules:
        if rule.when(ctx):
            apply(rule, ctx)
