"""Capture sizes: the one place that computes them (docs/policy.md, section 5).

Pure functions of integers; the size rules in `policy.py` call them.
"""

from __future__ import annotations

GIB = 1024  # MiB per GiB


def memory_tier(memory_mib: int, tp: int) -> tuple[int, int]:
    """(chunked_prefill_size, decode max_bs) defaults for a per-GPU memory size."""
    if memory_mib < 20 * GIB:
        return 2048, 8
    if memory_mib < 35 * GIB:
        return 2048, 24 if tp < 4 else 80
    if memory_mib < 60 * GIB:
        return 4096, 32 if tp < 4 else 160
    if memory_mib < 160 * GIB:
        return 8192, 256 if tp < 4 else 512
    return 16384, 512


def decode_batch_sizes(max_bs: int, speculative: bool, no_padding: bool) -> tuple[int, ...]:
    """Decode batch sizes to capture, all <= max_bs and ending with max_bs."""
    if no_padding:
        sizes = list(range(1, max_bs + 1))
    elif speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8),
                 *range(272, max_bs + 1, 16)]
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 497, 16),
                 *range(512, max_bs + 1, 32)]
    kept = [s for s in sizes if s <= max_bs]
    if not kept or kept[-1] != max_bs:
        kept.append(max_bs)
    return tuple(kept)


def prefill_token_buckets(max_num_tokens: int) -> tuple[int, ...]:
    """Prefill token counts to capture, all <= max_num_tokens (max itself is not appended)."""
    sizes = [*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
             *range(1280, 4097, 256), *range(4608, max_num_tokens + 1, 512)]
    return tuple(s for s in sizes if s <= max_num_tokens)
