"""Named policies: the registry, versions, what each plan carries, what a profile refuses, and
the evaluation order that makes sglang 0.5.17 what it was."""

from __future__ import annotations

import pytest

from cgsvc.errors import ServiceError
from cgsvc.plan import compare
from cgsvc.resolve import get_policy, policy_version, resolve
from cgsvc.resolve.engine import Stage
from cgsvc.resolve.policies import POLICIES
from cgsvc.spec import parse_spec

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}


def test_the_policies_and_their_versions() -> None:
    assert list(POLICIES) == ["cgsvc", "sglang-0.5.17", "sglang-0.5.18", "sglang-0.5.23"]
    versions = {name: policy_version(name) for name in POLICIES}
    assert len(set(versions.values())) == len(versions)  # a version names one rule table
    assert all(len(v) == 16 for v in versions.values())
    assert get_policy("SGLang-0.5.17") is POLICIES["sglang-0.5.17"]  # names are case-insensitive


def test_an_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(ServiceError) as err:
        resolve(parse_spec(KIMI), "sglang-0.5.99")
    assert err.value.code == "INVALID_ARGUMENT"
    (violation,) = err.value.violations
    assert violation.field == "policy"
    assert all(name in violation.description for name in POLICIES)


@pytest.mark.parametrize("name", list(POLICIES))
def test_plans_carry_the_policy_and_rule_ids_are_unique(name: str) -> None:
    plan = resolve(parse_spec(KIMI), name)
    assert plan.policy == name and plan.policy_version == policy_version(name)
    assert plan.to_dict()["policy"] == name
    ids = [r.id for r in POLICIES[name].rules]
    assert len(ids) == len(set(ids))


def test_cgsvc_resolves_attention_before_any_graph_rule_and_0517_after() -> None:
    """The structural difference: cgsvc's table runs the attention stage before the prefill
    cascade; sglang 0.5.17's (and 0.5.23's) runs it after; 0.5.18's before."""
    def first(policy: str, stage: Stage) -> int:
        return next(i for i, r in enumerate(POLICIES[policy].rules) if r.stage == stage)

    assert first("cgsvc", Stage.ATTENTION) < first("cgsvc", Stage.PREFILL_CASCADE)
    assert first("sglang-0.5.17", Stage.ATTENTION) > first("sglang-0.5.17", Stage.PREFILL_CASCADE)
    assert first("sglang-0.5.18", Stage.ATTENTION) < first("sglang-0.5.18", Stage.PREFILL_CASCADE)


def test_the_kimi_regression_between_cgsvc_and_0517() -> None:
    a, b = resolve(parse_spec(KIMI)), resolve(parse_spec(KIMI), "sglang-0.5.17")
    cmp = compare(a, b)
    assert ("prefill.backend", "disabled", "tc_piecewise") in cmp.changes
    assert "prefill.upgrade.multimodal_piecewise" in cmp.only_b
    assert "prefill.exception.trtllm_mla" in cmp.only_a
    assert compare(a, a).same


def test_the_same_spec_differs_across_releases() -> None:
    backends = {name: resolve(parse_spec(KIMI), name).prefill_backend for name in POLICIES}
    assert backends == {"cgsvc": "disabled", "sglang-0.5.17": "tc_piecewise", "sglang-0.5.18": "breakable",
                        "sglang-0.5.23": "breakable"}
