"""`make gpu-check` on a machine without a GPU: it runs what a CPU can and lists the rest; and
the engine's bookkeeping of sizes that failed to capture (the GPU cannot run here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from cgsvc_worker.engine import Engine
from cgsvc_worker.graphs import PhaseMode

from tests.conftest import ROOT

GPU_SECTIONS = ("nccl_graph", "trtllm_substitution", "flashinfer_vs_native", "decode_graphs", "check_graphs",
                "prefill_modes", "fp8_kv", "generate_cli")


def test_gpu_check_on_a_cpu_lists_what_needs_a_gpu(tmp_path: Path) -> None:
    if torch.cuda.is_available():  # pragma: no cover - the GPU machine runs the real thing
        return
    proc = subprocess.run([sys.executable, "bench/gpu_check.py", "--out", str(tmp_path), "--budget", "300"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {s["name"]: s["status"] for s in result["sections"]}
    assert status["versions"] == "ok" and status["check_graphs_cpu"] == "ok"
    # a launch through the service runs on a CPU too: what it reports is what a GPU run is read for
    launch = next(s for s in result["sections"] if s["name"] == "service_launch")
    assert status["service_launch"] == "ok", launch
    assert launch["data"]["state"] == "SUCCEEDED" and launch["data"]["dtype"] == "float32", launch["data"]
    assert launch["data"]["dtype_reason"] == "auto: float32 on cpu (the reference numerics)"
    # what a GPU run is read for on the capture and the warm-up: the bar's count, the timings, the log
    capture, timings, said = launch["data"]["capture"], launch["data"]["timings"], launch["data"]["rank0_log"]
    assert capture["done"] == capture["total"] and timings["warmup_s"] > 0 and "capture_s" in timings, launch["data"]
    assert any("capturing: " in x for x in said) and any("warmed up in" in x for x in said), said
    assert {n: status[n] for n in GPU_SECTIONS} == {n: "needs a GPU" for n in GPU_SECTIONS}
    cpu = next(s for s in result["sections"] if s["name"] == "check_graphs_cpu")
    assert all(row["capturable"] for row in cpu["data"]["table"])
    assert "### decode_graphs: needs a GPU" in (tmp_path / "gpu_check.md").read_text()


def test_a_size_that_failed_to_capture_is_reported_not_claimed() -> None:
    mode = PhaseMode("full", "full")
    Engine._captured(mode, [1, 2], {4: "RuntimeError: operation not permitted when stream is capturing"}, 0.5, 1024)
    assert mode.effective == "full" and mode.captured_sizes == [1, 2]
    assert mode.capture_failures == {"4": "RuntimeError: operation not permitted when stream is capturing"}
    nothing = PhaseMode("full", "full")
    Engine._captured(nothing, [], {1: "RuntimeError: x"}, 0.1, 0)
    assert nothing.effective == "disabled" and "no size could be captured" in nothing.reason
