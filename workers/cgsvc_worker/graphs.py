"""Graph modes that honour the plan, and the honest report of what really ran.

    decode  full          CUDA graphs captured for the plan's batch sizes; each step padded
                          to the next captured size (GPU). No CUDA -> eager, reported.
    prefill tc_piecewise  torch.compile of the pieces between attention breaks (a CUDA graph
                          per piece on GPU; on CPU the compiled pieces run without graphs).
    prefill breakable     graph segments with eager attention between them (GPU); eager on CPU.
    prefill full          one graph for the whole forward (GPU, experimental); eager on CPU.
    disabled              eager.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

NO_CUDA = "CUDA graphs need a CUDA device (torch.cuda.CUDAGraph cannot be constructed without one)"


@dataclass
class PhaseMode:
    requested: str
    effective: str
    reason: str = ""
    capture_seconds: float = 0.0
    capture_bytes: int = 0
    captured_sizes: list[int] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "effective": self.effective, "reason": self.reason,
                "capture_seconds": round(self.capture_seconds, 4), "capture_bytes": self.capture_bytes,
                "captured_sizes": self.captured_sizes}


def effective_prefill(requested: str, device: torch.device, allow_compile: bool) -> PhaseMode:
    if requested == "disabled":
        return PhaseMode(requested, "disabled")
    if requested == "tc_piecewise":
        if not allow_compile:
            return PhaseMode(requested, "disabled", "torch.compile turned off for this run (--no-compile)")
        if device.type == "cuda":
            return PhaseMode(requested, "tc_piecewise")
        return PhaseMode(requested, "tc_piecewise_nograph",
                         f"pieces compiled with torch.compile and run without graphs: {NO_CUDA}")
    if device.type == "cuda":
        # breakable / full prefill capture is not implemented in this worker: run eager, say so.
        return PhaseMode(requested, "disabled", f"{requested} prefill capture is not implemented in this worker; "
                                                "prefill runs eagerly")
    return PhaseMode(requested, "disabled", NO_CUDA)


def effective_decode(requested: str, device: torch.device) -> PhaseMode:
    if requested == "disabled":
        return PhaseMode(requested, "disabled")
    if device.type == "cuda":
        return PhaseMode(requested, "full")
    return PhaseMode(requested, "disabled", NO_CUDA)


class CompiledPieces:
    """tc_piecewise: each decoder layer's forward split at attention; the two pieces around
    every attention call are compiled (dynamic shapes, so new lengths do not recompile)."""

    def __init__(self, device: torch.device) -> None:
        # On CUDA, "reduce-overhead" has inductor capture a CUDA graph per compiled piece.
        mode = "reduce-overhead" if device.type == "cuda" else None
        self.pre = torch.compile(_pre_attention, dynamic=True, mode=mode)
        self.post = torch.compile(_post_attention, dynamic=True, mode=mode)


def _pre_attention(norm: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return norm(x)  # type: ignore[no-any-return]


def _post_attention(layer: torch.nn.Module, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
    return layer.post_attention(x, attn_out)  # type: ignore[no-any-return,operator]


class DecodeGraphs:
    """CUDA graphs for decode, one per captured batch size, over static input buffers.

    The attention metadata is padded to a fixed context capacity so that one graph serves
    every step of its batch size; a step of batch b replays the graph of the smallest
    captured size >= b, with the padding rows pointing at a scratch slot.
    """

    def __init__(self, sizes: list[int], max_context: int, run: Callable[..., torch.Tensor], device: torch.device,
                 scratch_slot: int) -> None:
        self.sizes = sorted(sizes)
        self.max_context = max_context
        self.run = run
        self.device = device
        self.scratch = scratch_slot
        self.graphs: dict[int, Any] = {}
        self.buffers: dict[int, dict[str, torch.Tensor]] = {}
        self.outputs: dict[int, torch.Tensor] = {}

    def capture(self) -> tuple[float, int]:
        t0 = time.perf_counter()
        before = torch.cuda.memory_allocated(self.device)
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):  # largest first, so smaller graphs reuse its pool
            buf = {"ids": torch.zeros(bs, dtype=torch.long, device=self.device),
                   "positions": torch.zeros(bs, dtype=torch.long, device=self.device),
                   "slots": torch.full((bs,), self.scratch, dtype=torch.long, device=self.device),
                   "ctx_idx": torch.full((bs, self.max_context), self.scratch, dtype=torch.long, device=self.device),
                   "ctx_mask": torch.zeros(bs, self.max_context, dtype=torch.bool, device=self.device)}
            buf["ctx_mask"][:, 0] = True
            self.run(**buf)  # warm up outside the graph
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[bs] = self.run(**buf)
            self.graphs[bs], self.buffers[bs] = graph, buf
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0, torch.cuda.memory_allocated(self.device) - before

    def size_for(self, batch: int) -> int | None:
        i = bisect.bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None

    def replay(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, ctx_idx: torch.Tensor,
               ctx_mask: torch.Tensor) -> torch.Tensor:
        b, length = ids.shape[0], ctx_idx.shape[1]
        bs = self.size_for(b)
        assert bs is not None and length <= self.max_context
        buf = self.buffers[bs]
        buf["ids"].zero_()
        buf["ids"][:b] = ids
        buf["positions"][:b] = positions
        buf["slots"].fill_(self.scratch)
        buf["slots"][:b] = slots
        buf["ctx_idx"].fill_(self.scratch)
        buf["ctx_idx"][:b, :length] = ctx_idx
        buf["ctx_mask"].zero_()
        buf["ctx_mask"][:, 0] = True
        buf["ctx_mask"][:b, :length] = ctx_mask
        self.graphs[bs].replay()
        return self.outputs[bs][:b]
