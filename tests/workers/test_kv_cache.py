"""The paged latent cache: ragged batches, page boundaries, exhaustion, storage formats."""

from __future__ import annotations

import pytest
import torch
from cgsvc_worker import tp
from cgsvc_worker.engine import DTYPES, Engine, EngineOptions, PlanMismatch, PlanView
from cgsvc_worker.kv_cache import (
    FP4_BLOCK,
    KVCacheExhausted,
    KVFormatError,
    LatentKVCache,
    kv_format,
)

from cgsvc.contract import KV_CACHE_DTYPES, KV_PAGE_TOKENS, kv_budget_floor

CPU = torch.device("cpu")


def test_pages_and_slots() -> None:
    cache = LatentKVCache(num_layers=2, latent_dim=3, page_size=4, num_pages=6, fmt=torch.float32, device=CPU)
    a = cache.allocate(1, 6)  # two pages
    b = cache.allocate(2, 3)  # one page
    assert a.tolist()[:4] == [4, 5, 6, 7] and len(set(a.tolist()) | set(b.tolist())) == 9
    assert cache.scratch_slot not in set(a.tolist()) | set(b.tolist())  # page 0 is never handed out
    more = cache.allocate(1, 3)  # crosses into a third page for seq 1
    assert len(cache.seqs[1].pages) == 3 and cache.seqs[1].length == 9
    assert cache.context_slots(1).tolist() == a.tolist() + more.tolist()
    cache.write(0, more, torch.ones(3, 3))
    assert torch.equal(cache.read(0, more), torch.ones(3, 3))
    assert cache.free_tokens == 4
    with pytest.raises(KVCacheExhausted, match="needs 2 more page"):
        cache.allocate(3, 5)
    assert cache.seqs[3].pages == []  # nothing half-allocated
    cache.release(1)
    assert cache.free_tokens == 16
    assert cache.bytes_per_token == 2 * 3 * 4


def test_budget_sizing() -> None:
    cache = LatentKVCache.from_budget(100_000, num_layers=2, latent_dim=96, page_size=16, fmt=torch.float32, device=CPU)
    assert cache.num_pages == 100_000 // (2 * 16 * 96 * 4)
    with pytest.raises(ValueError, match="at least two"):
        LatentKVCache.from_budget(100, 2, 96, 16, torch.float32, CPU)


@pytest.mark.parametrize("kv", KV_CACHE_DTYPES)
def test_the_services_budget_floor_is_the_workers_two_pages(kv: str) -> None:
    """The service refuses a --kv-cache-mb below kv_budget_floor before any rank starts: for an
    explicit dtype it is exactly the smallest budget a rank's cache is made in, and for auto it
    is at most what either dtype auto settles on needs (nothing that runs is refused)."""
    layers, latent = 3, 96
    for dtype in ("float32", "bfloat16"):
        fmt = kv_format(kv, DTYPES[dtype], latent)
        floor = kv_budget_floor(kv, dtype, layers, latent)
        assert LatentKVCache.from_budget(floor, layers, latent, KV_PAGE_TOKENS, fmt, CPU).num_pages == 2
        with pytest.raises(ValueError, match="at least two"):
            LatentKVCache.from_budget(floor - 1, layers, latent, KV_PAGE_TOKENS, fmt, CPU)
        assert kv_budget_floor(kv, "auto", layers, latent) <= floor


def _roundtrip(name: str, x: torch.Tensor) -> tuple[LatentKVCache, torch.Tensor]:
    cache = LatentKVCache(1, x.shape[1], 4, 8, kv_format(name, torch.float32, x.shape[1]), CPU)
    slots = torch.arange(4, 4 + x.shape[0])
    cache.write(0, slots, x)
    return cache, cache.read(0, slots)


def test_fp8_is_stored_as_fp8_with_a_quarter_of_fp32_bytes() -> None:
    x = torch.randn(5, 96) * 3
    fp32, _ = _roundtrip("auto", x)
    cache, back = _roundtrip("fp8_e4m3", x)
    assert cache.pool.dtype == torch.float8_e4m3fn
    assert cache.bytes_per_token * 4 == fp32.bytes_per_token
    assert ((back - x).abs() <= x.abs() * 2 ** -4 + 2 ** -9).all()  # e4m3: 3 mantissa bits
    assert int(cache.saturated) == 0
    cache.write(0, torch.tensor([4]), torch.full((1, 96), 1000.0))  # beyond e4m3's 448
    assert int(cache.saturated) == 96 and cache.read(0, torch.tensor([4])).max() == 448


def test_fp4_packs_two_values_per_byte_with_block_scales() -> None:
    x = torch.randn(6, 96)
    cache, back = _roundtrip("fp4_e2m1", x)
    assert cache.bytes_per_token == 96 // 2 + 96 // FP4_BLOCK
    blocks, err = x.view(6, -1, FP4_BLOCK), (back - x).view(6, -1, FP4_BLOCK)
    assert (err.abs() <= 0.2 * blocks.abs().amax(-1, keepdim=True)).all()  # half of e2m1's top step (4 -> 6)
    assert int(cache.saturated) == 0


def test_kv_formats_refuse_what_they_cannot_store() -> None:
    with pytest.raises(KVFormatError, match="one of auto"):
        kv_format("int3", torch.float32, 96)
    with pytest.raises(KVFormatError, match="multiple of 16"):
        kv_format("fp4_e2m1", torch.float32, 100)


def test_ragged_batch_equals_one_by_one(checkpoints: dict[str, str]) -> None:
    """Sequences of different lengths in one batch, crossing page boundaries (page 4), give the
    same logits as each sequence alone."""
    path = checkpoints["tiny"]
    prompts = [[3, 4, 5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23, 24]]
    batched = Engine(path, tp.single(), PlanView(), EngineOptions(page_size=4))
    lg = batched.prefill([0, 1, 2], prompts)
    toks = lg.argmax(-1).tolist()
    lg2 = batched.decode([0, 1, 2], toks)
    for i, p in enumerate(prompts):
        alone = Engine(path, tp.single(), PlanView(), EngineOptions(page_size=4))
        a = alone.prefill([7], [p])
        assert torch.allclose(a[0], lg[i], rtol=1e-4, atol=1e-4)
        assert torch.allclose(alone.decode([7], [toks[i]])[0], lg2[i], rtol=1e-4, atol=1e-4)


def test_latent_is_all_the_cache_keeps(checkpoints: dict[str, str]) -> None:
    engine = Engine(checkpoints["tiny"], tp.single(), PlanView(), EngineOptions())
    cfg = engine.cfg
    assert engine.cache.pool.shape[-1] == cfg.kv_lora_rank + cfg.qk_rope_head_dim
    d = engine.describe()["kv_cache"]
    assert d["bytes_per_token"] == cfg.num_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4
    assert d["ratio_vs_decompressed"] == round(
        cfg.num_layers * cfg.num_heads * (cfg.qk_head_dim + cfg.v_head_dim) * 4 / d["bytes_per_token"], 2)


@pytest.mark.parametrize(("kv", "ratio"), [("fp8_e4m3", 4.0), ("fp8_e5m2", 4.0), ("bfloat16", 2.0),
                                            ("fp4_e2m1", 4 * 96 / (48 + 6))])
def test_engine_stores_the_plans_kv_dtype(checkpoints: dict[str, str], kv: str, ratio: float) -> None:
    engine = Engine(checkpoints["tiny"], tp.single(), PlanView(kv_cache_dtype=kv), EngineOptions())
    engine.prefill([0], [[5, 6, 7, 8, 9]])
    engine.decode([0], [3])
    d = engine.describe()
    assert d["kv_cache"]["dtype"] == kv and d["kv_cache"]["ratio_vs_model_dtype"] == round(ratio, 2)
    (row,) = [f for f in d["plan_fidelity"] if f["field"] == "kv_cache_dtype"]
    assert row["status"] == "honoured" and row["effective"] == kv


def test_unknown_kv_dtype_is_refused(checkpoints: dict[str, str]) -> None:
    with pytest.raises(PlanMismatch, match="kv_cache_dtype"):
        Engine(checkpoints["tiny"], tp.single(), PlanView(kv_cache_dtype="int3"), EngineOptions())
