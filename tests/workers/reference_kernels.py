"""FlashInfer's MLA kernel contracts, written in plain torch, so that the worker's GPU-side
bookkeeping (page tables, static buffers for CUDA graphs, padding rows, scales, layouts) is
tested on a CPU. They follow the documented signatures and semantics of flashinfer 0.6.x
(`BatchMLAPagedAttentionWrapper`, `trtllm_batch_decode_with_kv_cache_mla`,
`trtllm_ragged_attention_deepseek`), including the refusals the real kernels make; the real
kernels themselves run in `make gpu-check` on a GPU."""

from __future__ import annotations

from typing import Any

import torch

KV_DTYPES = (torch.float16, torch.bfloat16, torch.float8_e4m3fn)


class BatchMLAPagedAttentionWrapper:
    """plan() on the host (it copies the index arrays; into the static buffers when built
    with use_cuda_graph=True), run() reads the paged ckv / kpe caches through them."""

    instances: list[BatchMLAPagedAttentionWrapper] = []

    def __init__(self, float_workspace_buffer: torch.Tensor, use_cuda_graph: bool = False,
                 qo_indptr: torch.Tensor | None = None, kv_indptr: torch.Tensor | None = None,
                 kv_indices: torch.Tensor | None = None, kv_len_arr: torch.Tensor | None = None,
                 backend: str = "auto") -> None:
        self.use_cuda_graph = use_cuda_graph
        self.bufs = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices,
                     "kv_len_arr": kv_len_arr}
        if use_cuda_graph and any(v is None for v in self.bufs.values()):
            raise ValueError("use_cuda_graph=True needs every index buffer")
        self.planned = False
        BatchMLAPagedAttentionWrapper.instances.append(self)

    def plan(self, qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
             kv_len_arr: torch.Tensor, num_heads: int, head_dim_ckv: int, head_dim_kpe: int, page_size: int,
             causal: bool, sm_scale: float, q_data_type: torch.dtype, kv_data_type: torch.dtype) -> None:
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_indices", kv_indices),
                        ("kv_len_arr", kv_len_arr)):
            if t.dtype != torch.int32:
                raise ValueError(f"{name} must be int32")
        if kv_data_type not in KV_DTYPES or q_data_type not in (torch.float16, torch.bfloat16):
            raise ValueError(f"MLA q {q_data_type} / kv {kv_data_type} is not supported")
        arrays = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr, "kv_indices": kv_indices, "kv_len_arr": kv_len_arr}
        if self.use_cuda_graph:
            for name, t in arrays.items():
                buf = self.bufs[name]
                assert buf is not None
                if name != "kv_indices" and buf.numel() != t.numel():
                    raise ValueError(f"{name}: a CUDA-graph wrapper is planned for a fixed batch size "
                                     f"({buf.numel()} entries), got {t.numel()}")
                buf[: t.numel()].copy_(t)
        else:
            self.bufs = {k: v.clone() for k, v in arrays.items()}
        self.heads, self.C, self.R, self.P = num_heads, head_dim_ckv, head_dim_kpe, page_size
        self.scale, self.q_dtype, self.kv_dtype = sm_scale, q_data_type, kv_data_type
        self.planned = True

    def run(self, q_nope: torch.Tensor, q_pe: torch.Tensor, ckv_cache: torch.Tensor, kpe_cache: torch.Tensor,
            ckv_scale: float | None = None, kpe_scale: float | None = None) -> torch.Tensor:
        assert self.planned, "run() before plan()"
        if q_nope.dtype != self.q_dtype or ckv_cache.dtype != self.kv_dtype:
            raise ValueError("dtypes differ from the planned ones")
        if (self.kv_dtype == torch.float8_e4m3fn) != (ckv_scale is not None):
            raise ValueError("an fp8 cache needs ckv_scale / kpe_scale, another cache must not get them")
        b = self.bufs
        kv_indptr, kv_indices, kv_len = b["kv_indptr"], b["kv_indices"], b["kv_len_arr"]
        assert kv_indptr is not None and kv_indices is not None and kv_len is not None
        rows = []
        for i in range(q_nope.shape[0]):
            pages = kv_indices[int(kv_indptr[i]): int(kv_indptr[i + 1])].long()
            n = int(kv_len[i])
            ckv = ckv_cache[pages].reshape(-1, self.C)[:n].float() * (ckv_scale or 1.0)
            kpe = kpe_cache[pages].reshape(-1, self.R)[:n].float() * (kpe_scale or 1.0)
            s = (q_nope[i].float() @ ckv.T + q_pe[i].float() @ kpe.T) * self.scale
            rows.append(torch.softmax(s, -1) @ ckv)
        return torch.stack(rows).to(q_nope.dtype)


class Trtllm:
    """trtllm-gen MLA: decode over [pages, page_size, C+R] with one dtype for query and KV and
    the scales folded into bmm1_scale / bmm2_scale; ragged DeepSeek prefill, causal aligned
    to the end of each sequence."""

    calls: list[dict[str, Any]] = []

    @staticmethod
    def decode(query: torch.Tensor, kv_cache: torch.Tensor, workspace_buffer: torch.Tensor, qk_nope_head_dim: int,
               kv_lora_rank: int, qk_rope_head_dim: int, block_tables: torch.Tensor, seq_lens: torch.Tensor,
               max_seq_len: int, bmm1_scale: float = 1.0, bmm2_scale: float = 1.0) -> torch.Tensor:
        Trtllm.calls.append({"kind": "decode", "page_size": kv_cache.shape[1], "query": tuple(query.shape),
                             "dtype": query.dtype})
        if query.dtype != kv_cache.dtype or kv_cache.shape[1] not in (32, 64):
            raise ValueError("query and KV in one dtype, pages of 32 or 64 tokens")
        if block_tables.dtype != torch.int32 or seq_lens.dtype != torch.int32:
            raise ValueError("block_tables and seq_lens must be int32")
        B, P, C = query.shape[0], kv_cache.shape[1], kv_lora_rank
        out = []
        for i in range(B):
            n = int(seq_lens[i])
            pages = block_tables[i, : -(-n // P)].long()
            kv = kv_cache[pages].reshape(-1, kv_cache.shape[-1])[:n].float()
            q = query[i, 0].float()  # [H, C+R]
            p = torch.softmax((q @ kv.T) * bmm1_scale, -1)
            out.append((p @ kv[:, :C]) * bmm2_scale)
        return torch.stack(out).unsqueeze(1).to(torch.bfloat16 if query.dtype != torch.float32 else torch.float32)

    @staticmethod
    def ragged_prefill(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, workspace_buffer: torch.Tensor,
                       seq_lens: torch.Tensor, max_q_len: int, max_kv_len: int, bmm1_scale: float, bmm2_scale: float,
                       o_sf_scale: float, batch_size: int, window_left: int, cum_seq_lens_q: torch.Tensor,
                       cum_seq_lens_kv: torch.Tensor, enable_pdl: Any, is_causal: bool,
                       return_lse: bool) -> torch.Tensor:
        Trtllm.calls.append({"kind": "prefill", "batch": batch_size})
        out = []
        for i in range(batch_size):
            qs, qe = int(cum_seq_lens_q[i]), int(cum_seq_lens_q[i + 1])
            ks, ke = int(cum_seq_lens_kv[i]), int(cum_seq_lens_kv[i + 1])
            q, k, v = query[qs:qe].float(), key[ks:ke].float(), value[ks:ke].float()
            s = torch.einsum("qhd,khd->hqk", q, k) * bmm1_scale
            n, m = qe - qs, ke - ks
            mask = torch.arange(m)[None, :] <= (m - n + torch.arange(n))[:, None]
            p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
            out.append(torch.einsum("hqk,khd->qhd", p, v) * bmm2_scale)
        return torch.cat(out).to(query.dtype)


mla = type("RefFlashinferMLA", (), {"BatchMLAPagedAttentionWrapper": BatchMLAPagedAttentionWrapper})
