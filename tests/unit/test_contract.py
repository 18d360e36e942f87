"""The server-worker contract: every message round-trips, and anything malformed is refused
with the field named."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cgsvc.contract import (
    SCHEMA_VERSION,
    ContractError,
    PlacedEvent,
    ProgressEvent,
    RankError,
    StateEvent,
    WorkerReport,
    parse_event,
    ran_alike,
    ran_as,
    read_report,
    tp_fits,
    tp_misfits,
    write_report,
)

OK_REPORT = {
    "status": "ok", "plan_fidelity": [{"field": "decode.backend", "requested": "full", "effective": "full",
                                        "status": "honoured", "reason": ""}],
    "modes": {p: {"requested": "full", "effective": "full", "reason": "", "capture_seconds": 0.5,
                  "capture_bytes": 10} for p in ("prefill", "decode")},
    "attention": {p: {"requested": "flashinfer", "effective": "flashinfer", "reason": ""} for p in ("prefill", "decode")},
    "aggregate": {"throughput_tok_s": 12.5, "output_tokens": 8, "ttft_ms": {"mean": 1, "p50": 2, "p90": 3, "p99": 4},
                  "tpot_ms": {"mean": 5, "p50": 6, "p90": 7, "p99": 8}},
    "kv_cache": {"bytes_per_token": 384}, "placement": [{"rank": 0, "device": "cpu", "visible_devices": ""}],
    "requests": [], "notes": ["kept in the body"],
}


def test_events_round_trip() -> None:
    for event in (StateEvent("running"), StateEvent("failed", "boom"), ProgressEvent(3, 10),
                  ProgressEvent(0, 10, prompt_done=4096, prompt_total=8192),
                  ProgressEvent(0, 10, prompt_total=80, capture_done=12, capture_total=94), PlacedEvent(("2", "3"))):
        back = parse_event(json.dumps(event.to_dict()))
        assert type(back) is type(event) and {**back.__dict__, "time": 0.0} == {**event.__dict__, "time": 0.0}


@pytest.mark.parametrize(("line", "names"), [
    ("not json", "event: not JSON"),
    ('{"event": "state"}', "event.state: missing"),
    ('{"event": "state", "state": "dancing"}', "event.state: 'dancing' is not one of"),
    ('{"event": "progress", "tokens_done": 5, "tokens_total": 2}', "event.tokens_done: 5 is not within"),
    ('{"event": "progress", "tokens_done": "5", "tokens_total": 9}', "event.tokens_done: expected int"),
    ('{"event": "progress", "tokens_done": 0, "tokens_total": 2, "prompt_done": 9, "prompt_total": 8}',
     "event.prompt_done: 9 is not within"),
    ('{"event": "progress", "tokens_done": 0, "tokens_total": 2, "capture_done": 3, "capture_total": 2}',
     "event.capture_done: 3 is not within"),
    ('{"event": "placed", "devices": []}', "event.devices"),
    ('{"event": "exploded"}', "event.event: 'exploded' is not one of state, progress, placed"),
    (f'{{"schema": {SCHEMA_VERSION + 1}, "event": "state", "state": "running"}}', "newer than this server's"),
])
def test_malformed_events_name_the_field(line: str, names: str) -> None:
    with pytest.raises(ContractError, match=names.replace("(", r"\(").replace(".", r"\.")):
        parse_event(line)


def test_reports_round_trip_and_keep_their_body(tmp_path: Path) -> None:
    write_report(tmp_path / "r.json", OK_REPORT)
    report = read_report(tmp_path / "r.json")
    assert report.ok and report.ttft_ms.p99 == 4 and report.kv_bytes_per_token == 384
    assert report.plan_fidelity[0].field == "decode.backend" and report.placement[0].device == "cpu"
    assert report.body["notes"] == ["kept in the body"] and report.to_dict()["schema"] == SCHEMA_VERSION
    failed = WorkerReport.failed("rank 2 died", "RuntimeError", (RankError(2, -9, "killed"),))
    write_report(tmp_path / "f.json", failed)
    back = read_report(tmp_path / "f.json")
    assert not back.ok and back.rank_errors == (RankError(2, -9, "killed"),) and back.error == "rank 2 died"


def test_a_report_is_written_whole_past_a_leftover_temporary_file(tmp_path: Path) -> None:
    """A worker killed mid-write once left `r.json.tmp` behind; the next report must not trip on
    it, nor leave one of its own."""
    (tmp_path / "r.json.tmp").mkdir()  # what a fixed temporary name would collide with
    write_report(tmp_path / "r.json", OK_REPORT)
    write_report(tmp_path / "r.json", OK_REPORT)  # replaced whole, again
    assert read_report(tmp_path / "r.json").ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json", "r.json.tmp"]


@pytest.mark.parametrize(("change", "names"), [
    ({"status": "maybe"}, "report.status: 'maybe' is not one of ok, failed"),
    ({"aggregate": None}, "report.aggregate: expected dict"),
    ({"plan_fidelity": [{"field": "x", "requested": 1, "effective": 2, "status": "substituted", "reason": ""}]},
     "plan_fidelity[x].reason: required"),
    ({"modes": {"prefill": {"requested": "full"}}}, "report.modes.prefill.effective: missing"),
    ({"kv_cache": {"bytes_per_token": 1.5}}, "report.kv_cache.bytes_per_token: expected int"),
])
def test_malformed_reports_name_the_field(tmp_path: Path, change: dict[str, object], names: str) -> None:
    (tmp_path / "r.json").write_text(json.dumps({**OK_REPORT, **change}))
    with pytest.raises(ContractError, match=names.replace("[", r"\[").replace("(", r"\(").replace(".", r"\.")):
        read_report(tmp_path / "r.json")


def test_missing_or_broken_report_files(tmp_path: Path) -> None:
    with pytest.raises(ContractError, match="no r.json was written"):
        read_report(tmp_path / "r.json")
    (tmp_path / "r.json").write_text('{"status": "ok"')
    with pytest.raises(ContractError, match="not JSON"):
        read_report(tmp_path / "r.json")
    with pytest.raises(ContractError, match="report.plan_fidelity: missing"):  # a worker cannot write it either
        write_report(tmp_path / "w.json", {"status": "ok"})


def fidelity(**fields: tuple[Any, Any]) -> dict[str, Any]:
    """A worker report's plan_fidelity: field -> (requested, effective)."""
    return {"plan_fidelity": [{"field": f.replace("__", "."), "requested": r, "effective": e}
                              for f, (r, e) in fields.items()]}


def test_arms_whose_plans_differ_only_where_the_workers_substituted_ran_alike() -> None:
    """Regression: on a CPU, cgsvc's plan (prefill disabled) and sglang 0.5.18's (prefill
    breakable, substituted to disabled) ran identically, yet the verdict read "TPOT: B is faster
    by 7.25 ms": drift between launches, reported as the plans' effect."""
    a = ran_as(fidelity(prefill__backend=("disabled", "disabled"), prefill__num_tokens=([], []),
                        decode__backend=("full", "static_eager")))
    b = ran_as(fidelity(prefill__backend=("breakable", "disabled"), prefill__num_tokens=([4, 8], []),
                        decode__backend=("full", "static_eager")))
    assert ran_alike(a, b) == ["prefill.backend", "prefill.num_tokens"]
    differs = ran_as(fidelity(prefill__backend=("breakable", "tc_piecewise_nograph"), prefill__num_tokens=([4, 8], [4, 8]),
                              decode__backend=("full", "static_eager")))
    assert ran_alike(a, differs) == []  # what ran differs: the measurement is the plans'
    assert ran_alike(a, a) == []  # an A/A run (the same plan twice) measures the machine on purpose
    assert ran_alike(a, {}) == []  # an arm with no report yet says nothing


def test_a_launch_whose_requests_had_no_second_token_has_no_tpot() -> None:
    """--output-len 1: every request ends at its first token, so there is no time per output
    token; the summary said "TPOT ms p50 0.0 p99 0.0" and `launches summary` took the 0 into
    its median. Now TPOT is absent (proto3 optional), and a measured one is present."""
    from cgsvc.codec import report_summary

    none = {**OK_REPORT, "aggregate": {**OK_REPORT["aggregate"], "tpot_ms": {}}}
    summary = report_summary(json.dumps(none))
    assert not summary.HasField("tpot_ms_p50") and not summary.HasField("tpot_ms_p99")
    assert summary.ttft_ms_p50 == 2
    measured = report_summary(json.dumps(OK_REPORT))
    assert measured.HasField("tpot_ms_p50") and (measured.tpot_ms_p50, measured.tpot_ms_p99) == (6, 8)
    # codec.measured, which the CLI's show, summary and diff read through: None where unset
    from cgsvc.codec import measured as read
    assert (read(summary, "tpot_ms_p50"), read(summary, "ttft_ms_p50"), read(measured, "tpot_ms_p99")) == (None, 2.0, 8.0)


def test_a_progress_event_of_an_earlier_worker_has_no_prompt_counts() -> None:
    """A worker of the release before prompt progress writes only tokens: read as 0 of 0."""
    event = parse_event('{"event": "progress", "tokens_done": 3, "tokens_total": 10}')
    assert event == ProgressEvent(3, 10, event.time, 0, 0)  # type: ignore[union-attr]


def test_a_kv_budget_below_two_pages_is_refused_with_the_smallest_that_holds_them() -> None:
    """DeepSeek-V3: 61 layers of 576 values (512 latent + 64 rotary key) a token. A page of 16
    tokens stored as the model's dtype (auto) is at least 16-bit: 2 pages need 2.15 MiB."""
    from cgsvc import catalog
    from cgsvc.contract import EngineSettings
    from cgsvc.domain.launches import kv_budget_problem

    v3 = catalog.facts_for_spec({"model": {"name": "deepseek-ai/DeepSeek-V3"}})
    assert v3 is not None
    small = kv_budget_problem(EngineSettings(kv_cache_mb=2), "auto", v3)
    assert small is not None and small.field == "engine.kv_cache_mb"
    assert small.description == ("2 MiB is under the 2 KV cache pages a rank needs: at least 2.15 MiB (2248704 "
                                 "bytes: 2 x 16 tokens x 61 layers x 1152 bytes, kv_cache_dtype auto, dtype auto "
                                 "(16-bit at least)), or 0 (auto)")
    assert kv_budget_problem(EngineSettings(kv_cache_mb=2.15), "auto", v3) is None  # 2.15 MiB holds them
    wide = kv_budget_problem(EngineSettings(kv_cache_mb=2.15, dtype="float32"), "auto", v3)
    assert wide is not None and "2 x 16 tokens x 61 layers x 2304 bytes" in wide.description
    fp8 = kv_budget_problem(EngineSettings(kv_cache_mb=1), "fp8_e4m3", v3)  # a byte a value, whatever the dtype
    assert fp8 is not None and fp8.description.endswith("576 bytes, kv_cache_dtype fp8_e4m3), or 0 (auto)")
    assert kv_budget_problem(EngineSettings(kv_cache_mb=0), "auto", v3) is None  # auto: the workers size it


def test_a_succeeded_record_says_what_the_workers_substituted_count_first() -> None:
    """The SUCCEEDED audit record's words on plan fidelity (the count first: `audit list` cuts a
    long message), and nothing from a worker whose report has no plan fidelity."""
    from cgsvc.domain.launches import fidelity_said

    def report(*substituted: str) -> dict[str, Any]:
        return {"plan_fidelity": [{"field": f, "status": "substituted" if f in substituted else "honoured"}
                                  for f in ("decode.backend", "decode.bs", "kv_cache_dtype")]}

    assert fidelity_said(report("decode.backend", "kv_cache_dtype")) == (
        "2 of 3 plan fields substituted by the workers: decode.backend, kv_cache_dtype (launches show has each "
        "one's reason)")
    assert fidelity_said(report()) == "all 3 plan fields ran as planned (or had nothing to act on)"
    assert fidelity_said({}) == ""


def test_the_tp_sizes_a_checkpoint_fits_are_those_that_split_every_sharded_size() -> None:
    # Kimi-K2.6: 64 heads, 163,840 vocabulary rows, 384 routed experts: gcd 64
    kimi = {"num_attention_heads": 64, "vocab_size": 163840, "routed_experts": 384}
    assert tp_fits(kimi) == [1, 2, 4, 8, 16, 32, 64]
    assert tp_misfits(3, kimi) == ["64 attention heads", "163840 vocabulary rows"]  # 384 = 3 x 128
    # an odd vocabulary leaves 2 of them; a dense model (no experts) is read by its other sizes
    assert tp_fits({**kimi, "vocab_size": 510}) == [1, 2]
    assert tp_fits({"num_attention_heads": 28, "vocab_size": 152064, "routed_experts": 0}) == [1, 2, 4]
    assert all(not tp_misfits(tp, kimi) for tp in tp_fits(kimi))
