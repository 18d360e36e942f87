"""The paged latent KV cache: per token per layer it keeps only the compressed latent and the
rotated key (kv_lora_rank + qk_rope_head_dim values), in fixed-size pages from one pool, in
the storage format the plan's `kv_cache_dtype` names.

    pool[layer]: [num_pages * page_size, row_bytes] of raw bytes, viewed as the format's dtype
    a sequence:  a page table (page ids); token t lives in slot page_table[t // P] * P + t % P
    page 0:      the scratch page: padding rows of a padded step write and read there; it is
                 never given to a sequence

Formats (docs/decisions.md, "KV cache formats"):

    auto, bfloat16, float16   the values as such (auto: the model's dtype)
    fp8_e4m3, fp8_e5m2        one byte per value; per layer two static per-tensor scales, one
                              for the compressed latent and one for the rotated key (the
                              engine calibrates them at load), the layout FlashInfer's and
                              trtllm-gen's FP8 MLA kernels read
    fp4_e2m1                  two values per byte (e2m1), one e4m3 scale per 16 values
                              (the NVFP4 block layout); read by torch_native only

Every write and read is a fixed-shape tensor operation (no host synchronisation), so the
cache can be used inside captured CUDA graphs and fullgraph-compiled steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from cgsvc.contract import FP4_BLOCK, KV_CACHE_DTYPES, kv_row_bytes


class KVCacheExhausted(RuntimeError):
    """No free page for a sequence that needs one."""


class KVFormatError(ValueError):
    """A kv_cache_dtype this cache cannot store."""


# The 16 values of e2m1, by their 4-bit code (sign bit 3).
_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
_E2M1_BOUNDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # round-to-nearest thresholds on |x|


@dataclass(frozen=True)
class KVFormat:
    """How one plan `kv_cache_dtype` is stored."""

    name: str  # the plan's value
    dtype: torch.dtype  # the element dtype values are stored in (uint8 for packed fp4)
    quantised: bool = False

    def row_bytes(self, latent_dim: int) -> int:
        return kv_row_bytes(self.name, torch.empty((), dtype=self.dtype).element_size(), latent_dim)

    @property
    def fp8(self) -> bool:
        return self.name.startswith("fp8")


def kv_format(name: str, model_dtype: torch.dtype, latent_dim: int) -> KVFormat:
    """The storage for a plan's kv_cache_dtype; KVFormatError when it cannot be stored."""
    if name == "auto":
        return KVFormat("auto", model_dtype)
    if name in ("bfloat16", "float16"):
        return KVFormat(name, getattr(torch, name))
    if name == "fp8_e4m3":
        return KVFormat(name, torch.float8_e4m3fn, quantised=True)
    if name == "fp8_e5m2":
        return KVFormat(name, torch.float8_e5m2, quantised=True)
    if name == "fp4_e2m1":
        if latent_dim % FP4_BLOCK:
            raise KVFormatError(f"fp4_e2m1 stores blocks of {FP4_BLOCK} values; this model's latent has "
                                f"{latent_dim} values per token, not a multiple of {FP4_BLOCK}")
        return KVFormat(name, torch.uint8, quantised=True)
    raise KVFormatError(f"unknown kv_cache_dtype {name!r}; one of {', '.join(KV_CACHE_DTYPES)}")


@dataclass
class SequenceCache:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens stored


class LatentKVCache:
    SCRATCH_PAGE = 0

    def __init__(self, num_layers: int, latent_dim: int, page_size: int, num_pages: int, fmt: KVFormat | torch.dtype,
                 device: torch.device, split: int = 0) -> None:
        if num_pages < 2 or page_size < 1:
            raise ValueError("the KV cache needs at least two pages (one is the scratch page) of at least one token")
        if isinstance(fmt, torch.dtype):
            fmt = KVFormat("auto", fmt)
        self.num_layers, self.latent_dim, self.page_size, self.num_pages = num_layers, latent_dim, page_size, num_pages
        self.format, self.device = fmt, device
        self.row_bytes = fmt.row_bytes(latent_dim)
        self.raw = torch.zeros(num_layers, num_pages * page_size, self.row_bytes, dtype=torch.uint8, device=device)
        # Per-layer dequantisation scales of the fp8 formats (real = stored * scale), one for the
        # first `split` values (the compressed latent) and one for the rest (the rotated key):
        # static, and tensors, so that captured graphs read them rather than bake them in.
        self.split = split or latent_dim
        self.scale_values: list[tuple[float, float]] = [(1.0, 1.0)] * num_layers  # host copies, for kernels
        self.scale_rows = torch.ones(num_layers, latent_dim, dtype=torch.float32, device=device)
        # Values clipped to the format's range, counted on the device (read when reporting).
        self.saturated = torch.zeros((), dtype=torch.long, device=device)
        self.fp4_values = torch.tensor(_E2M1, dtype=torch.float32, device=device)  # built once: no copy in a graph
        self.free: list[int] = list(range(num_pages - 1, 0, -1))  # page 0 is the scratch page
        self.seqs: dict[int, SequenceCache] = {}

    def set_scales(self, scales: list[tuple[float, float]]) -> None:
        """Per layer (latent scale, rope scale); set before anything is written or captured."""
        self.scale_values = list(scales)
        for layer, (c, r) in enumerate(scales):
            self.scale_rows[layer, : self.split] = c
            self.scale_rows[layer, self.split:] = r

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, latent_dim: int, page_size: int,
                    fmt: KVFormat | torch.dtype, device: torch.device, split: int = 0) -> LatentKVCache:
        if isinstance(fmt, torch.dtype):
            fmt = KVFormat("auto", fmt)
        per_page = num_layers * page_size * fmt.row_bytes(latent_dim)
        pages = budget_bytes // per_page
        if pages < 2:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds {pages} page(s) of {per_page} bytes; "
                             "the cache needs at least two (one is the scratch page)")
        return cls(num_layers, latent_dim, page_size, int(pages), fmt, device, split)

    # ------------------------------------------------------------------ views
    @property
    def dtype(self) -> torch.dtype:
        return self.format.dtype

    @property
    def pool(self) -> torch.Tensor:
        """[layers, slots, latent] in the stored dtype (fp4: the packed bytes)."""
        if self.format.name == "fp4_e2m1":
            return self.raw
        return self.raw.view(self.format.dtype)

    def paged(self, layer: int) -> torch.Tensor:
        """One layer's pool as [pages, page_size, latent] (the layout the MLA kernels read)."""
        return self.pool[layer].view(self.num_pages, self.page_size, -1)

    @property
    def bytes_per_token(self) -> int:
        """Across all layers, on this rank, scales included."""
        return self.num_layers * self.row_bytes

    @property
    def capacity_tokens(self) -> int:
        """Tokens one sequence could hold if it had every page but the scratch page."""
        return (self.num_pages - 1) * self.page_size

    @property
    def free_tokens(self) -> int:
        return len(self.free) * self.page_size

    @property
    def scratch_slot(self) -> int:
        return self.SCRATCH_PAGE * self.page_size

    # ------------------------------------------------------------------ pages
    def allocate(self, seq_id: int, new_tokens: int) -> torch.Tensor:
        """Reserve slots for new_tokens more tokens of seq_id; returns their slot indices."""
        seq = self.seqs.setdefault(seq_id, SequenceCache())
        need_pages = -(-(seq.length + new_tokens) // self.page_size) - len(seq.pages)
        if need_pages > len(self.free):
            raise KVCacheExhausted(
                f"KV cache exhausted: sequence {seq_id} needs {need_pages} more page(s) of {self.page_size} tokens, "
                f"{len(self.free)} free of {self.num_pages - 1}; lower concurrency or lengths, or give the cache "
                "more memory")
        seq.pages += [self.free.pop() for _ in range(need_pages)]
        positions = torch.arange(seq.length, seq.length + new_tokens)
        seq.length += new_tokens
        return self._slots(seq, positions)

    def _slots(self, seq: SequenceCache, positions: torch.Tensor) -> torch.Tensor:
        pages = torch.tensor(seq.pages, dtype=torch.long)
        return (pages[positions // self.page_size] * self.page_size + positions % self.page_size).to(self.device)

    def context_slots(self, seq_id: int) -> torch.Tensor:
        seq = self.seqs[seq_id]
        return self._slots(seq, torch.arange(seq.length))

    def release(self, seq_id: int) -> None:
        seq = self.seqs.pop(seq_id, None)
        if seq is not None:
            self.free += reversed(seq.pages)

    # ------------------------------------------------------------------ values
    def write(self, layer: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        """Store latents [n, latent_dim] at slots [n] (quantised as the format says)."""
        rows = self.encode(layer, latent)
        # index_put_ on the pool itself, not index_copy_ on its layer view: a compiled step
        # (inductor) then updates the pool in place instead of copying it whole to apply a
        # mutation made through a view.
        self.raw.index_put_((torch.full_like(slots, layer), slots), rows)

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """Latents at slots (any shape [...]) as [..., latent_dim], dequantised to float32 for
        quantised formats, the stored dtype otherwise."""
        return self.decode(layer, self.raw[layer][slots])

    def encode(self, layer: int, latent: torch.Tensor) -> torch.Tensor:
        """[n, latent_dim] values -> [n, row_bytes] stored bytes."""
        name = self.format.name
        if not self.format.quantised:
            return latent.to(self.format.dtype).contiguous().view(torch.uint8)
        if self.format.fp8:
            limit = torch.finfo(self.format.dtype).max
            x = latent.float() / self.scale_rows[layer]
            self.saturated.add_((x.abs() > limit).sum())
            return x.clamp(-limit, limit).to(self.format.dtype).view(torch.uint8)
        assert name == "fp4_e2m1"
        return _fp4_encode(latent.float(), self.saturated)

    def decode(self, layer: int, rows: torch.Tensor) -> torch.Tensor:
        if not self.format.quantised:
            return rows.view(self.format.dtype)
        if self.format.fp8:
            return rows.view(self.format.dtype).float() * self.scale_rows[layer]
        return _fp4_decode(rows, self.latent_dim, self.fp4_values)


def _fp4_encode(x: torch.Tensor, saturated: torch.Tensor) -> torch.Tensor:
    """[n, D] float -> [n, D/2 + D/16] bytes: e2m1 codes packed low nibble first, then one
    e4m3 scale per block of 16 values. The scale is block amax / 6, raised by 1/8 before it is
    rounded to e4m3 (3 mantissa bits) so that rounding never shrinks it below amax / 6: the
    block then fits e2m1's range of +-6 and nothing is clipped."""
    n, d = x.shape
    blocks = x.view(n, d // FP4_BLOCK, FP4_BLOCK)
    scale = (blocks.abs().amax(-1, keepdim=True) * (1.125 / 6.0)).to(torch.float8_e4m3fn)
    s = scale.float()
    scaled = torch.where(s > 0, blocks / s, torch.zeros_like(blocks))
    saturated.add_((scaled.abs() > 6.0).sum())
    mag = scaled.abs()
    code = torch.zeros_like(mag, dtype=torch.uint8)
    for bound in _E2M1_BOUNDS:
        code += (mag > bound).to(torch.uint8)
    code = code + (scaled < 0).to(torch.uint8) * 8
    code = code.view(n, d)
    packed = code[:, 0::2] | (code[:, 1::2] << 4)
    return torch.cat([packed, scale.view(n, d // FP4_BLOCK).view(torch.uint8)], dim=-1)


def _fp4_decode(rows: torch.Tensor, d: int, table: torch.Tensor) -> torch.Tensor:
    """[..., D/2 + D/16] bytes -> [..., D] float32."""
    lead = rows.shape[:-1]
    packed, scales = rows[..., : d // 2], rows[..., d // 2:]
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*lead, d)
    values = table[codes.long()].view(*lead, d // FP4_BLOCK, FP4_BLOCK)
    s = scales.contiguous().view(torch.float8_e4m3fn).float().unsqueeze(-1)
    return (values * s).view(*lead, d)
