"""The DeepSeek-V3 architecture (DeepSeek-V2/V3/R1, Kimi-K2.x): MLA attention, dense and MoE
layers, tensor-parallel over a TPGroup.

Tokens of all sequences in a step are packed into one [T, hidden] tensor; a `StepBatch`
(engine.py) says which sequence each token belongs to and where its latent lives in the
KV cache. Attention itself is delegated to a backend (attention.py) so that the same model
runs the torch_native reference, flashinfer or trtllm-gen kernels.

Shapes: T tokens, H local heads (num_heads / tp), C = kv_lora_rank, R = qk_rope_head_dim,
N = qk_nope_head_dim, V = v_head_dim, D = hidden_size.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cgsvc_worker.config import ModelConfig
from cgsvc_worker.layers import Linear, LMHead, RMSNorm, Rotary, VocabEmbedding
from cgsvc_worker.tp import TPGroup


class MLAAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.layer = cfg, layer
        self.head_start, self.head_end = tp.shard(cfg.num_heads, "attention heads")
        self.heads = self.head_end - self.head_start
        D, C, R = cfg.hidden_size, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        if cfg.q_lora_rank:
            self.q_a_proj = Linear(D, cfg.q_lora_rank, tp, None, dtype)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, dtype)
            self.q_b_proj = Linear(cfg.q_lora_rank, cfg.num_heads * cfg.qk_head_dim, tp, "rows", dtype)
        else:
            self.q_proj = Linear(D, cfg.num_heads * cfg.qk_head_dim, tp, "rows", dtype)
        self.kv_a_proj_with_mqa = Linear(D, C + R, tp, None, dtype)
        self.kv_a_layernorm = RMSNorm(C, cfg.rms_norm_eps, dtype)
        self.kv_b_proj = Linear(C, cfg.num_heads * (cfg.qk_nope_head_dim + cfg.v_head_dim), tp, "rows", dtype)
        self.o_proj = Linear(cfg.num_heads * cfg.v_head_dim, D, tp, "cols", dtype)
        self.scale = cfg.softmax_scale

    def w_uk_uv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """kv_b_proj split per head: W_UK [H, N, C] (latent -> key) and W_UV [H, V, C] (latent -> value)."""
        w = self.kv_b_proj.weight.view(self.heads, self.cfg.qk_nope_head_dim + self.cfg.v_head_dim,
                                       self.cfg.kv_lora_rank)
        return w[:, : self.cfg.qk_nope_head_dim], w[:, self.cfg.qk_nope_head_dim:]

    def forward(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor,
                batch: Any, backend: Any) -> torch.Tensor:
        cfg, T = self.cfg, x.shape[0]
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if cfg.q_lora_rank else self.q_proj(x)
        q = q.view(T, self.heads, cfg.qk_head_dim)
        q_nope, q_rot = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        c, k_rot = self.kv_a_proj_with_mqa(x).split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        c = self.kv_a_layernorm(c)
        q_rot = rotary(q_rot, cos, sin)
        k_rot = rotary(k_rot.unsqueeze(1), cos, sin).squeeze(1)
        latent = torch.cat([c, k_rot], dim=-1)  # [T, C + R]: all the cache keeps
        out = backend.attend(self, q_nope, q_rot, latent, batch)  # [T, H, V]
        return self.o_proj(out.reshape(T, self.heads * cfg.v_head_dim))


class MLP(nn.Module):
    """SwiGLU MLP, intermediate dimension split across ranks; `reduce` all-reduces the output."""

    def __init__(self, dim: int, inter: int, tp: TPGroup, dtype: torch.dtype, reduce: bool = True) -> None:
        super().__init__()
        self.gate_proj = Linear(dim, inter, tp, "rows", dtype)
        self.up_proj = Linear(dim, inter, tp, "rows", dtype)
        # reduce=False: the caller reduces (MoE sums routed and shared parts first).
        self.down_proj = Linear(inter, dim, tp, "cols", dtype, reduce=reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Routed experts and shared experts. Routing as the checkpoint's family does it: V3's
    sigmoid scores with grouped top-k and the noaux_tc correction bias, or V2's softmax scores
    with greedy / group-limited greedy top-k. Experts are partitioned across TP ranks; routed and shared partial
    outputs are summed with one all-reduce."""

    def __init__(self, cfg: ModelConfig, tp: TPGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.cfg, self.tp = cfg, tp
        E, D, inter = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.expert_start, self.expert_end = tp.shard(E, "routed experts")
        local = self.expert_end - self.expert_start
        self.gate_weight = nn.Parameter(torch.empty(E, D, dtype=torch.float32), requires_grad=False)
        self.e_score_correction_bias = nn.Parameter(torch.zeros(E, dtype=torch.float32), requires_grad=False)
        self.w_gate_up = nn.Parameter(torch.empty(local, 2 * inter, D, dtype=dtype), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(local, D, inter, dtype=dtype), requires_grad=False)
        self.shared_experts = MLP(D, inter * cfg.n_shared_experts, tp, dtype, reduce=False) if cfg.n_shared_experts else None

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.cfg.topk_method != "noaux_tc":
            return self.route_v2(x)
        cfg = self.cfg
        scores = F.linear(x.float(), self.gate_weight).sigmoid()
        choice = scores + self.e_score_correction_bias
        per_group = cfg.n_routed_experts // cfg.n_group
        group_scores = choice.view(-1, cfg.n_group, per_group).topk(2, dim=-1)[0].sum(-1)
        group_idx = group_scores.topk(cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        keep = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(-1, cfg.n_routed_experts)
        choice = choice.masked_fill(~keep.bool(), float("-inf"))
        idx = choice.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)[1]
        weights = scores.gather(1, idx)
        if cfg.norm_topk_prob:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * cfg.routed_scaling_factor

    def route_v2(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        logits = F.linear(x.float(), self.gate_weight)
        scores = logits.softmax(-1) if cfg.scoring_func == "softmax" else logits.sigmoid()
        if cfg.topk_method == "group_limited_greedy":
            per_group = cfg.n_routed_experts // cfg.n_group
            group_scores = scores.view(-1, cfg.n_group, per_group).max(dim=-1).values
            group_idx = group_scores.topk(cfg.topk_group, dim=-1, sorted=False)[1]
            group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
            keep = group_mask.unsqueeze(-1).expand(-1, cfg.n_group, per_group).reshape(-1, cfg.n_routed_experts)
            scores = scores.masked_fill(~keep.bool(), 0.0)
        weights, idx = scores.topk(cfg.num_experts_per_tok, dim=-1, sorted=False)
        if cfg.norm_topk_prob and cfg.num_experts_per_tok > 1:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return idx, weights * cfg.routed_scaling_factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        idx, weights = self.route(x)
        out = torch.zeros_like(x)
        local = (idx >= self.expert_start) & (idx < self.expert_end)
        for e in torch.unique(idx[local]).tolist():
            token, slot = torch.where(idx == e)
            le = e - self.expert_start
            gate, up = F.linear(x[token], self.w_gate_up[le]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w_down[le]) * weights[token, slot, None]
            out.index_add_(0, token, y.to(out.dtype))
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return self.tp.all_reduce(out)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = MLAAttention(cfg, tp, layer, dtype)
        self.mlp: nn.Module = MoE(cfg, tp, dtype) if cfg.is_moe_layer(layer) else MLP(
            cfg.hidden_size, cfg.intermediate_size, tp, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    def forward(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor, batch: Any,
                backend: Any) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rotary, cos, sin, batch, backend)
        return x + self.mlp(self.post_attention_layernorm(x))

    # The pieces between attention breaks, for graph modes that split the forward at attention.
    def pre_attention(self, x: torch.Tensor) -> torch.Tensor:
        return self.input_layernorm(x)

    def post_attention(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg, self.tp, self.dtype = cfg, tp, dtype
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp, dtype)
        self.rotary = Rotary(cfg.rope)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: Any, backend: Any) -> torch.Tensor:
        """Hidden states after the final norm, [T, D]."""
        x = self.embed_tokens(ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        for layer in self.layers:
            x = layer(x, self.rotary, cos, sin, batch, backend)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
