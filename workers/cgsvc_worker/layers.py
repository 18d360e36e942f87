"""Building blocks: RMSNorm, tensor-parallel linear layers, the embedding and YaRN rotary."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from cgsvc_worker.config import RopeConfig
from cgsvc_worker.tp import TPGroup


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class Linear(nn.Module):
    """y = x W^T. `shard` says how the hub tensor [out, in] is split across TP ranks:
    "rows" (column-parallel: each rank owns out/tp outputs), "cols" (row-parallel: in/tp
    inputs, all-reduced after unless reduce=False), or None (replicated).

    `parts` fuses several hub tensors that read the same input into one matrix, one GEMM
    instead of several (as serving engines merge gate/up or the MLA down-projections): the
    hub names (siblings of this module) and their output sizes, stacked in that order, each
    sharded on its own."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup, shard: str | None = None,
                 dtype: torch.dtype = torch.float32, reduce: bool = True,
                 parts: tuple[tuple[str, int], ...] = ()) -> None:
        super().__init__()
        self.tp, self.shard, self.parts = tp, shard, parts
        if parts and sum(n for _, n in parts) != out_features:
            raise ValueError(f"fused parts {parts} do not add up to {out_features} outputs")
        self.reduce = reduce and shard == "cols"
        if shard == "rows":
            out_features //= tp.size
        elif shard == "cols":
            in_features //= tp.size
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight)
        if self.reduce:
            y = self.tp.all_reduce(y)
        return y


class VocabEmbedding(nn.Module):
    """Embedding rows split by vocabulary; ids outside a rank's range contribute zeros, summed by all-reduce."""

    def __init__(self, vocab: int, dim: int, tp: TPGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.tp = tp
        self.start, self.end = tp.shard(vocab, "vocabulary rows")
        self.weight = nn.Parameter(torch.empty(self.end - self.start, dim, dtype=dtype), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        return self.tp.all_reduce(out)


class LMHead(nn.Module):
    """Vocabulary-parallel output projection; logits are gathered to every rank."""

    def __init__(self, dim: int, vocab: int, tp: TPGroup, dtype: torch.dtype) -> None:
        super().__init__()
        self.tp = tp
        self.weight = nn.Parameter(torch.empty(vocab // tp.size, dim, dtype=dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tp.all_gather_last(F.linear(x, self.weight))


def _yarn_inv_freq(cfg: RopeConfig) -> tuple[torch.Tensor, float]:
    dim, base = cfg.dim, cfg.theta
    pos_freqs = base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if cfg.rope_type != "yarn":
        return 1.0 / pos_freqs, 1.0

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    def correction_dim(rotations: float) -> float:
        return (dim * math.log(cfg.original_max_position_embeddings / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(cfg.beta_fast), correction_dim(cfg.beta_slow)
    if cfg.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (cfg.factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    if cfg.mscale and cfg.mscale_all_dim:
        attention_factor = mscale(cfg.factor, cfg.mscale) / mscale(cfg.factor, cfg.mscale_all_dim)
    else:
        attention_factor = mscale(cfg.factor)
    return inv_freq, attention_factor


class Rotary(nn.Module):
    """YaRN rotary embedding with DeepSeek's mscale, applied to interleaved pairs when the
    checkpoint lays them out that way (DeepSeek-V3's rope_interleave)."""

    def __init__(self, cfg: RopeConfig) -> None:
        super().__init__()
        inv_freq, self.scaling = _yarn_inv_freq(cfg)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.interleave = cfg.interleave

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq: torch.Tensor = self.inv_freq  # type: ignore[assignment]
        freqs = positions.float()[:, None] * inv_freq[None, :]
        return (freqs.cos() * self.scaling).to(dtype), (freqs.sin() * self.scaling).to(dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [tokens, heads, dim]; cos/sin: [tokens, dim/2]."""
        c, s = cos[:, None, :], sin[:, None, :]
        if self.interleave:
            x1, x2 = x[..., 0::2], x[..., 1::2]
        else:
            half = x.shape[-1] // 2
            x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)
