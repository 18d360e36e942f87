"""Behaviour pinned by data: one case per file in tests/cases/resolver (spec in, plan fields,
fired/forced rule ids, warnings or the refusal out), and per engine profile a file of cases in
tests/cases/profiles/POLICY.json. See tests/cases/README.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cgsvc.errors import ServiceError
from cgsvc.resolve import resolve
from cgsvc.resolve.policies import POLICIES
from cgsvc.resolve.policy import RULES, RULES_BY_ID
from cgsvc.spec import parse_spec
from tests.conftest import CASES, ROOT

CASE_FILES = sorted((CASES / "resolver").glob("*.json"))
PROFILE_FILES = sorted((CASES / "profiles").glob("*.json"))


def load_case(path: Path) -> dict[str, Any]:
    text = path.read_text().replace("@fixtures/", str(ROOT / "tests" / "fixtures") + "/")
    case: dict[str, Any] = json.loads(text)
    return case


def assert_subset(expected: Any, actual: Any, where: str = "plan") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected an object, got {actual!r}"
        for key, value in expected.items():
            assert key in actual, f"{where}.{key} missing"
            assert_subset(value, actual[key], f"{where}.{key}")
    else:
        assert expected == actual, f"{where}: expected {expected!r}, got {actual!r}"


def run_case(case: dict[str, Any], policy: str = "cgsvc") -> tuple[Any, ServiceError | None]:
    try:
        return resolve(parse_spec(case["spec"]), policy), None
    except ServiceError as exc:
        return None, exc


def profile_cases() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in PROFILE_FILES:
        data = load_case(path)
        out += [(data["policy"], c) for c in data["cases"]]
    return out


PROFILE_CASES = profile_cases()


@pytest.mark.parametrize("path", CASE_FILES, ids=[p.stem for p in CASE_FILES])
def test_case(path: Path) -> None:
    check_case(load_case(path), "cgsvc")


@pytest.mark.parametrize(("policy", "case"), PROFILE_CASES, ids=[f"{p}:{c['name']}" for p, c in PROFILE_CASES])
def test_profile_case(policy: str, case: dict[str, Any]) -> None:
    check_case(case, policy)


def check_case(case: dict[str, Any], policy: str) -> None:
    expect = case["expect"]
    plan, error = run_case(case, policy)
    if "error" in expect:
        assert error is not None, f"expected {expect['error']['code']}, got a plan"
        assert error.code == expect["error"]["code"], error.message
        if "rule_id" in expect["error"]:
            assert error.rule_id == expect["error"]["rule_id"]
        fields = [v.field for v in error.violations]
        for f in expect["error"].get("fields", []):
            assert f in fields, f"violation for {f} missing; got {fields}"
        assert all(v.description for v in error.violations)
        for field, phrases in expect["error"].get("says", {}).items():
            said = " | ".join(v.description for v in error.violations if v.field == field)
            for phrase in phrases:
                assert phrase in said, f"{field}: {phrase!r} not in {said!r}"
        return
    assert error is None, f"unexpected refusal: {error.code} {error.message}"
    assert_subset(expect.get("plan", {}), plan.to_dict())
    if "locked" in expect.get("plan", {}):
        assert sorted(plan.locked) == sorted(expect["plan"]["locked"])
    fired = [d.rule_id for d in plan.decisions if not d.forced]
    forced = [d.rule_id for d in plan.decisions if d.forced]
    for rid in expect.get("fired", []):
        assert rid in fired, f"{rid} did not fire; fired: {fired}"
    order = expect.get("fired_in_order", [])
    positions = [fired.index(r) if r in fired else -1 for r in order]
    assert -1 not in positions, f"expected {order} to fire; fired: {fired}"
    assert positions == sorted(positions), f"expected order {order}; fired: {fired}"
    for rid in expect.get("forced", []):
        assert rid in forced, f"{rid} made no forced decision; forced: {forced}"
    for rid in expect.get("not_fired", []):
        assert rid not in fired + forced, f"{rid} fired"
    if "warnings" in expect:
        assert sorted(w.rule_id for w in plan.warnings) == sorted(expect["warnings"])


def test_every_rule_has_a_case() -> None:
    """Every rule in the table fires, is forced or refuses in at least one case file."""
    seen: set[str] = set()
    for path in CASE_FILES:
        case = load_case(path)
        plan, error = run_case(case)
        if error is not None and error.rule_id:
            seen.add(error.rule_id)
        if plan is not None:
            seen.update(d.rule_id for d in plan.decisions)
            seen.update(w.rule_id for w in plan.warnings)
    missing = sorted(r.id for r in RULES if r.id not in seen)
    assert not missing, f"rules without a case: {missing}"


def test_every_profile_has_cases_and_every_profile_rule_one() -> None:
    """Each engine profile has a case file, and every rule of its own (one that is not
    cgsvc's very rule object) fires, is forced or refuses in one of its cases."""
    profiles = {name for name in POLICIES if name != "cgsvc"}
    assert profiles == {p for p, _ in PROFILE_CASES}
    for name in sorted(profiles):
        seen: set[str] = set()
        for policy, case in PROFILE_CASES:
            if policy != name:
                continue
            plan, error = run_case(case, policy)
            if error is not None and error.rule_id:
                seen.add(error.rule_id)
            if plan is not None:
                seen.update(d.rule_id for d in plan.decisions)
                seen.update(w.rule_id for w in plan.warnings)
        own = [r.id for r in POLICIES[name].rules if RULES_BY_ID.get(r.id) is not r]
        missing = sorted(r for r in own if r not in seen)
        assert not missing, f"{name}: rules without a case: {missing}"
