"""The DeepSeek-V3 architecture (DeepSeek-V2/V3/R1, Kimi-K2.x): MLA attention, dense and MoE
layers, tensor-parallel over a TPGroup.

Tokens of all sequences in a step are packed into one [T, hidden] tensor; the step's
attention metadata (attention.py: `PrefillMeta`, `DecodeMeta`) says which sequence each
token belongs to and where its latent lives in the KV cache. The attention core is delegated
to a backend (attention.py) so that the same model runs the torch_native reference,
FlashInfer or trtllm-gen kernels. Graph modes (graphs.py) split each layer at that core:
`attention_input` (norm, projections, rotary) | attention core | `finish` (o_proj, residuals,
MLP or MoE); `static=True` selects MoE dispatch with fixed shapes for captured steps.

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
            # q_a_proj and kv_a_proj_with_mqa both read x and are replicated: one GEMM
            self.qkv_a_proj = Linear(D, cfg.q_lora_rank + C + R, tp, None, dtype,
                                     parts=(("q_a_proj", cfg.q_lora_rank), ("kv_a_proj_with_mqa", C + R)))
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

    def project(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Everything before the attention core: q_nope [T,H,N], q_rot [T,H,R] and the latent
        [T, C+R] (the compressed KV after its norm, and the rotated key) that the cache keeps."""
        cfg, T = self.cfg, x.shape[0]
        if cfg.q_lora_rank:
            q_a, kv = self.qkv_a_proj(x).split([cfg.q_lora_rank, cfg.latent_dim], dim=-1)
            q = self.q_b_proj(self.q_a_layernorm(q_a))
        else:
            q, kv = self.q_proj(x), self.kv_a_proj_with_mqa(x)
        q = q.view(T, self.heads, cfg.qk_head_dim)
        q_nope, q_rot = q.split([cfg.qk_nope_head_dim, cfg.qk_rope_head_dim], dim=-1)
        c, k_rot = kv.split([cfg.kv_lora_rank, cfg.qk_rope_head_dim], dim=-1)
        c = self.kv_a_layernorm(c)
        q_rot = rotary(q_rot, cos, sin)
        k_rot = rotary(k_rot.unsqueeze(1), cos, sin).squeeze(1)
        return q_nope, q_rot, torch.cat([c, k_rot], dim=-1)

    def output(self, o: torch.Tensor) -> torch.Tensor:
        """The attention core's [T, H, V] through o_proj (all-reduced across ranks)."""
        return self.o_proj(o.reshape(o.shape[0], self.heads * self.cfg.v_head_dim))

    def forward(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor,
                meta: Any, backend: Any) -> torch.Tensor:
        q_nope, q_rot, latent = self.project(x, rotary, cos, sin)
        return self.output(backend.attend(self, q_nope, q_rot, latent, meta))


class MLP(nn.Module):
    """SwiGLU MLP, intermediate dimension split across ranks; `reduce` all-reduces the output."""

    def __init__(self, dim: int, inter: int, tp: TPGroup, dtype: torch.dtype, reduce: bool = True) -> None:
        super().__init__()
        self.gate_up_proj = Linear(dim, 2 * inter, tp, "rows", dtype, parts=(("gate_proj", inter), ("up_proj", inter)))
        # reduce=False: the caller reduces (MoE sums routed and shared parts first).
        self.down_proj = Linear(inter, dim, tp, "cols", dtype, reduce=reduce)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)


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

    def forward(self, x: torch.Tensor, static: bool = False) -> torch.Tensor:
        """static=True: fixed shapes and no host synchronisation (a step that CUDA graphs or a
        fullgraph compile capture); static=False: only the selected experts run (eager steps)."""
        idx, weights = self.route(x)
        out = self.dispatch_static(x, idx, weights) if static else self.dispatch_sparse(x, idx, weights)
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return self.tp.all_reduce(out)

    def dispatch_sparse(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Each selected local expert on exactly its tokens. The expert list and token sets
        depend on the data: the host reads them (not capturable; eager steps only)."""
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        local = (idx >= self.expert_start) & (idx < self.expert_end)
        for e in torch.unique(idx[local]).tolist():
            token, slot = torch.where(idx == e)
            le = e - self.expert_start
            gate, up = F.linear(x[token], self.w_gate_up[le]).chunk(2, dim=-1)
            y = F.linear(F.silu(gate) * up, self.w_down[le])
            out.index_add_(0, token, y.float() * weights[token, slot, None])
        return out.to(x.dtype)

    def dispatch_static(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """Expert dispatch with shapes fixed by the token count alone. Few tokens (T x top-k <=
        local experts, decode): gather each assignment's expert weights and batch-multiply, so
        only the chosen experts' weights are read. More tokens: every local expert on every
        token, combined by the routing weights, so each expert's weights are read once.
        Assignments to other ranks' experts get weight 0. Every path sums the weighted expert
        outputs in float32, so that they agree with each other to float32 rounding."""
        T, k = idx.shape
        n_local = self.expert_end - self.expert_start
        local = idx - self.expert_start
        mine = (local >= 0) & (local < n_local)
        w = torch.where(mine, weights, torch.zeros_like(weights)).float()
        e = local.clamp(0, n_local - 1)
        if T * k <= n_local:
            xa = x.unsqueeze(1).expand(T, k, x.shape[-1]).reshape(T * k, -1, 1)
            h = torch.bmm(self.w_gate_up[e.reshape(-1)], xa).squeeze(-1)
            gate, up = h.chunk(2, dim=-1)
            y = torch.bmm(self.w_down[e.reshape(-1)], (F.silu(gate) * up).unsqueeze(-1)).squeeze(-1)
            return (y.float().view(T, k, -1) * w.unsqueeze(-1)).sum(1).to(x.dtype)
        combine = torch.zeros(T, n_local, dtype=torch.float32, device=x.device).scatter_add_(1, e, w)
        gate, up = torch.einsum("td,eid->eti", x, self.w_gate_up).chunk(2, dim=-1)
        y = torch.einsum("eti,edi->etd", F.silu(gate) * up, self.w_down)
        return torch.einsum("etd,te->td", y.float(), combine).to(x.dtype)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, layer: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.self_attn = MLAAttention(cfg, tp, layer, dtype)
        self.mlp: nn.Module = MoE(cfg, tp, dtype) if cfg.is_moe_layer(layer) else MLP(
            cfg.hidden_size, cfg.intermediate_size, tp, dtype)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)

    # A layer as the pieces that graph modes split at attention: attention_input (norm and
    # projections), the attention core (the backend's), finish (o_proj, residuals, MLP).
    def attention_input(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor,
                        sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self.self_attn.project(self.input_layernorm(x), rotary, cos, sin)

    def finish(self, x: torch.Tensor, o: torch.Tensor, static: bool) -> torch.Tensor:
        x = x + self.self_attn.output(o)
        h = self.post_attention_layernorm(x)
        return x + (self.mlp(h, static) if isinstance(self.mlp, MoE) else self.mlp(h))

    def forward(self, x: torch.Tensor, rotary: Rotary, cos: torch.Tensor, sin: torch.Tensor, meta: Any,
                backend: Any, static: bool = False) -> torch.Tensor:
        q_nope, q_rot, latent = self.attention_input(x, rotary, cos, sin)
        return self.finish(x, backend.attend(self.self_attn, q_nope, q_rot, latent, meta), static)


class DeepseekV3Model(nn.Module):
    def __init__(self, cfg: ModelConfig, tp: TPGroup, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.cfg, self.tp, self.dtype = cfg, tp, dtype
        self.embed_tokens = VocabEmbedding(cfg.vocab_size, cfg.hidden_size, tp, dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, tp, i, dtype) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.lm_head = LMHead(cfg.hidden_size, cfg.vocab_size, tp, dtype)
        self.rotary = Rotary(cfg.rope)

    @property
    def local_heads(self) -> int:
        """Attention heads on this rank."""
        return self.cfg.num_heads // self.tp.size

    def embed(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x = self.embed_tokens(ids)
        cos, sin = self.rotary.cos_sin(positions, x.dtype)
        return x, cos, sin

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, meta: Any, backend: Any,
                static: bool = False) -> torch.Tensor:
        """Hidden states after the final norm, [T, D]."""
        x, cos, sin = self.embed(ids, positions)
        for layer in self.layers:
            x = layer(x, self.rotary, cos, sin, meta, backend, static)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden)
