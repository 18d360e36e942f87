"""`cgsvc-worker` as a user runs it: real processes, reports, exit codes, bad input."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.conftest import ROOT
from tests.workers.reference import hf_greedy, hf_model

PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [100, 200, 300]]


def worker(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def generate(tmp: Path, model: str, *extra: str, tp: int = 1, prompts: Any = PROMPTS, new: int = 5) -> tuple[int, dict[str, Any]]:
    pf, out = tmp / "prompts.json", tmp / f"out-{tp}.json"
    pf.write_text(json.dumps(prompts))
    proc = worker("generate", "--model-path", model, "--tp", str(tp), "--prompts", str(pf), "--max-new-tokens",
                  str(new), "--output", str(out), *extra)
    assert "Traceback" not in proc.stderr or proc.returncode != 0, proc.stderr
    return proc.returncode, json.loads(out.read_text())


def plan_file(tmp: Path, prefill: str = "disabled", decode: str = "full", attention: str = "trtllm_mla",
              spec: dict[str, Any] | None = None) -> str:
    plan = {"policy_version": "p", "plan_hash": "h", "attention_backend": {"prefill": attention, "decode": attention},
            "prefill": {"backend": prefill, "max_num_tokens": 64, "num_tokens": [4, 8, 16] if prefill != "disabled" else []},
            "decode": {"backend": decode, "max_bs": 8, "bs": [1, 2, 4, 8] if decode != "disabled" else []}}
    path = tmp / "plan.json"
    path.write_text(json.dumps({"plan": plan, **({"spec": spec} if spec else {})}))
    return str(path)


def test_tp4_generate_equals_tp1_and_transformers(checkpoints: dict[str, str], tmp_path: Path) -> None:
    rc1, r1 = generate(tmp_path, checkpoints["tiny"])
    rc4, r4 = generate(tmp_path, checkpoints["tiny"], tp=4)
    assert rc1 == rc4 == 0 and r1["status"] == r4["status"] == "ok"
    tokens = [r["output_tokens"] for r in r4["requests"]]
    assert tokens == [r["output_tokens"] for r in r1["requests"]]
    ref = hf_model(checkpoints["tiny"], torch.float32)
    assert tokens == [hf_greedy(ref, p, 5)[0] for p in PROMPTS]
    assert r4["tp"] == 4 and r4["aggregate"]["output_tokens"] == 10
    for r in r4["requests"]:
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0


def test_report_says_what_ran(checkpoints: dict[str, str], tmp_path: Path) -> None:
    kimi_spec = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300"}}
    rc, r = generate(tmp_path, checkpoints["tiny-kimi"], "--plan", plan_file(tmp_path, spec=kimi_spec))
    assert rc == 0, r
    assert r["modes"]["decode"] == {**r["modes"]["decode"], "requested": "full", "effective": "static_eager"}
    assert "CUDA" in r["modes"]["decode"]["reason"] and r["modes"]["decode"]["compiled_sizes"] == []
    assert r["steps"]["decode"]["by_size"] == {"2": 4}  # the planned size a batch of 2 pads to
    assert r["attention"]["prefill"]["requested"] == "trtllm_mla"
    assert r["attention"]["prefill"]["effective"] == "torch_native" and r["attention"]["prefill"]["reason"]
    assert r["kv_cache"]["values_per_token_per_layer"] == 64 + 32
    assert any("vision" in n for n in r["notes"])
    assert any("vision_tower (1 tensor)" in n for n in r["notes"]), r["notes"]  # it read "(1 tensors)"
    for key in ("ttft_ms", "tpot_ms"):
        assert set(r["aggregate"][key]) == {"mean", "p50", "p90", "p99"}


def test_tc_piecewise_prefill_compiles_on_cpu(checkpoints: dict[str, str], tmp_path: Path) -> None:
    # two layers, one of each kind: the inductor compile is most of this test's time
    model = checkpoints["tiny-2-layers"]
    rc, eager = generate(tmp_path, model)
    rc2, compiled = generate(tmp_path, model, "--plan", plan_file(tmp_path, prefill="tc_piecewise"))
    assert rc == rc2 == 0, compiled
    assert compiled["modes"]["prefill"]["effective"] == "tc_piecewise_nograph"
    assert compiled["modes"]["prefill"]["capture_seconds"] > 0
    assert [r["output_tokens"] for r in compiled["requests"]] == [r["output_tokens"] for r in eager["requests"]]


def test_bench_command(checkpoints: dict[str, str], tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    proc = worker("bench", "--model-path", checkpoints["tiny"], "--input-len", "32", "--output-len", "4",
                  "--requests", "3", "--concurrency", "1", "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["workload"]["concurrency"] == 1 and len(r["requests"]) == 3
    assert all(len(x["output_tokens"]) == 4 and x["prompt_tokens"] == 32 for x in r["requests"])


def test_a_long_prefill_says_how_far_it_has_got(checkpoints: dict[str, str], tmp_path: Path) -> None:
    """A prompt prefilled in many chunks is one engine step after another with no token out:
    the log said nothing between "running" and the first token (minutes, for a 100k-token
    prompt on a CPU), so a launch looked hung at 0 tokens. Rank 0 now says the prompt tokens
    prefilled so far, at most every --log-every seconds (0: every step)."""
    path = Path(plan_file(tmp_path, decode="disabled"))
    plan = json.loads(path.read_text())
    plan["plan"]["chunked_prefill_size"] = 8
    path.write_text(json.dumps(plan))
    proc = worker("bench", "--model-path", checkpoints["tiny"], "--input-len", "20", "--output-len", "2",
                  "--requests", "2", "--concurrency", "1", "--plan", str(path),
                  "--log-every", "0", "--output", str(tmp_path / "bench.json"))
    assert proc.returncode == 0, proc.stderr
    said = [line.split("rank 0: ", 1)[1] for line in proc.stderr.splitlines() if "rank 0: " in line]
    # 2 requests of 20 prompt tokens in chunks of 8: 8, 16, 20 for the first, then 28, 36, 40
    for done in (8, 16, 20, 28, 36, 40):
        assert any(f"{done} of 40 prompt tokens prefilled" in line for line in said), said
    assert said[-1].startswith("4 of 4 tokens generated, 2 of 2 requests done, 40 of 40 prompt tokens prefilled")
    with_default = worker("bench", "--model-path", checkpoints["tiny"], "--input-len", "20", "--output-len", "2",
                          "--requests", "1", "--plan", str(path))
    assert with_default.returncode == 0 and "prompt tokens prefilled" in with_default.stderr  # the last line
    assert "8 of 20 prompt tokens prefilled" not in with_default.stderr  # not every step: every 5 s


def test_a_workload_larger_than_the_kv_cache_queues_and_says_so(checkpoints: dict[str, str], tmp_path: Path) -> None:
    """Four requests at once, a cache with room for two (7 pages of 4 tokens, 1536 bytes a token
    here): the run failed "KV cache exhausted"; now two wait, and the report says so."""
    out = tmp_path / "bench.json"
    proc = worker("bench", "--model-path", checkpoints["tiny"], "--input-len", "6", "--output-len", "4",
                  "--requests", "4", "--concurrency", "0", "--page-size", "4", "--kv-cache-mb", "0.042",
                  "--output", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["kv_cache"]["pages"] == 7 and r["aggregate"]["waited_for_kv"] == 2
    assert all(len(x["output_tokens"]) == 4 for x in r["requests"])
    note = "2 of 4 requests waited for room in the KV cache (6 pages of 4 tokens on each rank) before their prefill"
    assert any(n.startswith(note) for n in r["notes"]) and note in proc.stderr, r["notes"]


def test_a_group_nobody_follows_is_stopped_with_a_report_saying_why(checkpoints: dict[str, str],
                                                                    tmp_path: Path) -> None:
    """--unfollowed-after: a group (one rank here, supervised all the same) whose --follow-file
    nobody touches stops, and its report says why (test_unfollowed_counts_from_the_last_touch: a
    recent touch keeps it going)."""
    out, follow = tmp_path / "bench.json", tmp_path / "followed"
    proc = worker("bench", "--model-path", checkpoints["tiny"], "--input-len", "8", "--output-len", "100000",
                  "--requests", "1", "--output", str(out), "--follow-file", str(follow), "--unfollowed-after", "2")
    assert proc.returncode == 1, proc.stderr
    r = json.loads(out.read_text())
    assert r["status"] == "failed" and r["error_kind"] == "Unfollowed", r
    assert "no cgsvc server followed this group for" in r["error"] and "limit is 2 s" in r["error"]
    assert "no cgsvc server followed this group" in proc.stderr


def test_unfollowed_after_without_a_follow_file_is_refused(checkpoints: dict[str, str]) -> None:
    for extra in (["--unfollowed-after", "5"], ["--unfollowed-after", "-1", "--follow-file", "/tmp/x"]):
        proc = worker("bench", "--model-path", checkpoints["tiny"], "--requests", "1", *extra)
        assert proc.returncode == 2 and "--unfollowed-after" in proc.stderr and "--follow-file" in proc.stderr, proc


@pytest.mark.parametrize(("args", "said"), [
    (("bench", "--input-len", "0"), "--input-len must be at least 1, got 0"),  # was an IndexError inside a rank
    (("bench", "--output-len", "0"), "--output-len must be at least 1, got 0"),  # was a report of nothing generated
    (("bench", "--requests", "0"), "--requests must be at least 1, got 0"),  # was an "ok" report of no requests
    (("bench", "--concurrency", "-1"), "--concurrency must be 0 (all) or more, got -1"),  # was torch.cat's error
    (("bench", "--tp", "0"), "--tp must be at least 1, got 0"),
    (("bench", "--log-every", "-1"), "--log-every must be 0 (every step) or more, got -1"),
    # was a ValueError report from each rank after it loaded, three JSON objects on standard output
    (("bench", "--tp", "3"), "--tp 3 does not divide the checkpoint's 8 attention heads or 512 vocabulary rows or "
                             "8 routed experts; valid: 1, 2, 4, 8"),
    (("generate", "--prompts", "p.json", "--max-new-tokens", "0"), "--max-new-tokens must be at least 1, got 0"),
    (("check-graphs", "--kv-cache-mb", "0"), "--kv-cache-mb must be auto or more than 0, got 0"),
])
def test_a_flag_out_of_bounds_is_refused_by_name_before_any_rank_starts(checkpoints: dict[str, str],
                                                                        args: tuple[str, ...], said: str) -> None:
    proc = worker(*args[:1], "--model-path", checkpoints["tiny"], *args[1:], timeout=60)
    assert (proc.returncode, proc.stdout) == (2, ""), proc
    assert proc.stderr.strip() == f"cgsvc-worker: {said}", proc.stderr


def test_a_group_that_fails_without_output_prints_one_report(checkpoints: dict[str, str], tmp_path: Path) -> None:
    """Standard output holds one JSON object, rank 0's (docs/worker-report.md); every rank's
    failure report was printed there, one after another, which no JSON reader takes."""
    model = tmp_path / "m"
    shutil.copytree(checkpoints["tiny"], model)
    config = json.loads((model / "config.json").read_text())
    config["kv_lora_rank"] = 48  # every rank fails to load it
    (model / "config.json").write_text(json.dumps(config))
    proc = worker("bench", "--model-path", str(model), "--tp", "2", "--requests", "1", "--output-len", "2")
    assert proc.returncode == 2, proc.stderr
    report = json.loads(proc.stdout)  # one object: a second would be "Extra data"
    assert report["status"] == "failed" and "the model expects" in report["error"], report
    assert "cgsvc-worker: rank 1: " in proc.stderr and "the model expects" in proc.stderr, proc.stderr


def test_unfollowed_counts_from_the_last_touch(tmp_path: Path) -> None:
    from cgsvc_worker.supervisor import Unfollowed

    follow = tmp_path / "followed"
    watch = Unfollowed(str(follow), 5)
    assert watch.lapsed() == ""  # just started: counted from the start while there is no file
    watch.since -= 60
    assert "for 60 s" in watch.lapsed()
    follow.touch()
    assert watch.lapsed() == ""  # touched now
    os.utime(follow, (time.time() - 30, time.time() - 30))
    assert "for 30 s" in watch.lapsed() and "limit is 5 s" in watch.lapsed()
    assert Unfollowed(str(follow), 0).lapsed() == "" and Unfollowed("", 5).lapsed() == ""  # no limit, no file


@pytest.mark.parametrize("case", ["missing_tensor", "shape_mismatch", "unsupported_arch", "other_model",
                                  "too_long", "kv_exhausted", "bad_prompts"])
def test_bad_input_fails_clearly(checkpoints: dict[str, str], tmp_path: Path, case: str) -> None:
    model = str(tmp_path / "m")
    shutil.copytree(checkpoints["tiny"], model)
    cfg_path = Path(model) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    extra: list[str] = []
    tp, prompts, expect = 1, PROMPTS, ""
    if case == "missing_tensor":
        from safetensors.torch import load_file, save_file
        t = load_file(f"{model}/model.safetensors")
        del t["model.layers.2.self_attn.kv_b_proj.weight"]
        save_file(t, f"{model}/model.safetensors")
        expect = "missing tensor 'model.layers.2.self_attn.kv_b_proj.weight'"
    elif case == "shape_mismatch":
        cfg["kv_lora_rank"] = 48
        expect = "the model expects"
    elif case == "unsupported_arch":
        cfg["architectures"] = ["LlamaForCausalLM"]
        expect = "unsupported architecture 'LlamaForCausalLM'"
    elif case == "other_model":
        extra = ["--plan", plan_file(tmp_path, spec={"model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
                                                     "hardware": {"gpu": "H100"}})]
        expect = "(LlamaForCausalLM), which this worker does not run"
    elif case == "too_long":
        extra, expect = ["--context-length", "8"], "exceed the context of 8 tokens"
    elif case == "kv_exhausted":
        extra, expect = ["--kv-cache-mb", "0.02", "--page-size", "4"], "KV cache exhausted"
    elif case == "bad_prompts":
        prompts, expect = [[1, 2], "x"], "--prompts must be"
    cfg_path.write_text(json.dumps(cfg))
    rc, report = generate(tmp_path, model, *extra, tp=tp, prompts=prompts)
    assert rc != 0
    assert report["status"] == "failed" and expect in report["error"], report
    assert "requests" not in report  # no partial output passed off as complete


def test_a_ranks_group_devices_are_all_visible_to_it_and_it_uses_its_own() -> None:
    """Each rank saw its own GPU alone (CUDA_VISIBLE_DEVICES=6, as cuda:0). NCCL then cannot open
    CUDA IPC between the ranks' GPUs and falls back from NVLink P2P to host shared memory, which
    would have put every decode all-reduce of a TP4 launch through the host. As vLLM and sglang
    do, every rank now sees the group's devices and takes its own by LOCAL_RANK; another group's
    devices stay invisible. A CPU slot still sees no GPU."""
    from cgsvc_worker.runtime import device_name
    from cgsvc_worker.supervisor import rank_environment

    env = rank_environment(2, 4, 29500, ["4", "5", "6", "7"])
    assert (env["CUDA_VISIBLE_DEVICES"], env["LOCAL_RANK"], env["RANK"]) == ("4,5,6,7", "2", "2")
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"  # the ids as nvidia-smi, which made the inventory, numbers them
    cpu = rank_environment(1, 2, 29500, ["cpu0", "cpu1"])
    assert (cpu["CUDA_VISIBLE_DEVICES"], cpu["LOCAL_RANK"]) == ("", "0")
    assert "CUDA_VISIBLE_DEVICES" not in rank_environment(0, 1, 29500, [])  # no devices given: as found
    # the server's name for a rank's device: its own GPU among those visible, or cpu
    assert device_name({"device": "cuda:2", "visible_devices": "4,5,6,7"}) == "6"
    assert device_name({"device": "cuda:0", "visible_devices": "3"}) == "3"  # Ray: one GPU an actor
    assert device_name({"device": "cuda:1", "visible_devices": ""}) == "1"
    assert device_name({"device": "cpu", "visible_devices": ""}) == "cpu"
    # GPU ids given on a machine without CUDA (the dispatcher tests): the rank's own by LOCAL_RANK
    assert device_name({"device": "cpu", "visible_devices": "4,5,6,7", "local_rank": 2}) == "6"
    # Ray assigns each rank actor a GPU of its own; the group's view is made from them, in rank order
    from cgsvc_worker.ray_group import group_gpus

    assert group_gpus(["3", "1", "0", "2"], 1) == {"CUDA_VISIBLE_DEVICES": "3,1,0,2", "LOCAL_RANK": "1"}
    assert group_gpus(["", "", "", ""], 0) == {} and group_gpus(["0,1", "2,3"], 0) == {}  # CPU bundles; 2 a rank
