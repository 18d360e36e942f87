"""Small DeepSeek-V3-architecture checkpoints generated locally (no downloads), in the hub
layout: config.json with DeepSeek-V3's YaRN settings and safetensors with hub tensor names
(per-expert `mlp.experts.{i}.*` weights). Random weights with initializer_range 0.1, so
attention is not nearly uniform and greedy tokens are not near-ties.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch
from safetensors.torch import save_file

YARN = {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0,
        "original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}

BASE: dict[str, Any] = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 512, "hidden_size": 256,
    "intermediate_size": 512, "moe_intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 8, "q_lora_rank": 96, "kv_lora_rank": 64, "qk_nope_head_dim": 32, "qk_rope_head_dim": 32,
    "v_head_dim": 32, "n_routed_experts": 8, "n_shared_experts": 1, "num_experts_per_tok": 2, "n_group": 2,
    "topk_group": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,
    "moe_layer_freq": 1, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 163840,
    "rope_theta": 10000.0, "rope_scaling": YARN, "tie_word_embeddings": False, "initializer_range": 0.1,
    "attention_bias": False, "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
}

PRESETS: dict[str, dict[str, Any]] = {
    # dense + MoE layers, q LoRA: the default test model
    "tiny": {},
    # DeepSeek-V2-Lite's plain q_proj variant
    "tiny-qproj": {"q_lora_rank": None},
    # a Kimi-K2.6-shaped multimodal wrapper around the tiny text model (vision tower stubbed)
    "tiny-kimi": {},
    # DeepSeek-V2(-Lite): softmax routing with group-limited greedy top-k, q_proj attention
    "tiny-v2": {"architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "q_lora_rank": None,
                "topk_method": "group_limited_greedy", "scoring_func": "softmax", "norm_topk_prob": False,
                "routed_scaling_factor": 1.0},
    # flashinfer-compatible MLA dims, for GPU runs
    "flashinfer": {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 16, "num_key_value_heads": 16,
                   "q_lora_rank": 384, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
                   "v_head_dim": 128, "intermediate_size": 2048, "moe_intermediate_size": 256, "vocab_size": 4096,
                   "n_routed_experts": 16, "n_group": 4, "topk_group": 2, "initializer_range": 0.02},
    # about 160 M parameters, dense: large enough that arithmetic dominates on a CPU
    "bench": {"hidden_size": 1024, "num_hidden_layers": 8, "num_attention_heads": 16, "num_key_value_heads": 16,
              "q_lora_rank": 384, "kv_lora_rank": 256, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64,
              "v_head_dim": 64, "intermediate_size": 2816, "vocab_size": 32000, "first_k_dense_replace": 8,
              "n_routed_experts": 0, "initializer_range": 0.02},
}


def text_config(preset: str) -> dict[str, Any]:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; one of {', '.join(PRESETS)}")
    return {**BASE, **PRESETS[preset]}


def random_tensors(cfg: dict[str, Any], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    std = float(cfg["initializer_range"])

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    def norm(n: int) -> torch.Tensor:
        return 1.0 + 0.1 * torch.randn(n, generator=g)

    D, H, V = cfg["hidden_size"], cfg["num_attention_heads"], cfg["vocab_size"]
    qk = cfg["qk_nope_head_dim"] + cfg["qk_rope_head_dim"]
    C, R = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": norm(D),
                                  "lm_head.weight": w(V, D)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = norm(D)
        t[p + "post_attention_layernorm.weight"] = norm(D)
        a = p + "self_attn."
        if cfg["q_lora_rank"]:
            t[a + "q_a_proj.weight"] = w(cfg["q_lora_rank"], D)
            t[a + "q_a_layernorm.weight"] = norm(cfg["q_lora_rank"])
            t[a + "q_b_proj.weight"] = w(H * qk, cfg["q_lora_rank"])
        else:
            t[a + "q_proj.weight"] = w(H * qk, D)
        t[a + "kv_a_proj_with_mqa.weight"] = w(C + R, D)
        t[a + "kv_a_layernorm.weight"] = norm(C)
        t[a + "kv_b_proj.weight"] = w(H * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"]), C)
        t[a + "o_proj.weight"] = w(D, H * cfg["v_head_dim"])
        m = p + "mlp."
        if cfg["n_routed_experts"] and i >= cfg["first_k_dense_replace"]:
            E, inter = cfg["n_routed_experts"], cfg["moe_intermediate_size"]
            t[m + "gate.weight"] = w(E, D)
            if cfg["model_type"] != "deepseek_v2":
                t[m + "gate.e_score_correction_bias"] = 0.01 * torch.randn(E, generator=g)
            for e in range(E):
                t[m + f"experts.{e}.gate_proj.weight"] = w(inter, D)
                t[m + f"experts.{e}.up_proj.weight"] = w(inter, D)
                t[m + f"experts.{e}.down_proj.weight"] = w(D, inter)
            S = inter * cfg["n_shared_experts"]
            t[m + "shared_experts.gate_proj.weight"] = w(S, D)
            t[m + "shared_experts.up_proj.weight"] = w(S, D)
            t[m + "shared_experts.down_proj.weight"] = w(D, S)
        else:
            inter = cfg["intermediate_size"]
            t[m + "gate_proj.weight"] = w(inter, D)
            t[m + "up_proj.weight"] = w(inter, D)
            t[m + "down_proj.weight"] = w(D, inter)
    return t


def make_checkpoint(out: str, preset: str = "tiny", seed: int = 0, dtype: str = "float32",
                    overrides: dict[str, Any] | None = None) -> str:
    """Write a checkpoint directory; returns its path. `overrides` replace config.json keys."""
    cfg = {**text_config(preset), **(overrides or {})}
    tensors = random_tensors(cfg, seed)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    tensors = {k: v.to(torch_dtype) if not k.endswith(("gate.weight", "e_score_correction_bias")) else v
               for k, v in tensors.items()}
    cfg["torch_dtype"] = dtype
    os.makedirs(out, exist_ok=True)
    if preset == "tiny-kimi":
        config = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25",
                  "text_config": cfg, "vision_config": {"model_type": "moonvit", "hidden_size": 32},
                  "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4",
                                          "kv_cache_quant_algo": "FP8"}}
        tensors = {f"language_model.{k}": v for k, v in tensors.items()}
        tensors["vision_tower.patch_embed.weight"] = torch.zeros(32, 3, 2, 2)
        tensors["mm_projector.weight"] = torch.zeros(cfg["hidden_size"], 32)
    else:
        config = cfg
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(config, fh, indent=2)
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(out, "model.safetensors"))
    return out
