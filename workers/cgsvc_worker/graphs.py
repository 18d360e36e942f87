"""Graph modes that honour the plan, and the honest report of what really ran.

    decode  full          every step padded to the next planned `decode.bs` size and run as
                          one program of fixed shapes: a CUDA graph per size (GPU), captured at
                          start; on a CPU the same padded step compiled with
                          torch.compile(fullgraph=True, dynamic=False) on its first use per
                          size (no graphs: reported as a substitution).
    prefill tc_piecewise  the forward split at every attention core into pieces; the pieces
                          compiled with torch.compile (inductor, without cudagraph trees) and
                          captured as one CUDA graph per piece per planned `prefill.num_tokens`
                          size (GPU); on a CPU the compiled pieces run without graphs.
    prefill breakable     the same pieces captured eagerly (GPU); eager on a CPU.
    prefill full          not one graph here (the ragged attention core is eager): runs as
                          breakable on a GPU, reported.
    disabled              eager.

Steps above `decode.max_bs` / `prefill.max_num_tokens`, or with no planned size that fits,
run eagerly and are counted per reason (`StepStats`).
"""

from __future__ import annotations

import bisect
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

NO_CUDA = "CUDA graphs need a CUDA device (torch.cuda.CUDAGraph cannot be constructed without one)"


def raise_compile_limits() -> None:
    """One compiled program per planned size: dynamo's default of 8 per function would fall
    back to eager, silently, after the eighth."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = 1024
    torch._dynamo.config.accumulated_cache_size_limit = 4096


def compiled(fn: Callable[..., Any], backend: str, dynamic: bool = False) -> Callable[..., Any]:
    """torch.compile with no graph breaks allowed; backend "trace" runs dynamo's graph with
    eager kernels (proves the step is capturable, costs little to compile)."""
    raise_compile_limits()
    return torch.compile(fn, fullgraph=True, dynamic=dynamic, backend="eager" if backend == "trace" else backend)


@dataclass
class PhaseMode:
    requested: str
    effective: str
    reason: str = ""
    capture_seconds: float = 0.0
    capture_bytes: int = 0
    captured_sizes: list[int] = field(default_factory=list)  # CUDA graphs captured
    compiled_sizes: list[int] = field(default_factory=list)  # CPU programs compiled on first use
    capture_failures: dict[str, str] = field(default_factory=dict)  # size -> why it was not captured

    def to_dict(self) -> dict[str, Any]:
        return {"requested": self.requested, "effective": self.effective, "reason": self.reason,
                "capture_seconds": round(self.capture_seconds, 4), "capture_bytes": self.capture_bytes,
                "captured_sizes": self.captured_sizes, "compiled_sizes": self.compiled_sizes,
                "capture_failures": self.capture_failures}


def effective_prefill(requested: str, device: torch.device, allow_compile: bool) -> PhaseMode:
    if requested == "disabled":
        return PhaseMode(requested, "disabled")
    cuda = device.type == "cuda"
    if requested == "tc_piecewise":
        if not allow_compile:
            return PhaseMode(requested, "disabled", "torch.compile turned off for this run (--no-compile)")
        if cuda:
            return PhaseMode(requested, "tc_piecewise")
        return PhaseMode(requested, "tc_piecewise_nograph",
                         f"pieces compiled with torch.compile (inductor) and run without graphs, each step padded to "
                         f"the planned token count: {NO_CUDA}")
    if not cuda:
        return PhaseMode(requested, "disabled", NO_CUDA)
    if requested == "full":
        return PhaseMode(requested, "breakable", "the prefill attention core is ragged and eager in this worker, so "
                                                 "the forward cannot be one graph; its pieces are captured instead")
    return PhaseMode(requested, "breakable")


def effective_decode(requested: str, device: torch.device, cpu_decode: str = "eager") -> PhaseMode:
    """cpu_decode: how a CPU runs the planned steps: "eager" (the capture-safe step at the
    planned padded shapes, uncompiled), "trace" (torch.compile with dynamo's graph and eager
    kernels) or "inductor" (compiled kernels)."""
    if requested == "disabled":
        return PhaseMode(requested, "disabled")
    if device.type == "cuda":
        return PhaseMode(requested, "full")
    if cpu_decode == "eager":
        return PhaseMode(requested, "static_eager",
                         f"{NO_CUDA}; each step is padded to the planned batch size and runs the capture-safe step "
                         "eagerly (`cgsvc-worker check-graphs` proves each size compiles; cpu_decode trace|inductor, "
                         "`cgsvc-cli launch --cpu-decode` or `cgsvc-worker --cpu-decode`, runs them compiled)")
    how = "dynamo-traced, eager kernels" if cpu_decode == "trace" else "inductor"
    return PhaseMode(requested, "static_compiled",
                     f"{NO_CUDA}; each step is padded to the planned batch size and runs as a "
                     f"torch.compile(fullgraph=True) program ({how}), compiled at capture for the sizes the run "
                     "reaches")


@dataclass
class StepStats:
    """Steps per padded size, and eager steps per reason, for one phase."""

    by_size: Counter[int] = field(default_factory=Counter)
    eager: Counter[str] = field(default_factory=Counter)
    padded_rows: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"by_size": {str(k): v for k, v in sorted(self.by_size.items())}, "eager": dict(self.eager),
                "padded_rows": self.padded_rows}


def next_size(sizes: list[int], n: int) -> int | None:
    """The smallest planned size >= n."""
    i = bisect.bisect_left(sizes, n)
    return sizes[i] if i < len(sizes) else None


# ---------------------------------------------------------------------------- decode


def capture_error(exc: BaseException) -> str:
    """One line for a size that could not be captured."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


class DecodeGraphs:
    """CUDA graphs for decode, one per planned batch size, over static input buffers. The
    attention backend gets `prepare_graph(bs)` before each capture and `plan(meta, bs)` (on the
    host, outside capture) before each replay. Capture runs largest first so that smaller
    graphs reuse its memory pool. A size that fails to capture is left out, with the reason
    in `failed`; steps of that size run eagerly."""

    def __init__(self, sizes: list[int], max_pages: int, step: Callable[..., torch.Tensor], backend: Any,
                 make_meta: Callable[[int], Any], device: torch.device) -> None:
        self.sizes = sorted(sizes)
        self.max_pages = max_pages
        self.step, self.backend, self.make_meta, self.device = step, backend, make_meta, device
        self.graphs: dict[int, Any] = {}
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, Any]] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.failed: dict[int, str] = {}

    def capture(self, each: Callable[[], None] = lambda: None) -> tuple[float, int]:
        """Every size, largest first; `each()` after each, captured or failed."""
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        before = torch.cuda.memory_allocated(self.device)
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            try:
                self._capture_one(bs, pool)
            except RuntimeError as exc:
                self.failed[bs] = capture_error(exc)
            each()
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0, torch.cuda.memory_allocated(self.device) - before

    def _capture_one(self, bs: int, pool: Any) -> None:
        """One size: buffers, a host plan, a warm-up outside the graph, the capture."""
        ids = torch.zeros(bs, dtype=torch.long, device=self.device)
        positions = torch.zeros(bs, dtype=torch.long, device=self.device)
        meta = self.make_meta(bs)  # every row padding: context 1 on the scratch page
        self.backend.prepare_graph(bs)
        self.backend.plan(meta, bs)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.step(ids, positions, meta)  # warm-up outside the graph (allocator, kernels)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            self.outputs[bs] = self.step(ids, positions, meta)
        self.graphs[bs], self.inputs[bs] = graph, (ids, positions, meta)

    def replay(self, bs: int, ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
        """Copy the step's (already padded) inputs into size bs's buffers, plan, replay."""
        s_ids, s_pos, s_meta = self.inputs[bs]
        s_ids.copy_(ids)
        s_pos.copy_(positions)
        s_meta.slots.copy_(meta.slots)
        s_meta.block_table.zero_()
        s_meta.block_table[:, : meta.block_table.shape[1]].copy_(meta.block_table)
        s_meta.ctx_lens.copy_(meta.ctx_lens)
        s_meta.host_lens, s_meta.host_pages = meta.host_lens, meta.host_pages
        self.backend.plan(s_meta, bs)
        self.graphs[bs].replay()
        return self.outputs[bs]


class CompiledDecode:
    """CPU: the padded decode step compiled once per planned batch size: at capture for the
    sizes the run will reach (`warming`), any other on first use (`late`: a step whose time is
    the compiler's). The batch is static, as in a CUDA graph; the context length (the block
    table's width) is a dynamic dimension, as it is for the GPU kernels, which read lengths
    from their metadata, so a growing context does not recompile."""

    MIN_PAGES = 2  # widths 0 and 1 would be specialised by the compiler, not kept dynamic

    def __init__(self, step: Callable[..., torch.Tensor], backend: str, mode: PhaseMode) -> None:
        self.fn = compiled(step, backend)
        self.mode = mode
        self.warming = False
        self.late: list[int] = []  # sizes first compiled inside the run

    def __call__(self, bs: int, ids: torch.Tensor, positions: torch.Tensor, meta: Any) -> torch.Tensor:
        torch._dynamo.mark_dynamic(meta.block_table, 1)
        if bs in self.mode.compiled_sizes:
            return self.fn(ids, positions, meta)  # type: ignore[no-any-return]
        t0 = time.perf_counter()
        out = self.fn(ids, positions, meta)
        self.mode.capture_seconds += time.perf_counter() - t0
        self.mode.compiled_sizes.append(bs)
        if not self.warming:
            self.late.append(bs)
        return out  # type: ignore[no-any-return]


# ---------------------------------------------------------------------------- prefill


class Pieces:
    """The model's forward as L+1 pieces between its L attention cores:

        piece 0:    embed, rotary, layer 0's attention input -> x, cos, sin, q_nope, q_rot, latent
        piece i:    layer i-1's finish (o_proj, residuals, MLP/MoE), layer i's attention input
        piece L:    layer L-1's finish, final norm -> hidden

    Each piece is a function of tensors only, with static MoE dispatch, so it can be compiled
    and captured; the attention core runs between them."""

    def __init__(self, model: Any) -> None:
        self.model = model
        layers = list(model.layers)
        self.fns: list[Callable[..., Any]] = [self._first]
        self.fns += [self._mid(i) for i in range(1, len(layers))]
        self.fns.append(self._last)

    def _first(self, ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        m = self.model
        x, cos, sin = m.embed(ids, positions)
        return (x, cos, sin, *m.layers[0].attention_input(x, m.rotary, cos, sin))

    def _mid(self, i: int) -> Callable[..., tuple[torch.Tensor, ...]]:
        m = self.model
        prev, layer = m.layers[i - 1], m.layers[i]

        def piece(x: torch.Tensor, o: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
            x = prev.finish(x, o, True)
            return (x, *layer.attention_input(x, m.rotary, cos, sin))
        return piece

    def _last(self, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        m = self.model
        return m.norm(m.layers[-1].finish(x, o, True))  # type: ignore[no-any-return]

    def run(self, fns: list[Callable[..., Any]], ids: torch.Tensor, positions: torch.Tensor, meta: Any,
            backend: Any) -> torch.Tensor:
        """The forward with these piece implementations (eager, compiled or graph replays)."""
        layers = self.model.layers
        x, cos, sin, qn, qr, lat = fns[0](ids, positions)
        for i in range(1, len(layers)):
            o = backend.attend(layers[i - 1].self_attn, qn, qr, lat, meta)
            x, qn, qr, lat = fns[i](x, o, cos, sin)
        o = backend.attend(layers[-1].self_attn, qn, qr, lat, meta)
        return fns[-1](x, o)  # type: ignore[no-any-return]


class PieceGraphs:
    """CUDA graphs of the pieces, one per piece per planned token count, each over static
    inputs: the previous piece's graph outputs and a buffer the eager attention output is
    copied into. Pieces may be compiled first (tc_piecewise) or eager (breakable)."""

    def __init__(self, pieces: Pieces, fns: list[Callable[..., Any]], sizes: list[int], device: torch.device,
                 heads: int, v_dim: int, dtype: torch.dtype) -> None:
        self.pieces, self.fns, self.sizes, self.device = pieces, fns, sorted(sizes), device
        self.heads, self.v_dim, self.dtype = heads, v_dim, dtype
        self.graphs: dict[int, list[Any]] = {}
        self.io: dict[int, dict[str, Any]] = {}
        self.failed: dict[int, str] = {}

    def capture(self, warm: Callable[[int], Any], each: Callable[[], None] = lambda: None) -> tuple[float, int]:
        """`warm(n)` runs one eager step of n tokens through self.fns (compiles them). A size
        that fails to capture is left out, with the reason in `failed`; `each()` after each."""
        torch.cuda.synchronize(self.device)
        t0 = time.perf_counter()
        before = torch.cuda.memory_allocated(self.device)
        pool = torch.cuda.graph_pool_handle()
        for n in reversed(self.sizes):
            try:
                warm(n)
                self._capture_one(n, pool)
            except RuntimeError as exc:
                self.failed[n] = capture_error(exc)
            each()
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0, torch.cuda.memory_allocated(self.device) - before

    def _capture_one(self, n: int, pool: Any) -> None:
        ids = torch.zeros(n, dtype=torch.long, device=self.device)
        pos = torch.zeros(n, dtype=torch.long, device=self.device)
        o_buf = torch.zeros(n, self.heads, self.v_dim, dtype=self.dtype, device=self.device)
        graphs, outs = [], []
        args: tuple[torch.Tensor, ...] = (ids, pos)
        cos = sin = torch.empty(0)
        for k, fn in enumerate(self.fns):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, pool=pool):
                out = fn(*args)
            graphs.append(g)
            outs.append(out)
            if k == 0:
                x, cos, sin = out[0], out[1], out[2]
            else:
                x = out[0] if k < len(self.fns) - 1 else out
            if k < len(self.fns) - 2:
                args = (x, o_buf, cos, sin)
            elif k == len(self.fns) - 2:
                args = (x, o_buf)
        self.graphs[n] = graphs
        self.io[n] = {"ids": ids, "positions": pos, "o": o_buf, "outs": outs}

    def run(self, n: int, ids: torch.Tensor, positions: torch.Tensor, meta: Any, backend: Any) -> torch.Tensor:
        io, graphs, layers = self.io[n], self.graphs[n], self.pieces.model.layers
        io["ids"].copy_(ids)
        io["positions"].copy_(positions)
        graphs[0].replay()
        for k in range(1, len(graphs)):
            prev = io["outs"][k - 1]
            qn, qr, lat = prev[-3], prev[-2], prev[-1]
            io["o"].copy_(backend.attend(layers[k - 1].self_attn, qn, qr, lat, meta))
            graphs[k].replay()
        return io["outs"][-1]  # type: ignore[no-any-return]
