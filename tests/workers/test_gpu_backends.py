"""The GPU attention backends' bookkeeping on a CPU, against FlashInfer's kernel contracts
written in torch (reference_kernels.py): page tables, the static buffers and per-size wrappers
that CUDA graphs need, padding rows on the scratch page, fp8 scales, trtllm-gen layouts, and
the honest choice (and refusal) of a backend. The kernels themselves run in `make gpu-check`."""

from __future__ import annotations

import pytest
import torch
from cgsvc_worker import tp
from cgsvc_worker.attention import (
    FlashInferMLA,
    TrtllmMLA,
    decode_meta,
    select_backend,
    trtllm_problem,
)
from cgsvc_worker.engine import Engine, EngineOptions, PlanView
from cgsvc_worker.kv_cache import kv_format

from tests.workers import reference_kernels as ref
from tests.workers.reference import rel_err

PROMPTS = [[5, 6, 7, 8, 9, 10, 11, 12, 13], [100, 200, 300], [42] * 20]


def engine(path: str, page_size: int = 16, kv: str = "auto") -> Engine:
    return Engine(path, tp.single(), PlanView(kv_cache_dtype=kv), EngineOptions(dtype="bfloat16", page_size=page_size))


def flashinfer(e: Engine) -> FlashInferMLA:
    attn = e.model.layers[0].self_attn
    return FlashInferMLA(torch.device("cpu"), e.cache, attn.heads, e.cfg.kv_lora_rank, e.cfg.qk_rope_head_dim,
                         e.cfg.softmax_scale, e.dtype, kernels=ref.mla)


def teacher_forced(a: Engine, b: Engine, steps: int = 4) -> list[float]:
    """Relative errors of b's logits against a's, both fed a's greedy tokens."""
    ids = list(range(len(PROMPTS)))
    la, lb = a.prefill(ids, PROMPTS), b.prefill(ids, PROMPTS)
    errs = [rel_err(lb, la)]
    for _ in range(steps):
        toks = la.argmax(-1).tolist()
        la, lb = a.decode(ids, toks), b.decode(ids, toks)
        errs.append(rel_err(lb, la))
    return errs


@pytest.mark.parametrize("kv", ["auto", "fp8_e4m3"])
def test_flashinfer_decode_bookkeeping_matches_torch_native(checkpoints: dict[str, str], kv: str) -> None:
    path = checkpoints["tiny-dense-bf16"]
    native, fi = engine(path, page_size=4, kv=kv), engine(path, page_size=4, kv=kv)
    fi.decode_backend = flashinfer(fi)
    assert max(teacher_forced(native, fi)) < 2e-2
    assert fi.decode_backend.plans == 4  # one host plan per step, shared by every layer


def test_flashinfer_graph_wrappers_use_static_buffers_and_padding_rows(checkpoints: dict[str, str]) -> None:
    """One wrapper per captured batch size, planned into its static buffers; padding rows
    attend to the scratch page and leave the real rows' results unchanged."""
    e = engine(checkpoints["tiny-dense-bf16"], page_size=4)
    backend = flashinfer(e)
    e.decode_backend = backend
    e.prefill([0, 1, 2], PROMPTS)
    cache = e.cache
    slots = torch.cat([cache.allocate(s, 1) for s in (0, 1, 2)])
    lens = [cache.seqs[s].length for s in (0, 1, 2)]
    pages = [list(cache.seqs[s].pages) for s in (0, 1, 2)]
    ids, pos = torch.tensor([1, 2, 3]), torch.tensor([n - 1 for n in lens])
    exact = decode_meta(cache, slots, lens, pages, 3, max(map(len, pages)))
    backend.plan(exact, None)
    with torch.inference_mode():
        want = e._decode_step(ids, pos, exact)
    backend.prepare_graph(8)
    wrapper, bufs = backend.graph_wrappers[8]
    padded = decode_meta(cache, slots, lens, pages, 8, 16)
    backend.plan(padded, 8)
    assert backend.current is wrapper and wrapper.use_cuda_graph
    assert bufs["kv_len_arr"].tolist() == lens + [1] * 5
    assert bufs["kv_indptr"].tolist()[-1] == sum(map(len, pages)) + 5
    assert bufs["kv_indices"][sum(map(len, pages)):sum(map(len, pages)) + 5].tolist() == [cache.SCRATCH_PAGE] * 5
    with torch.inference_mode():
        got = e._decode_step(torch.cat([ids, ids.new_zeros(5)]), torch.cat([pos, pos.new_zeros(5)]), padded)
    assert rel_err(got[:3], want) < 1e-2
    with pytest.raises(ValueError, match="fixed batch size"):  # a graph's wrapper serves one size only
        backend.plan(decode_meta(cache, slots, lens, pages, 3, 8), 8)


def test_trtllm_kernels_read_the_latent_pages(checkpoints: dict[str, str]) -> None:
    """trtllm_mla decode (absorbed, [pages, 32, C+R]) and ragged prefill (decompressed, causal
    at the end) give torch_native's logits, with chunked prefill's prefixes too."""
    path = checkpoints["tiny-dense-bf16"]
    native = engine(path, page_size=32)
    native.chunk_tokens = 8
    trt = engine(path, page_size=32)
    trt.chunk_tokens = 8
    trt.prefill_backend = trt.decode_backend = TrtllmMLA(torch.device("cpu"), trt.cfg, kernels=ref.Trtllm)
    ref.Trtllm.calls.clear()
    assert max(teacher_forced(native, trt)) < 2e-2
    kinds = {c["kind"] for c in ref.Trtllm.calls}
    assert kinds == {"decode", "prefill"} and all(c["page_size"] == 32 for c in ref.Trtllm.calls
                                                    if c["kind"] == "decode")


def test_trtllm_fp8_queries_match_the_fp8_cache(checkpoints: dict[str, str]) -> None:
    path = checkpoints["tiny-dense-bf16"]
    native, trt = engine(path, page_size=64, kv="fp8_e4m3"), engine(path, page_size=64, kv="fp8_e4m3")
    trt.decode_backend = TrtllmMLA(torch.device("cpu"), trt.cfg, kernels=ref.Trtllm)
    ref.Trtllm.calls.clear()
    assert max(teacher_forced(native, trt)) < 5e-2  # the query is quantised too, as the kernel needs
    assert {c["dtype"] for c in ref.Trtllm.calls} == {torch.float8_e4m3fn}


def test_backend_choice_on_hopper_and_blackwell(checkpoints: dict[str, str]) -> None:
    """As for an sm90 GPU (capability given): trtllm_mla is substituted with the reason;
    fp32 queries are refused by FlashInfer; prefill is reported as the SDPA that runs."""
    e = engine(checkpoints["tiny-dense-bf16"])
    cfg = type("Cfg", (), {"kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                           "softmax_scale": 0.07})()
    cpu, heads = torch.device("cpu"), 4
    fi, choice = select_backend("trtllm_mla", "decode", cpu, e.cache, cfg, heads, torch.bfloat16, ref.mla, (9, 0))
    assert isinstance(fi, FlashInferMLA) and choice.effective == "flashinfer"
    assert "sm100 / sm103 only; this GPU is sm90" in choice.reason
    _, pre = select_backend("trtllm_mla", "prefill", cpu, e.cache, cfg, heads, torch.bfloat16, ref.mla, (9, 0))
    assert pre.effective == "torch_native" and "torch SDPA" in pre.reason
    _, fp32 = select_backend("flashinfer", "decode", cpu, e.cache, cfg, heads, torch.float32, ref.mla, (9, 0))
    assert fp32.effective == "torch_native" and "fp16 / bf16 queries" in fp32.reason
    _, tiny = select_backend("flashinfer", "decode", cpu, e.cache, e.cfg, heads, torch.bfloat16, ref.mla, (9, 0))
    assert tiny.effective == "torch_native" and "kv_lora_rank % 128" in tiny.reason
    _, on_cpu = select_backend("flashinfer", "decode", cpu, e.cache, cfg, heads, torch.bfloat16)
    assert on_cpu.effective == "torch_native" and "need a CUDA device" in on_cpu.reason


def test_trtllm_rules_name_what_must_change() -> None:
    cfg = type("Cfg", (), {"kv_lora_rank": 512, "qk_rope_head_dim": 64})()
    bf16 = kv_format("auto", torch.bfloat16, 576)
    assert trtllm_problem((10, 0), cfg, torch.bfloat16, bf16, 64) == ""
    assert "pages of 32 or 64" in trtllm_problem((10, 0), cfg, torch.bfloat16, bf16, 16)
    assert "fp8_e4m3 KV" in trtllm_problem((10, 3), cfg, torch.bfloat16, kv_format("fp8_e5m2", torch.bfloat16, 576), 32)
    assert "computes in bfloat16" in trtllm_problem((10, 0), cfg, torch.float32, bf16, 32)
    assert "sm90" in trtllm_problem((9, 0), cfg, torch.bfloat16, bf16, 64)
