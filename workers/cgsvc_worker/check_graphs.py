"""`cgsvc-worker check-graphs`: prove that every planned size can be captured.

For every planned decode `bs` and prefill `num_tokens`, build that step exactly as the engine
runs it (padding rows included, static MoE dispatch), then

    on a CPU   compile it with torch.compile(fullgraph=True, dynamic=False): a graph break, a
               host synchronisation or a data-dependent shape fails the compile;
    on CUDA    capture it as CUDA graphs (the decode step whole, prefill piece by piece with
               the attention core eager between), replay, and

compare with the same step run eagerly. Output:

    {"device", "decode": [{"bs", "capturable", "max_abs_diff", "reason"}],
     "prefill": [{"num_tokens", "capturable", "max_abs_diff", "reason"}]}

A size is capturable when it compiles or captures and its result matches eager (relative
tolerance 1e-3 in float32, 5e-2 in half precision).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from cgsvc_worker.attention import PrefillMeta, decode_meta
from cgsvc_worker.engine import Engine
from cgsvc_worker.graphs import DecodeGraphs, PieceGraphs, compiled


def _tolerance(dtype: torch.dtype) -> float:
    return 1e-3 if dtype == torch.float32 else 5e-2


def _compare(eager: torch.Tensor, other: torch.Tensor, dtype: torch.dtype) -> tuple[float, str]:
    diff = float((eager.float() - other.float()).abs().max())
    scale = float(eager.float().abs().max()) or 1.0
    if diff > _tolerance(dtype) * scale:
        return diff, f"replay differs from eager by {diff:.3g} (max |eager| {scale:.3g})"
    return diff, ""


def _attempt(run: Callable[[], tuple[float, str]]) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        diff, problem = run()
    except Exception as exc:  # noqa: BLE001 - any failure to compile or capture is the finding
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return {"capturable": False, "max_abs_diff": None, "reason": f"{type(exc).__name__}: {first}"[:500],
                "seconds": round(time.perf_counter() - t0, 3)}
    return {"capturable": not problem, "max_abs_diff": diff, "reason": problem,
            "seconds": round(time.perf_counter() - t0, 3)}


def check_decode(engine: Engine, bs: int, backend: str) -> dict[str, Any]:
    cache, dev, vocab = engine.cache, engine.tp.device, engine.cfg.vocab_size
    seqs = [900_000 + i for i in range(bs)]
    # contexts of different lengths, crossing page boundaries
    prompts = [[(31 * i + 7 * j) % (vocab - 2) + 2 for j in range(3 + (5 * i) % 11)] for i in range(bs)]
    engine.prefill(seqs, prompts)
    try:
        slots = torch.cat([cache.allocate(s, 1) for s in seqs])
        lens = [cache.seqs[s].length for s in seqs]
        pages = [list(cache.seqs[s].pages) for s in seqs]
        ids = torch.tensor([p[-1] for p in prompts], dtype=torch.long, device=dev)
        positions = torch.tensor([n - 1 for n in lens], dtype=torch.long, device=dev)
        width = max(len(p) for p in pages)
        meta = decode_meta(cache, slots, lens, pages, bs, width)

        def run() -> tuple[float, str]:
            with torch.inference_mode():
                engine.decode_backend.plan(meta, None)
                eager = engine._decode_step(ids, positions, meta).clone()
                if dev.type == "cuda":
                    graphs = DecodeGraphs([bs], width, engine._decode_step, engine.decode_backend,
                                          lambda rows: decode_meta(cache, slots[:0], [], [], rows, width), dev)
                    graphs.capture()
                    other = graphs.replay(bs, ids, positions, meta)
                else:
                    other = compiled(engine._decode_step, backend)(ids, positions, meta)
            return _compare(eager, other, engine.dtype)

        return {"bs": bs, **_attempt(run)}
    finally:
        for s in seqs:
            engine.release(s)


def check_prefill(engine: Engine, n: int, backend: str) -> dict[str, Any]:
    cache, dev, vocab = engine.cache, engine.tp.device, engine.cfg.vocab_size
    lens = [n - n // 3, n // 3] if n >= 3 else [n]  # two sequences, as a ragged batch
    seqs = [800_000 + i for i in range(len(lens))]
    try:
        slots = torch.cat([cache.allocate(s, k) for s, k in zip(seqs, lens, strict=True)])
        ids = torch.tensor([(13 * i) % (vocab - 2) + 2 for i in range(n)], dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(k, device=dev) for k in lens])
        meta = PrefillMeta(slots, lens, [cache.context_slots(s) for s in seqs], cache)
        pieces = engine.pieces

        def run() -> tuple[float, str]:
            with torch.inference_mode():
                eager = engine.model.logits(pieces.run(pieces.fns, ids, positions, meta,
                                                       engine.prefill_backend)).clone()
                if dev.type == "cuda":
                    heads = engine.model.local_heads
                    graphs = PieceGraphs(pieces, pieces.fns, [n], dev, heads, engine.cfg.v_head_dim, engine.dtype)
                    graphs.capture(lambda _n: pieces.run(pieces.fns, ids, positions, meta, engine.prefill_backend))
                    hidden = graphs.run(n, ids, positions, meta, engine.prefill_backend)
                else:
                    fns = [compiled(fn, backend) for fn in pieces.fns]
                    hidden = pieces.run(fns, ids, positions, meta, engine.prefill_backend)
                other = engine.model.logits(hidden)
            return _compare(eager, other, engine.dtype)

        return {"num_tokens": n, **_attempt(run)}
    finally:
        for s in seqs:
            engine.release(s)


def check_graphs(engine: Engine, backend: str = "inductor",
                 progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Every planned decode bs and prefill num_tokens of the engine's plan, checked."""
    torch._dynamo.reset()
    out: dict[str, Any] = {"device": str(engine.tp.device),
                           "method": ("CUDA graph capture and replay" if engine.tp.device.type == "cuda" else
                                      f"torch.compile(fullgraph=True, dynamic=False, backend={backend!r})"),
                           "decode": [], "prefill": []}
    for bs in engine.plan.decode_bs:
        if progress:
            progress(f"decode bs={bs}")
        out["decode"].append(check_decode(engine, bs, backend))
    for n in engine.plan.prefill_num_tokens:
        if progress:
            progress(f"prefill num_tokens={n}")
        out["prefill"].append(check_prefill(engine, n, backend))
    rows = out["decode"] + out["prefill"]
    out["capturable"] = all(r["capturable"] for r in rows)
    out["checked"] = len(rows)
    return out
