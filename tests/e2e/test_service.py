"""The service over real sockets with a real server process (SQLite under a temp data dir)."""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
from cgsvc_client.client import Client
from google.protobuf import descriptor_pool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)

from cgsvc.errors import ServiceError
from cgsvc.v1 import audit_pb2, plan_service_pb2
from tests.conftest import ROOT, llama_dir
from tests.e2e.server import ServerProcess

KIMI: dict[str, Any] = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
                        "parallelism": {"tp": 4}}
SPEC_FILE = ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def test_server_and_offline_output_are_identical(server: ServerProcess) -> None:
    for extra in ([], ["--enforce-piecewise"], ["--explain", "prefill.backend"]):
        offline = cli("resolve", "--spec", str(SPEC_FILE), "-o", "json", *extra)
        remote = cli("resolve", "--spec", str(SPEC_FILE), "-o", "json", "--server", server.address, *extra)
        assert offline.returncode == remote.returncode == 0, remote.stderr
        key = "explain" if extra[:1] == ["--explain"] else "plan"
        got, want = json.loads(remote.stdout)[key], json.loads(offline.stdout)[key]
        # the server's answer also names the stored plan and its audit record, first
        resource = {k: got.pop(k) for k in ("name", "audit_record", "create_time") if k in got}
        assert resource["name"].startswith("plans/") and resource["audit_record"].startswith("auditRecords/")
        assert json.dumps(got) == json.dumps(want)  # the same plan, field for field and in order
        t_off = cli("resolve", "--spec", str(SPEC_FILE), "-o", "table", *extra)
        t_rem = cli("resolve", "--spec", str(SPEC_FILE), "-o", "table", "--server", server.address, *extra)
        head, _, rest = t_rem.stdout.partition("\n\n")
        assert head.startswith("plans/") and "auditRecords/" in head
        assert rest == t_off.stdout
    bad = ["resolve", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H100", "--gpus", "8", "--tp", "8",
           "--attention-backend", "trtllm_mla", "-o", "json"]
    offline, remote = cli(*bad), cli(*bad, "--server", server.address)
    assert offline.returncode == remote.returncode == 2
    assert offline.stdout == remote.stdout


def test_an_explain_typo_is_refused_before_anything_is_sent(server: ServerProcess, client: Client) -> None:
    before = client.get_checkpoint().tree_size
    bad = cli("resolve", "--spec", str(SPEC_FILE), "--explain", "prefill.bakend", "-o", "json", "--server", server.address)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "explain"
    assert client.get_checkpoint().tree_size == before  # no plan stored, no record written


def test_cgsvc_server_in_the_environment_stands_for_server(server: ServerProcess) -> None:
    env = {**os.environ, "CGSVC_SERVER": server.address}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], capture_output=True, text=True,
                              timeout=60, cwd=ROOT, env=env)
    remote = json.loads(run("resolve", "--spec", str(SPEC_FILE), "-o", "json").stdout)["plan"]
    assert remote["name"].startswith("plans/")  # stored by the server the variable names
    verify = run("audit", "verify", "-o", "json")  # a command that needs a server no longer asks for --server
    assert verify.returncode == 0 and json.loads(verify.stdout)["verification"]["ok"], verify.stdout + verify.stderr
    offline = json.loads(run("resolve", "--spec", str(SPEC_FILE), "-o", "json", "--server", "").stdout)["plan"]
    assert "name" not in offline and offline["plan_hash"] == remote["plan_hash"]  # --server '' resolves here
    env["CGSVC_SERVER"] = ""
    missing = run("audit", "verify", "-o", "json")
    assert missing.returncode == 2  # an empty variable is no server
    assert json.loads(missing.stdout)["error"]["field_violations"] == [{"field": "server", "description": "required"}]


def test_connection_and_output_options_may_come_before_the_command(server: ServerProcess) -> None:
    """`cgsvc-cli --server X audit verify`, as kubectl and gcloud take it, not 'invalid choice: X'."""
    for args in (["--server", server.address, "-o", "json", "audit", "verify"],
                 [f"--server={server.address}", "--timeout", "20", "audit", "verify", "-o", "json"]):
        out = cli(*args)
        assert out.returncode == 0 and json.loads(out.stdout)["verification"]["ok"], out.stdout + out.stderr
    late = cli("-o", "json", "rules", "--server", server.address)  # a command that takes no server says so
    assert late.returncode == 2 and "unrecognized arguments: --server" in json.loads(late.stdout)["error"]["message"]


def test_list_all_follows_every_page(server: ServerProcess, client: Client) -> None:
    """--all gathers every page into one answer, the same items as following the tokens by hand."""
    for _ in range(3):
        client.resolve(KIMI)

    def listed(*args: str) -> Any:
        out = cli(*args, "--server", server.address, "-o", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)
    by_hand, token = [], ""
    while True:
        page = listed("audit", "list", "--page-size", "2", *(["--page-token", token] if token else []))
        by_hand += page["records"]
        if not (token := page["next_page_token"]):
            break
    every = listed("audit", "list", "--page-size", "2", "--all")
    assert len(by_hand) >= 3 and every["records"] == by_hand and every["next_page_token"] == ""
    # streamed page by page (constant memory for a million records), in print_json's very layout
    raw = cli("audit", "list", "--page-size", "2", "--all", "--server", server.address, "-o", "json").stdout
    assert raw == json.dumps({"records": by_hand, "next_page_token": ""}, indent=2, ensure_ascii=False) + "\n"
    none = cli("launches", "list", "--filter", 'state = "RUNNING"', "--all", "--server", server.address, "-o", "json")
    assert none.stdout == '{\n  "launches": [],\n  "next_page_token": ""\n}\n'
    for args, said in ((("launches", "list", "--filter", 'state = "RUNNING"'), 'no launches match state = "RUNNING"'),
                       (("experiments", "list"), "no experiments"),
                       (("plans", "list", "--filter", 'gpu = "NoSuchGPU"'), 'no plans match gpu = "NoSuchGPU"'),
                       (("audit", "list", "--since", "2999-01-01T00:00:00Z"),
                        'no audit records match time >= "2999-01-01T00:00:00.000000Z"')):
        empty = cli(*args, "--server", server.address, "-o", "table")  # a table of nothing says so
        assert (empty.returncode, empty.stdout) == (0, said + "\n"), (args, empty.stdout, empty.stderr)
    plans = listed("plans", "list", "--page-size", "1", "--all")
    assert len(plans["plans"]) >= 3 and plans["next_page_token"] == ""
    table = cli("plans", "list", "--page-size", "1", "--all", "--server", server.address, "-o", "table").stdout
    assert "next page:" not in table and len({p["name"] for p in plans["plans"]}) == len(plans["plans"])
    assert all(p["name"] in table for p in plans["plans"])


def test_a_name_from_another_collection_is_refused_as_typed(server: ServerProcess) -> None:
    """A bare ID gets its collection's prefix; a name with another collection's prefix reaches
    the server as the user typed it, so the error quotes it (not 'auditRecords/plans/3')."""
    for args, collection in ((["audit", "show", "plans/3"], "auditRecords"), (["plans", "show", "auditRecords/1"], "plans"),
                             (["launches", "show", "plans/3"], "launches")):
        out = cli(*args, "--server", server.address, "-o", "json")
        err = json.loads(out.stdout)["error"]
        assert out.returncode == 2 and err["field_violations"][0]["field"] == "name", out.stdout
        assert f"must look like {collection}/ID, got '{args[2]}'" in err["message"]
    made = json.loads(cli("resolve", "--spec", str(SPEC_FILE), "--server", server.address, "-o", "json").stdout)["plan"]
    seq = made["audit_record"].removeprefix("auditRecords/")
    bare = cli("audit", "show", seq, "--server", server.address, "-o", "json")
    assert bare.returncode == 0 and str(json.loads(bare.stdout)["record"]["sequence"]) == seq, bare.stdout
    plan_id = made["name"].removeprefix("plans/")
    shown = cli("plans", "show", plan_id, "--server", server.address, "-o", "json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["plan"]["name"] == made["name"]


def test_resolve_get_list(client: Client) -> None:
    plan = client.resolve_proto(KIMI)
    assert plan.name.startswith("plans/") and plan.audit_record.startswith("auditRecords/")
    assert plan.prefill.backend == "disabled" and plan.spec.model.name == "nvidia/Kimi-K2.6-NVFP4"
    got = client.get_plan(plan.name)
    assert got.plan_hash == plan.plan_hash and got.audit_record == plan.audit_record
    rec = client.get_audit_record(plan.audit_record)
    assert rec.plan_id == plan.name.split("/")[1] and rec.outcome_code == 0
    assert "breakable.mla" in rec.rule_ids
    assert json.loads(rec.plan_json)["plan_hash"] == plan.plan_hash

    h200 = {**KIMI, "hardware": {"gpu": "H200", "gpu_count": 4}}
    names = {client.resolve_proto(h200).name for _ in range(5)}
    seen: list[str] = []
    token = ""
    while True:
        page = client.list_plans('gpu = "H200" AND prefill_backend = "tc_piecewise"', page_size=2, page_token=token)
        seen += [p.name for p in page.plans]
        token = page.next_page_token
        if not token:
            break
    assert names <= set(seen) and all(client.get_plan(n).spec.hardware.gpu == "H200" for n in seen)


def test_the_python_client_reads_every_page_of_each_collection(client: Client) -> None:
    """A program had to loop on next_page_token itself for launches, records and experiments
    (only plans had an iterator): each collection has one, taking the filter and order a page does."""
    for _ in range(3):
        client.resolve_proto(KIMI)

    def paged(list_call: Any, field: str, filter: str, **kw: Any) -> list[str]:
        seen, token = [], ""
        while True:
            page = list_call(filter, 2, token, **kw)
            seen += [x.name for x in getattr(page, field)]
            if not (token := page.next_page_token):
                return seen

    resolved = paged(client.list_audit_records, "records", 'method = "ResolvePlan"')
    assert len(resolved) >= 3
    assert [r.name for r in client.iter_audit_records('method = "ResolvePlan"', page_size=2)] == resolved
    newest = client.iter_audit_records('method = "ResolvePlan"', page_size=2, order_by="sequence desc",
                                       view=audit_pb2.AUDIT_RECORD_VIEW_BASIC)
    assert [(r.name, r.plan_json) for r in newest] == [(name, "") for name in reversed(resolved)]
    assert [p.name for p in client.iter_plans('gpu = "GB300"', page_size=2, order_by="create_time desc")] == (
        paged(client.list_plans, "plans", 'gpu = "GB300"', order_by="create_time desc"))
    for iterate, list_call, field in ((client.iter_launches, client.list_launches, "launches"),
                                      (client.iter_experiments, client.list_experiments, "experiments")):
        assert [x.name for x in iterate("", page_size=2)] == paged(list_call, field, "")
    with pytest.raises(ServiceError) as e:  # a bad filter is refused when the first page is read
        next(client.iter_launches('state = "RUNING"'))
    assert e.value.code == "INVALID_ARGUMENT"


def test_validate_only_stores_no_plan_but_is_audited(client: Client) -> None:
    before = len(list(client.iter_plans()))
    plan = client.resolve_proto(KIMI, validate_only=True)
    assert plan.name == "" and plan.audit_record
    assert len(list(client.iter_plans())) == before
    assert client.get_audit_record(plan.audit_record).outcome_message == "validate_only"


def test_each_answer_is_its_own_plan_whole(client: Client) -> None:
    """Regression guard for the answer built from cached bytes (the resolution's plan and spec,
    encoded once) followed by the request's own fields: each answer carries its own name,
    record and time, and parses to the same message as the plan read back (GetPlan), the spec in
    its recorded spelling included."""
    spelled = {**KIMI, "hardware": {"gpu": "gb300", "gpu_count": 4}}
    a, b = client.resolve_proto(spelled), client.resolve_proto(KIMI)
    assert a.name != b.name and a.audit_record != b.audit_record and a.plan_hash == b.plan_hash
    for answer in (a, b):
        stored = client.get_plan(answer.name)
        assert answer == stored, answer.name
        assert answer.spec.hardware.gpu == "GB300" and answer.create_time.seconds > 0
    checked = client.resolve_proto(KIMI, validate_only=True)
    assert checked.name == "" and not checked.HasField("create_time") and checked.audit_record
    assert checked.decisions == a.decisions and checked.spec == a.spec


def test_request_id_is_idempotent(client: Client) -> None:
    rid = uuid.uuid4().hex
    a = client.resolve_proto(KIMI, request_id=rid)
    b = client.resolve_proto(KIMI, request_id=rid)
    assert a.name == b.name and a.plan_hash == b.plan_hash
    with pytest.raises(ServiceError) as err:
        client.resolve_proto({**KIMI, "parallelism": {"tp": 2}}, request_id=rid)
    assert err.value.code == "INVALID_ARGUMENT" and err.value.violations[0].field == "request_id"


def test_refusals_carry_rich_details_and_are_audited(client: Client) -> None:
    with pytest.raises(ServiceError) as err:
        client.resolve({"model": {"name": "nope"}, "hardware": {"gpu": "GB300"}})
    assert err.value.code == "INVALID_ARGUMENT"
    assert [v.field for v in err.value.violations] == ["model.name"]
    with pytest.raises(ServiceError) as err:
        client.resolve({**KIMI, "overrides": {"enforce_piecewise_cuda_graph": True}, "features": {"cpu_offload_gb": 8}})
    assert err.value.code == "FAILED_PRECONDITION" and err.value.rule_id == "tc_piecewise.cpu_offload_or_hicache"
    refused = client.list_audit_records('outcome = FAILED_PRECONDITION AND rule_id = "tc_piecewise.cpu_offload_or_hicache"')
    assert refused.records and refused.records[-1].plan_json == ""
    invalid = client.list_audit_records('outcome = INVALID_ARGUMENT AND model = "nope"')
    assert len(invalid.records) == 1
    assert client.verify_audit_log().ok


def test_models_over_the_wire_match_the_offline_listing_and_refusals_reach_whole(server: ServerProcess,
                                                                                 client: Client) -> None:
    offline = cli("models", "-o", "json")
    remote = cli("models", "-o", "json", "--server", server.address)
    assert offline.returncode == remote.returncode == 0, remote.stderr
    assert remote.stdout == offline.stdout and "nvidia/Kimi-K2.6-NVFP4" in remote.stdout
    assert [m.name for m in client.list_models().models] == [m["name"] for m in json.loads(remote.stdout)["models"]]
    bad = ["resolve", "--model", "DeepSeek-V3.1", "--gpu", "H200", "--gpus", "8", "--tp", "8", "-o", "json"]
    offline, remote = cli(*bad), cli(*bad, "--server", server.address)
    assert offline.returncode == remote.returncode == 2
    assert remote.stdout == offline.stdout  # the refusal was not cut on its way (it used to be, mid-list)
    assert "did you mean 'deepseek-ai/DeepSeek-V3.2'" in remote.stdout and "(cut at" not in remote.stdout


def test_audit_cli_list_show_verify(server: ServerProcess, client: Client) -> None:
    client.resolve(KIMI)
    out = cli("audit", "list", "--server", server.address, "--filter", 'rule_id = "breakable.mla"', "-o", "json")
    recs = json.loads(out.stdout)["records"]
    assert recs and all("breakable.mla" in r["rule_ids"] for r in recs)
    show = cli("audit", "show", recs[0]["name"], "--server", server.address, "-o", "json")
    assert json.loads(show.stdout)["record"]["record_hash"] == recs[0]["record_hash"]
    verify = cli("audit", "verify", "--server", server.address, "-o", "table")
    assert verify.returncode == 0 and "audit chain OK" in verify.stdout
    assert json.loads(cli("audit", "verify", "--server", server.address, "-o", "json").stdout)["verification"]["ok"]
    plans = cli("plans", "list", "--server", server.address, "-o", "table")
    assert plans.returncode == 0 and "nvidia/Kimi-K2.6-NVFP4" in plans.stdout
    name = client.resolve_proto(KIMI).name
    shown = json.loads(cli("plans", "show", name, "--server", server.address, "-o", "json").stdout)["plan"]
    assert shown["name"] == name and shown["spec"]["hardware"]["gpu"] == "GB300" and shown["decode"]["backend"] == "full"
    bad = cli("audit", "list", "--server", server.address, "--filter", "colour = red", "-o", "json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "filter"


def test_audit_list_table_shows_the_model_its_filter_matches(server: ServerProcess, client: Client,
                                                              tmp_path: Path) -> None:
    """A spec that names its model by path alone is recorded under that path: the table's model
    column read the spec's name and showed "-" for every such record, while `model = PATH` found
    them."""
    path = str(llama_dir(tmp_path / "ckpt-seen-in-table"))
    client.resolve({"model": {"path": path}, "hardware": {"gpu": "H200"}})
    table = cli("audit", "list", "--server", server.address, "--filter", f'model = "{path}"', "-o", "table")
    assert table.returncode == 0, table.stderr
    rows = [line for line in table.stdout.splitlines() if "ResolvePlan" in line]
    assert len(rows) == 1 and path in rows[0].split()


def test_a_filter_joins_terms_with_or_over_the_wire(server: ServerProcess, client: Client) -> None:
    """`plans list --filter 'gpu = "GB300" OR gpu = "H200"'` lists the plans of either GPU, as
    many as the two filters apart; an AND group as one side of OR is refused on `filter`, exit 2,
    saying how to write it."""
    client.resolve(KIMI)
    client.resolve({"model": {"name": "deepseek-ai/DeepSeek-V3"}, "hardware": {"gpu": "H200", "gpu_count": 8}})

    def gpus(text: str) -> list[str]:
        done = cli("plans", "list", "--all", "--server", server.address, "--filter", text, "-o", "json")
        assert done.returncode == 0, done.stderr
        return [p["spec"]["hardware"]["gpu"] for p in json.loads(done.stdout)["plans"]]

    either = gpus('gpu = "gb300" OR gpu = "H200"')
    assert set(either) == {"GB300", "H200"} and len(either) == len(gpus('gpu = "GB300"')) + len(gpus('gpu = "H200"'))
    assert set(gpus('(gpu = "GB300" OR gpu = "H200") AND model = "deepseek-v3"')) == {"H200"}
    family = cli("plans", "list", "--all", "--server", server.address, "--filter", 'model = "NVIDIA/*"', "-o", "json")
    models = {p["spec"]["model"]["name"] for p in json.loads(family.stdout)["plans"]}  # a prefix, in any case
    assert "nvidia/Kimi-K2.6-NVFP4" in models and all(m.startswith("nvidia/") for m in models), models
    bad = cli("plans", "list", "--server", server.address, "--filter", '(gpu = "GB300" AND model = "x") OR gpu = "H200"',
              "-o", "json")
    violation = json.loads(bad.stdout)["error"]["field_violations"][0]
    assert bad.returncode == 2 and violation["field"] == "filter" and "(a OR c) AND (b OR c)" in violation["description"]


def test_health_and_reflection(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.address) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        for service in ("", "cgsvc.v1.PlanService", "cgsvc.v1.AuditService"):
            assert health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5).status == \
                health_pb2.HealthCheckResponse.SERVING
        db = ProtoReflectionDescriptorDatabase(ch)
        services = set(db.get_services())
        assert {"cgsvc.v1.PlanService", "cgsvc.v1.AuditService", "grpc.health.v1.Health"} <= services
        pool = descriptor_pool.DescriptorPool(db)
        method = pool.FindServiceByName("cgsvc.v1.PlanService").FindMethodByName("ResolvePlan")
        assert method.input_type.full_name == "cgsvc.v1.ResolvePlanRequest"


def test_bad_input_keeps_the_server_up(server: ServerProcess, client: Client) -> None:
    with grpc.insecure_channel(server.address) as ch:
        raw = ch.unary_unary("/cgsvc.v1.PlanService/ResolvePlan")
        for payload in (b"\xff\xff\xff", b"\x0a\x05\x0a\x03\x0a\x01\xc3", b"\x0a\x02\x0a"):
            with pytest.raises(grpc.RpcError) as err:
                raw(payload, timeout=5)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        with pytest.raises(grpc.RpcError) as err:
            raw(b"\x0a" + b"\x80" * 5 * 1024 * 1024, timeout=10)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a caller whose 1 us deadline passes as the call goes out: whether the deadline or the
        # answer (an empty spec's refusal) reaches the client first is a race on loopback (in a
        # full run the answer has won it five times in five), so either is right, and nothing
        # else is; a deadline passing inside a handler is test_outcomes.py's slow handler
        for _ in range(5):
            with pytest.raises(grpc.RpcError) as err:
                ch.unary_unary("/cgsvc.v1.PlanService/ResolvePlan")(
                    plan_service_pb2.ResolvePlanRequest().SerializeToString(), timeout=0.000001)
            assert err.value.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INVALID_ARGUMENT), err.value
    for bad, says in (({"filter": "model ="}, "expected FIELD OP VALUE"), ({"page_token": "zzz"}, "is not one this server issued"),
                      ({"page_size": -1}, "must not be negative (0 asks for the default, 50; at most 1000), got -1")):
        with pytest.raises(ServiceError) as e:
            client.list_plans(**bad)  # type: ignore[arg-type]
        (field,) = bad
        assert e.value.code == "INVALID_ARGUMENT" and e.value.violations[0].field == field, e.value
        # regression: "page_size: page_size must not be negative" named its field twice and no valid value
        assert says in e.value.violations[0].description and field not in e.value.violations[0].description, e.value
    for name in ("plans/", "x/1", "plans/a/b"):
        with pytest.raises(ServiceError) as e:
            client.get_plan(name)
        assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(ServiceError) as e:
        client.get_plan("plans/doesnotexist")
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(ServiceError) as e:
        client.get_audit_record("auditRecords/abc")
    assert e.value.code == "INVALID_ARGUMENT"
    size = client.get_checkpoint().tree_size
    with pytest.raises(ServiceError) as e:  # a sequence number past the end: say where the log ends
        client.get_audit_record(f"auditRecords/{size + 1}")
    assert e.value.code == "NOT_FOUND", e.value
    assert e.value.message == f"auditRecords/{size + 1} does not exist: the log ends at auditRecords/{size}"
    assert server.alive() and client.verify_audit_log().ok
    assert client.resolve(KIMI).prefill_backend == "disabled"


def test_metrics_endpoint(server: ServerProcess, client: Client) -> None:
    client.resolve(KIMI)
    text = server.metrics_text()
    assert 'cgsvc_rpc_total{code="OK",method="/cgsvc.v1.PlanService/ResolvePlan"}' in text
    assert "cgsvc_audit_append_seconds_count" in text
    assert 'cgsvc_plans_total{decode_backend="full",prefill_backend="disabled"}' in text
    # Start-up's objects are out of the collector's sight (a full collection walking them held
    # the event loop 70-90 ms every few seconds under load), and what serving makes is not.
    frozen = float(re.search(r"^cgsvc_gc_frozen_objects (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert frozen > 50_000
    assert 'python_gc_collections_total{generation="0"}' in text
    assert "cgsvc_gc_pause_seconds_bucket" in text or "# TYPE cgsvc_gc_pause_seconds histogram" in text


def test_logs_are_json_with_request_fields(server: ServerProcess, client: Client) -> None:
    client.resolve(KIMI, request_id="log-check-1")
    lines = [json.loads(x) for x in server.log_path.read_text().splitlines() if x.startswith("{")]
    rpc = [x for x in lines if x.get("request_id") == "log-check-1"]
    assert rpc and {"method", "principal", "duration_ms", "outcome", "trace_id"} <= set(rpc[0])


def test_model_path_specs_are_resolved_fresh(client: Client, tmp_path: Path) -> None:
    """Regression guard for memoised resolution: a spec naming model.path reads config.json each
    time, so an edited checkpoint config changes the plan."""
    cfg = llama_dir(tmp_path) / "config.json"
    spec = {"model": {"path": str(tmp_path)}, "hardware": {"gpu": "B200"}}
    assert client.resolve(spec).attention_prefill == "trtllm_mha"
    cfg.write_text(json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "kv_lora_rank": 32}))
    assert client.resolve(spec).attention_prefill == "trtllm_mla"


def test_a_second_server_on_one_data_directory_is_refused_and_the_first_keeps_serving(tmp_path: Path) -> None:
    """Two servers on one data directory would share one owner name and each start the other's
    launches: the second is refused, naming the field, and the first keeps serving; once the first
    stops, the directory is free again (and keeps its owner name)."""
    with ServerProcess(tmp_path / "srv") as srv:
        name = (srv.data_dir / "instance").read_text().strip()
        proc = subprocess.run([sys.executable, "-m", "cgsvc.server.main", "serve", "--address", "127.0.0.1:0",
                               "--data-dir", str(srv.data_dir)], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "data_dir:" in proc.stderr and "in use by another cgsvc server" in proc.stderr, proc.stderr
        with Client(srv.address) as c:
            assert c.resolve({"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"}, "hardware": {"gpu": "H100"}})
            assert c.verify_audit_log().ok
    with ServerProcess(tmp_path / "srv"):
        assert (tmp_path / "srv" / "instance").read_text().strip() == name


def follow(server: ServerProcess, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "cgsvc_client.cli", "audit", "list", "--follow", "--interval",
                             "0.2", *args, "--server", server.address, "-o", "json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def stop(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C: a follow ends quietly with exit 0; its stderr."""
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 0
    assert proc.stderr is not None
    return proc.stderr.read()


def test_audit_list_follow_prints_each_matching_record_as_it_commits(server: ServerProcess, client: Client) -> None:
    """`audit list --follow`, as `tail -f`: one JSON line per new record that matches, until stopped;
    a filter of OR terms too (the follow's `AND sequence > N` narrows all of it: OR binds tighter)."""
    client.resolve(KIMI)  # history before the follow starts: not printed without --all
    bad = {**KIMI, "parallelism": {"tp": 3}}
    with pytest.raises(ServiceError):
        client.resolve(bad)  # a refusal in the history, which the OR filter below must not print again
    refused_filter = ("--filter", 'outcome = "INVALID_ARGUMENT" OR outcome = "FAILED_PRECONDITION"')
    proc = follow(server, *refused_filter)
    try:
        assert proc.stderr is not None and proc.stdout is not None
        started = proc.stderr.readline()  # said before it polls: what follows is new
        assert started.startswith("following the audit log after auditRecords/") and "Ctrl-C" in started, started
        start = int(re.findall(r"auditRecords/(\d+)", started)[0])
        client.resolve(KIMI)  # matches nothing
        for _ in range(2):
            with pytest.raises(ServiceError):
                client.resolve(bad)
        refused = [json.loads(proc.stdout.readline())["record"] for _ in range(2)]
        assert [r["outcome_code"] for r in refused] == [3, 3]  # INVALID_ARGUMENT
        sequences = [int(r["sequence"]) for r in refused]
        assert start < sequences[0] < sequences[1] == client.get_checkpoint().tree_size
        assert "Traceback" not in stop(proc)
    finally:
        proc.kill()
        proc.wait()
    # --all --follow: the history that matches first, then what comes
    proc = follow(server, "--all", "--filter", f'outcome = "INVALID_ARGUMENT" AND sequence > {start}')
    try:
        assert proc.stdout is not None
        history = [json.loads(proc.stdout.readline())["record"] for _ in range(2)]
        assert [int(r["sequence"]) for r in history] == sequences
        with pytest.raises(ServiceError):
            client.resolve(bad)
        assert int(json.loads(proc.stdout.readline())["record"]["sequence"]) == client.get_checkpoint().tree_size
        stop(proc)
    finally:
        proc.kill()
        proc.wait()
    # a table on a pipe whose reader goes away (`--follow | head -2`): the next record ends it, exit 0
    proc = subprocess.Popen([sys.executable, "-m", "cgsvc_client.cli", "audit", "list", "-f", "--interval", "0.2",
                             "--server", server.address, "-o", "table"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.readline().split() == ["seq", "time", "principal", "method", "model", "outcome", "plan",
                                                  "launch", "detail", "hash"]
        proc.stderr.readline()
        client.resolve(KIMI)
        row = proc.stdout.readline().split()
        assert row[0] == str(client.get_checkpoint().tree_size) and row[3] == "ResolvePlan", row
        proc.stdout.close()
        client.resolve(KIMI)
        assert proc.wait(timeout=20) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
    bad_interval = cli("audit", "list", "--follow", "--interval", "0", "--server", server.address, "-o", "json")
    assert bad_interval.returncode == 2
    assert len(bad_interval.stdout.splitlines()) == 1, "a JSON-lines stream's error is one line too"
    assert json.loads(bad_interval.stdout)["error"]["field_violations"][0]["field"] == "interval"


def test_plans_show_explain_answers_why_a_stored_plan_has_its_mode(server: ServerProcess, client: Client) -> None:
    """The question a fleet asks of a plan already launched: which rules gave it its prefill graph."""
    plan = client.resolve_proto(KIMI)
    shown = cli("plans", "show", plan.name.split("/")[1], "--explain", "Prefill.Backend", "--server", server.address,
                "-o", "json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    explain = json.loads(shown.stdout)["explain"]
    assert (explain["field"], explain["name"], explain["audit_record"]) == ("prefill.backend", plan.name,
                                                                           plan.audit_record)
    assert [d["rule_id"] for d in explain["decisions"]] == [
        "default.prefill.backend", "prefill.exception.trtllm_mla", "breakable.mla"]
    offline = json.loads(cli("resolve", "--spec", str(SPEC_FILE), "--explain", "prefill.backend", "-o",
                             "json").stdout)["explain"]
    assert explain["decisions"] == offline["decisions"]
    table = cli("plans", "show", plan.name, "--explain", "prefill.backend", "--server", server.address,
                "-o", "table").stdout
    assert plan.name in table and "breakable.mla" in table and "sizes.decode.bs" not in table
    typo = cli("plans", "show", plan.name, "--explain", "prefill.bakend", "--server", server.address, "-o", "json")
    assert typo.returncode == 2 and json.loads(typo.stdout)["error"]["field_violations"][0]["field"] == "explain"


def test_a_follow_outlives_a_server_restart(tmp_path: Path) -> None:
    """A follower says the server is not answering and asks again; the restarted server's records
    come through, none twice and none missed."""
    srv = ServerProcess(tmp_path / "srv").start()
    proc = follow(srv, "--filter", 'method = "ResolvePlan"')
    try:
        assert proc.stderr is not None and proc.stdout is not None
        assert proc.stderr.readline().startswith("following the audit log after auditRecords/")
        with Client(srv.address) as c:
            c.resolve(KIMI)
        first = json.loads(proc.stdout.readline())["record"]
        srv.stop()
        assert "UNAVAILABLE" in proc.stderr.readline()  # said, and asked again
        srv.start()  # the same data directory and port
        with Client(srv.address) as c:
            c.resolve(KIMI)
            c.resolve(KIMI)
            last = c.get_checkpoint().tree_size
        later = [json.loads(proc.stdout.readline())["record"] for _ in range(2)]
        sequences = [int(first["sequence"]), *(int(r["sequence"]) for r in later)]
        assert sequences == sorted(set(sequences)) and sequences[-1] == last
        assert all(r["method"].endswith("/ResolvePlan") for r in later)
        assert "Traceback" not in stop(proc)
    finally:
        proc.kill()
        proc.wait()
        srv.stop()


def test_newest_first_lists_the_latest_items_first(server: ServerProcess, client: Client) -> None:
    """`--newest-first` on any list: the most recent first (order_by "... desc" on the wire), page
    by page with --all; the server refuses an order it cannot give on order_by, and a follow, which
    reads forward, refuses it too."""
    made = [client.resolve_proto(KIMI) for _ in range(3)]

    def listed(*args: str) -> Any:
        out = cli(*args, "--server", server.address, "-o", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    latest = listed("plans", "list", "--newest-first", "--page-size", "2")
    assert [p["name"] for p in latest["plans"]] == [made[2].name, made[1].name] and latest["next_page_token"]
    records = listed("audit", "list", "--newest-first", "--all", "--page-size", "2", "--filter",
                     'method = "ResolvePlan"')["records"]
    sequences = [int(r["sequence"]) for r in records]
    assert sequences == sorted(sequences, reverse=True) and sequences[0] == int(made[2].audit_record.split("/")[1])
    with pytest.raises(ServiceError) as e:
        client.list_audit_records(order_by="time desc")
    assert e.value.code == "INVALID_ARGUMENT" and e.value.violations[0].field == "order_by", e.value
    assert "give 'sequence' (oldest first, the default) or 'sequence desc' (newest first)" in e.value.message
    followed = cli("audit", "list", "--follow", "--newest-first", "--server", server.address, "-o", "json")
    assert followed.returncode == 2, followed.stdout + followed.stderr
    assert json.loads(followed.stdout)["error"]["field_violations"][0]["field"] == "order_by"


def test_since_narrows_any_list_to_recent_items(server: ServerProcess, client: Client) -> None:
    """`--since 15m` or `--since TIME` on any list: a term on the collection's time field, joined
    to --filter."""
    def listed(*args: str) -> Any:
        out = cli(*args, "--server", server.address, "-o", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)

    first = client.resolve_proto(KIMI)
    cut = client.get_audit_record(first.audit_record).time.ToJsonString()
    second = client.resolve_proto(KIMI)
    recent = listed("audit", "list", "--since", cut, "--filter", 'method = "ResolvePlan"', "--all")["records"]
    assert [r["name"] for r in recent] == [first.audit_record, second.audit_record]
    plans = listed("plans", "list", "--since", cut, "--all")["plans"]
    assert [p["name"] for p in plans] == [first.name, second.name]
    assert listed("audit", "list", "--since", "10m", "--all")["records"][-1]["name"] == second.audit_record
    assert listed("launches", "list", "--since", "1d")["launches"] == []
    assert listed("experiments", "list", "--since", "2099-01-01T00:00:00Z")["experiments"] == []
    for bad_since in ("yesterday", "2026-12-06", "-5m"):
        bad = cli("audit", "list", "--since", bad_since, "--server", server.address, "-o", "json")
        assert bad.returncode == 2, (bad_since, bad.stdout)
        assert json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "since"


def test_plans_summary_counts_the_fleets_plans_by_the_fields_asked(server: ServerProcess, client: Client) -> None:
    """`plans summary --by gpu,prefill_backend`: how many stored plans run which modes, over every
    page, with --filter and --since as a listing takes them."""
    h200 = {**KIMI, "hardware": {"gpu": "H200", "gpu_count": 4}}
    start = client.get_audit_record(client.resolve_proto(KIMI).audit_record).time.ToJsonString()
    client.resolve_proto(KIMI)
    client.resolve_proto(h200)

    def summary(*args: str) -> Any:
        out = cli("plans", "summary", *args, "--since", start, "--server", server.address, "-o", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)["summary"]

    got = summary("--by", "GPU,prefill_backend")
    assert got["by"] == ["gpu", "prefill_backend"] and got["plans"] == 3
    every = json.loads(cli("plans", "list", "--since", start, "--all", "--server", server.address, "-o",
                           "json").stdout)["plans"]
    expected: dict[tuple[str, str], int] = {}
    for p in every:
        key = (p["spec"]["hardware"]["gpu"], p["prefill"]["backend"])
        expected[key] = expected.get(key, 0) + 1
    assert {(g["gpu"], g["prefill_backend"]): g["plans"] for g in got["groups"]} == expected
    assert [g["plans"] for g in got["groups"]] == sorted((g["plans"] for g in got["groups"]), reverse=True)
    only = summary("--by", "model", "--filter", 'gpu = "H200"')
    assert only["plans"] == 1 and only["groups"] == [{"model": "nvidia/Kimi-K2.6-NVFP4", "plans": 1}]
    assert summary("--by", "day")["groups"] == [{"day": start[:10], "plans": 3}]  # plans made a UTC day
    # a rule's reach across the fleet's plans: a plan counts once under every rule it used
    rules = summary("--by", "rule_id")
    used = collections.Counter(r for p in every for r in dict.fromkeys(
        [d["rule_id"] for d in p["decisions"]] + [w["rule_id"] for w in p.get("warnings", [])]))
    assert {g["rule_id"]: g["plans"] for g in rules["groups"]} == dict(used), rules
    assert rules["plans"] == 3 and {"rule_id": "breakable.mla", "plans": 2} in rules["groups"], rules
    by_gpu = summary("--by", "gpu,rule_id", "--filter", 'rule_id = "breakable.mla"')
    assert by_gpu["plans"] == 2 and {"gpu": "GB300", "rule_id": "breakable.mla", "plans": 2} in by_gpu["groups"]
    assert {g["gpu"] for g in by_gpu["groups"]} == {"GB300"}, by_gpu  # H200's plan did not use it
    rule_table = cli("plans", "summary", "--by", "rule_id", "--since", start, "--server", server.address,
                     "-o", "table").stdout
    assert "3 plans in" in rule_table and "a plan counts once under each rule it used" in rule_table, rule_table
    table = cli("plans", "summary", "--since", start, "--server", server.address, "-o", "table").stdout
    assert "3 plans in" in table and "GB300" in table and "share" in table
    assert "counts once under each" not in table
    bad = cli("plans", "summary", "--by", "gpu,colour", "--server", server.address, "-o", "json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "by"


def test_audit_summary_counts_the_records_by_the_fields_asked(server: ServerProcess, client: Client) -> None:
    """`audit summary --by principal,outcome --since 1h`: who is refused how often, over every
    page, as the records list them (an RPC by name, an outcome by its code name, a day)."""
    start = client.get_audit_record(client.resolve_proto(KIMI).audit_record).time.ToJsonString()
    for _ in range(2):
        with pytest.raises(ServiceError):
            client.resolve({**KIMI, "parallelism": {"tp": 3}})

    def summary(*args: str) -> Any:
        out = cli("audit", "summary", *args, "--since", start, "--server", server.address, "-o", "json")
        assert out.returncode == 0, out.stdout + out.stderr
        return json.loads(out.stdout)["summary"]

    got = summary("--by", "method,Outcome", "--filter", 'method = "ResolvePlan"')
    assert got["by"] == ["method", "outcome"] and got["records"] == 3, got
    assert got["groups"] == [{"method": "ResolvePlan", "outcome": "INVALID_ARGUMENT", "records": 2},
                             {"method": "ResolvePlan", "outcome": "OK", "records": 1}], got
    day = summary("--by", "day", "--filter", 'outcome != "OK" AND method = "ResolvePlan"')
    assert day["groups"] == [{"day": start[:10], "records": 2}], day
    rules = summary("--by", "outcome,rule_id", "--filter", 'method = "ResolvePlan"')  # refusals name no rule here
    assert {"outcome": "INVALID_ARGUMENT", "rule_id": "-", "records": 2} in rules["groups"], rules
    assert {"outcome": "OK", "rule_id": "breakable.mla", "records": 1} in rules["groups"], rules
    table = cli("audit", "summary", "--since", start, "--server", server.address, "-o", "table").stdout
    assert "ResolvePlan" in table and "INVALID_ARGUMENT" in table and "share" in table and " records in " in table
    bad = cli("audit", "summary", "--by", "colour", "--server", server.address, "-o", "json")
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "by"


def test_a_basic_view_of_the_records_leaves_their_plans_out(server: ServerProcess, client: Client) -> None:
    """AIP-157: ListAuditRecords with view BASIC answers every field but the plan's JSON and the
    hashed bytes (each the plan again, several KiB a record), which a table or a count never
    shows; UNSPECIFIED and FULL answer them whole, as before."""
    from cgsvc.v1 import audit_pb2

    name = client.resolve_proto(KIMI).audit_record
    text = f'sequence = {name.split("/")[1]}'
    (full,) = client.list_audit_records(text).records
    (basic,) = client.list_audit_records(text, view=audit_pb2.AUDIT_RECORD_VIEW_BASIC).records
    assert full.plan_json and full.hashed_json and not basic.plan_json and not basic.hashed_json
    assert basic == audit_pb2.AuditRecord(**{**{f.name: getattr(full, f.name) for f in full.DESCRIPTOR.fields
                                                 if f.name not in ("plan_json", "hashed_json", "rule_ids", "time")}},
                                          rule_ids=full.rule_ids, time=full.time)
    assert basic.ByteSize() * 4 < full.ByteSize(), (basic.ByteSize(), full.ByteSize())
    (explicit,) = client.list_audit_records(text, view=audit_pb2.AUDIT_RECORD_VIEW_FULL).records
    assert explicit == full
    with pytest.raises(ServiceError) as refused:  # a number no view has (proto3 keeps it): named, not read as FULL
        client.list_audit_records(text, view=7)  # type: ignore[arg-type]
    assert refused.value.code == "INVALID_ARGUMENT" and refused.value.violations[0].field == "view", refused.value
    assert "AUDIT_RECORD_VIEW_BASIC" in refused.value.violations[0].description


def test_audit_show_on_a_terminal_renders_the_recorded_plan_with_its_decision_trail(server: ServerProcess,
                                                                                    client: Client) -> None:
    plan = client.resolve_proto(KIMI)
    table = cli("audit", "show", plan.audit_record, "--server", server.address, "-o", "table")
    assert table.returncode == 0, table.stderr
    head, _, rest = table.stdout.partition("\n\n")
    assert head.splitlines()[0].split() == ["name", plan.audit_record]
    assert "method" in head and "ResolvePlan" in head and '"gpu":"GB300"' in head  # the spec, on one line
    lines = dict(line.split(None, 1) for line in head.splitlines())
    assert lines["outcome"] == "OK" and lines["rule_ids"].startswith("default.prefill.backend, ")
    # regression: the hashed bytes (the whole plan again, several KiB on one line) filled the terminal
    recorded_bytes = len(client.get_audit_record(plan.audit_record).hashed_json.encode())
    assert lines["hashed_json"] == f"{recorded_bytes} bytes (-o json shows them; audit verify checks them)", lines
    assert "decision trail" in rest and "breakable.mla" in rest and "prefill graph" in rest
    recorded = json.loads(cli("audit", "show", plan.audit_record, "--server", server.address, "-o",
                              "json").stdout)["record"]
    assert json.loads(recorded["plan_json"])["plan_hash"] == plan.plan_hash  # JSON keeps the record whole


def test_a_page_that_would_not_fit_in_one_message_is_cut_short_and_the_rest_follows(tmp_path: Path) -> None:
    """Regression: `audit list --page-size 1000` failed with RESOURCE_EXHAUSTED ("Sent message
    larger than max") once the log held a few hundred plans, each record carrying its plan twice
    (its JSON and the hashed bytes); `--all` asks for pages of 1000. A page now holds what fits
    in max_message_bytes and says where the rest begins (AIP-158 lets a page be shorter)."""
    with ServerProcess(tmp_path / "srv", "--max-message-bytes", "65536") as srv, Client(srv.address) as c:
        for i in range(1, 25):
            c.resolve_proto({**KIMI, "parallelism": {"tp": 4}, "hardware": {"gpu": "GB300", "gpu_count": 4 + i}})
        records, token, pages = [], "", 0
        while True:
            page = c.list_audit_records(page_size=1000, page_token=token)
            assert page.ByteSize() <= 65536 and page.records, page.ByteSize()
            records += page.records
            pages, token = pages + 1, page.next_page_token
            if not token:
                break
        assert pages > 1 and [r.sequence for r in records] == list(range(1, len(records) + 1)), pages
        assert len(records) >= 24  # every record, once, in order, across short pages
        newest = c.list_audit_records(page_size=1000, order_by="sequence desc")
        assert newest.next_page_token and newest.records[0].sequence == len(records)
        plans = c.list_plans(page_size=1000)
        assert len(plans.plans) < 24 and plans.next_page_token  # its plans are cut short the same way
        listed = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "audit", "list", "--all", "--server",
                                 srv.address, "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        # a record's sequence is a JSON number, as a launch's counts are (not the proto3 mapping's string)
        assert [r["sequence"] for r in json.loads(listed.stdout)["records"]] == [r.sequence for r in records]
