"""The worker next to Hugging Face transformers on this CPU, same model, same threads, one run.

    .venv/bin/python bench/worker_bench.py [--prompt-len 512] [--new-tokens 64] [--dtype bfloat16]

Generates the ~160 M-parameter `bench` checkpoint (dense DeepSeek-V3 architecture), then
measures prefill time and decode tokens/s at batch 1 for cgsvc_worker (TP1, torch_native,
absorbed decode over the latent cache) and for transformers' DeepseekV3ForCausalLM (its own
cache, greedy loop), compares the KV bytes per token, and times TP4-over-gloo next to TP1
through `cgsvc-worker bench`. Prints Markdown for bench/RESULTS.md.
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
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent


def timed(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ours(path: str, dtype: str, prompt: list[int], new: int, repeat: int) -> dict[str, float]:
    from cgsvc_worker import tp
    from cgsvc_worker.engine import Engine, EngineOptions, PlanView

    engine = Engine(path, tp.single(), PlanView(), EngineOptions(dtype=dtype, kv_cache_bytes=512 << 20))
    seq = [0]

    def prefill() -> None:
        seq[0] += 1
        engine.prefill([seq[0]], [prompt])
        engine.release(seq[0])

    prefill()
    t_prefill = timed(prefill, repeat)
    engine.prefill([0], [prompt])
    tok = [1]
    engine.decode([0], tok)  # warm
    t0 = time.perf_counter()
    for _ in range(new):
        tok = engine.decode([0], tok).argmax(-1).tolist()
    decode_s = time.perf_counter() - t0
    return {"prefill_ms": t_prefill * 1000, "decode_tok_s": new / decode_s,
            "kv_bytes_per_token": engine.cache.bytes_per_token,
            "decompressed_bytes_per_token": engine.describe()["kv_cache"]["decompressed_bytes_per_token"],
            "params": sum(p.numel() for p in engine.model.parameters())}


def reference(path: str, dtype: str, prompt: list[int], new: int, repeat: int) -> dict[str, float]:
    from transformers import DeepseekV3ForCausalLM, DynamicCache

    model = DeepseekV3ForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation="sdpa").eval()
    ids = torch.tensor([prompt])
    with torch.inference_mode():
        model(ids)
        t_prefill = timed(lambda: model(ids, cache=DynamicCache(config=model.config)), repeat)
        cache = DynamicCache(config=model.config)
        out = model(ids, cache=cache)
        tok = out.logits[:, -1:].argmax(-1)
        out = model(tok, cache=cache)  # warm
        tok = out.logits[:, -1:].argmax(-1)
        t0 = time.perf_counter()
        for _ in range(new):
            out = model(tok, cache=cache)
            tok = out.logits[:, -1:].argmax(-1)
        decode_s = time.perf_counter() - t0
        tokens = len(prompt) + 1 + new  # prefill, the warm-up step, the timed steps
        cache_bytes = sum(t.numel() * t.element_size() for layer in cache.layers
                          for t in (layer.keys, layer.values) if t is not None)
    return {"prefill_ms": t_prefill * 1000, "decode_tok_s": new / decode_s,
            "kv_bytes_per_token": cache_bytes / tokens}


def tp_run(path: str, tp: int, prompt_len: int, new: int, dtype: str) -> dict[str, float]:
    out = Path(tempfile.mkdtemp()) / f"tp{tp}.json"
    subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "bench", "--model-path", path, "--tp", str(tp),
                    "--input-len", str(prompt_len), "--output-len", str(new), "--requests", "2", "--concurrency", "1",
                    "--dtype", dtype, "--output", str(out)], check=True, cwd=ROOT)
    r = json.loads(out.read_text())
    return {"ttft_ms": r["aggregate"]["ttft_ms"]["p50"], "tpot_ms": r["aggregate"]["tpot_ms"]["p50"],
            "process_group_s": r["timings"]["process_group_s"], "load_s": r["timings"]["load_s"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ns = ap.parse_args()
    torch.set_num_threads(ns.threads)
    from cgsvc_worker.checkpoint import make_checkpoint

    path = make_checkpoint(tempfile.mkdtemp(prefix="cgsvc-bench-ckpt-"), "bench", seed=0, dtype=ns.dtype)
    prompt = [(i * 7919) % 31000 + 2 for i in range(ns.prompt_len)]
    a = ours(path, ns.dtype, prompt, ns.new_tokens, ns.repeat)
    b = reference(path, ns.dtype, prompt, ns.new_tokens, ns.repeat)
    print(f"# bench checkpoint: {a['params'] / 1e6:.0f} M parameters, {ns.dtype}, {ns.threads} threads, "
          f"prompt {ns.prompt_len} tokens, {ns.new_tokens} decode steps at batch 1")
    print("| | cgsvc_worker | transformers | ratio |")
    print("|---|---|---|---|")
    print(f"| prefill ms (lower is better) | {a['prefill_ms']:.1f} | {b['prefill_ms']:.1f} | "
          f"{b['prefill_ms'] / a['prefill_ms']:.2f}x |")
    print(f"| decode tokens/s | {a['decode_tok_s']:.1f} | {b['decode_tok_s']:.1f} | "
          f"{a['decode_tok_s'] / b['decode_tok_s']:.2f}x |")
    print(f"| KV bytes per token | {a['kv_bytes_per_token']:.0f} | {b['kv_bytes_per_token']:.0f} | "
          f"{b['kv_bytes_per_token'] / a['kv_bytes_per_token']:.2f}x |")
    print(f"| KV bytes per token, decompressed K/V (an MHA-style cache) | {a['kv_bytes_per_token']:.0f} | "
          f"{a['decompressed_bytes_per_token']:.0f} | {a['decompressed_bytes_per_token'] / a['kv_bytes_per_token']:.2f}x |")
    t1 = tp_run(path, 1, ns.prompt_len, ns.new_tokens, ns.dtype)
    t4 = tp_run(path, 4, ns.prompt_len, ns.new_tokens, ns.dtype)
    print()
    print("| cgsvc-worker bench | TTFT p50 ms | TPOT p50 ms | process group s | load s |")
    print("|---|---|---|---|---|")
    for name, t in (("TP1", t1), ("TP4 over gloo", t4)):
        print(f"| {name} | {t['ttft_ms']:.1f} | {t['tpot_ms']:.1f} | {t['process_group_s']:.2f} | {t['load_s']:.2f} |")


if __name__ == "__main__":
    main()
