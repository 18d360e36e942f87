"""Evidence before release, end to end on a real server: plan names in every answer, policies
through the server and in the audit log, policy impact over a history (refusals and two policy
versions included), and A/B experiments on real TP4 worker groups with the tiny checkpoint."""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cgsvc_client.client import Client
from cgsvc_worker.checkpoint import make_checkpoint

from cgsvc.audit.records import AuditEntry
from cgsvc.audit.store import AuditStore
from cgsvc.domain.plans import RESOLVE_METHOD
from cgsvc.errors import CODE_NUMBERS, ServiceError
from cgsvc.plan import canonical_json
from cgsvc.resolve import policy_version, resolve
from cgsvc.spec import parse_spec, spec_to_dict
from tests.conftest import ROOT
from tests.e2e.server import ServerProcess
from tests.e2e.test_launch_path import assert_started_once, state_records, supervisor_pid, wait_for
from tests.e2e.test_launches import no_processes_left

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}
LLAMA = {"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "hardware": {"gpu": "H100"}}
# cgsvc refuses trtllm_mla off Blackwell (a hard rule); the sglang profiles have no such check
TRTLLM_ON_HOPPER = {"model": {"name": "deepseek-ai/DeepSeek-V3"}, "hardware": {"gpu": "H100", "gpu_count": 8},
                    "parallelism": {"tp": 8}, "overrides": {"attention_backend": "trtllm_mla"}}
# every policy refuses it: tp 3 does not divide 64 heads
REFUSED_BY_ALL = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
                  "parallelism": {"tp": 3}}
# cgsvc accepts it; sglang 0.5.23 has no tc_piecewise
TC_PIECEWISE = {**LLAMA, "overrides": {"cuda_graph": {"prefill": {"backend": "tc_piecewise"}}}}


def cli(srv: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args, "--server", srv.address],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture()
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "srv") as s:
        yield s


def test_resolve_answers_name_the_plan_and_its_record(srv: ServerProcess) -> None:
    spec = ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"
    out = json.loads(cli(srv, "resolve", "--spec", str(spec), "-o", "json").stdout)["plan"]
    assert out["name"].startswith("plans/") and out["audit_record"].startswith("auditRecords/")
    assert out["policy"] == "cgsvc"
    table = cli(srv, "resolve", "--spec", str(spec), "--policy", "sglang-0.5.17", "-o", "table").stdout
    assert table.splitlines()[0].startswith("plans/") and "auditRecords/" in table.splitlines()[0]
    assert "sglang-0.5.17" in table
    explain = json.loads(cli(srv, "resolve", "--spec", str(spec), "--explain", "prefill.backend", "-o", "json").stdout)
    assert explain["explain"]["name"].startswith("plans/")


def test_a_policy_travels_to_the_plan_the_record_and_the_filters(srv: ServerProcess) -> None:
    with Client(srv.address) as c:
        msg = c.resolve_proto(KIMI, policy="sglang-0.5.17")
        assert msg.policy == "sglang-0.5.17" and msg.prefill.backend == "tc_piecewise"
        assert c.get_plan(msg.name).policy == "sglang-0.5.17"
        rec = c.get_audit_record(msg.audit_record)
        assert rec.policy == "sglang-0.5.17" and rec.policy_version == policy_version("sglang-0.5.17")
        assert rec.schema_version == 2 and '"policy":"sglang-0.5.17"' in rec.hashed_json
        c.resolve(KIMI)
        plans = c.list_plans('policy = "sglang-0.5.17"').plans
        assert [p.name for p in plans] == [msg.name]
        with pytest.raises(ServiceError) as err:
            c.resolve(KIMI, policy="vllm-1.0")
        assert err.value.code == "INVALID_ARGUMENT" and "sglang-0.5.23" in err.value.violations[0].description
        refused = c.list_audit_records('policy = "vllm-1.0"').records
        assert len(refused) == 1 and refused[0].outcome_code == CODE_NUMBERS["INVALID_ARGUMENT"]
        names = [p.name for p in c.list_policies().policies]
        assert names == ["cgsvc", "sglang-0.5.17", "sglang-0.5.18", "sglang-0.5.23"]
        assert c.verify_audit_log().ok


def seed_older_history(data_dir: Path) -> None:
    """Records written by an earlier cgsvc release (another version of the cgsvc policy)."""
    store = AuditStore(f"sqlite:///{data_dir / 'cgsvc.db'}")
    try:
        for spec in (KIMI, KIMI, LLAMA):
            canonical = spec_to_dict(parse_spec(spec))
            store.append(AuditEntry(principal="old-orchestrator", peer="", method=RESOLVE_METHOD,
                                    model=canonical["model"]["name"], gpu=canonical["hardware"]["gpu"],
                                    spec_json=canonical_json(canonical), policy="cgsvc",
                                    policy_version="00000000000000aa", service_version="0.0.9"))
    finally:
        store.close()


def test_policy_impact_over_a_history(tmp_path: Path) -> None:
    data = tmp_path / "srv"
    data.mkdir()
    seed_older_history(data)
    with ServerProcess(data) as srv, Client(srv.address) as c:
        for spec in (KIMI, LLAMA, TC_PIECEWISE):
            c.resolve(spec)
        for spec in (TRTLLM_ON_HOPPER, REFUSED_BY_ALL):
            with pytest.raises(ServiceError):
                c.resolve(spec)
        proc = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "-o", "json")
        assert proc.returncode == 0, proc.stderr
        impact = json.loads(proc.stdout)["impact"]
        assert impact["baseline"] == {"name": "cgsvc", "version": policy_version("cgsvc")}
        assert impact["candidate"]["name"] == "sglang-0.5.17"
        # 3 old records (2 specs) + 5 new ones: Kimi, Llama, TC_PIECEWISE, and two refusals
        assert impact["records_examined"] == 8 and impact["specs_examined"] == 5
        under = {(r["policy"], r["version"]): r["records"] for r in impact["recorded_under"]}
        assert under == {("cgsvc", "00000000000000aa"): 3, ("cgsvc", policy_version("cgsvc")): 5}
        (kimi,) = [s for s in impact["changed"] if s["model"] == "nvidia/Kimi-K2.6-NVFP4"]
        assert kimi["records"] == 3 and kimi["example_record"] == "auditRecords/1"
        change = next(ch for ch in kimi["changes"] if ch["field"] == "prefill.backend")
        assert (change["baseline"], change["candidate"]) == ("disabled", "tc_piecewise")
        assert "prefill.upgrade.multimodal_piecewise" in change["candidate_rules"]
        assert "prefill.upgrade.multimodal_piecewise" in kimi["rules"]["candidate_only"]
        assert "prefill.exception.trtllm_mla" in kimi["rules"]["baseline_only"]
        (accepted,) = impact["newly_accepted"]
        assert accepted["model"] == "deepseek-ai/DeepSeek-V3" and accepted["code"] == "FAILED_PRECONDITION"
        assert accepted["rule_id"] == "attention.trtllm_mla.requires_blackwell"
        assert impact["newly_refused"] == []
        assert impact["unchanged"] + len(impact["changed"]) + 1 == 5

        later = json.loads(cli(srv, "policy", "impact", "--candidate", "sglang-0.5.23", "-o", "json").stdout)["impact"]
        (refused,) = later["newly_refused"]
        assert refused["fields"] == ["overrides.cuda_graph.prefill.backend"] and refused["code"] == "INVALID_ARGUMENT"

        narrowed = json.loads(cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "--filter",
                                  'gpu = "GB300"', "-o", "json").stdout)["impact"]
        assert narrowed["specs_examined"] == 2 and narrowed["records_examined"] == 4  # Kimi x3, the refused tp 3
        spelt = json.loads(cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "--filter",
                               'gpu = "gb300"', "-o", "json").stdout)["impact"]  # as --gpu gb300 would resolve
        assert {k: v for k, v in spelt.items() if k != "filter"} == {k: v for k, v in narrowed.items() if k != "filter"}
        table = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "-o", "table").stdout
        assert "prefill.backend" in table and "tc_piecewise" in table and "prefill.upgrade.multimodal_piecewise" in table
        assert f"5 distinct specs in 8 records: {len(impact['changed'])} changed, 0 newly refused, 1 newly accepted" \
            in table, table
        bad = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "--filter", "colour = 1", "-o", "json")
        assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "filter"
        unknown = cli(srv, "policy", "impact", "--candidate", "sglang-9", "-o", "json")
        assert unknown.returncode == 2 and "sglang-0.5.17" in unknown.stdout
        assert c.verify_audit_log().ok


def seed_recorded_history(data_dir: Path) -> None:
    """What an earlier cgsvc release recorded: plans it resolved (this one resolved Kimi's prefill
    as sglang 0.5.17 does, the regression of the README, and accepted trtllm_mla on Hopper), a
    refusal, a record of no plan (written before records held plans), and a plan under another
    policy, which a comparison of cgsvc's recorded plans leaves out."""
    store = AuditStore(f"sqlite:///{data_dir / 'cgsvc.db'}")
    old = {"policy": "cgsvc", "policy_version": "00000000000000aa", "service_version": "0.0.9"}

    def record(spec: dict[str, Any], plan_under: str = "", refused: str = "", **more: Any) -> None:
        canonical = spec_to_dict(parse_spec(spec))
        fields: dict[str, Any] = {**old, **more}
        if plan_under:
            plan = resolve(parse_spec(spec), plan_under)
            fields.update(plan_json=canonical_json(plan.to_dict()), plan_hash=plan.plan_hash,
                          rule_ids=tuple(d.rule_id for d in plan.decisions))
        if refused:
            fields.update(outcome_code=CODE_NUMBERS[refused], outcome_message="parallelism.tp: tp=3 does not divide")
        store.append(AuditEntry(principal="old-orchestrator", peer="", method=RESOLVE_METHOD,
                                model=canonical["model"]["name"], gpu=canonical["hardware"]["gpu"],
                                spec_json=canonical_json(canonical), **fields))

    try:
        record(KIMI, "sglang-0.5.17")
        record(KIMI, "sglang-0.5.17")
        record(LLAMA, "cgsvc")
        record(TRTLLM_ON_HOPPER, "sglang-0.5.17")
        record(REFUSED_BY_ALL, refused="INVALID_ARGUMENT")
        record(TC_PIECEWISE)  # no plan, no refusal: nothing to compare with
        record({**LLAMA, "features": {"max_running_requests": 7}}, "sglang-0.5.17", policy="sglang-0.5.17")
    finally:
        store.close()


def test_policy_impact_against_what_the_log_recorded(tmp_path: Path) -> None:
    """`--baseline recorded`: the candidate's plans now against the plans the log holds for that
    policy, which is how a change to a policy's own rules is weighed before it ships (copy the
    fleet's log with `cgsvc store copy`, serve it with the changed code, compare)."""
    data = tmp_path / "srv"
    data.mkdir()
    seed_recorded_history(data)
    with ServerProcess(data) as srv, Client(srv.address) as c:
        proc = cli(srv, "policy", "impact", "--candidate", "cgsvc", "--baseline", "recorded", "-o", "json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        impact = json.loads(proc.stdout)["impact"]
        assert impact["baseline"] == {"name": "recorded", "version": ""}
        assert impact["candidate"] == {"name": "cgsvc", "version": policy_version("cgsvc")}
        # cgsvc's records only: 5 specs in 6 records; the sglang-0.5.17 one is left out
        assert (impact["specs_examined"], impact["records_examined"]) == (5, 6), impact
        assert impact["recorded_under"] == [{"policy": "cgsvc", "version": "00000000000000aa", "records": 6}]
        (kimi,) = impact["changed"]
        assert kimi["model"] == "nvidia/Kimi-K2.6-NVFP4" and kimi["records"] == 2
        change = next(ch for ch in kimi["changes"] if ch["field"] == "prefill.backend")
        assert (change["baseline"], change["candidate"]) == ("tc_piecewise", "disabled")
        assert "prefill.upgrade.multimodal_piecewise" in change["baseline_rules"]  # the recorded plan's own trail
        assert "breakable.mla" in change["candidate_rules"]
        (refused,) = impact["newly_refused"]
        assert refused["model"] == "deepseek-ai/DeepSeek-V3" and refused["rule_id"] == \
            "attention.trtllm_mla.requires_blackwell"
        assert impact["newly_accepted"] == [] and impact["unchanged"] == 2  # Llama's plan; refused then and now
        assert impact["baseline_unknown"] == 1  # the record of no plan
        table = cli(srv, "policy", "impact", "--candidate", "cgsvc", "--baseline", "recorded", "-o", "table").stdout
        assert "recorded -> cgsvc" in table and "1 spec with no recorded plan or refusal" in table, table
        # the latest record of a spec is its baseline: resolved now, Kimi's recorded plan is today's
        c.resolve(KIMI)
        again = json.loads(cli(srv, "policy", "impact", "--candidate", "cgsvc", "--baseline", "recorded",
                               "-o", "json").stdout)["impact"]
        assert again["changed"] == [] and again["unchanged"] == 3 and again["records_examined"] == 7, again
        # a filter narrows the history as ever; a candidate of another name compares its own records
        narrowed = json.loads(cli(srv, "policy", "impact", "--candidate", "cgsvc", "--baseline", "recorded",
                                  "--filter", 'gpu = "H100"', "-o", "json").stdout)["impact"]
        assert (narrowed["specs_examined"], len(narrowed["newly_refused"])) == (3, 1), narrowed
        other = json.loads(cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "--baseline", "recorded",
                               "-o", "json").stdout)["impact"]
        assert (other["specs_examined"], other["unchanged"]) == (1, 1), other
        # a gate for CI: --exit-code answers 1 when anything changes (plans, refusals), 0 when nothing does
        gate = ("policy", "impact", "--candidate", "cgsvc", "--baseline", "recorded", "--exit-code", "-o", "json")
        assert cli(srv, *gate).returncode == 1  # trtllm_mla on Hopper is refused now
        assert cli(srv, *gate, "--filter", 'model = "meta-llama/*"').returncode == 0
        assert cli(srv, *gate, "--filter", "colour = 1").returncode == 2  # refused as bad input, as ever
        unreachable = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *gate, "--server", "127.0.0.1:1"],
                                     capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert unreachable.returncode == 3, unreachable.stdout  # no answer: not "they differ" (1)
        unknown = cli(srv, "policy", "impact", "--candidate", "cgsvc", "--baseline", "recordd", "-o", "json")
        err = json.loads(unknown.stdout)["error"]
        assert unknown.returncode == 2 and err["field_violations"][0]["field"] == "baseline", err
        assert "or recorded" in err["message"], err


def test_an_impact_too_large_for_one_message_lists_what_fits_and_counts_everything(tmp_path: Path) -> None:
    """Regression: ComputePolicyImpact listed every changed spec, about 1 KB each, so a history of
    a few thousand distinct specs failed with RESOURCE_EXHAUSTED, the one question the command is
    for unanswered. The changes by field are now summed on the server over every changed spec,
    each list holds what fits in one message, and totals count them all."""
    with ServerProcess(tmp_path / "srv", "--max-message-bytes", "65536") as srv, Client(srv.address) as c:
        for max_bs in range(1, 121):  # 120 distinct Kimi specs: each changes under sglang 0.5.17
            c.resolve({**KIMI, "overrides": {"cuda_graph": {"decode": {"max_bs": max_bs}}}})
        proc = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "-o", "json")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        impact = json.loads(proc.stdout)["impact"]
        assert impact["specs_examined"] == 120 and impact["changed_total"] == 120, impact["changed_total"]
        assert 0 < len(impact["changed"]) < 120  # what fits, in the order the history first held them
        (prefill,) = [f for f in impact["by_field"] if f["field"] == "prefill.backend"]
        assert (prefill["baseline"], prefill["candidate"], prefill["specs"], prefill["records"]) == \
            ("disabled", "tc_piecewise", 120, 120), prefill
        assert any("prefill.upgrade.multimodal_piecewise" in trail for trail in prefill["candidate_rules"])
        assert len(prefill["examples"]) == 2 and prefill["examples"][0]["record"] == "auditRecords/1"
        table = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.17", "-o", "table").stdout
        assert "120 distinct specs in 120 records: 120 changed" in table, table
        assert f"the answer lists {len(impact['changed'])} of the 120 changed specs" in table, table


def test_policy_impact_on_an_empty_history_says_so(srv: ServerProcess) -> None:
    impact = json.loads(cli(srv, "policy", "impact", "--candidate", "sglang-0.5.18", "-o", "json").stdout)["impact"]
    assert impact["specs_examined"] == 0 and impact["changed"] == [] and impact["unchanged"] == 0
    table = cli(srv, "policy", "impact", "--candidate", "sglang-0.5.18", "-o", "table")
    assert table.returncode == 0 and "holds no ResolvePlan or CreateLaunch specs" in table.stdout
    for flag, field in (("--candidate", "candidate"), ("--baseline", "baseline")):  # the request's field, by name
        args = ["--candidate", "sglang-0.5.18", flag, "sglang-9"] if flag == "--baseline" else [flag, "sglang-9"]
        refused = cli(srv, "policy", "impact", *args, "-o", "json")
        err = json.loads(refused.stdout)["error"]
        assert refused.returncode == 2 and err["field_violations"][0]["field"] == field, err
        assert "unknown policy 'sglang-9'; known: cgsvc, sglang-0.5.17" in err["message"], err


def test_plans_diff_of_stored_plans(srv: ServerProcess) -> None:
    with Client(srv.address) as c:
        a, b = c.resolve_proto(KIMI).name, c.resolve_proto(KIMI, policy="sglang-0.5.17").name
    proc = cli(srv, "plans", "diff", a, b, "--exit-code", "-o", "json")
    assert proc.returncode == 1
    diff = json.loads(proc.stdout)["diff"]
    assert diff["a"]["source"] == a and diff["a"]["audit_record"].startswith("auditRecords/")
    assert {"field": "prefill.backend", "a": "disabled", "b": "tc_piecewise"} in diff["changes"]


# ---------------------------------------------------------------------------- experiments

WORKLOAD = {"input_len": 12, "output_len": 4, "requests": 3, "concurrency": 1, "seed": 5}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_checkpoint(str(tmp_path_factory.mktemp("kimi") / "tiny-kimi"), "tiny-kimi")


def two_plans(c: Client) -> tuple[str, str]:
    """The default policy's plan and sglang 0.5.18's (prefill `breakable`, which a CPU runs
    eagerly: 0.5.17's `tc_piecewise` would spend most of the test compiling on every rank)."""
    return c.resolve_proto(KIMI).name, c.resolve_proto(KIMI, policy="sglang-0.5.18").name


def test_an_experiment_runs_the_arms_interleaved_and_is_stored(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        a, b = two_plans(c)
    # A and B as `plans diff A B` takes them (a bare ID too); `--plan A --plan B` reads the same
    proc = cli(srv, "experiment", "run", a, b.removeprefix("plans/"), "--model-path", ckpt, "--input-len", "12",
               "--output-len", "4", "--requests", "3", "--repeats", "2", "--seed", "5", "--kv-cache-mb", "16",
               "--label", "team=infra", "--label", "ticket=inc-42", "-o", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "4/4 launches" in proc.stderr  # progress on the way
    exp = json.loads(proc.stdout)["experiment"]
    assert exp["labels"] == {"team": "infra", "ticket": "inc-42"}, exp
    assert exp["state"] == "SUCCEEDED" and exp["plans"] == [a, b]
    assert [(r["arm"], r["repeat"]) for r in exp["runs"]] == [("A", 1), ("B", 1), ("A", 2), ("B", 2)]
    assert all(r["state"] == "SUCCEEDED" for r in exp["runs"])
    res = exp["result"]
    for arm in ("A", "B"):
        assert res["arms"][arm]["ttft_ms"]["n"] == 6 and len(res["arms"][arm]["samples"]["ttft_ms"]) == 6
        lo, hi = res["arms"][arm]["ttft_ms"]["ci"]
        assert lo <= res["arms"][arm]["ttft_ms"]["mean"] <= hi
    # the breakable arm ran on CPU: the report says what was substituted
    assert any(s.startswith("prefill.backend: ") for s in res["arms"]["B"]["substituted"])
    # ... and so did A's attention and decode: on this CPU both arms ran alike, and the verdict says
    # so before any difference it measured (drift between launches, not the plans)
    assert res["ran_alike"] == ["prefill.backend", "prefill.max_num_tokens", "prefill.num_tokens"], res["ran_alike"]
    assert res["verdict"].startswith("A and B ran alike here: their plans differ only in prefill.backend, ")
    assert "; TTFT: " in res["verdict"] and "scipy.stats.bootstrap" in res["method"]
    with Client(srv.address) as c:
        launches = [c.get_launch(r["launch"]) for r in exp["runs"]]
        assert [x.plan for x in launches] == [a, b, a, b]
        # each launch says which experiment made it, and the experiment's launches are found by it
        assert {x.experiment for x in launches} == {exp["name"]}
        mine = c.list_launches(filter=f'experiment = "{exp["name"]}"').launches
        assert [x.name for x in mine] == [r["launch"] for r in exp["runs"]]
        # ... and carries its labels: the ticket finds the experiment and every launch it made
        assert all(dict(x.labels) == exp["labels"] for x in launches)
        ticket = c.list_launches(filter='labels.ticket = "inc-42"').launches
        assert [x.name for x in ticket] == [r["launch"] for r in exp["runs"]]
        assert [x.name for x in c.list_experiments(filter='labels.ticket = "inc-42"').experiments] == [exp["name"]]
        assert c.list_experiments(filter='labels.ticket = "inc-43"').experiments == []
        made = c.get_audit_record(launches[3].audit_records[0]).outcome_message
        assert made.endswith(f", arm B, repeat 2 of {exp['name']}, labels team=infra, ticket=inc-42"), made
        started = c.get_audit_record(exp["audit_records"][0]).outcome_message  # the log holds every label it had
        assert started.endswith(", labels team=infra, ticket=inc-42"), started
        for x in launches:  # each run's launch is created as the last one ends: started once all the same
            assert_started_once(c, x.name)
        assert all(x.workload.seed == 5 for x in launches)
        # the engine settings asked for reach every launch of both arms, and what ran says so
        assert exp["engine"] == {"dtype": "auto", "kv_cache_mb": 16.0, "cpu_decode": "eager"}, exp["engine"]
        assert all(x.engine.kv_cache_mb == 16 and x.report.kv_cache_budget_bytes == 16 << 20 for x in launches)
        end = c.get_audit_record(exp["audit_records"][-1])
        assert exp["name"] in end.outcome_message and "SUCCEEDED" in end.outcome_message
    listed = json.loads(cli(srv, "experiments", "list", "-o", "json").stdout)["experiments"]
    assert [e["name"] for e in listed] == [exp["name"]]
    for plan in (a, b.removeprefix("plans/")):  # the experiments that measured a plan, as either arm
        measured = cli(srv, "experiments", "list", "--filter", f'plan = "{plan}"', "-o", "json").stdout
        assert [e["name"] for e in json.loads(measured)["experiments"]] == [exp["name"]], measured
    # the list's verdict column is each metric's call in a few words (it was the verdict's first
    # 80 characters: the "ran alike" preface and nothing of TTFT's or TPOT's call)
    assert res["verdict_brief"].startswith("ran alike; TTFT ") and "; TPOT " in res["verdict_brief"]
    table = cli(srv, "experiments", "list", "-L", "ticket,owner", "-o", "table").stdout
    assert res["verdict_brief"] in table, table
    assert table.splitlines()[0].split()[-2:] == ["ticket", "owner"], table
    assert [line.split()[-2:] for line in table.splitlines() if exp["name"] in line] == [["inc-42", "-"]], table
    run = cli(srv, "launches", "show", exp["runs"][0]["launch"], "-o", "table").stdout
    assert f"experiment      {exp['name']} (a run of it: `cgsvc-cli experiments show {exp['name']}`)" in run, run
    by = json.loads(cli(srv, "launches", "summary", "--by", "experiment", "--filter", 'experiment != ""',
                        "-o", "json").stdout)
    assert [(g["experiment"], g["launches"]) for g in by["summary"]["groups"]] == [(exp["name"], 4)], by
    shown = cli(srv, "experiments", "show", exp["name"], "-o", "table").stdout
    assert "B - A" in shown and "verdict:" in shown
    assert "engine      dtype auto, KV cache 16 MiB a rank, CPU decode eager" in shown, shown
    assert "labels      team=infra, ticket=inc-42" in shown, shown
    # `experiments diff`: did a verdict hold? An experiment against itself holds on every metric
    held = cli(srv, "experiments", "diff", exp["name"], exp["name"].split("/")[1], "--exit-code", "-o", "json")
    assert held.returncode == 0, held.stdout + held.stderr
    d = json.loads(held.stdout)["diff"]
    assert d["request_differs"] == [] and [m["metric"] for m in d["metrics"]] == ["ttft_ms", "tpot_ms"], d
    assert d["arms_swapped"] is False, d
    for m in d["metrics"]:
        assert m["a"] == m["b"] and m["agreement"] in ("held", "neither can tell"), m
        assert m["a"]["brief"] in res["verdict_brief"], (m, res["verdict_brief"])
    told = cli(srv, "experiments", "diff", exp["name"], exp["name"], "-o", "table").stdout
    assert "the same request" in told and "agreement" in told, told
    assert d["a"]["ran_alike"] == res["ran_alike"] and "in a, A and B ran alike" in told, told  # read as noise
    # the same plans with the arms the other way round: read reversed, so that "held" means the same plan won
    other = cli(srv, "experiment", "run", b, a, "--model-path", ckpt, "--input-len", "12", "--output-len", "4",
                "--requests", "2", "--repeats", "1", "--seed", "5", "--kv-cache-mb", "16", "-o", "json")
    assert other.returncode == 0, other.stdout + other.stderr
    turned = json.loads(other.stdout)["experiment"]
    d = json.loads(cli(srv, "experiments", "diff", exp["name"], turned["name"], "-o", "json").stdout)["diff"]
    assert d["arms_swapped"] is True and d["request_differs"] == ["workload", "repeats"], d
    as_given = turned["result"]["difference"]["ttft_ms"]
    assert d["metrics"][0]["b"]["mean"] == pytest.approx(-as_given["mean"]), (d["metrics"][0], as_given)
    # `experiments summary`: the experiments counted by what they found, each metric's call as the
    # stored result gives it, and by their arms (the turned experiment has the plans the other way)
    from cgsvc.domain.stats import CALL_WORDS, metric_call

    found = json.loads(cli(srv, "experiments", "summary", "--by", "state,ttft,tpot", "-o", "json").stdout)["summary"]
    calls = collections.Counter(("SUCCEEDED", *(CALL_WORDS[metric_call(x["result"], m)["call"]]
                                                for m in ("ttft_ms", "tpot_ms"))) for x in (exp, turned))
    assert found["experiments"] == 2 and {(g["state"], g["ttft"], g["tpot"]): g["experiments"]
                                          for g in found["groups"]} == dict(calls), found
    assert sum(g["launches"] for g in found["groups"]) == 6  # 2 a arm, then 1
    assert all(g["succeeded"] == g["experiments"] for g in found["groups"]), found
    arms = json.loads(cli(srv, "experiments", "summary", "--by", "a,ran_alike,labels.team", "-o", "json").stdout)
    assert sorted((g["a"], g["ran_alike"], g["labels.team"], g["experiments"], g["launches"], g["succeeded"])
                  for g in arms["summary"]["groups"]) == sorted([(a, "yes", "infra", 1, 4, 1), (b, "yes", "-", 1, 2, 1)])
    table = cli(srv, "experiments", "summary", "--by", "tpot", "-o", "table")
    assert table.returncode == 0 and table.stdout.rstrip().endswith("2 experiments in " + (
        "1 group" if len({g[2] for g in calls}) == 1 else "2 groups")), table.stdout
    unknown = cli(srv, "experiments", "summary", "--by", "verdict", "-o", "json")
    assert unknown.returncode == 2 and "valid: state, principal" in unknown.stdout, unknown.stdout
    assert "ran_alike, labels.KEY (comma-separated)" in unknown.stdout, unknown.stdout  # labels too, as --by takes
    wrong = cli(srv, "experiments", "diff", exp["name"], "plans/x", "-o", "json")
    assert wrong.returncode == 2 and '"field": "b"' in wrong.stdout, wrong.stdout
    # `experiments label`: an ended experiment's labels change, audited; its launches keep theirs
    relabel = cli(srv, "experiments", "label", exp["name"], "owner=ana", "ticket-", "-o", "table")
    assert relabel.returncode == 0 and "labels owner=ana, team=infra" in relabel.stdout, relabel.stdout + relabel.stderr
    with Client(srv.address) as c:
        assert dict(c.get_experiment(exp["name"]).labels) == {"owner": "ana", "team": "infra"}
        assert [x.name for x in c.list_experiments(filter='labels.owner = "ana"').experiments] == [exp["name"]]
        assert all(dict(c.get_launch(r["launch"]).labels)["ticket"] == "inc-42" for r in exp["runs"])
        rec = c.list_audit_records('method = "UpdateExperiment"').records[-1]
        assert rec.outcome_message == f"{exp['name']}: labels: owner=ana added, ticket=inc-42 removed", rec
        with pytest.raises(ServiceError) as e:
            c.label_experiment(exp["name"], {"Owner": "x"})
        assert {v.field for v in e.value.violations} == {"experiment.labels.Owner", "update_mask"}, e.value


def wait_experiment(c: Client, name: str, pred: Any, timeout: float = 300) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        msg = c.get_experiment(name)
        if pred(msg):
            return msg
        time.sleep(0.2)
    raise AssertionError(f"{name} did not get there: {msg}")


def test_an_experiment_whose_launch_fails_stops_names_it_and_keeps_what_was_measured(
        srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        a, b = two_plans(c)
        exp = c.create_experiment([a, b], ckpt, {**WORKLOAD, "output_len": 100, "requests": 1}, repeats=2)
        running = wait_experiment(c, exp.name, lambda m: any(r.arm == "B" and r.state == "RUNNING" for r in m.runs))
        victim = running.runs[-1].launch
        c.cancel_launch(victim)
        done = wait_experiment(c, exp.name, lambda m: m.state != "RUNNING")
        assert done.state == "FAILED"
        assert victim in done.error and "CANCELLED" in done.error and "arm B, repeat 1" in done.error
        assert [r.state for r in done.runs] == ["SUCCEEDED", "CANCELLED"]  # it stopped: no A2, no B2
        arms = done.result["arms"]
        assert int(arms["A"]["ttft_ms"]["n"]) == 1 and int(arms["B"]["ttft_ms"]["n"]) == 0
        end = c.get_audit_record(done.audit_records[-1])
        assert "FAILED" in end.outcome_message and victim in end.outcome_message


def test_a_cancelled_experiment_stops_its_launch_ends_cancelled_and_keeps_what_it_measured(
        srv: ServerProcess, ckpt: str) -> None:
    """An experiment started by mistake ran every launch of every repeat: there was no way to stop
    it but to cancel its launches one by one. `experiments cancel` stores the request (for whichever
    replica runs it), cancels the launch running now, starts no other, and the experiment ends
    CANCELLED with the samples measured before; who asked is in the audit log. Cancelling it again,
    or as an auditor, is refused."""
    with Client(srv.address) as c:
        a, b = two_plans(c)
        long = {**WORKLOAD, "output_len": 100, "requests": 1}
        exp = c.create_experiment([a, b], ckpt, long, repeats=3, request_id="cancel-me", labels={"ticket": "inc-7"})
        # a retry (the answer lost, say) is that experiment, not a second one on the same devices ...
        assert c.create_experiment([a, b], ckpt, long, repeats=3, request_id="cancel-me",
                                   labels={"ticket": "inc-7"}).name == exp.name
        for other in ({"repeats": 2, "labels": {"ticket": "inc-7"}}, {"repeats": 3, "labels": {"ticket": "inc-9"}}):
            with pytest.raises(ServiceError) as e:  # ... and the key is not taken for another request
                c.create_experiment([a, b], ckpt, long, request_id="cancel-me", **other)  # type: ignore[arg-type]
            assert [v.field for v in e.value.violations] == ["request_id"] and exp.name in e.value.message, e.value
        replays = c.list_audit_records('method = "CreateExperiment" AND request_id = "cancel-me"').records
        assert [r.outcome_code for r in replays] == [0, 0, 3, 3], replays  # made, replayed, refused twice
        assert replays[1].outcome_message.startswith(f"{exp.name}: replay of request_id 'cancel-me'"), replays[1]
        running = wait_experiment(c, exp.name, lambda m: any(r.arm == "B" and r.state == "RUNNING" for r in m.runs))
        victim = running.runs[-1].launch
        asked = cli(srv, "experiments", "cancel", exp.name.split("/")[1], "-o", "json")
        assert asked.returncode == 0, asked.stdout + asked.stderr
        answered = json.loads(asked.stdout)["experiment"]
        assert (answered["name"], answered["cancel_requested_by"]) == (exp.name, "local"), answered
        waited = cli(srv, "experiments", "wait", exp.name, "-o", "json")  # until it ends, as a script would
        assert waited.returncode == 4, waited.stdout + waited.stderr  # it did not succeed
        assert json.loads(waited.stdout)["experiment"]["state"] == "CANCELLED"
        series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in srv.metrics_text().splitlines()
                  if line.startswith("cgsvc_experiments_")}
        assert series['cgsvc_experiments_ended_total{state="CANCELLED"}'] == 1, series
        assert series['cgsvc_experiments_ended_total{state="SUCCEEDED"}'] == 0, series
        assert series["cgsvc_experiments_running"] == 0, series
        done = wait_experiment(c, exp.name, lambda m: m.state != "RUNNING")
        assert done.state == "CANCELLED" and done.cancel_requested_by == "local", done.error
        assert done.error == "cancelled by local; the 1 sample measured before is kept", done.error
        assert [r.state for r in done.runs] == ["SUCCEEDED", "CANCELLED"]  # no A2: nothing started after
        assert c.get_launch(victim).state == "CANCELLED"
        assert int(done.result["arms"]["A"]["ttft_ms"]["n"]) == 1
        asks = [r for r in c.list_audit_records('method = "CancelExperiment"').records]
        assert [(r.principal, r.outcome_code) for r in asks] == [("local", 0)]
        assert asks[0].outcome_message.startswith(f"{exp.name}: cancel asked by local")
        again = cli(srv, "experiments", "cancel", exp.name, "-o", "json")
        assert again.returncode == 2 and "has already ended (CANCELLED)" in again.stdout, again.stdout
        refused = c.list_audit_records('method = "CancelExperiment" AND outcome = "FAILED_PRECONDITION"').records
        assert len(refused) == 1  # the refusal is audited too
    runs = cli(srv, "experiments", "list", "--filter", 'state = "cancelled"', "-o", "json")
    assert [x["name"] for x in json.loads(runs.stdout)["experiments"]] == [exp.name]
    # run it again as it was asked for: the server reads its request, and the new one names the old
    rerun = cli(srv, "experiments", "rerun", exp.name.split("/")[1], "--detach", "-o", "json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    again = json.loads(rerun.stdout)["experiment"]
    assert again["name"] != exp.name and again["rerun_of"] == exp.name, again
    assert again["labels"] == {"ticket": "inc-7"}, again  # the experiment's own, unless others are given
    kept = ("plans", "workload", "model_path", "repeats", "dispatcher", "engine")
    assert {k: again[k] for k in kept} == {k: json.loads(runs.stdout)["experiments"][0][k] for k in kept}, again
    assert f"{again['name']}: {exp.name} again" in rerun.stderr, rerun.stderr
    with Client(srv.address) as c:
        made = c.get_audit_record(again["audit_records"][0])
        assert made.outcome_message.endswith(f", rerun of {exp.name}, labels ticket=inc-7"), made.outcome_message
        assert [x.name for x in c.list_experiments(filter=f'rerun_of = "{exp.name}"').experiments] == [again["name"]]
        c.cancel_experiment(again["name"])
        assert wait_experiment(c, again["name"], lambda m: m.state != "RUNNING").state == "CANCELLED"
        # a rerun runs what the experiment ran: anything else asked beside it is refused by name
        with pytest.raises(ServiceError) as e:
            c.create_experiment([a, b], ckpt, WORKLOAD, repeats=1, rerun_of=exp.name)
        assert e.value.code == "INVALID_ARGUMENT" and {v.field for v in e.value.violations} == {
            "plans", "model_path", "workload", "repeats"}, e.value
        for name, code in (("experiments/nope", "NOT_FOUND"), (a, "INVALID_ARGUMENT")):
            with pytest.raises(ServiceError) as e:
                c.create_experiment([], "", {}, repeats=0, rerun_of=name)
            assert e.value.code == code, (name, e.value)
    shown = cli(srv, "experiments", "show", again["name"], "-o", "table").stdout
    assert f"rerun of    {exp.name}" in shown, shown
    # labels given with a rerun replace the experiment's
    other = cli(srv, "experiments", "rerun", exp.name, "--detach", "--label", "ticket=inc-8", "-o", "json")
    assert other.returncode == 0, other.stdout + other.stderr
    relabelled = json.loads(other.stdout)["experiment"]
    assert relabelled["labels"] == {"ticket": "inc-8"} and relabelled["rerun_of"] == exp.name, relabelled
    with Client(srv.address) as c:
        c.cancel_experiment(relabelled["name"])
        assert wait_experiment(c, relabelled["name"], lambda m: m.state != "RUNNING").state == "CANCELLED"


def test_a_cancel_that_lands_as_the_last_launch_finishes_still_ends_the_experiment_cancelled(
        srv: ServerProcess, ckpt: str) -> None:
    """Regression: `experiments cancel` was accepted ("it ends after its current launch stops"),
    but the last launch finished before the cancel reached it, and the experiment ended SUCCEEDED
    with `cancel_requested_by` set: a script waiting for CANCELLED never saw it. The request is
    stored here straight into the experiment's row (as a replica does first) while the last launch
    runs, and that launch is left to finish, which is the race's outcome made certain."""
    from cgsvc.launch.store import ExperimentStore
    with Client(srv.address) as c:
        a, b = two_plans(c)
        # long enough (about 3 s of decode) for the poll below to see B running; the cancel is a row write
        exp = c.create_experiment([a, b], ckpt, {**WORKLOAD, "output_len": 40, "requests": 1}, repeats=1)
        wait_experiment(c, exp.name, lambda m: any(r.arm == "B" and r.state == "RUNNING" for r in m.runs))
        store = AuditStore(f"sqlite:///{srv.data_dir / 'cgsvc.db'}")
        try:
            assert ExperimentStore(store).request_cancel(exp.name.split("/")[1], "local")
        finally:
            store.close()
        done = wait_experiment(c, exp.name, lambda m: m.state != "RUNNING")
        assert [r.state for r in done.runs] == ["SUCCEEDED", "SUCCEEDED"]  # the launch finished all the same
        assert done.state == "CANCELLED" and done.cancel_requested_by == "local", (done.state, done.error)
        assert done.error == ("cancelled by local as its last launch finished: every launch it planned ran, "
                              "and the 2 samples measured in them are kept"), done.error
        assert int(done.result["arms"]["B"]["ttft_ms"]["n"]) == 1
        end = c.get_audit_record(done.audit_records[-1])
        assert end.outcome_message.startswith(f"{exp.name}: CANCELLED: ") and "as its last launch finished" in end.outcome_message


def test_a_restart_ends_a_running_experiment_and_leaves_none_of_its_launches_running(
        srv: ServerProcess, ckpt: str) -> None:
    """The server is killed while an experiment's launch runs. Restarted, it re-attaches to the
    launch's group, ends the experiment FAILED (its schedule cannot resume) saying so, and
    cancels the launch, which served nothing any more, with a record saying why."""
    with Client(srv.address) as c:
        a, b = two_plans(c)
        exp = c.create_experiment([a, b], ckpt, {**WORKLOAD, "output_len": 4000, "requests": 1}, repeats=1)
        running = wait_experiment(c, exp.name, lambda m: any(r.state == "RUNNING" for r in m.runs))
        victim = running.runs[-1].launch
        pid = supervisor_pid(state_records(c, victim))
    srv.kill9()
    srv.start()  # its recovery has run when it answers
    with Client(srv.address) as c:
        done = c.get_experiment(exp.name)
        assert done.state == "FAILED", done
        assert "the server stopped while the experiment ran" in done.error, done.error
        assert f"{victim}, which it ran, is cancelled" in done.error, done.error
        wait_for(f"{victim} cancelled", lambda: c.get_launch(victim).state == "CANCELLED", timeout=60)
        said = state_records(c, victim)
        assert any(m.startswith("re-attached after a server restart") for m in said), said
        why = f"cancelled by cgsvc: {exp.name}, which ran it, ended FAILED: the server stopped while the experiment ran"
        assert said[-1].startswith(f"RUNNING -> CANCELLED: {why}"), said
        assert c.get_launch(victim).error.startswith(why)
    assert no_processes_left(pid, timeout=15), f"the launch's group (supervisor pid {pid}) still runs"


def test_bad_experiments_are_refused_by_field_and_audited(srv: ServerProcess, ckpt: str, tmp_path: Path) -> None:
    with Client(srv.address) as c:
        a, _ = two_plans(c)
        cases = [
            (dict(plans=[a], model_path=ckpt, repeats=1), "plans"),
            (dict(plans=[a, "plans/nope"], model_path=ckpt, repeats=1), None),  # NOT_FOUND
            (dict(plans=[a, a], model_path=ckpt, repeats=0), "repeats"),
            (dict(plans=[a, a], model_path=str(tmp_path / "none"), repeats=1), "model_path"),
            (dict(plans=[a, "launches/x"], model_path=ckpt, repeats=1), "plans[1]"),
            (dict(plans=[a, a], model_path=ckpt, repeats=1, engine={"dtype": "fp64"}), "engine.dtype"),
            (dict(plans=[a, a], model_path=ckpt, repeats=1, labels={"Team": "infra"}), "labels.Team"),
            (dict(plans=[a, a], model_path=ckpt, repeats=1, labels={"team": "a,b"}), "labels.team"),
        ]
        for kwargs, field in cases:
            with pytest.raises(ServiceError) as err:
                c.create_experiment(workload=WORKLOAD, **kwargs)  # type: ignore[arg-type]
            if field is None:
                assert err.value.code == "NOT_FOUND"
            else:
                assert field in [v.field for v in err.value.violations], err.value
        refusals = c.list_audit_records('method = "/cgsvc.v1.ExperimentService/CreateExperiment"').records
        assert len(refusals) == len(cases) and all(r.outcome_code != 0 for r in refusals)
        assert c.list_experiments().experiments == []
        with pytest.raises(ServiceError) as nf:
            c.get_experiment("experiments/nope")
        assert nf.value.code == "NOT_FOUND"


def test_a_launch_from_a_spec_resolves_under_the_policy_asked_for(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        launch = c.create_launch(ckpt, {**WORKLOAD, "output_len": 200}, spec=KIMI, policy="sglang-0.5.18").metadata
        plan = c.get_plan(launch.plan)
        assert plan.policy == "sglang-0.5.18" and plan.prefill.backend == "breakable"
        created = c.list_audit_records(f'launch_id = "{launch.name.removeprefix("launches/")}"').records[0]
        assert created.method.endswith("CreateLaunch") and created.policy == "sglang-0.5.18"
        c.cancel_launch(launch.name)
        # the group is stopped before the server is
        wait_for(f"{launch.name} cancelled", lambda: c.get_launch(launch.name).state == "CANCELLED", timeout=60)
