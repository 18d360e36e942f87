"""`cgsvc-cli plans diff` and `cgsvc-cli policies` offline: spec files resolved on the spot,
plan files, the JSON shape, the table, and git's exit-code convention."""

from __future__ import annotations

import json
from pathlib import Path

from tests.unit.test_cli_resolve import KIMI_SPEC, as_json, cli, cli_stdin


def test_a_spec_under_two_policies_differs_in_prefill_with_the_rules_behind_it() -> None:
    proc = cli("plans", "diff", str(KIMI_SPEC), str(KIMI_SPEC), "--policy-b", "sglang-0.5.17", "-o", "json")
    assert proc.returncode == 0, proc.stderr  # without --exit-code a difference is not a failure
    diff = as_json(proc)["diff"]
    assert diff["a"]["policy"] == "cgsvc" and diff["b"]["policy"] == "sglang-0.5.17"
    assert {"field": "prefill.backend", "a": "disabled", "b": "tc_piecewise"} in diff["changes"]
    assert "prefill.upgrade.multimodal_piecewise" in diff["rules"]["only_b"]
    assert "breakable.mla" in diff["rules"]["only_a"]


def test_exit_code_follows_git(tmp_path: Path) -> None:
    same = cli("plans", "diff", str(KIMI_SPEC), str(KIMI_SPEC), "--exit-code", "-o", "json")
    assert same.returncode == 0 and as_json(same)["diff"]["changes"] == []
    differ = cli("plans", "diff", str(KIMI_SPEC), str(KIMI_SPEC), "--policy-b", "sglang-0.5.23", "--exit-code",
                 "-o", "table")
    assert differ.returncode == 1
    assert "prefill.backend" in differ.stdout and "decided by (a)" in differ.stdout
    missing = cli("plans", "diff", str(tmp_path / "nope.json"), str(KIMI_SPEC), "--exit-code", "-o", "json")
    assert missing.returncode == 2  # a refusal, never mistaken for "they differ"
    err = as_json(missing)["error"]
    assert err["field_violations"][0]["field"] == "a" and "nope.json" in err["message"]


def test_a_plan_file_against_a_spec_file(tmp_path: Path) -> None:
    plan = cli("resolve", "--spec", str(KIMI_SPEC), "--policy", "sglang-0.5.18", "-o", "json")
    path = tmp_path / "plan.json"
    path.write_text(plan.stdout)
    proc = cli("plans", "diff", str(path), str(KIMI_SPEC), "--policy-b", "sglang-0.5.18", "--exit-code", "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    d = as_json(proc)["diff"]
    assert d["a"]["kind"] == "plan file" and d["b"]["kind"].startswith("spec file")


def test_a_policy_flag_applies_to_a_spec_and_is_never_dropped(tmp_path: Path) -> None:
    """--policy-a/-b re-resolve a spec file. A plan is resolved already: beside one the flag is
    refused by name rather than ignored; an unknown policy is named by its flag."""
    path = tmp_path / "plan.json"
    path.write_text(cli("resolve", "--spec", str(KIMI_SPEC), "-o", "json").stdout)
    for args, field, words in (
            ((str(path), str(KIMI_SPEC), "--policy-a", "sglang-0.5.17"), "policy_a", "is a plan file, resolved already"),
            (("plans/abc", str(KIMI_SPEC), "--policy-a", "sglang-0.5.17"), "policy_a", "is a stored plan, resolved"),
            ((str(KIMI_SPEC), str(KIMI_SPEC), "--policy-b", "sglang-9"), "policy_b", "unknown policy 'sglang-9'")):
        proc = cli("plans", "diff", *args, "--exit-code", "-o", "json")
        err = as_json(proc)["error"]
        assert proc.returncode == 2 and err["field_violations"][0]["field"] == field, err
        assert words in err["message"], err


def test_a_stored_plan_needs_a_server() -> None:
    proc = cli("plans", "diff", "plans/abc", str(KIMI_SPEC), "-o", "json")
    assert proc.returncode == 2 and "--server" in as_json(proc)["error"]["message"]


def test_a_spec_a_profile_cannot_express_names_the_field(tmp_path: Path) -> None:
    spec = json.loads(KIMI_SPEC.read_text())
    spec.setdefault("overrides", {})["cuda_graph"] = {"prefill": {"backend": "tc_piecewise"}}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    proc = cli("resolve", "--spec", str(path), "--policy", "sglang-0.5.23", "-o", "json")
    assert proc.returncode == 2
    (violation,) = as_json(proc)["error"]["field_violations"]
    assert violation["field"] == "overrides.cuda_graph.prefill.backend" and "full, breakable, disabled" in violation["description"]


def test_policies_and_rules_per_policy() -> None:
    listed = as_json(cli("policies", "-o", "json"))["policies"]
    assert [p["name"] for p in listed] == ["cgsvc", "sglang-0.5.17", "sglang-0.5.18", "sglang-0.5.23"]
    assert [p["default"] for p in listed] == [True, False, False, False]
    rules = as_json(cli("rules", "--policy", "sglang-0.5.17", "-o", "json"))
    assert rules["policy"] == "sglang-0.5.17" and rules["policy_version"] == listed[1]["version"]
    ids = [r["id"] for r in rules["rules"]]
    assert ids.index("prefill.upgrade.multimodal_piecewise") < ids.index("attention.deepseek_v3.blackwell")
    unknown = cli("rules", "--policy", "vllm", "-o", "json")
    assert unknown.returncode == 2 and "sglang-0.5.18" in unknown.stdout


def test_one_side_may_come_on_standard_input_but_not_both() -> None:
    plan = cli("resolve", "--spec", str(KIMI_SPEC), "-o", "json").stdout
    proc = cli_stdin(plan, "plans", "diff", "-", str(KIMI_SPEC), "--exit-code", "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diff = as_json(proc)["diff"]
    assert diff["a"]["kind"] == "plan file" and diff["a"]["source"] == "-"
    both = cli_stdin(plan, "plans", "diff", "-", "-", "-o", "json")
    assert both.returncode == 2
    (violation,) = as_json(both)["error"]["field_violations"]
    assert violation["field"] == "b" and "standard input" in violation["description"]


def test_rules_writes_and_reads_narrow_the_table_to_one_field() -> None:
    every = as_json(cli("rules", "-o", "json"))["rules"]
    writers = as_json(cli("rules", "--writes", "Prefill.Backend", "-o", "json"))
    assert writers["rules"] == [r for r in every if "prefill.backend" in r["writes"]]
    assert {"default.prefill.backend", "prefill.exception.trtllm_mla", "breakable.mla"} <= {r["id"] for r in writers["rules"]}
    readers = as_json(cli("rules", "--reads", "hardware.gpu", "--policy", "sglang-0.5.17", "-o", "json"))["rules"]
    assert readers and all("hardware.gpu" in r["reads"] for r in readers)
    table = cli("rules", "--writes", "decode.bs", "-o", "table").stdout
    assert table.startswith("policy cgsvc ") and "rules of " in table.splitlines()[0] and "write decode.bs" in table
    one = cli("rules", "--writes", "decode.max_bs", "-o", "table").stdout.splitlines()[0]
    assert ": 1 rule of " in one, one  # not "1 rules"
    for flag, typo in (("--writes", "prefill.bakend"), ("--reads", "hardware.gpuu")):
        bad = cli("rules", flag, typo, "-o", "json")
        assert bad.returncode == 2, bad.stdout
        (violation,) = as_json(bad)["error"]["field_violations"]
        assert violation["field"] == flag.lstrip("-") and "valid:" in violation["description"]
