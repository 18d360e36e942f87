"""The paged latent KV cache: per token per layer it keeps only the compressed latent and the
rotated key (kv_lora_rank + qk_rope_head_dim values), in fixed-size pages from one pool.

    pool[layer]: [num_pages * page_size, kv_lora_rank + qk_rope_head_dim]
    a sequence:  a page table (page ids); token t lives in slot page_table[t // P] * P + t % P
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


class KVCacheExhausted(RuntimeError):
    """No free page for a sequence that needs one."""


@dataclass
class SequenceCache:
    pages: list[int] = field(default_factory=list)
    length: int = 0  # tokens stored


class LatentKVCache:
    def __init__(self, num_layers: int, latent_dim: int, page_size: int, num_pages: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError("the KV cache needs at least one page of at least one token")
        self.num_layers, self.latent_dim, self.page_size, self.num_pages = num_layers, latent_dim, page_size, num_pages
        self.dtype, self.device = dtype, device
        self.pool = torch.zeros(num_layers, num_pages * page_size, latent_dim, dtype=dtype, device=device)
        self.free: list[int] = list(range(num_pages - 1, -1, -1))
        self.seqs: dict[int, SequenceCache] = {}

    @classmethod
    def from_budget(cls, budget_bytes: int, num_layers: int, latent_dim: int, page_size: int, dtype: torch.dtype,
                    device: torch.device) -> LatentKVCache:
        per_page = num_layers * page_size * latent_dim * torch.empty((), dtype=dtype).element_size()
        pages = budget_bytes // per_page
        if pages < 1:
            raise ValueError(f"a KV budget of {budget_bytes} bytes holds no page of {per_page} bytes")
        return cls(num_layers, latent_dim, page_size, int(pages), dtype, device)

    @property
    def bytes_per_token(self) -> int:
        """Across all layers, on this rank."""
        return self.num_layers * self.latent_dim * self.pool.element_size()

    @property
    def free_tokens(self) -> int:
        return len(self.free) * self.page_size

    def allocate(self, seq_id: int, new_tokens: int) -> torch.Tensor:
        """Reserve slots for new_tokens more tokens of seq_id; returns their slot indices."""
        seq = self.seqs.setdefault(seq_id, SequenceCache())
        need_pages = -(-(seq.length + new_tokens) // self.page_size) - len(seq.pages)
        if need_pages > len(self.free):
            raise KVCacheExhausted(
                f"KV cache exhausted: sequence {seq_id} needs {need_pages} more page(s) of {self.page_size} tokens, "
                f"{len(self.free)} free of {self.num_pages}; lower concurrency or lengths, or give the cache more memory")
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

    def write(self, layer: int, slots: torch.Tensor, latent: torch.Tensor) -> None:
        self.pool[layer].index_copy_(0, slots, latent.to(self.dtype))

    def read(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        return self.pool[layer].index_select(0, slots)
