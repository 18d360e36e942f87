"""MLA attention cores behind one interface, and the honest choice between them.

    backend.attend(attn, q_nope [T,H,N], q_rot [T,H,R], latent [T,C+R], meta) -> [T,H,V]

Every backend writes the step's latents to the paged cache first. Prefill (`PrefillMeta`,
a ragged batch, always eager) decompresses K/V through kv_b_proj; decode (`DecodeMeta`,
fixed shapes, capturable) absorbs W_UK into the query and W_UV into the output and attends
over the latent cache directly.

Backends:
    torch_native  plain torch, CPU and GPU; decode is a fixed-shape gather over the block
                  table (graph-safe)
    flashinfer    FlashInfer's paged MLA decode kernel (fa2 / fa3); one wrapper per captured
                  batch size with static index buffers, planned on the host before each replay
    trtllm_mla    FlashInfer's trtllm-gen MLA kernels (Blackwell sm100 / sm103): decode over
                  [pages, page_size, C+R], ragged DeepSeek prefill

`select_backend` returns the backend that will really run and, when that is not the one the
plan asked for, why: the effective backend is always reported, never assumed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F

from cgsvc_worker.kv_cache import KVFormat, LatentKVCache

GPU_MLA_BACKENDS = ("flashinfer", "trtllm_mla", "fa3", "triton", "flashmla", "cutlass_mla")
WORKSPACE_BYTES = 128 * 1024 * 1024


@dataclass
class PrefillMeta:
    """A prefill step: a ragged batch whose attention core runs eagerly."""

    slots: torch.Tensor  # [T] cache slots of the step's rows (padding rows: the scratch slot)
    new_lens: list[int]  # tokens this step, per sequence
    ctx_slots: list[torch.Tensor]  # per sequence, the slots of its whole context after this step
    cache: LatentKVCache
    mode: str = "prefill"


@dataclass
class DecodeMeta:
    """A decode step of B rows with fixed shapes: one new token per row, its context read
    through the block table. Padding rows have context length 1 on the scratch page."""

    slots: torch.Tensor  # [B] long
    block_table: torch.Tensor  # [B, max_pages] int32
    ctx_lens: torch.Tensor  # [B] int32
    cache: LatentKVCache
    # Host copies for kernels that plan on the host (FlashInfer); never read inside a graph.
    host_lens: list[int] = field(default_factory=list)
    host_pages: list[list[int]] = field(default_factory=list)
    mode: str = "decode"

    @property
    def capacity(self) -> int:
        """Context positions one row can hold (the block table's width in tokens)."""
        return int(self.block_table.shape[1]) * self.cache.page_size


def decode_meta(cache: LatentKVCache, slots: torch.Tensor, lens: list[int], pages: list[list[int]], rows: int,
                max_pages: int) -> DecodeMeta:
    """Host-built metadata for `rows` rows (len(lens) real ones, the rest padding)."""
    pad = rows - len(lens)
    lens_all = lens + [1] * pad
    pages_all = pages + [[cache.SCRATCH_PAGE]] * pad
    table = torch.full((rows, max_pages), cache.SCRATCH_PAGE, dtype=torch.int32)
    for i, p in enumerate(pages_all):
        table[i, : len(p)] = torch.tensor(p, dtype=torch.int32)
    dev = cache.device
    full_slots = torch.full((rows,), cache.scratch_slot, dtype=torch.long, device=dev)
    full_slots[: len(lens)] = slots
    return DecodeMeta(full_slots, table.to(dev), torch.tensor(lens_all, dtype=torch.int32, device=dev), cache,
                      lens_all, pages_all)


class TorchNativeMLA:
    """The reference backend: plain torch, CPU and GPU. Subclasses replace prefill or decode."""

    name = "torch_native"

    def attend(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor,
               meta: PrefillMeta | DecodeMeta) -> torch.Tensor:
        meta.cache.write(attn.layer, meta.slots, latent)
        if meta.mode == "prefill":
            return self.prefill(attn, q_nope, q_rot, meta)  # type: ignore[arg-type]
        return self.decode(attn, q_nope, q_rot, meta)  # type: ignore[arg-type]

    def prefill(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        cfg, H = attn.cfg, attn.heads
        C, N, V = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim
        outs, start = [], 0
        for n, slots in zip(meta.new_lens, meta.ctx_slots, strict=True):
            ctx = meta.cache.read(attn.layer, slots).to(q_nope.dtype)  # [L, C+R]
            L = ctx.shape[0]
            kv = F.linear(ctx[:, :C], attn.kv_b_proj.weight).view(L, H, N + V)
            k = torch.cat([kv[..., :N], ctx[:, None, C:].expand(L, H, cfg.qk_rope_head_dim)], dim=-1)
            q = torch.cat([q_nope[start:start + n], q_rot[start:start + n]], dim=-1)
            prefix = L - n
            mask = None
            if prefix:  # earlier chunks of this sequence: visible to every new token
                mask = torch.arange(L, device=q.device)[None, :] <= (prefix + torch.arange(n, device=q.device))[:, None]
            o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), kv[..., N:].transpose(0, 1),
                                               attn_mask=mask, is_causal=mask is None, scale=attn.scale)
            outs.append(o.transpose(0, 1))
            start += n
        out = torch.cat(outs, dim=0)
        pad = q_nope.shape[0] - start
        if pad:  # padding rows of a padded step: nothing to attend to
            out = torch.cat([out, out.new_zeros(pad, *out.shape[1:])], dim=0)
        return out

    def decode(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        # Accumulate in fp32, as the GPU kernels do: the absorbed path multiplies more
        # low-precision factors than the decompressed one and would drift in bf16.
        C, f32, P = attn.cfg.kv_lora_rank, torch.float32, meta.cache.page_size
        pos = torch.arange(meta.capacity, device=q_nope.device)
        idx = meta.block_table.long()[:, pos // P] * P + pos % P  # [B, capacity] slots
        mask = pos[None, :] < meta.ctx_lens[:, None]
        ctx = meta.cache.read(attn.layer, idx).to(f32)  # [B, capacity, C+R]
        c, k_rot = ctx[..., :C], ctx[..., C:]
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope.to(f32), attn.w_uk)  # W_UK absorbed into the query
        scores = (torch.einsum("bhc,blc->bhl", q_lat, c) + torch.einsum("bhr,blr->bhl", q_rot.to(f32), k_rot)) * attn.scale
        p = torch.softmax(scores.masked_fill(~mask[:, None, :], float("-inf")), dim=-1)
        o_lat = torch.einsum("bhl,blc->bhc", p, c)
        return torch.einsum("bhc,hvc->bhv", o_lat, attn.w_uv).to(q_nope.dtype)  # W_UV absorbed

    # Hooks for kernels that plan on the host before a step (no-ops here).
    def prepare_graph(self, rows: int) -> None:
        """Called once per captured batch size, before its capture."""

    def plan(self, meta: DecodeMeta, graph_rows: int | None) -> None:
        """Called before every decode step (eager, or before a graph's replay), outside capture."""


class FlashInferMLA(TorchNativeMLA):
    """FlashInfer's paged MLA decode kernel (absorbed). One wrapper per captured batch size,
    built with use_cuda_graph=True over static index buffers; `plan()` (which copies to the
    host) runs outside capture before each replay; eager steps use a plain wrapper. Prefill is
    not this class's job (select_backend reports prefill as torch_native)."""

    name = "flashinfer"

    def __init__(self, device: torch.device, cache: LatentKVCache, heads: int, kv_lora_rank: int, rope_dim: int,
                 scale: float, q_dtype: torch.dtype, kernels: Any = None) -> None:
        self.kernels = kernels or importlib.import_module("flashinfer.mla")
        self.device, self.cache, self.heads = device, cache, heads
        self.C, self.R, self.scale, self.q_dtype = kv_lora_rank, rope_dim, scale, q_dtype
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.int8, device=device)
        self.eager = self.kernels.BatchMLAPagedAttentionWrapper(self.workspace)
        self.graph_wrappers: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
        self.current: Any = None
        self.plans = 0  # host plans made (one per step, shared by every layer)

    def prepare_graph(self, rows: int) -> None:
        dev, i32 = self.device, torch.int32
        bufs = {"qo_indptr": torch.arange(rows + 1, dtype=i32, device=dev),
                "kv_indptr": torch.zeros(rows + 1, dtype=i32, device=dev),
                # every page of the pool, plus the scratch page once per padding row
                "kv_indices": torch.zeros(self.cache.num_pages + rows, dtype=i32, device=dev),
                "kv_len_arr": torch.ones(rows, dtype=i32, device=dev)}
        wrapper = self.kernels.BatchMLAPagedAttentionWrapper(
            self.workspace, use_cuda_graph=True, qo_indptr=bufs["qo_indptr"], kv_indptr=bufs["kv_indptr"],
            kv_indices=bufs["kv_indices"], kv_len_arr=bufs["kv_len_arr"])
        self.graph_wrappers[rows] = (wrapper, bufs)

    def plan(self, meta: DecodeMeta, graph_rows: int | None) -> None:
        rows = len(meta.host_lens)
        counts = [len(p) for p in meta.host_pages]
        kv_indptr = torch.tensor([0] + counts, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        kv_indices = torch.tensor([x for p in meta.host_pages for x in p], dtype=torch.int32)
        wrapper = self.eager if graph_rows is None else self.graph_wrappers[graph_rows][0]
        wrapper.plan(torch.arange(rows + 1, dtype=torch.int32), kv_indptr, kv_indices,
                     torch.tensor(meta.host_lens, dtype=torch.int32), self.heads, self.C, self.R,
                     self.cache.page_size, False, self.scale, self.q_dtype, self.cache.dtype)
        self.current = wrapper
        self.plans += 1

    def decode(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        C, cache = self.C, meta.cache
        paged = cache.paged(attn.layer)
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope.float(), attn.w_uk).to(q_nope.dtype).contiguous()
        extra: dict[str, float] = {}
        if cache.format.fp8:
            s_c, s_r = cache.scale_values[attn.layer]
            extra = {"ckv_scale": s_c, "kpe_scale": s_r}
        o_lat = self.current.run(q_lat, q_rot.contiguous(), paged[..., :C], paged[..., C:], **extra)
        return torch.einsum("bhc,hvc->bhv", o_lat.float(), attn.w_uv).to(q_nope.dtype)


class TrtllmMLA(TorchNativeMLA):
    """FlashInfer's trtllm-gen MLA kernels (Blackwell sm100 / sm103). Decode reads the latent
    cache as [pages, page_size, C+R] (page size 32 or 64) through the block table, with the
    query and KV in one dtype (bf16, or fp8 with bf16 output) and the softmax and value scales
    folded into bmm1_scale / bmm2_scale; its arguments are the step's static tensors, so it
    captures. Prefill runs the ragged DeepSeek kernel over the decompressed K/V."""

    name = "trtllm_mla"
    PAGE_SIZES = (32, 64)

    def __init__(self, device: torch.device, cfg: Any, kernels: Any = None) -> None:
        if kernels is None:
            mla = importlib.import_module("flashinfer.mla")
            prefill = importlib.import_module("flashinfer.prefill")
            kernels = type("TrtllmKernels", (), {
                "decode": staticmethod(mla.trtllm_batch_decode_with_kv_cache_mla),
                "ragged_prefill": staticmethod(prefill.trtllm_ragged_attention_deepseek)})
        self.kernels, self.cfg = kernels, cfg
        # Zero-initialised: the kernels keep semaphores in their workspace.
        self.workspace = torch.zeros(WORKSPACE_BYTES, dtype=torch.uint8, device=device)

    def decode(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        cfg, cache = self.cfg, meta.cache
        kv = cache.paged(attn.layer)
        # One kernel scale cannot serve two KV scales: the latent's and the rope key's are folded
        # into the query's two parts instead (q.k = (q_c s_c).c' + (q_r s_r).k_r'), the latent's
        # also into bmm2 (o = s_c p.c').
        s_c, s_r = cache.scale_values[attn.layer] if cache.format.fp8 else (1.0, 1.0)
        q_lat = torch.einsum("bhn,hnc->bhc", q_nope.float(), attn.w_uk) * s_c
        query = torch.cat([q_lat, q_rot.float() * s_r], dim=-1).unsqueeze(1).to(kv.dtype)  # [B, 1, H, C+R]
        out = self.kernels.decode(
            query=query, kv_cache=kv, workspace_buffer=self.workspace, qk_nope_head_dim=cfg.qk_nope_head_dim,
            kv_lora_rank=cfg.kv_lora_rank, qk_rope_head_dim=cfg.qk_rope_head_dim, block_tables=meta.block_table,
            seq_lens=meta.ctx_lens, max_seq_len=meta.capacity, bmm1_scale=attn.scale, bmm2_scale=s_c)
        o_lat = out.reshape(q_nope.shape[0], attn.heads, cfg.kv_lora_rank).float()
        return torch.einsum("bhc,hvc->bhv", o_lat, attn.w_uv).to(q_nope.dtype)

    def prefill(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, meta: PrefillMeta) -> torch.Tensor:
        cfg, H = self.cfg, attn.heads
        C, N, V, R = cfg.kv_lora_rank, cfg.qk_nope_head_dim, cfg.v_head_dim, cfg.qk_rope_head_dim
        real = sum(meta.new_lens)
        ctx = meta.cache.read(attn.layer, torch.cat(meta.ctx_slots)).to(q_nope.dtype)  # [Lkv, C+R]
        kv = F.linear(ctx[:, :C], attn.kv_b_proj.weight).view(-1, H, N + V)
        k = torch.cat([kv[..., :N], ctx[:, None, C:].expand(-1, H, R)], dim=-1).contiguous()
        v = kv[..., N:].contiguous()
        q = torch.cat([q_nope[:real], q_rot[:real]], dim=-1).contiguous()
        dev = q.device
        kv_lens = [int(s.numel()) for s in meta.ctx_slots]
        cum_q = torch.tensor([0] + meta.new_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(dev)
        cum_kv = torch.tensor([0] + kv_lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(dev)
        out = self.kernels.ragged_prefill(
            query=q, key=k, value=v, workspace_buffer=self.workspace,
            seq_lens=torch.tensor(kv_lens, dtype=torch.int32, device=dev), max_q_len=max(meta.new_lens),
            max_kv_len=max(kv_lens), bmm1_scale=attn.scale, bmm2_scale=1.0, o_sf_scale=1.0,
            batch_size=len(kv_lens), window_left=-1, cum_seq_lens_q=cum_q, cum_seq_lens_kv=cum_kv,
            enable_pdl=None, is_causal=True, return_lse=False)
        pad = q_nope.shape[0] - real
        return torch.cat([out, out.new_zeros(pad, H, V)], dim=0) if pad else out


@dataclass(frozen=True)
class BackendChoice:
    requested: str
    effective: str
    reason: str  # empty when effective == requested

    def to_dict(self) -> dict[str, str]:
        return {"requested": self.requested, "effective": self.effective, "reason": self.reason}


def compute_capability(device: torch.device) -> tuple[int, int]:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)


def select_backend(requested: str, phase: str, device: torch.device, cache: LatentKVCache, cfg: Any, heads: int,
                   model_dtype: torch.dtype, kernels: Any = None,
                   capability: tuple[int, int] | None = None) -> tuple[TorchNativeMLA, BackendChoice]:
    """The attention core that will run `phase` ("prefill" or "decode") for the plan's
    `requested` backend, falling back honestly to torch_native with the reason. `capability`
    given explicitly selects as for a GPU of that compute capability whatever the device
    (tests do so on a CPU with reference kernels); otherwise it is read from the device."""
    def native(reason: str) -> tuple[TorchNativeMLA, BackendChoice]:
        return TorchNativeMLA(), BackendChoice(requested, "torch_native", reason)

    if requested == "torch_native":
        return TorchNativeMLA(), BackendChoice(requested, "torch_native", "")
    if requested not in GPU_MLA_BACKENDS:
        return native(f"{requested!r} is not an MLA attention backend this worker knows "
                      f"({', '.join(GPU_MLA_BACKENDS)}, torch_native)")
    if device.type != "cuda" and capability is None:
        return native(f"{requested} kernels need a CUDA device; this rank runs on {device.type}")
    major, minor = capability or compute_capability(device)
    fmt: KVFormat = cache.format
    if requested == "trtllm_mla":
        problem = trtllm_problem((major, minor), cfg, model_dtype, fmt, cache.page_size)
        if not problem:
            try:
                return TrtllmMLA(device, cfg, kernels), BackendChoice(requested, "trtllm_mla", "")
            except ImportError as exc:
                problem = f"flashinfer is not importable ({exc}); install the 'gpu' extra"
        if phase == "prefill":
            return native(f"{problem}; prefill's ragged attention runs torch SDPA")
        choice, reason = _flashinfer_decode(device, cache, cfg, heads, model_dtype, kernels, (major, minor))
        if isinstance(choice, FlashInferMLA):
            return choice, BackendChoice(requested, "flashinfer", f"{problem}; FlashInfer's MLA decode kernel "
                                                                  "is the nearest on this GPU")
        return native(f"{problem}; {reason}")
    if phase == "prefill":
        return native(f"this worker binds {requested} for MLA decode only; prefill's ragged decompressed attention "
                      "runs torch SDPA")
    choice, reason = _flashinfer_decode(device, cache, cfg, heads, model_dtype, kernels, (major, minor))
    if not isinstance(choice, FlashInferMLA):
        return native(reason)
    if requested == "flashinfer":
        return choice, BackendChoice(requested, "flashinfer", "")
    return choice, BackendChoice(requested, "flashinfer", f"no {requested} binding in this worker; FlashInfer's MLA "
                                                          "decode kernel (fa3 on sm90, fa2 elsewhere) is the nearest")


def trtllm_problem(cc: tuple[int, int], cfg: Any, model_dtype: torch.dtype, fmt: KVFormat, page_size: int) -> str:
    """Why the trtllm-gen MLA kernels cannot run this configuration, or ''."""
    if cc[0] != 10:
        return f"trtllm-gen MLA kernels run on Blackwell sm100 / sm103 only; this GPU is sm{cc[0]}{cc[1]}"
    if (cfg.kv_lora_rank, cfg.qk_rope_head_dim) not in ((512, 64), (256, 64)):
        return (f"trtllm-gen MLA needs a latent of 512 or 256 and a rope dim of 64 "
                f"(model: {cfg.kv_lora_rank}, {cfg.qk_rope_head_dim})")
    if model_dtype != torch.bfloat16:
        return f"trtllm-gen MLA computes in bfloat16; the model runs {str(model_dtype).removeprefix('torch.')}"
    if fmt.name not in ("auto", "bfloat16", "fp8_e4m3"):
        return f"trtllm-gen MLA reads a bf16 or fp8_e4m3 KV cache; the plan's cache is {fmt.name}"
    if page_size not in TrtllmMLA.PAGE_SIZES:
        return f"trtllm-gen MLA reads pages of 32 or 64 tokens; the cache has pages of {page_size}"
    return ""


def _flashinfer_decode(device: torch.device, cache: LatentKVCache, cfg: Any, heads: int, model_dtype: torch.dtype,
                       kernels: Any, cc: tuple[int, int]) -> tuple[FlashInferMLA | None, str]:
    """FlashInfer's MLA decode for this configuration, or None and why not."""
    fmt = cache.format
    if cfg.kv_lora_rank % 128 or cfg.qk_rope_head_dim != 64:
        return None, (f"FlashInfer MLA needs kv_lora_rank % 128 == 0 and a rope dim of 64 "
                      f"(model: {cfg.kv_lora_rank}, {cfg.qk_rope_head_dim})")
    if model_dtype not in (torch.float16, torch.bfloat16):
        return None, (f"FlashInfer MLA takes fp16 / bf16 queries; the model runs "
                      f"{str(model_dtype).removeprefix('torch.')} (run with --dtype bfloat16)")
    if fmt.name in ("fp8_e5m2", "fp4_e2m1"):
        return None, f"FlashInfer MLA reads fp16 / bf16 / fp8_e4m3 KV; the plan's cache is {fmt.name}"
    if fmt.name == "fp8_e4m3" and (cc[0] != 9 or model_dtype != torch.bfloat16 or cfg.kv_lora_rank != 512):
        return None, "FlashInfer's fp8 MLA needs sm90, bf16 queries and a latent of 512"
    if fmt.name in ("float16", "bfloat16") and fmt.dtype != model_dtype:
        return None, f"FlashInfer MLA reads KV in the query dtype; the cache is {fmt.name}, the model {model_dtype}"
    try:
        return FlashInferMLA(device, cache, heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim, float(cfg.softmax_scale),
                             model_dtype, kernels), ""
    except ImportError as exc:
        return None, f"flashinfer is not importable ({exc}); install the 'gpu' extra"

