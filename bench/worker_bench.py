"""The worker next to Hugging Face transformers and next to this CPU's own limit, in one run.

    .venv/bin/python bench/worker_bench.py [--prompt-len 512] [--new-tokens 64] [--dtype bfloat16]

Generates the ~160 M-parameter `bench` checkpoint (dense DeepSeek-V3 architecture), then, in
one process, same threads, side by side:

  * the bandwidth limit: a bf16 matrix-vector product over a 256 MiB matrix gives the bytes per
    second this CPU streams through a GEMV; the decode limit at batch 1 is that rate divided by
    the weight bytes one decode token reads (every weight once; one embedding row);
  * a second limit from the model's own matrices: one GEMV per weight matrix, back to back,
    nothing else (small matrices stream slower than one large one);
  * cgsvc_worker decode tokens/s at batch 1 and 8 (a plan without graphs; a plan's `full` decode
    on a CPU: the padded static step, eager by default or compiled with inductor), prefill time,
    against transformers' DeepseekV3ForCausalLM (its own cache, greedy loop);
  * the fp8_e4m3 latent cache: bytes per token, decode tokens/s, and its logits against the
    model-dtype cache (teacher-forced relative error, free-running greedy agreement);
  * TP4 over gloo next to TP1 through `cgsvc-worker bench`.

Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent


def timed(fn: Callable[[], Any], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gemv_bandwidth(dtype: torch.dtype, repeat: int = 7) -> float:
    """Bytes per second a matrix-vector product streams (a 256 MiB weight matrix, read once per call)."""
    w = torch.randn(16384, 8192, dtype=dtype)
    x = torch.randn(1, 8192, dtype=dtype)
    F.linear(x, w)
    return w.numel() * w.element_size() / timed(lambda: F.linear(x, w), repeat)


def gemv_floor(engine: Any, repeat: int = 9) -> float:
    """Seconds one decode token spends in matrix-vector products alone: every weight matrix of
    the model (the fused ones as fused) multiplied by one vector, back to back, nothing else."""
    from cgsvc_worker.layers import Linear, LMHead

    mats = [m.weight for m in engine.model.modules() if isinstance(m, Linear | LMHead)]
    xs = {w.shape[1]: torch.randn(1, w.shape[1], dtype=w.dtype) for w in mats}

    def sweep() -> None:
        for w in mats:
            F.linear(xs[w.shape[1]], w)

    sweep()
    return timed(sweep, repeat)


def weight_bytes_per_token(engine: Any) -> int:
    """Every parameter is read once per decode token, except the embedding table (one row)."""
    total = sum(p.numel() * p.element_size() for p in engine.model.parameters())
    emb = engine.model.embed_tokens.weight
    return total - emb.numel() * emb.element_size() + emb.shape[1] * emb.element_size()


def make_engine(path: str, dtype: str, **plan: Any) -> Any:
    from cgsvc_worker import tp
    from cgsvc_worker.engine import Engine, EngineOptions, PlanView

    cpu_decode = plan.pop("cpu_decode", "eager")
    return Engine(path, tp.single(), PlanView(**plan), EngineOptions(dtype=dtype, kv_cache_bytes=512 << 20,
                                                                   cpu_decode=cpu_decode))


def ours_decode(engine: Any, prompt: list[int], batch: int, new: int) -> tuple[float, list[list[int]]]:
    ids = list(range(100, 100 + batch))
    toks = engine.prefill(ids, [prompt] * batch).argmax(-1).tolist()
    toks = engine.decode(ids, toks).argmax(-1).tolist()  # warm (and compile, for the static step)
    out = [[t] for t in toks]
    t0 = time.perf_counter()
    for _ in range(new):
        toks = engine.decode(ids, toks).argmax(-1).tolist()
        for o, t in zip(out, toks, strict=True):
            o.append(t)
    elapsed = time.perf_counter() - t0
    for i in ids:
        engine.release(i)
    return batch * new / elapsed, out


def ours_prefill(engine: Any, prompt: list[int], repeat: int) -> float:
    seq = [0]

    def prefill() -> None:
        seq[0] += 1
        engine.prefill([seq[0]], [prompt])
        engine.release(seq[0])

    prefill()
    return timed(prefill, repeat)


def reference(path: str, dtype: str, prompt: list[int], new: int, repeat: int) -> dict[str, float]:
    from transformers import DeepseekV3ForCausalLM, DynamicCache

    model = DeepseekV3ForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    out: dict[str, float] = {}
    with torch.inference_mode():
        ids = torch.tensor([prompt])
        model(ids)
        out["prefill_ms"] = timed(lambda: model(ids, cache=DynamicCache(config=model.config)), repeat) * 1000
        for batch in (1, 8):
            ids = torch.tensor([prompt] * batch)
            cache = DynamicCache(config=model.config)
            tok = model(ids, cache=cache).logits[:, -1:].argmax(-1)
            tok = model(tok, cache=cache).logits[:, -1:].argmax(-1)  # warm
            t0 = time.perf_counter()
            for _ in range(new):
                tok = model(tok, cache=cache).logits[:, -1:].argmax(-1)
            out[f"decode_tok_s_bs{batch}"] = batch * new / (time.perf_counter() - t0)
    return out


def fp8_quality(path: str, dtype: str, prompt: list[int], new: int) -> dict[str, float]:
    """fp8 cache against the model-dtype cache: teacher-forced logits (both fed the model-dtype
    run's tokens) and free-running greedy agreement."""
    base, fp8 = make_engine(path, dtype), make_engine(path, dtype, kv_cache_dtype="fp8_e4m3")
    la, lb = base.prefill([0], [prompt]), fp8.prefill([0], [prompt])
    errs, agree = [], 0
    for _ in range(new):
        tok = la.argmax(-1).tolist()
        agree += int(la.argmax(-1) == lb.argmax(-1))
        errs.append(float((lb - la).norm() / la.norm()))
        la, lb = base.decode([0], tok), fp8.decode([0], tok)
    _, free_a = ours_decode(base, prompt, 1, new)
    _, free_b = ours_decode(fp8, prompt, 1, new)
    same = next((i for i, (a, b) in enumerate(zip(free_a[0], free_b[0], strict=True)) if a != b), len(free_a[0]))
    return {"teacher_forced_argmax_agreement": agree / new, "rel_err_mean": statistics.mean(errs),
            "rel_err_max": max(errs), "free_running_identical_prefix": same, "free_running_len": len(free_a[0]),
            "saturated": fp8.describe()["kv_cache"]["saturated_values"]}


def tp_run(path: str, tp: int, prompt_len: int, new: int, dtype: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp()) / f"tp{tp}.json"
    subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "bench", "--model-path", path, "--tp", str(tp),
                    "--input-len", str(prompt_len), "--output-len", str(new), "--requests", "2", "--concurrency", "1",
                    "--dtype", dtype, "--output", str(out)], check=True, cwd=ROOT, capture_output=True)
    r = json.loads(out.read_text())
    return {"ttft_ms": r["aggregate"]["ttft_ms"]["p50"], "tpot_ms": r["aggregate"]["tpot_ms"]["p50"],
            "process_group_s": r["timings"]["process_group_s"], "load_s": r["timings"]["load_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (default 512)")
    ap.add_argument("--new-tokens", type=int, default=64, help="timed decode steps (default 64)")
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"), help="model dtype")
    ap.add_argument("--repeat", type=int, default=3, help="prefill repeats (median)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads (default: all cores)")
    ap.add_argument("--skip-tp", action="store_true", help="leave out the TP1/TP4 subprocess rows")
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    from cgsvc_worker.checkpoint import make_checkpoint

    path = make_checkpoint(tempfile.mkdtemp(prefix="cgsvc-bench-ckpt-"), "bench", seed=0, dtype=ns.dtype)
    prompt = [(i * 7919) % 31000 + 2 for i in range(ns.prompt_len)]
    dt = getattr(torch, ns.dtype)
    full = {"decode_backend": "full", "decode_bs": [1, 2, 4, 8], "decode_max_bs": 8}
    eager = make_engine(path, ns.dtype)
    static = make_engine(path, ns.dtype, **full)
    inductor = make_engine(path, ns.dtype, **full, cpu_decode="inductor")
    fp8 = make_engine(path, ns.dtype, **full, cpu_decode="inductor", kv_cache_dtype="fp8_e4m3")
    bw = gemv_bandwidth(dt)
    wbytes = weight_bytes_per_token(eager)
    limit = bw / wbytes
    floor_s = gemv_floor(eager)
    rows: dict[str, dict[str, float]] = {}
    for name, eng in (("plan without graphs (eager)", eager), ("plan `full`, --cpu-decode eager (default)", static),
                      ("plan `full`, --cpu-decode inductor", inductor),
                      ("plan `full`, --cpu-decode inductor, fp8_e4m3 cache", fp8)):
        rows[name] = {f"bs{b}": ours_decode(eng, prompt, b, ns.new_tokens)[0] for b in (1, 8)}
    prefill_ms = ours_prefill(eager, prompt, ns.repeat) * 1000
    ref = reference(path, ns.dtype, prompt, ns.new_tokens, ns.repeat)
    bw_again = gemv_bandwidth(dt)  # the machine is noisy: the limit before and after
    floor_again = gemv_floor(eager)
    own = wbytes / min(floor_s, floor_again)  # the model's own matrices: the faster of two sweeps
    own_limit = 1 / min(floor_s, floor_again)
    quality = fp8_quality(path, ns.dtype, prompt, ns.new_tokens)

    params = sum(p.numel() for p in eager.model.parameters())
    print(f"# bench checkpoint: {params / 1e6:.0f} M parameters, {ns.dtype}, {ns.threads} threads, prompt "
          f"{ns.prompt_len} tokens, {ns.new_tokens} timed decode steps")
    print(f"# weight bytes per decode token {wbytes / 1e6:.1f} MB (KV bytes read per token at this context "
          f"{eager.cache.bytes_per_token * ns.prompt_len / 1e6:.1f} MB, not counted)")
    print(f"# limit A, the model's own matrices: one GEMV per weight matrix, back to back, streams "
          f"{own / 1e9:.1f} GB/s -> {own_limit:.1f} tokens/s at batch 1")
    print(f"# limit B, one 256 MiB GEMV: {bw / 1e9:.1f} GB/s (again after the runs: {bw_again / 1e9:.1f}) -> "
          f"{limit:.1f} tokens/s at batch 1")
    print()
    print("| decode tokens/s | batch 1 | of limit A | of limit B | vs transformers | batch 8 | vs transformers |")
    print("|---|---|---|---|---|---|---|")
    t1, t8 = ref["decode_tok_s_bs1"], ref["decode_tok_s_bs8"]
    for name, r in rows.items():
        print(f"| cgsvc_worker, {name} | {r['bs1']:.1f} | {r['bs1'] / own_limit:.0%} | {r['bs1'] / limit:.0%} | "
              f"{r['bs1'] / t1:.2f}x | {r['bs8']:.1f} | {r['bs8'] / t8:.2f}x |")
    print(f"| transformers | {t1:.1f} | {t1 / own_limit:.0%} | {t1 / limit:.0%} | 1.00x | {t8:.1f} | 1.00x |")
    print()
    print("| | cgsvc_worker | transformers | ratio |")
    print("|---|---|---|---|")
    print(f"| prefill ms, {ns.prompt_len} tokens (lower is better) | {prefill_ms:.1f} | {ref['prefill_ms']:.1f} | "
          f"{ref['prefill_ms'] / prefill_ms:.2f}x |")
    print(f"| KV bytes per token, model dtype | {eager.cache.bytes_per_token} | | |")
    print(f"| KV bytes per token, fp8_e4m3 (incl. scales: per layer, static) | {fp8.cache.bytes_per_token} | | "
          f"{eager.cache.bytes_per_token / fp8.cache.bytes_per_token:.2f}x smaller |")
    print()
    print(f"fp8_e4m3 cache against the {ns.dtype} cache over {ns.new_tokens} decode steps: teacher-forced argmax "
          f"agreement {quality['teacher_forced_argmax_agreement']:.0%}, logits relative L2 error mean "
          f"{quality['rel_err_mean']:.2e} max {quality['rel_err_max']:.2e}; free-running greedy tokens identical for "
          f"the first {quality['free_running_identical_prefix']} of {quality['free_running_len']}; values clipped "
          f"{quality['saturated']}")
    if ns.skip_tp:
        return
    t1r = tp_run(path, 1, ns.prompt_len, ns.new_tokens, ns.dtype)
    t4r = tp_run(path, 4, ns.prompt_len, ns.new_tokens, ns.dtype)
    print()
    print("| cgsvc-worker bench | TTFT p50 ms | TPOT p50 ms | process group s | load s |")
    print("|---|---|---|---|---|")
    for name, t in (("TP1", t1r), ("TP4 over gloo", t4r)):
        print(f"| {name} | {t['ttft_ms']:.1f} | {t['tpot_ms']:.1f} | {t['process_group_s']:.2f} | {t['load_s']:.2f} |")


if __name__ == "__main__":
    main()
