"""The paged latent cache: ragged batches, page boundaries, exhaustion."""

from __future__ import annotations

import pytest
import torch
from cgsvc_worker import tp
from cgsvc_worker.engine import Engine, EngineOptions, PlanView
from cgsvc_worker.kv_cache import KVCacheExhausted, LatentKVCache


def test_pages_and_slots() -> None:
    cache = LatentKVCache(num_layers=2, latent_dim=3, page_size=4, num_pages=5, dtype=torch.float32,
                          device=torch.device("cpu"))
    a = cache.allocate(1, 6)  # two pages
    b = cache.allocate(2, 3)  # one page
    assert a.tolist()[:4] == [0, 1, 2, 3] and len(set(a.tolist()) | set(b.tolist())) == 9
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
    cache = LatentKVCache.from_budget(100_000, num_layers=2, latent_dim=96, page_size=16, dtype=torch.float32,
                                      device=torch.device("cpu"))
    assert cache.num_pages == 100_000 // (2 * 16 * 96 * 4)
    with pytest.raises(ValueError, match="holds no page"):
        LatentKVCache.from_budget(100, 2, 96, 16, torch.float32, torch.device("cpu"))


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
