"""Sharded loading: a rank reads its slices only, and they are the right slices."""

from __future__ import annotations

import torch
from cgsvc_worker import loader
from cgsvc_worker.config import load_model_config
from cgsvc_worker.model import DeepseekV3Model, MoE
from cgsvc_worker.tp import TPGroup
from safetensors.torch import load_file


def test_rank_reads_only_its_shard(checkpoints: dict[str, str]) -> None:
    path = checkpoints["tiny"]
    cfg = load_model_config(path)
    full = loader.load(DeepseekV3Model(cfg, TPGroup(0, 1, torch.device("cpu"))), path)
    rank1 = DeepseekV3Model(cfg, TPGroup(1, 4, torch.device("cpu")))
    part = loader.load(rank1, path)
    assert part.bytes_read < 0.45 * full.bytes_read  # sharded tensors at 1/4, small replicated ones whole
    tensors = load_file(f"{path}/model.safetensors")
    attn = rank1.layers[0].self_attn
    rows = tensors["model.layers.0.self_attn.q_b_proj.weight"].shape[0] // 4
    assert torch.equal(attn.q_b_proj.weight, tensors["model.layers.0.self_attn.q_b_proj.weight"][rows:2 * rows])
    cols = tensors["model.layers.0.self_attn.o_proj.weight"].shape[1] // 4
    assert torch.equal(attn.o_proj.weight, tensors["model.layers.0.self_attn.o_proj.weight"][:, cols:2 * cols])
    moe = rank1.layers[1].mlp
    assert isinstance(moe, MoE) and (moe.expert_start, moe.expert_end) == (2, 4)
    assert torch.equal(moe.w_down[0], tensors["model.layers.1.mlp.experts.2.down_proj.weight"])
    vocab = cfg.vocab_size // 4
    assert torch.equal(rank1.embed_tokens.weight, tensors["model.embed_tokens.weight"][vocab:2 * vocab])
