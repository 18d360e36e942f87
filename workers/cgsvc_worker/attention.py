"""MLA attention backends behind one interface, and the honest choice between them.

    backend.attend(attn, q_nope [T,H,N], q_rot [T,H,R], latent [T,C+R], batch) -> [T,H,V]

Every backend writes the new tokens' latents to the paged cache first. Prefill decompresses
K/V through kv_b_proj over the ragged batch; decode absorbs W_UK into the query and W_UV
into the output and attends over the latent cache directly.

`select_backend` returns the backend that will really run and, when that is not the one
the plan asked for, why: the effective backend is always reported, never assumed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from cgsvc_worker.kv_cache import LatentKVCache


@dataclass
class StepBatch:
    """What attention needs to know about one forward step."""

    mode: str  # "prefill" or "decode"
    seq_ids: list[int]
    new_lens: list[int]  # tokens this step, per sequence
    ctx_lens: list[int]  # context length after this step, per sequence
    slots: torch.Tensor  # [T] cache slots of this step's tokens
    ctx_slots: list[torch.Tensor]  # per sequence, the slots of its whole context
    cache: LatentKVCache
    extras: dict[str, Any] = field(default_factory=dict)

    def padded_context(self) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, Lmax] slot indices (0-padded) and the [B, Lmax] validity mask."""
        if "padded" not in self.extras:
            lmax = max(self.ctx_lens)
            dev = self.cache.device
            idx = torch.zeros(len(self.ctx_lens), lmax, dtype=torch.long, device=dev)
            for i, s in enumerate(self.ctx_slots):
                idx[i, : s.numel()] = s
            mask = torch.arange(lmax, device=dev)[None, :] < torch.tensor(self.ctx_lens, device=dev)[:, None]
            self.extras["padded"] = (idx, mask)
        return self.extras["padded"]  # type: ignore[no-any-return]


class TorchNativeMLA:
    """The reference backend: plain torch, CPU and GPU. Subclasses replace prefill or decode."""

    name = "torch_native"

    def attend(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor,
               batch: StepBatch) -> torch.Tensor:
        batch.cache.write(attn.layer, batch.slots, latent)
        if batch.mode == "prefill":
            return self.prefill(attn, q_nope, q_rot, batch)
        return self.decode(attn, q_nope, q_rot, batch)

    def prefill(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        cfg, H = attn.cfg, attn.heads
        C, N, V = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        outs, start = [], 0
        for n, slots in zip(batch.new_lens, batch.ctx_slots, strict=True):
            ctx = batch.cache.read(attn.layer, slots).to(q_nope.dtype)  # [L, C+R]
            L = ctx.shape[0]
            kv = F.linear(ctx[:, :C], attn.kv_b_proj.weight).view(L, H, N + V)
            k = torch.cat([kv[..., :N], ctx[:, None, C:].expand(L, H, cfg.qk_rope_head_dim)], dim=-1)
            q = torch.cat([q_nope[start:start + n], q_rot[start:start + n]], dim=-1)
            prefix = L - n
            mask = None
            if prefix:
                mask = torch.arange(L, device=q.device)[None, :] <= (prefix + torch.arange(n, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), kv[..., N:].transpose(0, 1),
                                               attn_mask=mask, is_causal=mask is None, scale=attn.scale)
            outs.append(o.transpose(0, 1))
            start += n
        return torch.cat(outs, dim=0)

    def decode(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        # Accumulate in fp32, as the GPU kernels do: the absorbed path multiplies more
        # low-precision factors than the decompressed one and would drift in bf16.
        C, f32 = attn.cfg.kv_lora_rank, torch.float32
        idx, mask = batch.padded_context()
        ctx = batch.cache.pool[attn.layer][idx].to(f32)  # [B, L, C+R]
        c, k_rot = ctx[..., :C], ctx[..., C:]
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope.to(f32), attn.w_uk)  # W_UK absorbed into the query
        scores = (torch.einsum("bhc,blc->bhl", q_lat, c) + torch.einsum("bhr,blr->bhl", q_rot.to(f32), k_rot)) * attn.scale
        p = torch.softmax(scores.masked_fill(~mask[:, None, :], float("-inf")), dim=-1)
        o_lat = torch.einsum("bhl,blc->bhc", p, c)
        return torch.einsum("bhc,hvc->bhv", o_lat, attn.w_uv).to(q_nope.dtype)  # W_UV absorbed


class FlashInferMLA(TorchNativeMLA):
    """flashinfer's paged MLA kernel for decode (absorbed); prefill stays on the ragged
    decompressed path. Needs a CUDA device, kv_lora_rank % 128 == 0 and a rope dim of 64."""

    name = "flashinfer"

    def __init__(self, device: torch.device) -> None:
        import flashinfer  # noqa: F401 - imported for its side effect of failing early
        from flashinfer.mla import BatchMLAPagedAttentionWrapper

        self.workspace = torch.empty(128 * 1024 * 1024, dtype=torch.int8, device=device)
        self.wrapper = BatchMLAPagedAttentionWrapper(self.workspace)
        self.planned_for: object = None

    def decode(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, batch: StepBatch) -> torch.Tensor:
        cfg, cache = attn.cfg, batch.cache
        C, P = cfg.kv_lora_rank, cache.page_size
        if self.planned_for is not batch:  # one plan per step, shared by every layer
            dev = q_nope.device
            pages = [cache.seqs[s].pages for s in batch.seq_ids]
            kv_indptr = torch.tensor([0] + [sum(len(p) for p in pages[: i + 1]) for i in range(len(pages))],
                                     dtype=torch.int32, device=dev)
            self.wrapper.plan(torch.arange(len(pages) + 1, dtype=torch.int32, device=dev), kv_indptr,
                              torch.tensor([x for p in pages for x in p], dtype=torch.int32, device=dev),
                              torch.tensor(batch.ctx_lens, dtype=torch.int32, device=dev), attn.heads, C,
                              cfg.qk_rope_head_dim, P, False, attn.scale, q_nope.dtype, cache.dtype)
            self.planned_for = batch
        pool = cache.pool[attn.layer].view(cache.num_pages, P, -1)
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope.float(), attn.w_uk).to(q_nope.dtype).contiguous()
        o_lat = self.wrapper.run(q_lat, q_rot.contiguous(), pool[..., :C], pool[..., C:])
        return torch.einsum("bhc,hvc->bhv", o_lat.float(), attn.w_uv).to(q_nope.dtype)


@dataclass(frozen=True)
class BackendChoice:
    requested: str
    effective: str
    reason: str  # empty when effective == requested

    def to_dict(self) -> dict[str, str]:
        return {"requested": self.requested, "effective": self.effective, "reason": self.reason}


def select_backend(requested: str, device: torch.device, kv_lora_rank: int, rope_dim: int) -> tuple[Any, BackendChoice]:
    """The backend that will run for `requested`, falling back honestly to torch_native."""
    def native(reason: str) -> tuple[Any, BackendChoice]:
        return TorchNativeMLA(), BackendChoice(requested, "torch_native", reason)

    if requested == "torch_native":
        return TorchNativeMLA(), BackendChoice(requested, "torch_native", "")
    if device.type != "cuda":
        return native(f"{requested} kernels need a CUDA device; this rank runs on {device.type}")
    if requested in ("flashinfer", "trtllm_mla", "fa3", "triton", "flashmla", "cutlass_mla"):
        if kv_lora_rank % 128 or rope_dim != 64:
            return native(f"flashinfer MLA needs kv_lora_rank % 128 == 0 and a rope dim of 64 "
                          f"(model: {kv_lora_rank}, {rope_dim})")
        try:
            backend = FlashInferMLA(device)
        except ImportError as exc:
            return native(f"flashinfer is not importable ({exc}); install the 'gpu' extra")
        if requested == "flashinfer":
            return backend, BackendChoice(requested, "flashinfer", "")
        return backend, BackendChoice(requested, "flashinfer",
                                      f"no {requested} binding in this worker; flashinfer's MLA kernel is the "
                                      "nearest available on this GPU")
    return native(f"unknown attention backend {requested!r}")
