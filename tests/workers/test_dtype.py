"""The dtype a worker runs the model in: float32 on a CPU, 16-bit where the GPU kernels need it."""

from __future__ import annotations

import pytest
import torch
from cgsvc_worker import tp
from cgsvc_worker.config import load_model_config
from cgsvc_worker.engine import Engine, EngineOptions, PlanView, resolve_dtype


@pytest.mark.parametrize(("requested", "device", "checkpoint", "expect"), [
    ("auto", "cpu", "bfloat16", ("float32", "auto: float32 on cpu (the reference numerics)")),
    ("auto", "cuda", "bfloat16", ("bfloat16", "auto: bfloat16, the checkpoint's torch_dtype")),
    ("auto", "cuda", "float16", ("float16", "auto: float16, the checkpoint's torch_dtype")),
    # a float32 checkpoint (or one that names none) runs in bfloat16 on a GPU, whose MLA kernels
    # take 16-bit queries; it ran float32, so every GPU attention backend was substituted away
    ("auto", "cuda", "float32", ("bfloat16", "auto: bfloat16 on cuda (the checkpoint is float32; the GPU MLA "
                                              "kernels take 16-bit queries)")),
    ("auto", "cuda", "", ("bfloat16", "auto: bfloat16 on cuda (the checkpoint names no torch_dtype; the GPU MLA "
                                       "kernels take 16-bit queries)")),
    ("float32", "cuda", "bfloat16", ("float32", "asked for: --dtype float32")),
])
def test_dtype_auto_is_float32_on_a_cpu_and_sixteen_bits_on_a_gpu(requested: str, device: str, checkpoint: str,
                                                                  expect: tuple[str, str]) -> None:
    assert resolve_dtype(requested, torch.device(device), checkpoint) == expect


def test_the_report_says_which_dtype_auto_chose(checkpoints: dict[str, str]) -> None:
    engine = Engine(checkpoints["tiny-bf16"], tp.single(), PlanView(), EngineOptions())
    d = engine.describe()
    assert (d["dtype"], d["dtype_reason"]) == ("float32", "auto: float32 on cpu (the reference numerics)")
    assert not any("dtype" in n for n in d["notes"])  # a field of its own, not a note on every run
    assert load_model_config(checkpoints["tiny-bf16"]).torch_dtype == "bfloat16"
