"""The model configuration a worker needs, read from a checkpoint's config.json."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration",
                           "Kimi_K25ForConditionalGeneration")


# The model families this worker runs, by (text) architecture: V2 routes with softmax scores,
# V3 (and the Kimi-K2.x wrappers around a V3 text model) with sigmoid scores and noaux_tc.
FAMILIES = {"DeepseekV3ForCausalLM": "DeepSeek-V3", "DeepseekV2ForCausalLM": "DeepSeek-V2",
            "KimiK25ForConditionalGeneration": "DeepSeek-V3"}


def family_of(architecture: str) -> str | None:
    """The family of an architecture name (underscores ignored), or None when not one of ours."""
    return FAMILIES.get(architecture.replace("_", ""))


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing files, tensors, shapes or an unsupported model."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    dim: int
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    truncate: bool = True
    interleave: bool = True


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: int
    num_layers: int
    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    first_k_dense_replace: int
    moe_layer_freq: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    rope: RopeConfig
    multimodal_wrapper: bool = False
    # Routing: V3 scores experts with a sigmoid and picks them with the noaux_tc correction bias;
    # V2 uses softmax scores with "greedy" or "group_limited_greedy" top-k.
    scoring_func: str = "sigmoid"
    topk_method: str = "noaux_tc"
    torch_dtype: str = ""  # what the checkpoint says its weights are ("" where it does not say)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Values the KV cache keeps per token per layer: the compressed latent and the rotated key."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        scale = self.qk_head_dim ** -0.5
        if self.rope.rope_type != "default" and self.rope.mscale_all_dim:
            m = yarn_mscale(self.rope.factor, self.rope.mscale_all_dim)
            scale *= m * m
        return scale

    def is_moe_layer(self, layer: int) -> bool:
        return (self.n_routed_experts > 0 and layer >= self.first_k_dense_replace
                and layer % max(self.moe_layer_freq, 1) == 0)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _rope(text: dict[str, Any], rope_dim: int, max_pos: int) -> RopeConfig:
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", text.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")) or "default")
    factor = params.get("factor")
    orig = int(params.get("original_max_position_embeddings", 4096))
    if rope_type == "yarn" and factor is None:
        factor = max_pos / orig
    return RopeConfig(theta=theta, dim=rope_dim, rope_type=rope_type, factor=float(factor or 1.0),
                      original_max_position_embeddings=orig, beta_fast=float(params.get("beta_fast") or 32),
                      beta_slow=float(params.get("beta_slow") or 1), mscale=float(params.get("mscale") or 1.0),
                      mscale_all_dim=float(params.get("mscale_all_dim") or 0.0),
                      truncate=bool(params.get("truncate", True)),
                      interleave=bool(text.get("rope_interleave", True)))


def load_model_config(path: str) -> ModelConfig:
    """Read path/config.json (a multimodal wrapper's text_config for Kimi-K2.5/K2.6)."""
    cfg_path = os.path.join(path, "config.json")
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError(f"no config.json in {path!r}") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"cannot read {cfg_path}: {exc}") from None
    archs = config.get("architectures") or []
    arch = archs[0] if archs else config.get("model_type", "?")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise CheckpointError(f"unsupported architecture {arch!r}; this worker runs {', '.join(SUPPORTED_ARCHITECTURES)}")
    wrapper = "text_config" in config
    v2 = arch == "DeepseekV2ForCausalLM"
    text = config.get("text_config") or config
    try:
        kv_lora = int(text["kv_lora_rank"])
        rope_dim = int(text["qk_rope_head_dim"])
        max_pos = int(text.get("max_position_embeddings", 4096))
        n_routed = int(text.get("n_routed_experts") or 0)
        return ModelConfig(
            architecture=arch, vocab_size=int(text["vocab_size"]), hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            moe_intermediate_size=int(text.get("moe_intermediate_size") or 0),
            num_layers=int(text["num_hidden_layers"]), num_heads=int(text["num_attention_heads"]),
            q_lora_rank=int(text["q_lora_rank"]) if text.get("q_lora_rank") else None, kv_lora_rank=kv_lora,
            qk_nope_head_dim=int(text["qk_nope_head_dim"]), qk_rope_head_dim=rope_dim,
            v_head_dim=int(text["v_head_dim"]), n_routed_experts=n_routed,
            n_shared_experts=int(text.get("n_shared_experts") or 0),
            num_experts_per_tok=int(text.get("num_experts_per_tok") or 0),
            n_group=int(text.get("n_group") or 1), topk_group=int(text.get("topk_group") or 1),
            norm_topk_prob=bool(text.get("norm_topk_prob", True)),
            routed_scaling_factor=float(text.get("routed_scaling_factor") or 1.0),
            first_k_dense_replace=int(text.get("first_k_dense_replace") or 0),
            moe_layer_freq=int(text.get("moe_layer_freq") or 1), rms_norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=max_pos, tie_word_embeddings=bool(text.get("tie_word_embeddings", False)),
            rope=_rope(text, rope_dim, max_pos), multimodal_wrapper=wrapper,
            scoring_func=str(text.get("scoring_func") or ("softmax" if v2 else "sigmoid")),
            topk_method=str(text.get("topk_method") or ("greedy" if v2 else "noaux_tc")),
            # transformers v5 writes "dtype", earlier releases "torch_dtype"; a wrapper may keep it outside
            torch_dtype=str(text.get("dtype") or text.get("torch_dtype") or config.get("dtype")
                            or config.get("torch_dtype") or "").removeprefix("torch."))
    except KeyError as exc:
        raise CheckpointError(f"{cfg_path}: missing {exc.args[0]!r}, which an MLA model needs") from None
