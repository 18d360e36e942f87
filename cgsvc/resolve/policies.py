"""The named policies: `cgsvc` (the default rule table) and the engine profiles.

A policy is a rule table on the one engine; its version is a content hash (see
`cgsvc.resolve.policy_version`). `cgsvc-cli policies` lists them; docs/policies.md says
what each reproduces.
"""

from __future__ import annotations

from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.resolve.engine import Policy
from cgsvc.resolve.policy import RULES
from cgsvc.resolve.profiles import sglang

DEFAULT_POLICY = "cgsvc"

CGSVC = Policy(name=DEFAULT_POLICY, rules=RULES, sources=("policy.py",), doc="docs/policy.md",
               summary="cgsvc's own policy: attention backends first, then the prefill cascade "
                       "with the trtllm_mla exception, sizes and warnings")

POLICIES: dict[str, Policy] = {p.name: p for p in (CGSVC, *sglang.PROFILES)}


def get_policy(name: str, field: str = "policy") -> Policy:
    """The policy called `name` (case-insensitive); INVALID_ARGUMENT naming the request's `field`
    and the known ones otherwise."""
    policy = POLICIES.get((name or DEFAULT_POLICY).strip().lower())
    if policy is None:
        raise ServiceError.invalid([FieldViolation(
            field, f"unknown policy {name!r}; known: {', '.join(POLICIES)} (cgsvc-cli policies)")])
    return policy
