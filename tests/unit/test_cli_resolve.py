"""`cgsvc-cli resolve` as a user runs it: a real process, its output and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

KIMI_SPEC = ROOT / "examples" / "kimi-k2.6-gb300-tp4.json"


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def test_resolve_json_prints_the_plan_and_exits_0() -> None:
    proc = cli("resolve", "--spec", str(KIMI_SPEC), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    plan = as_json(proc)["plan"]
    assert list(plan)[:4] == ["policy", "policy_version", "plan_hash", "attention_backend"]
    assert plan["policy"] == "cgsvc"
    assert plan["prefill"]["backend"] == "disabled" and plan["decode"]["backend"] == "full"
    assert [d["rule_id"] for d in plan["decisions"] if d["field"] == "prefill.backend"] == [
        "default.prefill.backend", "prefill.exception.trtllm_mla", "breakable.mla"]


def test_convenience_flags_build_the_same_spec() -> None:
    by_file = as_json(cli("resolve", "--spec", str(KIMI_SPEC), "-o", "json"))
    by_flags = as_json(cli("resolve", "--model", "nvidia/Kimi-K2.6-NVFP4", "--gpu", "GB300", "--gpus", "4",
                           "--tp", "4", "-o", "json"))
    assert by_file == by_flags
    forced = as_json(cli("resolve", "--spec", str(KIMI_SPEC), "--prefill-graph", "tc_piecewise", "-o", "json"))
    assert forced["plan"]["prefill"]["backend"] == "tc_piecewise"
    assert forced["plan"]["locked"] == ["prefill.backend"]


def test_table_marks_locks_and_warnings() -> None:
    proc = cli("resolve", "--spec", str(KIMI_SPEC), "--enforce-piecewise", "--output", "table")
    assert proc.returncode == 0
    assert "tc_piecewise *locked" in proc.stdout
    assert "WARNING [trtllm_mla.fp8_paged_fallback]" in proc.stdout
    assert "prefill.deepseek_v3.trtllm_mla*" in proc.stdout  # the forced decision is marked
    both = cli("resolve", "--spec", str(KIMI_SPEC), "--output", "table", "--attention-backend", "FlashInfer")
    (row,) = [line for line in both.stdout.splitlines() if line.startswith("attention (prefill / decode)")]
    assert row.split(None, 4)[-1] == "flashinfer *locked / flashinfer *locked", row  # each phase marked where it is


def test_explain_prints_only_one_field() -> None:
    proc = cli("resolve", "--spec", str(KIMI_SPEC), "--explain", "prefill.backend", "-o", "json")
    out = as_json(proc)["explain"]
    assert out["field"] == "prefill.backend"
    assert {d["field"] for d in out["decisions"]} == {"prefill.backend"}
    table = cli("resolve", "--spec", str(KIMI_SPEC), "--explain", "decode.bs", "-o", "table").stdout
    assert "sizes.decode.bs" in table and "breakable.mla" not in table


def test_explain_of_a_field_no_rule_decides_is_refused_by_name_and_spellings_are_canonical() -> None:
    """--explain takes the plan fields the rules decide; anything else (a typo) was once an
    empty list and exit 0, which reads as "no rule touched it"."""
    for mode in ("json", "table"):
        proc = cli("resolve", "--spec", str(KIMI_SPEC), "--explain", "prefill.bogus", "-o", mode)
        assert proc.returncode == 2, proc.stdout
        if mode == "json":
            err = as_json(proc)["error"]
            assert err["code"] == "INVALID_ARGUMENT"
            assert err["field_violations"][0]["field"] == "explain"
            assert "'prefill.bogus'" in err["message"] and "prefill.backend" in err["message"]
            assert "decode.bs" in err["message"]  # every valid field is named
        else:
            assert "prefill.bogus" in proc.stderr + proc.stdout and "decode.bs" in proc.stderr + proc.stdout
    typo = as_json(cli("resolve", "--spec", str(KIMI_SPEC), "--explain", "prefil.backend", "-o", "json"))["error"]
    assert "'prefil.backend' is not a field the rules decide; did you mean 'prefill.backend'?" in typo["message"]
    out = as_json(cli("resolve", "--spec", str(KIMI_SPEC), "--explain", "Prefill.Backend", "-o", "json"))["explain"]
    assert out["field"] == "prefill.backend"  # one canonical spelling, as closed sets are everywhere
    assert [d["rule_id"] for d in out["decisions"]] == [
        "default.prefill.backend", "prefill.exception.trtllm_mla", "breakable.mla"]


def test_every_field_a_rule_may_write_can_be_explained() -> None:
    """--explain checks its field against engine.KEYS, so every rule's writes must be there."""
    from cgsvc.resolve.engine import KEYS
    from cgsvc.resolve.policies import POLICIES

    writes = {w for policy in POLICIES.values() for rule in policy.rules for w in rule.writes}
    assert writes <= set(KEYS), writes - set(KEYS)


def test_refusals_print_an_error_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300"}, "parallelism": {"tq": 4}}')
    proc = cli("resolve", "--spec", str(bad), "-o", "json")
    assert proc.returncode == 2
    err = as_json(proc)["error"]
    assert err["code"] == "INVALID_ARGUMENT"
    assert err["field_violations"][0]["field"] == "parallelism.tq"
    assert "valid fields here" in err["field_violations"][0]["description"]

    bad.write_text("{not json")
    proc = cli("resolve", "--spec", str(bad), "-o", "json")
    assert proc.returncode == 2 and as_json(proc)["error"]["field_violations"][0]["field"] == "spec"
    assert "Traceback" not in proc.stderr

    proc = cli("resolve", "--spec", str(tmp_path / "missing.json"), "-o", "json")
    assert proc.returncode == 2 and "cannot read" in as_json(proc)["error"]["message"]

    proc = cli("resolve", "--model", "deepseek-ai/DeepSeek-V3", "--gpu", "H100", "--gpus", "8", "--tp", "8",
               "--attention-backend", "trtllm_mla", "-o", "json")
    assert proc.returncode == 2
    err = as_json(proc)["error"]
    assert err["code"] == "FAILED_PRECONDITION" and err["rule_id"] == "attention.trtllm_mla.requires_blackwell"


def test_rules_lists_the_table() -> None:
    out = as_json(cli("rules", "-o", "json"))
    ids = [r["id"] for r in out["rules"]]
    assert "prefill.upgrade.multimodal_piecewise" in ids and "breakable.mla" in ids
    assert ids.index("attention.deepseek_v3.blackwell") < ids.index("prefill.upgrade.multimodal_piecewise")


def test_models_lists_the_catalog_the_refusal_points_to() -> None:
    proc = cli("resolve", "--model", "Kimi-K2.7", "--gpu", "GB300", "--gpus", "4", "--tp", "4", "-o", "json")
    assert proc.returncode == 2
    description = as_json(proc)["error"]["field_violations"][0]["description"]
    assert "did you mean 'moonshotai/Kimi-K2.6'" in description and "cgsvc-cli models" in description
    listed = as_json(cli("models", "-o", "json"))["models"]
    names = [m["name"] for m in listed]
    assert "moonshotai/Kimi-K2.6" in names and len(names) == len(set(names))
    assert f"one of {len(names)} catalog ids" in description
    assert list(listed[0]) == ["name", "aliases", "architecture", "text_architecture", "mla", "dsa", "moe",
                               "multimodal", "quantization", "kv_cache_dtype", "num_layers", "hidden_size",
                               "num_attention_heads"]
    table = cli("models", "-o", "table").stdout
    assert table.splitlines()[0].split()[:3] == ["model", "aliases", "architecture"]
    assert len(table.splitlines()) == len(names) + 2  # header, rule, one row a model
    assert any(line.startswith("deepseek-ai/DeepSeek-V3.2 ") and "MLA+DSA" in line for line in table.splitlines())


def test_no_arguments_at_all_is_a_usage_error_not_a_traceback() -> None:
    proc = cli()  # regression: json_requested's zip of no arguments raised ValueError
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.startswith("usage: cgsvc-cli") and "required" in proc.stderr, proc.stderr


def test_a_command_group_with_only_options_names_the_missing_subcommand() -> None:
    """Regression: `audit -o json` answered "invalid choice: 'json'" (argparse took the option's
    value for the subcommand), as `-o json` alone once did."""
    for words, field, choices in ((["audit"], "audit_command", "'list', 'summary', 'show', 'verify'"),
                                  (["launches"], "launches_command", "'list', 'summary', 'show'"), ([], "command", "'resolve'")):
        proc = cli(*words, "-o", "json")
        error = as_json(proc)["error"]
        assert proc.returncode == 2 and error["field_violations"][0]["field"] == field, error
        assert f"required after -o json (choose from {choices}" in error["message"], error


def test_policies_and_models_read_list_as_the_other_lists_do() -> None:
    """`plans list`, `launches list`, `replicas list` ...: `policies list` and `models list` were
    refused with "unrecognized arguments: list"."""
    for command in ("policies", "models"):
        assert as_json(cli(command, "list", "-o", "json")) == as_json(cli(command, "-o", "json"))
        refused = cli(command, "lsit", "-o", "json")
        assert refused.returncode == 2 and "list" in as_json(refused)["error"]["message"], refused.stdout


def test_an_experiment_takes_exactly_two_plans_given_either_way() -> None:
    """Refused on the command line, before any server is dialled (nothing answers on port 9)."""
    for plans in (["plans/a"], ["plans/a", "b", "--plan", "plans/c"], []):
        proc = cli("experiment", "run", *plans, "--model-path", "/x", "--server", "127.0.0.1:9", "-o", "json")
        error = as_json(proc)["error"]
        assert proc.returncode == 2 and error["field_violations"][0]["field"] == "plans", proc.stdout
        assert "give two plans, A (the baseline) then B" in error["message"], error


def test_a_server_that_cannot_be_reached_is_named_with_what_to_check() -> None:
    """gRPC's own words ("failed to connect to all addresses; ... Connection refused") named no
    remedy, and `--server 127.0.0.1` silently dialled port 443 (gRPC's default, not cgsvc's)."""
    def message(server: str) -> str:
        proc = cli("plans", "list", "--server", server, "--timeout", "5", "-o", "json")
        assert proc.returncode == 1, proc.stdout + proc.stderr
        return str(as_json(proc)["error"]["message"])

    refused = message("127.0.0.1:1")
    assert refused.startswith("UNAVAILABLE: ") or "Connection refused" in refused, refused
    assert "nothing answers at 127.0.0.1:1: is `cgsvc serve` running there? (--server or CGSVC_SERVER" in refused
    bare = message("127.0.0.1")
    assert "no port given, so gRPC dialled 443; cgsvc serves 50051 unless told otherwise" in bare, bare
    assert "nohost.invalid does not resolve" in message("nohost.invalid:50051")


def test_help_lists_every_exit_code_and_a_refusal_exits_with_the_listed_one(tmp_path: Path) -> None:
    """A script reads the exit codes off `--help`; the one for a refusal is what it gets."""
    help_text = cli("--help").stdout
    codes = {line.split()[0]: line for line in help_text.split("exit codes", 1)[1].splitlines()[1:]
             if line.strip()[:1].isdigit()}
    assert sorted(codes) == ["0", "1", "130", "2", "3", "4"]
    assert "INVALID_ARGUMENT" in codes["2"]
    env = help_text.split("environment:", 1)[1]
    assert "CGSVC_SERVER" in env and "CGSVC_TOKEN" in env  # what stands for --server and --token
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": {"name": "deepseek-ai/DeepSeek-V3"}, "hardware": {"gpu": "NoSuchGPU"}}))
    assert cli("resolve", "--spec", str(bad), "-o", "json").returncode == 2


def test_options_before_the_command_move_after_it_in_every_spelling() -> None:
    from cgsvc_client.cli import hoist_leading_options

    assert hoist_leading_options(["--server", "h:1", "-o", "json", "audit", "verify", "--filter", "x"]) == [
        "audit", "verify", "--filter", "x", "--server", "h:1", "-o", "json"]
    assert hoist_leading_options(["--server=h:1", "-ojson", "--timeout", "5", "plans", "list"]) == [
        "plans", "list", "--server=h:1", "-ojson", "--timeout", "5"]
    assert hoist_leading_options(["resolve", "--server", "h:1"]) == ["resolve", "--server", "h:1"]  # as given
    assert hoist_leading_options(["--help"]) == ["--help"]  # not a command's option: left for the top level
    table = cli("-otable", "rules")  # through the real entry point
    assert table.returncode == 0 and table.stdout.startswith("policy cgsvc ")


def cli_stdin(stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


def test_a_spec_on_standard_input_is_read_with_dash() -> None:
    by_file = as_json(cli("resolve", "--spec", str(KIMI_SPEC), "-o", "json"))
    by_stdin = cli_stdin(KIMI_SPEC.read_text(), "resolve", "--spec", "-", "-o", "json")
    assert by_stdin.returncode == 0, by_stdin.stdout + by_stdin.stderr
    assert as_json(by_stdin) == by_file
    # the convenience flags still amend what came in on stdin
    locked = as_json(cli_stdin(KIMI_SPEC.read_text(), "resolve", "--spec", "-", "--decode-graph", "disabled",
                               "-o", "json"))
    assert locked["plan"]["decode"]["backend"] == "disabled"


def test_bad_json_on_standard_input_names_the_field_and_the_stream() -> None:
    proc = cli_stdin("{not json", "resolve", "--spec", "-", "-o", "json")
    assert proc.returncode == 2
    (violation,) = as_json(proc)["error"]["field_violations"]
    assert violation["field"] == "spec" and "standard input" in violation["description"]
    empty = cli_stdin("", "resolve", "--spec", "-", "-o", "json")
    assert empty.returncode == 2 and "standard input" in as_json(empty)["error"]["message"]


def test_a_usage_error_under_o_json_is_a_json_error_naming_the_argument() -> None:
    for args, field, words in ((("-o", "json"), "command", "required after -o json (choose from 'resolve'"),
                               (("--server", "h:1", "-ojson"), "command", "required after --server h:1 -ojson"),
                               (("resolve", "--tp", "four", "-o", "json"), "tp", "invalid int value"),
                               (("--output=json", "resolve", "--tpp", "4"), "argv", "unrecognized arguments: --tpp"),
                               (("-ojson", "resolve", "-o", "yaml"), "output", "invalid choice"),
                               (("audit", "verify", "--server", "h:1", "--timeout", "0", "-o", "json"), "timeout",
                                "must be more than 0 seconds, got 0"),  # was an instant DEADLINE_EXCEEDED
                               (("audit", "verify", "--server", "h:1", "--timeout", "soon", "-o", "json"), "timeout",
                                "a number of seconds, got 'soon'")):
        proc = cli(*args)
        assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
        err = as_json(proc)["error"]
        assert err["code"] == "INVALID_ARGUMENT" and words in err["message"], (args, err)
        assert err["field_violations"][0]["field"] == field, (args, err)
        assert "--help" in err["message"] and "invalid choice: 'json'" not in err["message"], err
    missing = as_json(cli("audit", "prove", "-o", "json"))["error"]  # one violation per missing argument
    assert [(v["field"], v["description"]) for v in missing["field_violations"]] == [
        ("name", "required"), ("checkpoint", "required"), ("server", "required")]
    plain = cli("resolve", "--tp", "four")  # without -o json: argparse's own usage and message on stderr
    assert plain.returncode == 2 and plain.stdout == ""
    assert "usage: cgsvc-cli resolve" in plain.stderr and "invalid int value: 'four'" in plain.stderr


@pytest.mark.parametrize("command", [("plans", "list"), ("audit", "verify"), ("policy", "impact", "--candidate", "x"),
                                     ("launches", "list"), ("version",)])
def test_an_empty_server_where_a_command_needs_one_is_a_usage_error(command: tuple[str, ...]) -> None:
    """`--server ''` answers offline where a command can (resolve, rules); a command that needs a
    server dialled '' and printed gRPC's own "the target uri is not valid: dns:///" lines and an
    UNKNOWN error (exit 1)."""
    proc = cli(*command, "--server", "", "-o", "json")
    if command == ("version",):  # the client's own release needs no server: answered here
        assert proc.returncode == 0 and "dns:///" not in proc.stderr, proc
        return
    assert proc.returncode == 2 and "dns:///" not in proc.stderr, (proc.stdout, proc.stderr)
    (violation,) = as_json(proc)["error"]["field_violations"]
    assert violation["field"] == "server", violation
    assert violation["description"].startswith(f"`{' '.join(command[:2])}` needs a server"), violation
    plain = cli(*command, "--server", "")
    assert plain.returncode == 2 and "needs a server: HOST:PORT" in plain.stderr and "dns:///" not in plain.stderr


@pytest.mark.parametrize(("args", "code"), [
    (("rules", "-o", "table"), 0), (("resolve", "--spec", str(KIMI_SPEC), "-o", "json"), 0),
    (("rules", "-o", "table", "--writes", "decode.bs"), 0),
    (("resolve", "--spec", str(KIMI_SPEC), "--policy", "nope", "-o", "json"), 2),  # a refusal keeps its code
    (("resolve", "--tp", "four", "-o", "json"), 2)])
def test_a_reader_that_closed_the_pipe_gets_no_traceback(args: tuple[str, ...], code: int) -> None:
    """`cgsvc-cli ... | head`: the reader has what it wanted; the CLI stops quietly, with the exit
    code the command reached."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the CLI writes a byte: its first write fails, every time
    try:
        proc = subprocess.run([sys.executable, "-m", "cgsvc_client.cli", *args], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=60, cwd=ROOT)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (code, ""), proc.stderr


@pytest.mark.parametrize("args", [
    ("launch", "--model-path", "/m", "--seed"), ("launch", "--model-path", "/m", "--input-len"),
    ("launch", "--model-path", "/m", "--requests"), ("launch", "--model-path", "/m", "--concurrency"),
    ("plans", "list", "--page-size"), ("audit", "list", "--page-size"), ("launches", "list", "--page-size"),
    ("launches", "logs", "launches/x", "--tail"), ("launches", "logs", "launches/x", "--rank"),
    ("experiment", "run", "--plan", "plans/a", "--plan", "plans/b", "--model-path", "/m", "--repeats"),
])
def test_an_integer_the_api_cannot_carry_is_refused_naming_its_option(args: tuple[str, ...]) -> None:
    """Regression: a number past an int32 field's range (`--seed 99999999999999999999`) reached
    protobuf and ended the CLI in a traceback (ValueError: Value out of range). It is a bad command
    line, naming the option and the range, before anything is sent."""
    option = args[-1]
    proc = cli(*args, "99999999999999999999", "--server", "127.0.0.1:1", "-o", "json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (violation,) = as_json(proc)["error"]["field_violations"]
    assert violation["field"] == option.removeprefix("--").replace("-", "_"), violation
    assert "an integer from -2147483648 to 2147483647" in violation["description"], violation
    assert cli(*args, "x", "--server", "127.0.0.1:1", "-o", "json").returncode == 2


@pytest.mark.parametrize(("args", "field"), [
    (("audit", "witness", "--dir", "/nonexistent/w", "--every", "nan"), "every"),
    (("audit", "witness", "--dir", "/nonexistent/w", "--every", "inf"), "every"),
    (("audit", "list", "--follow", "--interval", "abc"), "interval"),
    (("launches", "logs", "launches/x", "-f", "--interval", "-1"), "interval"),
])
def test_a_stream_whose_command_line_does_not_parse_says_so_in_one_json_line(args: tuple[str, ...],
                                                                             field: str) -> None:
    """Regression: `--every nan` (and inf) passed the witness's own check and ended in a
    traceback from time.sleep; and a command line of a JSON-lines command (--follow, audit
    witness) that did not parse was answered in an indented object, not the one line such a
    command's reader takes. Durations are finite and more than 0, and the error is one line."""
    proc = cli(*args, "--server", "127.0.0.1:1", "-o", "json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stdout.splitlines()
    assert json.loads(line)["error"]["field_violations"][0]["field"] == field, line


@pytest.mark.parametrize(("text", "said"), [
    ("[" * 100_000 + "]" * 100_000, "nests deeper than"),  # regression: a RecursionError traceback
    ('{"model": {"name": "Kimi-K2.6"}, "hardware": {"gpu": "H200"}, "model": {"name": "DeepSeek-V3"}}',
     "key 'model' appears twice in one object"),  # was: the last one counted, silently
    ('{"model": {"name": "Kimi-K2.6"}, "hardware": {"gpu": "H200", "gpu_count": NaN}}', "NaN is not JSON"),
    ('{"model": {"name": "Kimi-K2.6"}, "hardware": {"gpu": "H200", "gpu_count": -Infinity}}', "-Infinity is not JSON"),
])
def test_a_file_that_is_not_plain_json_is_refused_naming_why(text: str, said: str) -> None:
    """Every file argument is read as RFC 8259 JSON: what Python's parser would take beyond it
    (NaN, a key given twice, whose last value wins) or cannot take (nesting past its recursion
    limit) is bad input on the argument, with no traceback."""
    proc = cli_stdin(text, "resolve", "--spec", "-", "-o", "json")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-500:]
    (violation,) = as_json(proc)["error"]["field_violations"]
    assert violation["field"] == "spec" and said in violation["description"], violation
