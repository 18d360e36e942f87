"""What was planned is what ran, or the report says exactly why not: plan fidelity for every plan
field, capture sizes honoured (padding, eager steps counted per reason), the model family
checked, and static MoE dispatch equal to the sparse one."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cgsvc_worker import tp
from cgsvc_worker.engine import Engine, EngineOptions, PlanMismatch, PlanView
from cgsvc_worker.fidelity import PLAN_FIELDS, STATUSES
from cgsvc_worker.model import MoE

from cgsvc.plan import Plan
from cgsvc.resolve import resolve
from cgsvc.spec import parse_spec
from tests.conftest import ROOT

# Plan fields that describe the plan rather than what a worker runs.
PLAN_METADATA = {"policy", "policy_version", "plan_hash", "locked", "decisions", "warnings", "estimates"}


def every_field_spec(model_path: str) -> dict[str, Any]:
    """A spec that sets every plan field explicitly (as the issue's new user did)."""
    return {"model": {"path": model_path}, "hardware": {"gpu": "H200", "gpu_count": 1}, "parallelism": {"tp": 1},
            "features": {"kv_cache_dtype": "fp8_e4m3", "chunked_prefill_size": 8},
            "overrides": {"attention_backend": "flashinfer",
                          "cuda_graph": {"prefill": {"backend": "tc_piecewise", "num_tokens": [8, 16, 32]},
                                         "decode": {"backend": "full", "bs": [1, 2, 4]}}}}


def _leaves(d: dict[str, Any], prefix: str = "") -> set[str]:
    out: set[str] = set()
    for k, v in d.items():
        if k in PLAN_METADATA:
            continue
        if isinstance(v, dict):
            out |= _leaves(v, f"{prefix}{k}.")
        else:
            out.add(prefix + k)
    return out


def test_every_plan_field_has_a_fidelity_entry(checkpoints: dict[str, str]) -> None:
    """Derived from the plan type: a new plan field without a fidelity entry fails here."""
    plan = resolve(parse_spec(every_field_spec(checkpoints["tiny"])))
    settings = _leaves(plan.body())
    assert settings == set(PLAN_FIELDS)
    assert len(dataclasses.fields(Plan)) - len(PLAN_METADATA) == len(PLAN_FIELDS)
    engine = Engine(checkpoints["tiny"], tp.single(), PlanView.from_json({"plan": plan.to_dict()}), EngineOptions())
    report = engine.describe()["plan_fidelity"]
    assert [f["field"] for f in report] == list(PLAN_FIELDS)
    for f in report:
        assert set(f) == {"field", "requested", "effective", "status", "reason"}
        assert f["status"] in STATUSES and (f["status"] == "honoured" or f["reason"]), f


def test_a_plan_with_every_field_set_is_honoured_or_explained(checkpoints: dict[str, str], tmp_path: Path) -> None:
    """The issue's scenario: resolve a spec that sets every field, hand the plan to
    `cgsvc-worker generate`, read the report. On the two-layer checkpoint (a dense layer and an
    MoE layer): the planned compile is most of the test's time (38 s against 48 s on four
    layers, cold inductor cache)."""
    model = checkpoints["tiny-2-layers"]
    plan = resolve(parse_spec(every_field_spec(model)))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"plan": plan.to_dict(), "spec": every_field_spec(model)}))
    prompts = tmp_path / "prompts.json"
    prompts.write_text(json.dumps([list(range(2, 22)), list(range(40, 51))]))  # 20 and 11 tokens
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "generate", "--model-path", model,
                           "--plan", str(plan_path), "--prompts", str(prompts), "--max-new-tokens", "4",
                           "--page-size", "4", "--output", str(out)], capture_output=True, text=True, cwd=ROOT,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    fid = {f["field"]: f for f in r["plan_fidelity"]}
    assert fid["kv_cache_dtype"] == {**fid["kv_cache_dtype"], "effective": "fp8_e4m3", "status": "honoured"}
    assert r["kv_cache"]["ratio_vs_model_dtype"] == 4.0 and r["kv_cache"]["stored_as"] == "float8_e4m3fn"
    assert fid["chunked_prefill_size"]["status"] == "honoured"
    # 8-token steps, earliest request first: [0:8] [8:16] [16:20]+[0:4] [4:11]
    assert [q["prefill_chunks"] for q in r["requests"]] == [3, 2]
    assert r["steps"]["prefill"]["by_size"] == {"8": 4} and r["steps"]["prefill"]["padded_rows"] == 1
    assert r["steps"]["decode"]["by_size"] == {"2": 3}
    for field in ("attention_backend.prefill", "attention_backend.decode", "prefill.backend", "decode.backend"):
        assert fid[field]["status"] == "substituted" and fid[field]["reason"], fid[field]  # a CPU
    assert fid["decode.bs"]["effective"] == [1, 2, 4]
    # chunks of 8 tokens: no prefill step can reach 16 or 32, and the report says so
    assert fid["prefill.num_tokens"]["status"] == "substituted" and fid["prefill.num_tokens"]["effective"] == [8]
    assert "exceed chunked_prefill_size (8)" in fid["prefill.num_tokens"]["reason"]
    assert "plan fidelity (fields not honoured as planned)" in proc.stderr
    assert "decode.backend" in proc.stderr and "kv_cache_dtype" not in proc.stderr
    # the values spelt as the report and `launches show` spell them: JSON, not Python's repr
    assert '"full" -> "static_eager"' in proc.stderr and "None" not in proc.stderr, proc.stderr


def test_capture_sizes_padding_and_eager_steps(checkpoints: dict[str, str]) -> None:
    plan = PlanView(decode_backend="full", decode_max_bs=4, decode_bs=[2, 4], prefill_backend="disabled")
    engine = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(page_size=4, cpu_decode="trace"))
    ref = Engine(checkpoints["tiny"], tp.single(), PlanView(), EngineOptions(page_size=4))
    prompts = [[3 + i, 4, 5 + i] for i in range(5)]
    for eng in (engine, ref):
        eng.prefill([0, 1, 2, 3, 4], prompts)
    a = engine.decode([0], [7])  # 1 -> padded to 2
    b = engine.decode([0, 1, 2], [7, 8, 9])  # 3 -> padded to 4
    c = engine.decode([0, 1, 2, 3, 4], [7, 8, 9, 10, 11])  # 5 > max_bs: eager
    ra, rb, rc = ref.decode([0], [7]), ref.decode([0, 1, 2], [7, 8, 9]), ref.decode([0, 1, 2, 3, 4], [7, 8, 9, 10, 11])
    for got, want in ((a, ra), (b, rb), (c, rc)):
        assert torch.allclose(got, want, atol=1e-4, rtol=1e-4)
    steps = engine.describe()["steps"]
    assert steps["decode"]["by_size"] == {"2": 1, "4": 1} and steps["decode"]["padded_rows"] == 2
    assert steps["decode"]["eager"] == {"batch above decode.max_bs (4)": 1}
    assert steps["prefill"]["eager"] == {"prefill.backend is disabled": 1}
    assert engine.decode_mode.effective == "static_compiled"
    assert engine.decode_mode.compiled_sizes == [2, 4]  # compiled on first use, once per size


def test_compiled_decode_sizes_the_run_reaches_are_compiled_before_it_is_timed(checkpoints: dict[str, str]) -> None:
    """With --cpu-decode trace|inductor each planned size compiled on the first step that used
    it: inside the timed run, so that step's TPOT (seconds, against milliseconds) was the
    compiler's. The capture now compiles the sizes a run of `decode_rows` rows reaches; a size
    compiled later all the same is named in a note."""
    plan = PlanView(decode_backend="full", decode_max_bs=8, decode_bs=[2, 4, 8], prefill_backend="disabled")
    engine = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(page_size=4, cpu_decode="trace"))
    engine.capture(decode_rows=3)  # 1, 2 -> 2; 3 -> 4: size 8 is never reached
    assert engine.decode_mode.compiled_sizes == [2, 4] and engine.decode_mode.capture_seconds > 0
    engine.prefill([0, 1, 2], [[3, 4, 5], [6, 7], [8]])
    engine.decode([0], [7])
    engine.decode([0, 1, 2], [7, 8, 9])
    assert engine.decode_mode.compiled_sizes == [2, 4]
    assert not any("compiled on first use" in n for n in engine.describe()["notes"])
    counted: list[tuple[int, int]] = []
    again = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(page_size=4, cpu_decode="trace"))
    again.capture(decode_rows=8, on_size=lambda done, total: counted.append((done, total)))
    assert counted == [(0, 3), (1, 3), (2, 3), (3, 3)]  # the total first, then each size as it is compiled
    late = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(page_size=4, cpu_decode="trace"))
    late.capture(decode_rows=1)
    late.prefill([0, 1, 2], [[3, 4, 5], [6, 7], [8]])
    late.decode([0, 1, 2], [7, 8, 9])
    assert late.decode_mode.compiled_sizes == [2, 4]
    (note,) = [n for n in late.describe()["notes"] if "compiled on first use" in n]
    assert "decode size 4" in note and "timed" in note, note


def test_the_capture_says_what_it_will_do_before_it_does_it(checkpoints: dict[str, str]) -> None:
    """The rank log said "capturing the planned sizes" and nothing more for the 105 s a CPU spent
    compiling a plan's prefill pieces; the line now says what the capture is about to do."""
    decode = PlanView(decode_backend="full", decode_max_bs=8, decode_bs=[2, 4, 8], prefill_backend="disabled")
    traced = Engine(checkpoints["tiny"], tp.single(), decode, EngineOptions(page_size=4, cpu_decode="trace"))
    assert traced.capture_work(decode_rows=3) == "decode compiled with torch.compile (trace) at batch sizes 2, 4"
    eager = Engine(checkpoints["tiny"], tp.single(), decode, EngineOptions(page_size=4))
    assert eager.capture_work(decode_rows=3) == "nothing to capture or compile (decode static_eager, prefill disabled)"
    pieces = PlanView(prefill_backend="tc_piecewise", prefill_num_tokens=[8, 16], prefill_max_num_tokens=16)
    piecewise = Engine(checkpoints["tiny"], tp.single(), pieces, EngineOptions(page_size=4))
    assert piecewise.capture_work(decode_rows=1) == ("the prefill pieces compiled with torch.compile (inductor, "
                                                     "dynamic shapes) at 8 tokens; minutes on a cold compile cache")


def test_plan_for_another_family_is_refused_naming_both(checkpoints: dict[str, str], tmp_path: Path) -> None:
    from cgsvc_worker.checkpoint import make_checkpoint

    v2 = {"plan": {"prefill": {"backend": "disabled"}, "decode": {"backend": "disabled"},
                   "attention_backend": {"prefill": "torch_native", "decode": "torch_native"}},
          "spec": {"model": {"name": "deepseek-ai/DeepSeek-V2-Lite"}, "hardware": {"gpu": "H100"}}}
    with pytest.raises(PlanMismatch, match=r"DeepSeek-V2-Lite \(DeepseekV2ForCausalLM\) \(DeepSeek-V2 family\); "
                                           r"the checkpoint is DeepseekV3ForCausalLM \(DeepSeek-V3 family\)"):
        Engine(checkpoints["tiny"], tp.single(), PlanView.from_json(v2), EngineOptions())
    v2_ckpt = make_checkpoint(str(tmp_path / "v2"), "tiny-v2")
    assert Engine(v2_ckpt, tp.single(), PlanView.from_json(v2), EngineOptions()).notes == []  # V2 plan, V2 model
    kimi = {**v2, "spec": {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300"}}}
    Engine(checkpoints["tiny"], tp.single(), PlanView.from_json(kimi), EngineOptions())  # Kimi wraps V3: accepted


def test_a_plan_value_outside_its_closed_set_is_refused_not_run_as_something_else() -> None:
    """prefill.backend "warp" ran as `breakable` on a GPU with no reason given, and on a CPU was
    reported as substituted because CUDA graphs need a GPU: a value that is no backend at all. A
    plan file is now refused on the field, with the values it may hold; a hand-written plan's
    other spelling (FULL) is read as the plan's own, as spec values are."""
    plan = {"prefill": {"backend": "disabled"}, "decode": {"backend": "FULL"},
            "attention_backend": {"prefill": "FA3", "decode": "torch_native"}, "kv_cache_dtype": "Auto"}
    view = PlanView.from_json({"plan": plan})
    assert (view.decode_backend, view.attention_prefill, view.kv_cache_dtype) == ("full", "fa3", "auto")
    for field, bad in (("prefill.backend", {"prefill": {"backend": "warp"}}),
                       ("decode.backend", {"decode": {"backend": "breakable"}}),
                       ("attention_backend.decode", {"attention_backend": {"prefill": "fa3", "decode": "nope"}}),
                       ("kv_cache_dtype", {"kv_cache_dtype": "int3"})):
        with pytest.raises(PlanMismatch, match=rf"^{field}: '\w+' is not one of the plan's values \("):
            PlanView.from_json({"plan": {**plan, **bad}})
    with pytest.raises(PlanMismatch, match=r"^decode.max_bs: -4 is below 0"):  # every batch would have run eagerly
        PlanView.from_json({"plan": {**plan, "decode": {"backend": "full", "max_bs": -4, "bs": [1, 2]}}})


@pytest.mark.parametrize("tokens", [1, 3, 64])  # gather path (T * k <= experts), dense path
def test_static_moe_dispatch_equals_sparse(checkpoints: dict[str, str], tokens: int) -> None:
    engine = Engine(checkpoints["tiny"], tp.single(), PlanView(), EngineOptions())
    moe = engine.model.layers[1].mlp
    assert isinstance(moe, MoE)
    x = torch.randn(tokens, engine.cfg.hidden_size, generator=torch.Generator().manual_seed(tokens))
    with torch.inference_mode():
        assert torch.allclose(moe(x, static=True), moe(x, static=False), atol=1e-5, rtol=1e-5)


def test_chunk_larger_than_the_cache_is_cut_and_reported(checkpoints: dict[str, str]) -> None:
    plan = PlanView(chunked_prefill_size=100_000)
    engine = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(kv_cache_bytes=1 << 20, page_size=4))
    (row,) = [f for f in engine.describe()["plan_fidelity"] if f["field"] == "chunked_prefill_size"]
    assert row["status"] == "substituted" and row["effective"] == engine.cache.capacity_tokens
    assert "exceed the KV cache" in row["reason"]


def test_prefill_sizes_no_step_can_reach_are_reported(checkpoints: dict[str, str]) -> None:
    plan = PlanView(prefill_backend="tc_piecewise", prefill_num_tokens=[8, 16, 64], prefill_max_num_tokens=64,
                    chunked_prefill_size=16)
    engine = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(allow_compile=False))
    (row,) = [f for f in engine.describe()["plan_fidelity"] if f["field"] == "prefill.num_tokens"]
    assert row["status"] == "not_applicable"  # --no-compile: prefill runs eagerly, sizes do not apply
    engine = Engine(checkpoints["tiny"], tp.single(), PlanView(**{**plan.__dict__, "prefill_backend": "breakable"}),
                    EngineOptions())
    assert engine.prefill_sizes == [8, 16]
    assert engine.substitutions["prefill.num_tokens"][1].startswith("sizes [64] exceed chunked_prefill_size (16)")
