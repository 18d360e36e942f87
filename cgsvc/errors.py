"""Errors the resolver and the service answer with, in the shape of google.rpc.Status.

The control plane raises `ServiceError` with a canonical code name — a refused spec
(INVALID_ARGUMENT, FAILED_PRECONDITION), a missing resource (NOT_FOUND), no free devices
(RESOURCE_EXHAUSTED), ... — and, for bad input, one `FieldViolation` per problem (the field
path and what would be valid). The gRPC
layer turns it into a rich status (BadRequest / ErrorInfo details); the CLI prints it as
`{"error": {...}}`. Nothing here imports grpc.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

# google.rpc.Code numbers for the codes we answer with.
CODE_NUMBERS = {
    "OK": 0, "CANCELLED": 1, "UNKNOWN": 2, "INVALID_ARGUMENT": 3, "DEADLINE_EXCEEDED": 4,
    "NOT_FOUND": 5, "ALREADY_EXISTS": 6, "PERMISSION_DENIED": 7, "RESOURCE_EXHAUSTED": 8,
    "FAILED_PRECONDITION": 9, "ABORTED": 10, "OUT_OF_RANGE": 11, "UNIMPLEMENTED": 12,
    "INTERNAL": 13, "UNAVAILABLE": 14, "DATA_LOSS": 15, "UNAUTHENTICATED": 16,
}
CODE_NAMES = {v: k for k, v in CODE_NUMBERS.items()}


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters and how long it was (for a caller's value that
    must fit somewhere: a status on the wire, an indexed column)."""
    return text if len(text) <= limit else f"{text[:limit]}... (cut at {limit} of {len(text)} characters)"


def one_spelling(value: str, choices: Sequence[str]) -> str | None:
    """`value` as the closed set `choices` spells it, matched in any case (what is kept is the one
    spelling, so plans, the audit log and errors never see another); None when it is not in it."""
    return {c.lower(): c for c in choices}.get(value.lower())


def did_you_mean(value: str, choices: Sequence[str]) -> str:
    """"did you mean 'X'? " for the one of `choices` nearest a mistyped `value` (compared in any
    case), to put before the list of what is valid; "" when none is near."""
    if len(value) > 100:  # far longer than any choice: nothing is near, and it costs no more
        return ""
    spellings = {c.lower(): c for c in choices}
    near = difflib.get_close_matches(value.lower(), list(spellings), n=1)
    return f"did you mean {spellings[near[0]]!r}? " if near else ""


@dataclass(frozen=True)
class FieldViolation:
    """One problem with one field: its dotted path and a description of what would be valid."""

    field: str
    description: str

    def to_dict(self) -> dict[str, str]:
        return {"field": self.field, "description": self.description}


@dataclass
class ServiceError(Exception):
    """Any answer other than OK: a canonical code, a message, field violations, (for rule
    refusals) the rule id, and for an answer a program may act on, a reason and its facts (the
    ErrorInfo's reason and metadata, e.g. LOGS_ELSEWHERE with the replica's address)."""

    code: str
    message: str
    violations: list[FieldViolation] = field(default_factory=list)
    rule_id: str | None = None
    reason: str = ""
    info: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)

    @classmethod
    def invalid(cls, violations: list[FieldViolation]) -> ServiceError:
        first = violations[0]
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        return cls("INVALID_ARGUMENT", f"{first.field}: {first.description}{more}", list(violations))

    @classmethod
    def refused_by_rule(cls, rule_id: str, fields: list[str], message: str) -> ServiceError:
        return cls(
            "FAILED_PRECONDITION",
            f"{rule_id}: {message}",
            [FieldViolation(f, message) for f in fields],
            rule_id=rule_id,
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message,
                               "field_violations": [v.to_dict() for v in self.violations]}
        if self.rule_id:
            out["rule_id"] = self.rule_id
        if self.reason:
            out["reason"] = self.reason
        if self.info:
            out["info"] = dict(self.info)
        return out
