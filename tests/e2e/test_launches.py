"""Launches end to end: real server, real worker processes, real gloo; faults and bad input."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cgsvc_client.client import Client
from cgsvc_worker.checkpoint import make_checkpoint

from cgsvc.errors import CODE_NUMBERS, ServiceError
from cgsvc.launch.dispatch import HOST, session_members
from tests.conftest import ROOT, llama_dir
from tests.e2e.server import ServerProcess

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}
SHORT = {"input_len": 12, "output_len": 6, "requests": 2, "concurrency": 1, "seed": 7}
LONG = {"input_len": 12, "output_len": 400, "requests": 1, "concurrency": 1, "seed": 3}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> str:
    return make_checkpoint(str(tmp_path_factory.mktemp("kimi") / "tiny-kimi"), "tiny-kimi")


@pytest.fixture()
def srv(tmp_path: Path) -> Iterator[ServerProcess]:
    with ServerProcess(tmp_path / "srv") as s:
        yield s


def wait_state(c: Client, name: str, states: tuple[str, ...], timeout: float = 120) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        launch = c.get_launch(name)
        if launch.state in states:
            return launch
        time.sleep(0.1)
    raise AssertionError(f"{name} never reached {states}; last {launch.state}")


def wait_tokens(c: Client, name: str, tokens: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while c.get_launch(name).tokens_done < tokens:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.1)


def handle(srv: ServerProcess, name: str) -> dict[str, Any]:
    db = sqlite3.connect(srv.data_dir / "cgsvc.db")
    row = db.execute("SELECT handle_json FROM launches WHERE launch_id = ?", (name.split("/")[1],)).fetchone()
    db.close()
    return dict(json.loads(row[0]))


def no_processes_left(pgid: int, timeout: float = 15) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not session_members(pgid):
            return True
        time.sleep(0.1)
    return False


def test_launch_watch_succeeds_and_matches_offline_run(srv: ServerProcess, ckpt: str, tmp_path: Path) -> None:
    with Client(srv.address) as c:
        op = c.create_launch(ckpt, SHORT, spec=KIMI)
        assert op.name.startswith("operations/") and not op.done
        states = [e.launch.state for e in c.watch_launch(op.metadata.name) if e.kind == "state"]
        assert states[-1] == "SUCCEEDED", c.get_launch(op.metadata.name).error
        assert {"LOADING", "RUNNING"} <= set(states)
        launch = c.get_launch(op.metadata.name)
        report = json.loads(launch.report_json)
        assert launch.report.decode_requested == "full" and launch.report.decode_effective == "static_eager"
        assert launch.report.ttft_ms_p50 > 0 and launch.report.tpot_ms_p50 > 0 and launch.report.substitutions
        fidelity = {f.field: f for f in launch.report.plan_fidelity}
        assert len(fidelity) == 10 and fidelity["decode.backend"].status == "substituted"
        assert fidelity["decode.bs"].requested.startswith("[1, 2, 4, 8") and fidelity["kv_cache_dtype"].effective
        assert launch.tokens_done == launch.tokens_total == 12
        # what a fleet alerts on: plan fields run as something else, by field; and how fast launches started
        seen = launch_metrics(srv)
        for field in ("attention_backend.prefill", "attention_backend.decode", "decode.backend"):
            assert seen[f'cgsvc_launch_substitutions_total{{dispatcher="local",field="{field}"}}'] == 1, seen
        assert seen['cgsvc_launch_substitutions_total{dispatcher="local",field="kv_cache_dtype"}'] == 0, seen
        assert seen['cgsvc_launch_ttft_seconds_count{dispatcher="local"}'] == 1, seen
        assert seen['cgsvc_launch_ttft_seconds_sum{dispatcher="local"}'] == pytest.approx(report["aggregate"][
            "ttft_ms"]["p50"] / 1000)
        assert seen['cgsvc_launch_tpot_seconds_sum{dispatcher="local"}'] == pytest.approx(report["aggregate"][
            "tpot_ms"]["p50"] / 1000)
        # the audit trail: the plan's record, CreateLaunch and every state change, linked by ids
        recs = [c.get_audit_record(n) for n in launch.audit_records]
        assert [r.method.rsplit("/", 1)[-1] for r in recs][:1] == ["CreateLaunch"]
        assert sum(r.method == "launch.state" for r in recs) >= 4
        # each is filed under its plan's model and GPU, as the CreateLaunch record is: `model = X`
        # finds how a model's launches went, not only that they were asked for
        assert {(r.model, r.gpu) for r in recs} == {("nvidia/Kimi-K2.6-NVFP4", "GB300")}, recs
        # each state's record is committed before the state is stored: the watcher that saw
        # SUCCEEDED can find its record
        ended = next(r for r in recs if r.outcome_message.startswith("RUNNING -> SUCCEEDED"))
        # and it says whether the plan ran as planned: an auditor reads it without the report
        assert ended.outcome_message == ("RUNNING -> SUCCEEDED: 3 of 10 plan fields substituted by the workers: "
                                         "attention_backend.prefill, attention_backend.decode, decode.backend "
                                         "(launches show has each one's reason)"), ended.outcome_message
        assert ended.time.ToDatetime() <= launch.update_time.ToDatetime(), (ended.time, launch.update_time)
        assert all(r.plan_id == launch.plan.split("/")[1] for r in recs)
        assert c.get_audit_record(launch.plan_audit_record).method.endswith("ResolvePlan")
        # every launch that used a rule, found by the rule: the CreateLaunch record carries its
        # plan's rules, and launches filter by them (through the plan, so older launches too)
        plan_rules = list(c.get_audit_record(launch.plan_audit_record).rule_ids)
        assert "breakable.mla" in plan_rules and list(recs[0].rule_ids) == plan_rules
        assert [x.name for x in c.list_launches('rule_id = "breakable.mla"').launches] == [launch.name]
        assert not c.list_launches('rule_id = "attention.cpu"').launches
        assert [x.name for x in c.list_launches('model = "nvidia/Kimi-K2.6-NVFP4" AND gpu = "GB300"').launches] == [
            launch.name]
        assert not c.list_launches('gpu = "H200"').launches
        assert (recs[0].model, recs[0].gpu) == ("nvidia/Kimi-K2.6-NVFP4", "GB300")  # the launch record says what ran
        used = c.list_audit_records('rule_id = "breakable.mla" AND method = "CreateLaunch"').records
        assert [r.name for r in used] == [recs[0].name]  # by the RPC's name, as the listings show it
        assert [p.name for p in c.list_plans('rule_id = "breakable.mla"').plans] == [launch.plan]
        assert c.verify_audit_log().ok
        logs = c.launch_logs(launch.name)
        assert {x.name for x in logs.logs} >= {"rank0.log", "rank3.log", "supervisor.log"}
    # The workers' own offline run on the same prompts generates the same tokens.
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"plan": report_plan(srv, launch.plan)}))
    out = tmp_path / "offline.json"
    subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "bench", "--model-path", ckpt, "--tp", "4",
                    "--plan", str(plan), "--input-len", "12", "--output-len", "6", "--requests", "2",
                    "--concurrency", "1", "--seed", "7", "--output", str(out)], check=True, cwd=ROOT, timeout=300)
    offline = json.loads(out.read_text())
    assert [r["output_tokens"] for r in offline["requests"]] == [r["output_tokens"] for r in report["requests"]]


def report_plan(srv: ServerProcess, name: str) -> dict[str, Any]:
    with Client(srv.address) as c:
        from cgsvc import codec

        return codec.plan_from_proto(c.get_plan(name)).to_dict()


def test_a_dead_rank_fails_the_launch_and_stops_the_group(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, LONG, spec=KIMI).metadata.name
        wait_tokens(c, name, 5)
        pgid = handle(srv, name)["pgid"]
        ranks = [p for p in session_members(pgid) if p != pgid]
        victim = max(ranks)
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        launch = wait_state(c, name, ("FAILED",), timeout=30)
        assert time.monotonic() - t0 < 10
        assert "exited with code -9" in launch.error and "rank" in launch.error
        assert no_processes_left(pgid)


def launch_metrics(srv: ServerProcess) -> dict[str, float]:
    """The launch and device series of the server's /metrics: 'name{labels}' -> value."""
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in srv.metrics_text().splitlines()
            if line.startswith(("cgsvc_launches_", "cgsvc_devices{", "cgsvc_launch_"))}


def test_cancel_stops_every_rank(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, LONG, spec=KIMI).metadata.name
        wait_tokens(c, name, 3)
        # what a fleet's dashboards read: launches by state, devices busy and free, launches ended
        running = launch_metrics(srv)
        assert running['cgsvc_launches_active{dispatcher="local",state="RUNNING"}'] == 1, running
        assert running['cgsvc_launches_active{dispatcher="local",state="PLACING"}'] == 0, running
        assert running['cgsvc_devices{dispatcher="local",status="busy"}'] == 4, running
        assert running['cgsvc_devices{dispatcher="local",status="free"}'] == 0, running
        assert running['cgsvc_launches_ended_total{dispatcher="local",state="CANCELLED"}'] == 0, running
        pgid = handle(srv, name)["pgid"]
        launch = c.cancel_launch(name)
        assert launch.state == "CANCELLED" and "cancelled by local" in launch.error
        assert no_processes_left(pgid)
        ended = launch_metrics(srv)
        assert ended['cgsvc_launches_ended_total{dispatcher="local",state="CANCELLED"}'] == 1, ended
        assert ended['cgsvc_launches_active{dispatcher="local",state="RUNNING"}'] == 0, ended
        assert ended['cgsvc_devices{dispatcher="local",status="free"}'] == 4, ended
        shown = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "show", name, "--server",
                                srv.address, "-o", "table"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        rows = dict(line.split(None, 1) for line in shown.stdout.splitlines() if line.split(None, 1)[0] in
                    ("workload", "progress"))
        done = c.get_launch(name).tokens_done
        assert 3 <= done < 400 and rows["progress"] == f"{done}/400 tokens", rows  # how far it got
        waited = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "wait", name, "--server",
                                 srv.address, "-o", "json"], capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert waited.returncode == 4, waited.stdout + waited.stderr  # ended, and not SUCCEEDED
        assert json.loads(waited.stdout)["launch"]["state"] == "CANCELLED" and "CANCELLED" in waited.stderr
        assert rows["workload"] == "1 request x 12 in / 400 out, concurrency 1, seed 3", rows
        # a cancelled group reports no fidelity: --explain gives the plan's side and says so
        why = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "show", name, "--explain",
                              "prefill.backend", "--server", srv.address, "-o", "table"],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert "decisions for prefill.backend:" in why.stdout and "breakable.mla" in why.stdout, why.stdout
        assert "what ran: not reported (CANCELLED" in why.stdout, why.stdout
        with pytest.raises(ServiceError) as e:
            c.cancel_launch(name)
        assert e.value.code == "FAILED_PRECONDITION"


def test_server_kill_9_and_restart_reattaches(srv: ServerProcess, ckpt: str) -> None:
    work = {**LONG, "output_len": 60}
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, work, spec=KIMI).metadata.name
        wait_tokens(c, name, 3)
    pgid = handle(srv, name)["pgid"]
    # Held still while the server is down: a restart slower than the group's last 57 tokens (a
    # loaded machine) found it ended and settled it instead of re-attaching (seen under -n 3).
    os.killpg(pgid, signal.SIGSTOP)
    try:
        srv.kill9()
        assert session_members(pgid), "the worker group must survive the server"
        srv.start()
    finally:
        os.killpg(pgid, signal.SIGCONT)
    assert any("re-attached" in line for line in srv.output + [srv.proc.stdout.readline()])  # type: ignore[union-attr]
    with Client(srv.address) as c:
        launch = wait_state(c, name, ("SUCCEEDED", "FAILED", "LOST"), timeout=180)
        assert launch.state == "SUCCEEDED", launch.error
        assert launch.tokens_done == 60
        assert c.verify_audit_log().ok
    assert no_processes_left(pgid)


def test_launch_wait_outlives_a_server_restart(srv: ServerProcess, ckpt: str, tmp_path: Path) -> None:
    """`launch --wait` in a deploy job failed with "UNAVAILABLE: Cancelling all calls" when the
    server restarted (an upgrade, a SIGTERM), though the launch ran on. It now says so on stderr
    and watches again; the restarted server re-attaches the group, and the wait ends with the
    launch (cancelled here, exit 4), not with the server's restart."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(KIMI))
    err = tmp_path / "wait.err"
    with open(err, "w") as stderr:
        waiting = subprocess.Popen([sys.executable, "-m", "cgsvc_client.cli", "launch", "--spec", str(spec),
                                    "--model-path", ckpt, "--input-len", "12", "--output-len", "4000", "--requests", "1",
                                    "--wait", "--server", srv.address, "-o", "json"],
                                   stdout=subprocess.PIPE, stderr=stderr, text=True, cwd=ROOT)
    try:
        with Client(srv.address) as c:
            deadline = time.monotonic() + 60
            while not c.list_launches().launches:
                assert time.monotonic() < deadline and waiting.poll() is None, err.read_text()
                time.sleep(0.1)
            name = c.list_launches().launches[0].name
            wait_tokens(c, name, 3)
        srv.stop()
        srv.start()  # the same port and data directory
        with Client(srv.address) as c:
            assert c.cancel_launch(name).state == "CANCELLED"
        out, _ = waiting.communicate(timeout=120)
    finally:
        waiting.kill()
    said = err.read_text()
    assert waiting.returncode == 4, said  # the launch ended other than SUCCEEDED: exit 4, not a failed wait
    assert json.loads(out)["launch"]["state"] == "CANCELLED", out
    assert f"{name}: UNAVAILABLE: " in said and "; watching again in 0.5 s" in said, said


def test_ctrl_c_during_launch_wait_stops_waiting_not_the_launch(srv: ServerProcess, ckpt: str, tmp_path: Path) -> None:
    """Ctrl-C in `launch --wait` printed a KeyboardInterrupt traceback and no launch name. It now
    stops waiting only: exit 130, the launch named with the commands that read and stop it, and
    (-o json) the launch as last seen on stdout; the launch runs on."""
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(KIMI))
    waiting = subprocess.Popen([sys.executable, "-m", "cgsvc_client.cli", "launch", "--spec", str(spec), "--model-path",
                                ckpt, "--input-len", "12", "--output-len", "4000", "--requests", "1", "--wait",
                                "--server", srv.address, "-o", "json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        with Client(srv.address) as c:
            deadline = time.monotonic() + 60
            while not c.list_launches().launches:
                assert time.monotonic() < deadline and waiting.poll() is None
                time.sleep(0.1)
            name = c.list_launches().launches[0].name
            wait_tokens(c, name, 3)
            waiting.send_signal(signal.SIGINT)
            out, err = waiting.communicate(timeout=30)
            assert waiting.returncode == 130, err
            assert "Traceback" not in err and f"stopped waiting: {name} goes on (RUNNING)" in err, err
            assert f"cgsvc-cli launches cancel {name}" in err and f"cgsvc-cli launches wait {name}" in err, err
            assert json.loads(out)["launch"]["name"] == name
            assert c.get_launch(name).state == "RUNNING"
            assert c.cancel_launch(name).state == "CANCELLED"
    finally:
        waiting.kill()


def test_server_restart_marks_a_vanished_group_lost(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, LONG, spec=KIMI).metadata.name
        wait_tokens(c, name, 2)
    pgid = handle(srv, name)["pgid"]
    srv.kill9()
    os.killpg(pgid, signal.SIGKILL)  # the machine "restarted": the group is gone, no report
    assert no_processes_left(pgid)
    srv.start()
    with Client(srv.address) as c:
        launch = wait_state(c, name, ("LOST", "FAILED"), timeout=30)
        assert launch.state == "LOST" and "no report" in launch.error


def test_admission_refuses_or_queues(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        first = c.create_launch(ckpt, {**LONG, "output_len": 30}, spec=KIMI).metadata.name
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, SHORT, spec=KIMI)
        assert e.value.code == "RESOURCE_EXHAUSTED" and "free" in e.value.message
        queued = c.create_launch(ckpt, SHORT, spec=KIMI, wait_for_resources=True).metadata
        assert queued.state == "PLACING"
        wait_state(c, first, ("SUCCEEDED",), timeout=180)
        assert wait_state(c, queued.name, ("SUCCEEDED",), timeout=180).state == "SUCCEEDED"
        too_big = {**KIMI, "hardware": {"gpu": "GB300", "gpu_count": 8}, "parallelism": {"tp": 8}}
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, SHORT, spec=too_big)
        assert e.value.code == "FAILED_PRECONDITION" and "needs 8 devices" in e.value.message


def reshaped(ckpt: Path, to: Path, **text: int) -> Path:
    """`to` holding ckpt's config.json with these text_config values changed (no weights: a
    launch refused on its config never reads them)."""
    config = json.loads((ckpt / "config.json").read_text())
    config["text_config"].update(text)
    to.mkdir(parents=True, exist_ok=True)
    (to / "config.json").write_text(json.dumps(config))
    return to


def test_bad_launches_start_nothing_and_are_audited(srv: ServerProcess, ckpt: str, tmp_path: Path) -> None:
    llama_ckpt = llama_dir(tmp_path / "llama")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"spec": {**KIMI, "overrides": {"attention_backend": "fa3"}, "hardware": {"gpu": "cpu"}}},
         "FAILED_PRECONDITION", ""),
        ({"plan": "plans/doesnotexist"}, "NOT_FOUND", ""),
        ({"spec": KIMI, "workload": {**SHORT, "output_len": 0}}, "INVALID_ARGUMENT", "workload.output_len"),
        ({"spec": KIMI, "workload": {**SHORT, "input_len": 200_000}}, "INVALID_ARGUMENT", "workload.input_len"),
        ({"spec": KIMI, "workload": {**SHORT, "requests": 2**31 - 1}}, "INVALID_ARGUMENT", "workload.requests"),
        ({"spec": KIMI, "model_path": str(llama_ckpt), "workload": {**SHORT, "output_len": 2**31 - 100}},
         "INVALID_ARGUMENT", "workload.input_len"),  # no context stated: a fixed bound, before any family check
        ({"spec": KIMI, "model_path": str(llama_ckpt)}, "FAILED_PRECONDITION", "model_path"),
        ({"spec": KIMI, "model_path": str(tmp_path / "nothing")}, "INVALID_ARGUMENT", "model_path"),
        ({"spec": KIMI, "dispatcher": "ray"}, "FAILED_PRECONDITION", "dispatcher"),
        # the plan's tp=4 cannot shard a checkpoint of 510 vocabulary rows: refused here, where the
        # ranks would have loaded it and failed one by one (ValueError) after holding 4 devices
        ({"spec": KIMI, "model_path": str(reshaped(Path(ckpt), tmp_path / "odd-vocab", vocab_size=510))},
         "FAILED_PRECONDITION", "model_path"),
        # a config.json and no weights: refused here, not by four ranks each failing to load
        ({"spec": KIMI, "model_path": str(reshaped(Path(ckpt), tmp_path / "no-weights"))}, "INVALID_ARGUMENT",
         "model_path"),
    ]
    with Client(srv.address) as c:
        for case, code, field in cases:
            kwargs: dict[str, Any] = {"spec": case.get("spec"), "plan": case.get("plan", ""),
                                      "dispatcher": case.get("dispatcher", "")}
            with pytest.raises(ServiceError) as e:
                c.create_launch(case.get("model_path", ckpt), case.get("workload", SHORT), **kwargs)
            assert e.value.code == code, (case, e.value.message)
            if "no-weights" in case.get("model_path", ""):
                assert "no *.safetensors weights in" in e.value.violations[0].description, e.value
            if "odd-vocab" in case.get("model_path", ""):
                assert "tp=4 (the plan's) does not divide the checkpoint's 510 vocabulary rows" in e.value.message
                # gcd(8 heads, 510 rows, 8 experts) = 2: the plans it could run
                assert e.value.violations[0].description.endswith("a plan of a tp that divides this one's: 1, 2")
            if field:
                assert field in [v.field for v in e.value.violations], e.value.violations
        assert list(c.list_launches().launches) == []
        refused = c.list_audit_records('method = "/cgsvc.v1.LaunchService/CreateLaunch"').records
        assert len(refused) == len(cases) and all(r.outcome_code != 0 for r in refused)
    assert not any((srv.data_dir / "launches").glob("*")) if (srv.data_dir / "launches").exists() else True


def test_a_bad_launch_names_every_problem_at_once_and_the_dispatcher_reads_in_any_case(
        srv: ServerProcess, ckpt: str) -> None:
    """Regression: a CreateLaunch with a bad workload answered only the workload's problems, and
    its spec's came one retry later; `dispatcher: "Ray"` was "not configured on this server"
    (FAILED_PRECONDITION) and a misspelt one too, where a closed set reads any case and a value
    outside it is INVALID_ARGUMENT with the nearest. Experiments read the dispatcher the same way."""
    no_gpu = {"model": KIMI["model"], "parallelism": {"tp": 4}}
    with Client(srv.address) as c:
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, {**SHORT, "input_len": 0}, spec=no_gpu, dispatcher="Rya")
        assert e.value.code == "INVALID_ARGUMENT", e.value
        said = {v.field: v.description for v in e.value.violations}
        assert set(said) == {"workload.input_len", "hardware.gpu", "dispatcher"}, said
        assert said["dispatcher"] == "unknown value 'Rya'; did you mean 'ray'? valid: local, ray", said
        would = c.create_launch(ckpt, SHORT, spec=KIMI, dispatcher="LOCAL", validate_only=True).metadata
        assert would.dispatcher == "local" and "local devices free now" in would.placement, would
        one = c.create_launch(ckpt, SHORT, spec={**no_gpu, "hardware": {"gpu": "cpu"}, "parallelism": {"tp": 1}},
                              validate_only=True).metadata
        said_one = c.get_audit_record(one.audit_records[0]).outcome_message
        assert " on 1 local rank; nothing was started" in said_one, said_one  # not "1 local ranks"
        with pytest.raises(ServiceError) as e:  # known, in any case, but not configured here
            c.create_launch(ckpt, SHORT, spec=KIMI, dispatcher="RAY")
        assert e.value.code == "FAILED_PRECONDITION" and "dispatcher 'ray' is not configured" in e.value.message
        plan = c.resolve_proto(KIMI).name
        with pytest.raises(ServiceError) as e:
            c.create_experiment([plan, plan], ckpt, SHORT, repeats=1, dispatcher="lcoal")
        assert e.value.code == "INVALID_ARGUMENT" and e.value.violations[0].field == "dispatcher", e.value
        assert "did you mean 'local'?" in e.value.violations[0].description
        records = c.list_audit_records('method = "CreateLaunch"').records
        assert [r.outcome_code for r in records] == [CODE_NUMBERS["INVALID_ARGUMENT"], 0, 0,
                                                     CODE_NUMBERS["FAILED_PRECONDITION"]], records
        assert list(c.list_launches().launches) == []


def test_cli_launch_wait_and_launches_commands(srv: ServerProcess, ckpt: str) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args, "--server", srv.address],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)

    started = cli("launch", "--spec", str(ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"), "--model-path", ckpt,
                  "--input-len", "8", "--output-len", "4", "--requests", "2", "-o", "json")
    assert started.returncode == 0, started.stderr  # answered at once; waited for apart, as a script does
    proc = cli("launches", "wait", json.loads(started.stdout)["launch"]["name"].split("/")[1], "-o", "json")
    assert proc.returncode == 0, proc.stderr
    launch = json.loads(proc.stdout)["launch"]
    assert launch["state"] == "SUCCEEDED" and "SUCCEEDED" in proc.stderr  # the progress lines
    assert launch["report"]["worker"]["status"] == "ok"
    listed = json.loads(cli("launches", "list", "--filter", 'state = "SUCCEEDED"', "-o", "json").stdout)
    assert [x["name"] for x in listed["launches"]] == [launch["name"]]
    shown = cli("launches", "show", launch["name"], "-o", "table").stdout
    assert "requested full -> effective static_eager" in shown
    lines = {line.split("  ", 1)[0]: line for line in shown.splitlines()}
    assert lines["workload"].endswith("2 requests x 8 in / 4 out, concurrency 1, seed 0"), lines
    assert "progress" not in lines  # a launch that succeeded gives its throughput instead
    # not honoured: attention x2 and decode.backend (a CPU), prefill sizes (prefill disabled by the plan)
    assert lines["plan fidelity"].endswith("5 of 10 plan fields honoured as planned, 3 substituted, 2 not applicable "
                                            "(nothing to act on)")
    assert 'decode.backend: "full" -> "static_eager" (CUDA graphs need a CUDA device' in shown
    assert any(k == "not applicable" and "prefill.max_num_tokens" in v for k, v in
               ((line.split("  ", 1)[0], line) for line in shown.splitlines()))
    logs = cli("launches", "logs", launch["name"], "--rank", "2", "-o", "json")
    assert [x["name"] for x in json.loads(logs.stdout)["logs"]] == ["rank2.log"]
    for args, field, words in ((["--rank", "4"], "rank", "ranks 0..3"), (["--rank", "-2"], "rank", "ranks 0..3"),
                               (["--tail", "-1"], "tail_lines", "0 (the whole log) or more")):
        bad = cli("launches", "logs", launch["name"], *args, "-o", "json")  # a TP4 launch has no rank 4
        err = json.loads(bad.stdout)["error"]
        assert bad.returncode == 2 and err["field_violations"][0]["field"] == field and words in err["message"], err
    # on SQLite the one server supervises every launch: it is the only replica, with no lease to lapse
    instance = (srv.data_dir / "instance").read_text().strip()
    assert launch["owner"] == f"replicas/{instance}" and lines["supervised by"].endswith(launch["owner"])
    replicas = json.loads(cli("replicas", "list", "-o", "json").stdout)
    assert [(r["name"], r["host"], r["address"], r["answering"], r["lapsed"], r["active_launches"])
            for r in replicas["replicas"]] == [(launch["owner"], HOST, srv.address, True, False, 0)]
    assert replicas["lease_seconds"] == 30
    table = cli("replicas", "list", "-o", "table").stdout
    assert launch["owner"] in table and srv.address in table and "held" in table and "lapses after 30 s" in table


def test_watch_streams_progress(srv: ServerProcess, ckpt: str) -> None:
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, {**LONG, "output_len": 40}, spec=KIMI).metadata.name
        kinds: list[str] = []
        done: list[int] = []

        def watch() -> None:
            for e in c.watch_launch(name):
                kinds.append(e.kind)
                done.append(e.launch.tokens_done)

        t = threading.Thread(target=watch)
        t.start()
        t.join(180)
        assert "progress" in kinds and done == sorted(done) and done[-1] == 40


def test_logs_follow_streams_each_log_whole_until_the_launch_ends(srv: ServerProcess, ckpt: str) -> None:
    """`launches logs --follow`: the pieces a follower prints join into each log exactly, and it
    ends by itself, exit 0, when the launch does."""
    with Client(srv.address) as c:
        name = c.create_launch(ckpt, {**LONG, "output_len": 60}, spec=KIMI).metadata.name
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, "--follow",
                               "--interval", "0.2", "--tail", "0", "--server", srv.address, "-o", "json"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{name} ended SUCCEEDED" in proc.stderr
        pieces = [json.loads(line) for line in proc.stdout.splitlines()]
        whole = {x.name: x.text for x in c.launch_logs(name).logs}
        followed: dict[str, str] = {}
        for piece in pieces:
            followed[piece["log"]] = followed.get(piece["log"], "") + piece["text"]
        assert followed == {k: v for k, v in whole.items() if v}
        assert {"rank0.log", "rank1.log", "rank2.log", "rank3.log"} <= set(followed)
        assert "rank 0: captured in" in followed["rank0.log"]
        assert "60 of 60 tokens generated, 1 of 1 requests done, " in followed["rank0.log"]
        assert "prompt tokens prefilled (TTFT median so far" in followed["rank0.log"]
        for rank in (1, 2, 3):  # every rank's log says it finished, not only rank 0's
            assert f"rank {rank}: 60 of 60 tokens generated, 1 of 1 requests done" in followed[f"rank{rank}.log"]
        assert len(pieces) > len(followed), "some log was followed as it grew, not only read at the end"
        ended = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, "-f", "--tail",
                                "2", "--server", srv.address, "-o", "table"],
                               capture_output=True, text=True, timeout=60, cwd=ROOT)  # an ended launch: tail, done
        assert ended.returncode == 0 and f"{name} ended SUCCEEDED" in ended.stderr
        assert ended.stdout.startswith("==> rank0.log <==\n") and "==> rank3.log <==" in ended.stdout
        with pytest.raises(ServiceError) as e:
            c.launch_logs(name, after_offsets={"rank0.log": -1})
        assert e.value.code == "INVALID_ARGUMENT" and "after_offsets" in str(e.value.to_dict())


def test_validate_only_checks_everything_a_launch_would_and_starts_nothing(srv: ServerProcess, ckpt: str,
                                                                          tmp_path: Path) -> None:
    """CreateLaunch with validate_only (`launch --validate-only`): the same checks, the devices it
    would get now, one audited answer; no launch, no plan, no process."""
    with Client(srv.address) as c:
        before = c.get_checkpoint().tree_size
        op = c.create_launch(ckpt, SHORT, spec=KIMI, validate_only=True)
        would = op.metadata
        assert (op.name, op.done, would.name, would.state, would.plan) == ("", True, "", "", "")
        assert would.tp == 4 and list(would.devices) == ["cpu0", "cpu1", "cpu2", "cpu3"]
        assert would.placement.startswith("validate_only: 4 of 4 local devices free now")
        assert would.model_path == os.path.abspath(ckpt) and would.workload.output_len == SHORT["output_len"]
        records = c.list_audit_records(f"sequence > {before}").records
        assert [(r.method.rsplit("/", 1)[1], r.outcome_code, r.plan_id, r.launch_id) for r in records] == [
            ("ResolvePlan", 0, "", ""), ("CreateLaunch", 0, "", "")]
        assert records[1].outcome_message.startswith("validate_only: would launch") and records[1].rule_ids
        assert list(would.audit_records) == [records[1].name] and would.plan_audit_record == records[0].name
        stored = c.resolve_proto(KIMI)  # a stored plan validates against the checkpoint too
        assert c.create_launch(ckpt, SHORT, plan=stored.name, validate_only=True).metadata.plan == stored.name
        # what a launch would be refused for, it is refused for, audited alike
        for kwargs, code in (({"spec": KIMI, "workload": {**SHORT, "requests": 0}}, "INVALID_ARGUMENT"),
                             ({"spec": KIMI, "model_path": str(llama_dir(tmp_path / "llama"))}, "FAILED_PRECONDITION"),
                             ({"spec": {**KIMI, "parallelism": {"tp": 8}, "hardware": {"gpu": "GB300", "gpu_count": 8}}},
                              "FAILED_PRECONDITION")):
            args = {"model_path": ckpt, "workload": SHORT, **kwargs}
            with pytest.raises(ServiceError) as e:
                c.create_launch(args.pop("model_path"), args.pop("workload"), validate_only=True, **args)
            assert e.value.code == code, (kwargs, e.value.message)
        running = c.create_launch(ckpt, {**LONG, "output_len": 30}, spec=KIMI).metadata.name
        with pytest.raises(ServiceError) as e:  # the devices are busy: as a launch would be, unless it would queue
            c.create_launch(ckpt, SHORT, spec=KIMI, validate_only=True)
        assert e.value.code == "RESOURCE_EXHAUSTED"
        queued = c.create_launch(ckpt, SHORT, spec=KIMI, validate_only=True, wait_for_resources=True).metadata
        assert list(queued.devices) == [] and "would wait in PLACING" in queued.placement
        assert [x.name for x in c.list_launches().launches] == [running]  # none of the checks made a launch
        wait_state(c, running, ("SUCCEEDED",), timeout=180)
    out = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launch", "--validate-only", "--spec",
                          str(ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"), "--model-path", ckpt,
                          "--server", srv.address, "-o", "table"], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.startswith("valid: would launch") and "nothing was started" in out.stdout


def cli(*args: str, server: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args, "--server", server], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)


def test_launches_summary_gives_each_group_its_count_and_median_latencies(srv: ServerProcess, ckpt: str) -> None:
    """`launches summary --by prefill_effective,decode_effective`: what the launches that ran each
    way measured — counts, and the medians of their TTFT and TPOT p50 and throughput."""
    with Client(srv.address) as c:
        names = [c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name]
        wait_state(c, names[0], ("SUCCEEDED",), timeout=180)
        names.append(c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name)
        done = [wait_state(c, n, ("SUCCEEDED",), timeout=180) for n in names]
    out = cli("launches", "summary", "--by", "prefill_effective,decode_effective", "-o", "json",
              server=srv.address)
    assert out.returncode == 0, out.stdout + out.stderr
    summary = json.loads(out.stdout)["summary"]
    (group,) = summary["groups"]
    assert (group["prefill_effective"], group["decode_effective"]) == ("disabled", "static_eager")
    assert (group["launches"], group["succeeded"]) == (2, 2) and summary["launches"] == 2
    assert group["ttft_ms_p50_median"] == pytest.approx(statistics.median(x.report.ttft_ms_p50 for x in done))
    assert group["tpot_ms_p50_median"] == pytest.approx(statistics.median(x.report.tpot_ms_p50 for x in done))
    table = cli("launches", "summary", "--by", "state", "-o", "table", server=srv.address).stdout
    assert "SUCCEEDED" in table and "TTFT p50 ms" in table and "2 launches in 1 group;" in table
    # what a CPU ran other than planned, as the launch filter's `substituted` names the fields
    (group,) = json.loads(cli("launches", "summary", "--by", "substituted", "-o", "json",
                              server=srv.address).stdout)["summary"]["groups"]
    assert group["substituted"] == "attention_backend.prefill,attention_backend.decode,decode.backend", group
    (group,) = json.loads(cli("launches", "summary", "--by", "day", "-o", "json",  # launches a UTC day
                              server=srv.address).stdout)["summary"]["groups"]
    assert group == {**group, "day": done[0].create_time.ToJsonString()[:10], "launches": 2}, group


def test_a_launch_that_generated_no_second_token_reports_no_tpot(srv: ServerProcess, ckpt: str) -> None:
    """--output-len 1 times no token after the first: `launches show` said "TPOT ms p50 0.0 p99
    0.0", `launches summary` took that 0 into its median and `launches diff` compared it. TPOT is
    now absent from such a report, and every view says so or leaves it out."""
    since = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - 1))
    with Client(srv.address) as c:
        one = c.create_launch(ckpt, {**SHORT, "output_len": 1}, spec=KIMI).metadata.name
        first_only = wait_state(c, one, ("SUCCEEDED",), timeout=180)
        two = c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name
        timed = wait_state(c, two, ("SUCCEEDED",), timeout=180)
    assert not first_only.report.HasField("tpot_ms_p50") and first_only.report.ttft_ms_p50 > 0
    # prompt tokens are counted as they are prefilled, beside the tokens generated
    assert (timed.prompt_tokens_done, timed.prompt_tokens_total) == (24, 24) and timed.tokens_done == 12
    assert timed.report.HasField("tpot_ms_p50") and timed.report.tpot_ms_p50 > 0
    shown = cli("launches", "show", one, "-o", "table", server=srv.address).stdout
    assert "TPOT ms         - (no request generated a second token)" in shown, shown
    # what the workers noted beside the plan is shown too (it was only in -o json's report)
    assert "note            multimodal checkpoint: the vision tower is out of scope" in shown, shown
    summary = json.loads(cli("launches", "summary", "--by", "state", "--since", since, "-o", "json",
                             server=srv.address).stdout)["summary"]
    (group,) = summary["groups"]
    assert (group["state"], group["launches"]) == ("SUCCEEDED", 2)
    assert group["tpot_ms_p50_median"] == pytest.approx(timed.report.tpot_ms_p50)  # not the median of it and 0
    diff = json.loads(cli("launches", "diff", one, two, "-o", "json", server=srv.address).stdout)["diff"]
    tpot = {m["metric"]: m for m in diff["measured"]}["TPOT p50 ms"]
    assert tpot["a"] is None and tpot["b"] == round(timed.report.tpot_ms_p50, 3) and tpot["b_minus_a"] is None
    table = cli("launches", "diff", one, two, "-o", "table", server=srv.address).stdout
    (row,) = [line.split()[3:] for line in table.splitlines() if line.startswith("TPOT p50 ms")]
    assert row == ["-", f"{tpot['b']:g}", "-", "-"], table


def test_a_launch_runs_the_engine_settings_it_asks_for_and_says_what_ran(srv: ServerProcess, ckpt: str,
                                                                         tmp_path: Path) -> None:
    """The workers' dtype, KV cache budget and CPU decode mode were `cgsvc-worker` flags a launch
    could not pass (auto decided, and a CPU decode substitution named a flag no launch has).
    `launch --dtype --kv-cache-mb --cpu-decode` set them (closed sets in any case, kept in one
    spelling); the launch keeps what was asked, its report says what ran and why, and `launches
    show` and `launches diff` show both."""
    # TP2: each rank compiles its decode sizes (trace), and two ranks do it in half the CPU of four
    spec = str(tmp_path / "kimi-tp2.json")
    Path(spec).write_text(json.dumps({**KIMI, "hardware": {"gpu": "GB300", "gpu_count": 2}, "parallelism": {"tp": 2}}))
    workload = ("--input-len", "8", "--output-len", "3", "--requests", "1")
    proc = cli("launch", "--spec", spec, "--model-path", ckpt, *workload, "--dtype", "BFloat16", "--kv-cache-mb", "8",
               "--cpu-decode", "Trace", "--label", "team=infra", "--label", "ticket=inc-42", "--wait", "-o", "json",
               server=srv.address)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    asked = json.loads(proc.stdout)["launch"]
    assert asked["labels"] == {"team": "infra", "ticket": "inc-42"}, asked  # the orchestrator's own names for it
    assert asked["engine"] == {"dtype": "bfloat16", "kv_cache_mb": 8.0, "cpu_decode": "trace"}, asked["engine"]
    with Client(srv.address) as c:  # the audit log says what was asked, beside the plan
        created = c.get_audit_record(asked["audit_records"][0])
        assert created.method.endswith("CreateLaunch") and created.outcome_message.endswith(
            "on 2 local ranks (dtype bfloat16, KV cache 8 MiB a rank, CPU decode trace), labels team=infra, "
            "ticket=inc-42"), created.outcome_message  # the log holds every label a launch had
    report = asked["report"]
    assert (report["dtype"], report["kv_cache_budget_bytes"]) == ("bfloat16", 8 << 20), report
    assert report["dtype_reason"] == "asked for: --dtype bfloat16" and "8" in report["kv_cache_budget_reason"]
    assert report["decode_effective"] == "static_compiled", report  # trace: each planned size compiled
    # ... at capture, the one size a batch of one reaches, counted as the bar counts it
    assert (asked["capture_done"], asked["capture_total"]) == (1, 1), asked
    worker = report["worker"]
    assert worker["dtype"] == "bfloat16" and worker["kv_cache"]["budget_bytes"] == 8 << 20
    plain = cli("launch", "--spec", spec, "--model-path", ckpt, *workload, "--request-id", "engine-once", "--wait",
                "-o", "json", server=srv.address)
    assert plain.returncode == 0, plain.stdout + plain.stderr
    auto = json.loads(plain.stdout)["launch"]
    assert auto["engine"] == {"dtype": "auto", "kv_cache_mb": 0.0, "cpu_decode": "eager"}, auto["engine"]
    assert "capture_total" not in auto  # eager on a CPU: nothing to capture or compile
    assert (auto["report"]["dtype"], auto["report"]["dtype_reason"]) == (
        "float32", "auto: float32 on cpu (the reference numerics)")
    # the eager substitution names the setting a launch has now, not a worker's flag alone
    decode = {f["field"]: f for f in auto["report"]["plan_fidelity"]}["decode.backend"]
    assert "cpu_decode trace|inductor" in decode["reason"] and "launch --cpu-decode" in decode["reason"], decode
    shown = cli("launches", "show", asked["name"], "-o", "table", server=srv.address).stdout
    lines = {line.split("  ", 1)[0]: line for line in shown.splitlines()}
    assert lines["engine"].endswith("dtype bfloat16, KV cache 8 MiB a rank, CPU decode trace (as asked)"), shown
    assert lines["dtype"].endswith("bfloat16 (asked for: --dtype bfloat16)"), shown
    assert "8 MiB a rank (" in lines["KV cache"], shown
    # why it ran decode as it did, in one answer: the rules that planned the field, then what the workers did
    why = json.loads(cli("launches", "show", auto["name"], "--explain", "Decode.Backend", "-o", "json",
                         server=srv.address).stdout)["explain"]
    assert (why["field"], why["launch"], why["plan"]) == ("decode.backend", auto["name"], auto["plan"]), why
    assert why["decisions"] and all(d["field"] == "decode.backend" for d in why["decisions"]), why["decisions"]
    assert why["decisions"][-1]["after"] == "full", why["decisions"]  # what the plan asked for ...
    assert (why["ran"]["status"], why["ran"]["effective"]) == ("substituted", "static_eager"), why["ran"]  # ... ran
    assert why["ran"]["reason"] == decode["reason"], why["ran"]
    told = cli("launches", "show", auto["name"], "--explain", "decode.backend", "-o", "table", server=srv.address)
    assert told.returncode == 0 and "decisions for decode.backend:" in told.stdout, told.stdout
    assert 'what ran: substituted: "full" -> "static_eager" (' in told.stdout, told.stdout
    typo = cli("launches", "show", auto["name"], "--explain", "decode.bakend", "-o", "json", server=srv.address)
    assert typo.returncode == 2 and "decode.backend" in typo.stdout, typo.stdout  # named, with the nearest
    auto_shown = cli("launches", "show", auto["name"], "-o", "table", server=srv.address).stdout
    assert "engine          dtype auto, KV cache auto, CPU decode eager (as asked)" in auto_shown, auto_shown
    diff = json.loads(cli("launches", "diff", auto["name"], asked["name"], "-o", "json",
                          server=srv.address).stdout)["diff"]
    ran = {r["field"]: r for r in diff["ran"]}
    assert (ran["dtype"]["a"], ran["dtype"]["b"]) == ("float32", "bfloat16"), diff["ran"]
    assert (ran["engine (asked)"]["a"], ran["engine (asked)"]["b"]) == ("dtype auto, KV cache auto, CPU decode eager",
                                                        "dtype bfloat16, KV cache 8 MiB a rank, CPU decode trace")
    for dtype, expected in (("bfloat16", asked["name"]), ("FLOAT32", auto["name"])):  # the dtype that ran
        listed = json.loads(cli("launches", "list", "--filter", f'dtype = "{dtype}"', "-o", "json",
                                server=srv.address).stdout)
        assert [x["name"] for x in listed["launches"]] == [expected], (dtype, listed)
    for launch in (auto, asked):  # what each measured, compared as a number: at least its own TTFT, not above it
        ttft = launch["report"]["ttft_ms_p50"]
        for text, found in ((f"ttft_ms_p50 >= {ttft!r}", True), (f"ttft_ms_p50 > {ttft!r}", False)):
            listed = json.loads(cli("launches", "list", "--filter", text, "-o", "json", server=srv.address).stdout)
            assert (launch["name"] in [x["name"] for x in listed["launches"]]) is found, (text, listed)
    slowest = json.loads(cli("launches", "list", "--filter", 'state = "SUCCEEDED"', "--order-by", "ttft_ms_p50 desc",
                             "--all", "-o", "json", server=srv.address).stdout)["launches"]
    ttfts = [x["report"]["ttft_ms_p50"] for x in slowest]  # the slowest start first
    assert len(ttfts) >= 2 and ttfts == sorted(ttfts, reverse=True), ttfts
    both = cli("launches", "list", "--order-by", "ttft_ms_p50", "--newest-first", "-o", "json", server=srv.address)
    assert both.returncode == 2 and "not allowed with" in both.stdout, both.stdout
    wrong = cli("launches", "list", "--order-by", "ttft desc", "-o", "json", server=srv.address)
    assert wrong.returncode == 2 and '"field": "order_by"' in wrong.stdout and "ttft_ms_p50" in wrong.stdout, wrong.stdout
    # `launches rerun`: the same stored plan, checkpoint, workload, dispatcher and engine settings again
    again = cli("launches", "rerun", asked["name"].split("/")[1], "--wait", "--request-id", "rerun-once", "-o", "json",
                server=srv.address)
    assert again.returncode == 0, again.stdout + again.stderr
    rerun = json.loads(again.stdout)["launch"]
    assert rerun["name"] != asked["name"] and rerun["state"] == "SUCCEEDED", rerun
    assert {k: rerun[k] for k in ("plan", "model_path", "workload", "dispatcher", "engine", "tp")} == {
        k: asked[k] for k in ("plan", "model_path", "workload", "dispatcher", "engine", "tp")}, (rerun, asked)
    assert f"launches diff {asked['name']} {rerun['name']}" in again.stderr  # the next command, named
    # ... done by the server from the stored launch, so the rerun is a fact it records, not a claim
    assert rerun["rerun_of"] == asked["name"], rerun
    with Client(srv.address) as c:
        made = c.get_audit_record(rerun["audit_records"][0])
        assert made.outcome_message.endswith(f"rerun of {asked['name']}, labels team=infra, ticket=inc-42"), made
        assert made.launch_id == rerun["name"].split("/")[1], made
        for name in (asked["name"], asked["name"].split("/")[1]):  # every rerun of a launch, by name or ID
            found = c.list_launches(filter=f'rerun_of = "{name}"').launches
            assert [x.name for x in found] == [rerun["name"]], (name, found)
        assert [x.name for x in c.list_launches(filter='rerun_of = ""').launches if x.name == rerun["name"]] == []
        # a retry of the rerun is that rerun; the same launch asked for in full is another request
        assert c.rerun_launch(asked["name"], request_id="rerun-once").metadata.name == rerun["name"]
        with pytest.raises(ServiceError) as e:
            c.create_launch(asked["model_path"], asked["workload"], plan=asked["plan"], dispatcher="local",
                            engine=asked["engine"], request_id="rerun-once")
        assert [v.field for v in e.value.violations] == ["request_id"], e.value
        # a rerun runs what the launch ran: anything else asked beside it is refused by name
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, SHORT, rerun_of=asked["name"], dispatcher="local", engine={"dtype": "float32"})
        said = {v.field: v.description for v in e.value.violations}
        assert e.value.code == "INVALID_ARGUMENT" and set(said) == {
            "model_path", "workload", "dispatcher", "engine"}, said
        assert f"launch --plan {asked['plan']}" in said["workload"], said
        with pytest.raises(ServiceError) as e:
            c.create_launch("", {}, rerun_of="plans/" + asked["plan"].split("/")[1])
        assert e.value.code == "INVALID_ARGUMENT" and [v.field for v in e.value.violations] == ["rerun_of"], e.value
    # labels: the orchestrator's names for a launch, kept by its reruns, and filtered on
    assert rerun["labels"] == asked["labels"], rerun
    with Client(srv.address) as c:  # ... unless it is given its own: they name it, they are not what ran
        relabelled = c.rerun_launch(asked["name"], validate_only=True, labels={"purpose": "repro"}).metadata
        assert dict(relabelled.labels) == {"purpose": "repro"}, relabelled
        team = c.list_launches(filter='labels.team = "infra" AND labels.ticket = "inc-42"').launches
        assert [x.name for x in team] == [asked["name"], rerun["name"]], team
        assert asked["name"] not in [x.name for x in c.list_launches(filter='labels.team != "infra"').launches]
        assert c.list_launches(filter='labels.team = "infr"').launches == []  # whole values, not patterns
        teamed = [x.name for x in c.list_launches(filter="labels.team:*", page_size=1000).launches]  # has the key
        assert asked["name"] in teamed and auto["name"] not in teamed, teamed
    by_team = json.loads(cli("launches", "summary", "--by", "labels.team", "-o", "json", server=srv.address).stdout)
    teams = {g["labels.team"]: g["launches"] for g in by_team["summary"]["groups"]}
    assert teams["infra"] == 2 and teams["-"] == by_team["summary"]["launches"] - 2, by_team  # unlabelled: "-"
    with Client(srv.address) as c:
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, SHORT, spec=KIMI, labels={"Team": "x", "ok": "a b", "": "y"}, validate_only=True)
        said = {v.field: v.description for v in e.value.violations}
        assert e.value.code == "INVALID_ARGUMENT" and set(said) == {"labels.Team", "labels.ok", "labels"}, said
        assert "lower-case letter" in said["labels.Team"], said
    # -L KEYS: labels as columns of the list's table (kubectl's -L), "-" where a launch has none
    listed = cli("launches", "list", "-L", "team,ticket", "--all", "-o", "table", server=srv.address).stdout
    header, *rows = [line.split() for line in listed.splitlines() if line.strip() and not line.startswith("-")]
    assert header[-2:] == ["team", "ticket"], listed
    by_name = {row[0]: row[-2:] for row in rows if row[0].startswith("launches/")}
    assert by_name[asked["name"]] == ["infra", "inc-42"] and by_name[rerun["name"]] == ["infra", "inc-42"], listed
    assert by_name[auto["name"]] == ["-", "-"], listed  # a launch without them
    measured = {row[0]: row[6] for row in rows if row[0].startswith("launches/")}  # the p50s, as the filter reads them
    assert measured[asked["name"]] == f"{asked['report']['ttft_ms_p50']:.1f}/{asked['report']['tpot_ms_p50']:.1f}", listed
    wrong = cli("launches", "list", "-L", "Team", "-o", "json", server=srv.address)
    assert wrong.returncode == 2 and '"field": "label-columns"' in wrong.stdout, wrong.stdout
    rerun_shown = cli("launches", "show", rerun["name"], "-o", "table", server=srv.address).stdout
    assert "labels          team=infra, ticket=inc-42" in rerun_shown, rerun_shown
    assert f"rerun of        {asked['name']}" in rerun_shown, rerun_shown
    # the diff it names: the same plan, run the same way (devices aside), so --exit-code answers 0
    compared = cli("launches", "diff", asked["name"], rerun["name"], "--exit-code", "-o", "table", server=srv.address)
    assert compared.returncode == 0 and f"; rerun of {asked['name']})" in compared.stdout, compared.stdout
    checked = cli("launches", "rerun", auto["name"], "--validate-only", "-o", "json", server=srv.address)
    assert checked.returncode == 0 and json.loads(checked.stdout)["validated"]["plan"] == auto["plan"], checked.stdout
    missing = cli("launches", "rerun", "launches/nope", "-o", "json", server=srv.address)
    assert missing.returncode != 0 and "NOT_FOUND" in missing.stdout, missing.stdout + missing.stderr
    # `launches label`: labels change after the fact (a launch found to be the baseline, say), one
    # key at a time, the others kept, audited with what changed, in any state
    relabel = cli("launches", "label", rerun["name"], "purpose=baseline", "ticket-", "-o", "json", server=srv.address)
    assert relabel.returncode == 0, relabel.stdout + relabel.stderr
    got = json.loads(relabel.stdout)["launch"]
    assert got["state"] == "SUCCEEDED" and got["labels"] == {"team": "infra", "purpose": "baseline"}, got
    with Client(srv.address) as c:
        rec = c.get_audit_record(got["audit_records"][-1])
        assert (rec.method, rec.principal, rec.launch_id) == (
            "/cgsvc.v1.LaunchService/UpdateLaunch", "local", rerun["name"].split("/")[1]), rec
        assert rec.outcome_message == "labels: purpose=baseline added, ticket=inc-42 removed", rec.outcome_message
        assert [x.name for x in c.list_launches(filter='labels.purpose = "baseline"').launches] == [rerun["name"]]
        assert [x.name for x in c.list_launches(filter='labels.ticket = "inc-42"').launches] == [asked["name"]]
        from cgsvc.v1 import launch_pb2  # a raw request: what the CLI cannot send
        for mask, field in ((["state"], "update_mask"), (["labels.a"], "launch.labels.b")):
            with pytest.raises(ServiceError) as e:
                c.call(c.launches.UpdateLaunch, launch_pb2.UpdateLaunchRequest(
                    launch=launch_pb2.Launch(name=rerun["name"], labels={"b": "1"}), update_mask={"paths": mask}))
            assert e.value.code == "INVALID_ARGUMENT" and [v.field for v in e.value.violations] == [field], e.value
        with pytest.raises(ServiceError) as e:
            c.label_launch("launches/nope", {"a": "1"})
        assert e.value.code == "NOT_FOUND", e.value
        refused = c.list_audit_records('method = "UpdateLaunch" AND outcome != "OK"').records
        assert [r.outcome_code for r in refused] == [3, 3, 5], refused  # every refusal audited too
        assert dict(c.get_launch(rerun["name"]).labels) == got["labels"]  # nothing changed by them
    bad = cli("launches", "label", rerun["name"], "team", "-o", "json", server=srv.address)
    assert bad.returncode == 2 and '"field": "changes"' in bad.stdout, bad.stdout
    # bad settings: each named on its field, with what would do, in one answer; nothing started
    with Client(srv.address) as c:
        before = len(c.list_launches(page_size=100).launches)
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, SHORT, spec=KIMI, engine={"dtype": "fp64", "kv_cache_mb": -1, "cpu_decode": "graph"})
        said = {v.field: v.description for v in e.value.violations}
        assert e.value.code == "INVALID_ARGUMENT" and set(said) == {
            "engine.dtype", "engine.kv_cache_mb", "engine.cpu_decode"}, said
        assert "valid: auto, float32, bfloat16, float16" in said["engine.dtype"], said
        assert "0 (auto) or more than 0" in said["engine.kv_cache_mb"] and "eager, trace, inductor" in said[
            "engine.cpu_decode"], said
        for value in (float("nan"), float("inf"), 2.0**40):
            with pytest.raises(ServiceError) as e:
                c.create_launch(ckpt, SHORT, spec=KIMI, engine={"kv_cache_mb": value})
            assert [v.field for v in e.value.violations] == ["engine.kv_cache_mb"], (value, e.value)
        # a budget too small for the cache's two pages on this checkpoint is refused here, not by
        # every rank after loading (the tiny checkpoint: 4 layers of 96 values a token)
        for validate_only in (True, False):
            with pytest.raises(ServiceError) as e:
                c.create_launch(ckpt, SHORT, spec=KIMI, engine={"kv_cache_mb": 0.001, "dtype": "float32"},
                                validate_only=validate_only)
            (small,) = e.value.violations
            assert small.field == "engine.kv_cache_mb" and "under the 2 KV cache pages a rank needs" in small.description
            assert "at least 0.0118 MiB (12288 bytes: 2 x 16 tokens x 4 layers x 96 bytes" in small.description, small
        for given, kept in (("FLOAT16", "float16"), ("half", "float16"), ("BF16", "bfloat16"), ("float", "float32")):
            would = c.create_launch(ckpt, SHORT, spec=KIMI, engine={"dtype": given}, validate_only=True).metadata
            assert (would.engine.dtype, would.engine.cpu_decode) == (kept, "eager"), (given, would.engine)
        # a request_id is one request: the same request again is the launch it made (the default
        # settings hash as before there were any), and with other engine settings it is refused
        same = json.loads(Path(spec).read_text())
        again = {"input_len": 8, "output_len": 3, "requests": 1, "concurrency": 1, "seed": 0}
        assert c.create_launch(ckpt, again, spec=same, request_id="engine-once").metadata.name == auto["name"]
        with pytest.raises(ServiceError) as e:
            c.create_launch(ckpt, again, spec=same, request_id="engine-once", engine={"dtype": "float16"})
        assert [v.field for v in e.value.violations] == ["request_id"], e.value
        assert auto["name"] in e.value.violations[0].description, e.value
        assert len(c.list_launches(page_size=100).launches) == before
    summary = json.loads(cli("launches", "summary", "--by", "dtype,engine", "-o", "json",
                             server=srv.address).stdout)["summary"]
    assert sorted((g["dtype"], g["engine"], g["launches"]) for g in summary["groups"]) == [
        ("bfloat16", "dtype bfloat16, KV cache 8 MiB a rank, CPU decode trace", 2),  # with its rerun
        ("float32", "dtype auto, KV cache auto, CPU decode eager", 1)], summary


def test_launch_flags_without_a_spec_resolve_the_checkpoint_and_never_ride_beside_a_plan(srv: ServerProcess,
                                                                                         ckpt: str) -> None:
    """`launch --model-path DIR --gpu cpu --tp 1`: the flags make the spec, its model the checkpoint
    launched. Beside --plan (resolved already) a spec flag would be dropped without a word: refused,
    naming it, and nothing is made."""
    proc = cli("launch", "--model-path", ckpt, "--gpu", "cpu", "--tp", "1", "--input-len", "4", "--output-len", "2",
               "--requests", "1", "--wait", "-o", "json", server=srv.address)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    launch = json.loads(proc.stdout)["launch"]
    assert (launch["state"], launch["tp"]) == ("SUCCEEDED", 1)
    with Client(srv.address) as c:
        plan = c.get_plan(launch["plan"])
        assert (plan.spec.model.path, plan.spec.hardware.gpu, plan.spec.parallelism.tp) == (ckpt, "cpu", 1)
        refused = cli("launch", "--model-path", ckpt, "--plan", launch["plan"], "--tp", "2", "--enforce-piecewise",
                      "-o", "json", server=srv.address)
        err = json.loads(refused.stdout)["error"]
        assert refused.returncode == 2 and err["field_violations"][0]["field"] == "plan", err
        assert "got --plan and --tp, --enforce-piecewise" in err["message"], err
        assert [x.name for x in c.list_launches(page_size=10).launches] == [launch["name"]]
        missing = cli("launch", "--model-path", ckpt, "-o", "json", server=srv.address)  # no GPU: the resolver says
        assert missing.returncode == 2 and json.loads(missing.stdout)["error"]["field_violations"][0]["field"] \
            == "hardware.gpu", missing.stdout


def test_launches_diff_says_what_differed_in_the_plan_in_what_ran_and_in_what_it_measured(
        srv: ServerProcess, ckpt: str) -> None:
    """`launches diff A B`, for "yesterday's launch was faster: what differed?": the plans' fields
    with the rules behind each side, what each ran (effective modes, workload, checkpoint) and its
    measurements side by side, with --exit-code as plans diff has it."""
    # TP2: b compiles its prefill pieces in every rank, and two ranks compile in half the CPU of four
    spec = {**KIMI, "hardware": {"gpu": "GB300", "gpu_count": 2}, "parallelism": {"tp": 2}}
    with Client(srv.address) as c:
        a = c.create_launch(ckpt, SHORT, spec=spec).metadata.name
        assert wait_state(c, a, ("SUCCEEDED", "FAILED")).state == "SUCCEEDED"
        b = c.create_launch(ckpt, {**SHORT, "output_len": 4}, spec=spec, policy="sglang-0.5.17").metadata.name
        assert wait_state(c, b, ("SUCCEEDED", "FAILED")).state == "SUCCEEDED"
        # sglang 0.5.18's plan differs from a's only in prefill fields a CPU substitutes away
        alike = c.create_launch(ckpt, SHORT, spec=spec, policy="sglang-0.5.18").metadata.name
        assert wait_state(c, alike, ("SUCCEEDED", "FAILED")).state == "SUCCEEDED"
    out = cli("launches", "diff", a, b.split("/")[1], "-o", "json", "--exit-code", server=srv.address)
    assert out.returncode == 1, out.stdout + out.stderr  # they differ
    diff = json.loads(out.stdout)["diff"]
    assert (diff["a"]["launch"], diff["b"]["launch"]) == (a, b)
    change = next(x for x in diff["plan"]["changes"] if x["field"] == "prefill.backend")
    assert (change["a"], change["b"]) == ("disabled", "tc_piecewise")
    assert "prefill.upgrade.multimodal_piecewise" in diff["plan"]["rules"]["only_b"]
    ran = {x["field"]: (x["a"], x["b"]) for x in diff["ran"]}
    assert ran["prefill (effective)"] == ("disabled", "tc_piecewise_nograph")
    assert ran["workload"] == ("2 requests x 12 in / 6 out, concurrency 1, seed 7",
                               "2 requests x 12 in / 4 out, concurrency 1, seed 7")
    assert "decode (effective)" not in ran  # the same on both: not listed
    ttft = next(m for m in diff["measured"] if m["metric"] == "TTFT p50 ms")
    assert ttft["a"] > 0 and ttft["b"] > 0 and ttft["b_minus_a"] == round(ttft["b"] - ttft["a"], 3)
    assert "one launch a side" in diff["note"]  # no interval from one run each: experiments measure that
    assert diff["ran_alike"] == []  # b ran tc_piecewise_nograph: what ran differs
    twins = cli("launches", "diff", a, alike, "-o", "json", server=srv.address)
    assert json.loads(twins.stdout)["diff"]["ran_alike"] == ["prefill.backend", "prefill.max_num_tokens",
                                                             "prefill.num_tokens"], twins.stdout
    said = cli("launches", "diff", a, alike, "-o", "table", server=srv.address).stdout
    assert "a and b ran alike: their plans differ only in prefill.backend, prefill.max_num_tokens, " \
           "prefill.num_tokens" in said, said
    table = cli("launches", "diff", a, b, "-o", "table", server=srv.address)
    assert table.returncode == 0 and "prefill (effective)" in table.stdout and "TTFT p50 ms" in table.stdout
    same = cli("launches", "diff", a, a, "-o", "json", "--exit-code", server=srv.address)
    assert same.returncode == 0, same.stdout + same.stderr
    itself = json.loads(same.stdout)["diff"]
    assert itself["plan"]["changes"] == [] and itself["ran"] == []
    bad = cli("launches", "diff", a, "plans/x", "-o", "json", server=srv.address)
    assert bad.returncode == 2 and json.loads(bad.stdout)["error"]["field_violations"][0]["field"] == "b"
    # the launches whose prefill graphs a CPU substituted (b's tc_piecewise, alike's breakable), and not
    for text, expected in (('substituted = "prefill.backend"', [b, alike]), ('substituted != "prefill.backend"', [a])):
        listed = json.loads(cli("launches", "list", "--filter", text, "-o", "json", server=srv.address).stdout)
        assert [x["name"] for x in listed["launches"]] == expected, (text, listed)
    # on a CPU every launch substitutes something (attention backends, decode graphs)
    listed = json.loads(cli("launches", "list", "--filter", 'substituted = "none"', "-o", "json",
                            server=srv.address).stdout)
    assert listed["launches"] == [], listed


def test_logs_larger_than_one_message_are_read_whole_in_pieces(tmp_path: Path, ckpt: str) -> None:
    """Regression: `launches logs --tail 0` (and the first answer of `--follow --tail 0`) sent
    every log whole in one message, RESOURCE_EXHAUSTED once they passed max_message_bytes (a
    rank that logs a traceback loop, NCCL at debug level). An answer now holds what fits, says
    each log's size, and the CLI asks on from end_offset until it has all of it."""
    with ServerProcess(tmp_path / "srv", "--max-message-bytes", "65536") as srv, Client(srv.address) as c:
        name = c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name
        assert wait_state(c, name, ("SUCCEEDED", "FAILED")).state == "SUCCEEDED"
        logs = srv.data_dir / "launches" / name.split("/")[1] / "logs"
        for rank in (0, 1):  # a noisy rank: 120 KB of lines more than a message holds
            with open(logs / f"rank{rank}.log", "a") as fh:
                fh.writelines(f"rank {rank}: noise line {i:05d} " + "x" * 40 + "\n" for i in range(2000))
        whole = {p.name: p.read_text() for p in logs.glob("*.log")}
        answer = c.launch_logs(name)  # one answer: within the message, and saying what it left out
        assert answer.ByteSize() <= 65536
        cut = {x.name: (x.end_offset, x.size) for x in answer.logs}
        assert cut["rank0.log"][0] < cut["rank0.log"][1] == len(whole["rank0.log"].encode()), cut
        assert cut["rank2.log"][0] == cut["rank2.log"][1]  # a small log comes whole

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, *args,
                                   "--server", srv.address, "-o", "json"], capture_output=True, text=True, timeout=60,
                                  cwd=ROOT)

        read = cli("--tail", "0")
        assert read.returncode == 0, read.stderr
        assert {x["name"]: x["text"] for x in json.loads(read.stdout)["logs"]} == whole
        followed: dict[str, str] = {}
        for line in cli("--tail", "0", "--follow").stdout.splitlines():
            piece = json.loads(line)
            followed[piece["log"]] = followed.get(piece["log"], "") + piece["text"]
        assert followed == {k: v for k, v in whole.items() if v}
        last = {x["name"]: x["text"] for x in json.loads(cli("--tail", "3").stdout)["logs"]}
        assert last["rank1.log"] == "\n".join(whole["rank1.log"].splitlines()[-3:])


def test_an_ended_launchs_logs_are_removed_after_the_retention_audited_and_the_rest_kept(
        tmp_path: Path, ckpt: str) -> None:
    """`--launch-retention-days`: the run directory of a launch that ended and has not changed
    since loses its logs, events and report file on this machine; its record of that is committed
    first, its report, plan and records stay, and its logs answer that they were removed, when
    and why, where an empty answer would read as "the ranks wrote nothing"."""
    seconds = 2.0
    with ServerProcess(tmp_path / "srv", "--launch-retention-days", repr(seconds / 86400)) as srv, \
            Client(srv.address) as c:
        assert any(line.startswith("launch logs: removed 2.3") for line in srv.output), srv.output  # said at start
        name = c.create_launch(ckpt, SHORT, spec=KIMI).metadata.name
        ended = wait_state(c, name, ("SUCCEEDED",))
        assert [x.name for x in c.launch_logs(name).logs]  # kept while the retention runs
        run_dir = srv.data_dir / "launches" / name.split("/")[1]
        deadline = time.monotonic() + 60
        while not (run_dir / "removed.json").exists():
            assert time.monotonic() < deadline, sorted(p.name for p in run_dir.iterdir())
            time.sleep(0.2)
        assert sorted(p.name for p in run_dir.iterdir()) == ["plan.json", "removed.json"]
        records = c.list_audit_records(f'method = "launch.retention" AND launch_id = "{name}"').records
        assert len(records) == 1, records
        said = records[0].outcome_message
        assert said.startswith(f"{name}: logs and events removed from {run_dir} on {HOST}"), said
        assert records[0].model == "nvidia/Kimi-K2.6-NVFP4"  # filed by its plan, as its other records
        with pytest.raises(ServiceError) as e:
            c.launch_logs(name)
        assert e.value.code == "FAILED_PRECONDITION" and e.value.reason == "LOGS_REMOVED", e.value
        assert "removed" in e.value.message and records[0].name in e.value.message, e.value.message
        marker = run_dir / "removed.json"  # one edited by hand still answers why, not INTERNAL
        written = marker.read_text()
        marker.write_text(json.dumps({k: v for k, v in json.loads(written).items() if k != "retention_days"}))
        with pytest.raises(ServiceError) as e:
            c.launch_logs(name)
        assert e.value.reason == "LOGS_REMOVED" and "(? days after" in e.value.message, e.value
        marker.write_text(written)
        kept = c.get_launch(name)
        assert kept.state == "SUCCEEDED" and kept.report.ttft_ms_p50 == ended.report.ttft_ms_p50
        assert c.label_launch(name, {"kept": "yes"}).labels["kept"] == "yes"  # it may change still
        time.sleep(2.5)  # two sweeps or more (one a second) find nothing more to remove
        again = c.list_audit_records(f'method = "launch.retention" AND launch_id = "{name}"').records
        assert [r.name for r in again] == [records[0].name]
        cli = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", "launches", "logs", name, "--server",
                              srv.address], capture_output=True, text=True, timeout=60, cwd=ROOT)
        error = json.loads(cli.stdout)["error"]  # FAILED_PRECONDITION: exit 2, as LOGS_ELSEWHERE is
        assert cli.returncode == 2 and error["reason"] == "LOGS_REMOVED" and "removed" in error["message"], cli.stdout
