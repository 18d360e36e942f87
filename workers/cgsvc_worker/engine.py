"""The engine of one TP rank: loads the model, stores the latent cache in the plan's KV dtype,
picks attention backends and graph modes from the plan, and runs prefill and decode steps at
the plan's sizes: prompts split into chunks of at most `chunked_prefill_size` tokens, prefill
steps padded to the next planned `prefill.num_tokens`, decode batches to the next planned
`decode.bs`; anything above `max_num_tokens` / `max_bs` runs eagerly and is counted.

Every rank runs the same steps on the same inputs; logits are gathered to every rank, so
sampling (greedy, or seeded temperature sampling) agrees across ranks without a broadcast.
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cgsvc.contract import (
    ATTENTION_BACKENDS,
    DECODE_GRAPH_BACKENDS,
    KV_CACHE_DTYPES,
    KV_PAGE_TOKENS,
    PREFILL_GRAPH_BACKENDS,
)
from cgsvc.errors import one_spelling
from cgsvc_worker import loader
from cgsvc_worker.attention import (
    DecodeMeta,
    PrefillMeta,
    TrtllmMLA,
    compute_capability,
    decode_meta,
    select_backend,
)
from cgsvc_worker.config import ModelConfig, family_of, load_model_config
from cgsvc_worker.graphs import (
    CompiledDecode,
    DecodeGraphs,
    PieceGraphs,
    Pieces,
    StepStats,
    compiled,
    effective_decode,
    effective_prefill,
    next_size,
)
from cgsvc_worker.kv_cache import KVFormat, KVFormatError, LatentKVCache, kv_format
from cgsvc_worker.model import DeepseekV3Model
from cgsvc_worker.tp import TPGroup

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


CPU_KV_BYTES = 256 << 20
GPU_KV_SHARE = 0.5


def kv_budget(requested: int | None, device: torch.device,
              free_bytes: Callable[[], int] | None = None) -> tuple[int, str]:
    """The KV cache's bytes on this rank, and why. None (auto): 256 MiB on a CPU; on a GPU half
    of the memory free once the weights are loaded (`free_bytes`, torch.cuda.mem_get_info by
    default), the other half left to activations and captured graphs; serving engines size
    their pool from the device's memory the same way (sglang's --mem-fraction-static)."""
    if requested:
        return requested, f"asked for: --kv-cache-mb {requested / (1 << 20):.12g}"
    if device.type != "cuda":
        return CPU_KV_BYTES, f"auto: {CPU_KV_BYTES >> 20} MiB on {device.type}"
    free = free_bytes() if free_bytes is not None else torch.cuda.mem_get_info(device)[0]
    return int(free * GPU_KV_SHARE), (f"auto: half of the {free / (1 << 30):.1f} GiB free on {device} once the "
                                      "weights were loaded (the rest for activations and captured graphs)")


def resolve_dtype(requested: str, device: torch.device, checkpoint: str) -> tuple[str, str]:
    """The dtype a rank runs the model in, and (for `auto`) why. `auto` is float32 on a CPU, the
    numerics the reference is checked in; on a GPU it is the checkpoint's 16-bit dtype, else
    bfloat16, since the GPU MLA kernels (FlashInfer, trtllm-gen) take only 16-bit queries, as
    serving engines' own `--dtype auto` does for float32 checkpoints."""
    if requested != "auto":
        return requested, f"asked for: --dtype {requested}"
    if device.type != "cuda":
        return "float32", f"auto: float32 on {device.type} (the reference numerics)"
    if checkpoint in ("bfloat16", "float16"):
        return checkpoint, f"auto: {checkpoint}, the checkpoint's torch_dtype"
    said = f"is {checkpoint}" if checkpoint else "names no torch_dtype"
    return "bfloat16", f"auto: bfloat16 on {device.type} (the checkpoint {said}; the GPU MLA kernels take 16-bit queries)"


class PlanMismatch(ValueError):
    """A plan that cannot be run with the loaded checkpoint."""


@dataclass(frozen=True)
class CapturePart:
    """One part of Engine.capture: how many sizes it captures or compiles, in words, its work."""

    sizes: int
    words: str
    run: Callable[[Callable[[], None]], None]  # run(each): each() after every size


@dataclass
class EngineOptions:
    dtype: str = "auto"  # float32, bfloat16, float16, or auto (resolve_dtype)
    kv_cache_bytes: int | None = None  # None: auto (kv_budget)
    page_size: int = KV_PAGE_TOKENS
    allow_compile: bool = True
    max_context: int = 0  # 0: the model's max_position_embeddings
    cpu_decode: str = "eager"  # how a CPU runs planned `full` decode steps: eager | trace | inductor
    graph_context: int = 4096  # context positions a captured decode graph attends over (torch_native)


@dataclass
class PlanView:
    """Every field of a plan (the JSON form of docs/plan.md) that a worker honours."""

    prefill_backend: str = "disabled"
    decode_backend: str = "disabled"
    attention_prefill: str = "torch_native"
    attention_decode: str = "torch_native"
    prefill_max_num_tokens: int = 0
    prefill_num_tokens: list[int] = field(default_factory=list)
    decode_max_bs: int = 0
    decode_bs: list[int] = field(default_factory=list)
    kv_cache_dtype: str = "auto"
    chunked_prefill_size: int = 0  # 0 or less: prompts are not chunked
    policy_version: str = ""
    plan_hash: str = ""
    model_architecture: str = ""  # the text architecture the plan was resolved for, when known
    model_name: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanView:
        plan = data.get("plan", data)
        try:
            pre, dec = plan["prefill"], plan["decode"]
            view = cls(prefill_backend=pre["backend"], decode_backend=dec["backend"],
                       attention_prefill=plan["attention_backend"]["prefill"],
                       attention_decode=plan["attention_backend"]["decode"],
                       prefill_max_num_tokens=int(pre.get("max_num_tokens", 0)),
                       prefill_num_tokens=sorted(int(n) for n in pre.get("num_tokens", [])),
                       decode_max_bs=int(dec.get("max_bs", 0)), decode_bs=sorted(int(b) for b in dec.get("bs", [])),
                       kv_cache_dtype=str(plan.get("kv_cache_dtype", "auto")),
                       chunked_prefill_size=int(plan.get("chunked_prefill_size", 0)),
                       policy_version=plan.get("policy_version", ""), plan_hash=plan.get("plan_hash", ""))
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanMismatch(f"not a cgsvc plan ({type(exc).__name__}: {exc}); expected the JSON form of "
                               "docs/plan.md") from None
        if any(n < 1 for n in view.prefill_num_tokens + view.decode_bs):
            raise PlanMismatch("plan capture sizes must be positive")
        for name, cap in (("prefill.max_num_tokens", view.prefill_max_num_tokens), ("decode.max_bs", view.decode_max_bs)):
            if cap < 0:
                raise PlanMismatch(f"{name}: {cap} is below 0 (0: up to the largest planned size)")
        for name, attr, valid in CLOSED_FIELDS:
            setattr(view, attr, _one_of(name, getattr(view, attr), valid))
        spec = data.get("spec") or plan.get("spec")
        if spec:
            view.model_architecture, view.model_name = _plan_model(spec)
        return view


# Plan fields drawn from a closed set: (the plan's name, PlanView's attribute, the set).
CLOSED_FIELDS = (("prefill.backend", "prefill_backend", PREFILL_GRAPH_BACKENDS),
                 ("decode.backend", "decode_backend", DECODE_GRAPH_BACKENDS),
                 ("attention_backend.prefill", "attention_prefill", ATTENTION_BACKENDS),
                 ("attention_backend.decode", "attention_decode", ATTENTION_BACKENDS),
                 ("kv_cache_dtype", "kv_cache_dtype", KV_CACHE_DTYPES))


def _one_of(field: str, value: Any, valid: tuple[str, ...]) -> str:
    """A plan value of a closed set in its one spelling (a hand-written plan may use another case);
    a value outside the set is not a cgsvc plan, and is refused rather than run as something else."""
    spelt = one_spelling(str(value), valid)
    if spelt is None:
        raise PlanMismatch(f"{field}: {str(value)[:40]!r} is not one of the plan's values ({', '.join(valid)}); "
                           "expected the JSON form of docs/plan.md")
    return spelt


class _AmaxRecorder:
    """An attention core that records each layer's latent and rope-key amax, then runs torch_native."""

    def __init__(self, split: int, layers: int) -> None:
        from cgsvc_worker.attention import TorchNativeMLA

        self.native, self.split = TorchNativeMLA(), split
        self.amax = [(0.0, 0.0)] * layers

    def attend(self, attn: Any, q_nope: torch.Tensor, q_rot: torch.Tensor, latent: torch.Tensor,
               meta: Any) -> torch.Tensor:
        c, r = latent[:, : self.split].abs().max(), latent[:, self.split:].abs().max()
        self.amax[attn.layer] = (float(c), float(r))
        return self.native.attend(attn, q_nope, q_rot, latent, meta)


def _plan_model(spec: dict[str, Any]) -> tuple[str, str]:
    """The text architecture and name of the model a plan's spec names (through the catalog)."""
    from cgsvc import catalog
    from cgsvc.errors import ServiceError

    try:
        facts = catalog.facts_for_spec(spec)
    except ServiceError:  # an unreadable model.path just means "unknown" here
        return "", ""
    return (facts.text_architecture, facts.name) if facts else ("", "")


def check_plan_matches(plan: PlanView, cfg: ModelConfig) -> list[str]:
    """Raise PlanMismatch when the plan was resolved for another model family; return notes."""
    if not plan.model_architecture:
        return ["the plan carries no spec: its model was not checked against the checkpoint"]
    theirs, ours = family_of(plan.model_architecture), family_of(cfg.architecture)
    label = f"{plan.model_name} ({plan.model_architecture})" if plan.model_name else plan.model_architecture
    if theirs is None:
        raise PlanMismatch(f"the plan was resolved for {label}, which this worker does not run; the checkpoint is "
                           f"{cfg.architecture} ({ours} family)")
    if theirs != ours:
        raise PlanMismatch(f"the plan was resolved for {label} ({theirs} family); the checkpoint is "
                           f"{cfg.architecture} ({ours} family); resolve a plan for this model")
    return []


class Engine:
    def __init__(self, model_path: str, tp: TPGroup, plan: PlanView, options: EngineOptions,
                 kernels: Any = None) -> None:
        t0 = time.perf_counter()
        self.tp, self.plan, self.options = tp, plan, options
        self.cfg = load_model_config(model_path)
        self.notes = check_plan_matches(plan, self.cfg)
        if self.cfg.multimodal_wrapper:
            self.notes.append("multimodal checkpoint: the vision tower is out of scope; the text model runs")
        dtype, self.dtype_reason = resolve_dtype(options.dtype, tp.device, self.cfg.torch_dtype)
        self.dtype = DTYPES[dtype]
        with torch.device(tp.device):
            self.model = DeepseekV3Model(self.cfg, tp, self.dtype)
        self.load_report = loader.load(self.model, model_path)
        self.notes += self.load_report.notes
        self.load_seconds = time.perf_counter() - t0
        self.max_context = options.max_context or self.cfg.max_position_embeddings
        self.substitutions: dict[str, tuple[Any, str]] = {}  # plan field -> (effective, why)
        self.kv_budget, self.kv_budget_reason = kv_budget(options.kv_cache_bytes, tp.device)
        self.cache = LatentKVCache.from_budget(self.kv_budget, self.cfg.num_layers, self.cfg.latent_dim,
                                               self._page_size(), self._kv_format(), tp.device,
                                               split=self.cfg.kv_lora_rank)
        if self.cache.format.fp8:
            self.cache.set_scales(self._calibrate_kv_scales())
        heads = self.model.local_heads
        self.prefill_backend, self.attention_prefill = select_backend(
            plan.attention_prefill, "prefill", tp.device, self.cache, self.cfg, heads, self.dtype, kernels)
        self.decode_backend, self.attention_decode = select_backend(
            plan.attention_decode, "decode", tp.device, self.cache, self.cfg, heads, self.dtype, kernels)
        self.prefill_mode = effective_prefill(plan.prefill_backend, tp.device, options.allow_compile)
        self.decode_mode = effective_decode(plan.decode_backend, tp.device, options.cpu_decode)
        self.chunk_tokens = self._chunk_size()
        self.prefill_sizes = self._reachable_prefill_sizes()
        self.pieces = Pieces(self.model)
        self.piece_fns: list[Any] = list(self.pieces.fns)
        if self.prefill_mode.effective == "tc_piecewise":  # GPU: inductor per piece per size, then captured
            self.piece_fns = [compiled(fn, "inductor") for fn in self.pieces.fns]
        elif self.prefill_mode.effective == "tc_piecewise_nograph":  # CPU: one dynamic-shape compile per piece
            self.piece_fns = [compiled(fn, "inductor", dynamic=True) for fn in self.pieces.fns]
        self.piece_graphs: PieceGraphs | None = None
        self.decode_graphs: DecodeGraphs | None = None
        self.compiled_decode: CompiledDecode | None = None
        if self.decode_mode.effective == "static_compiled" and plan.decode_bs:
            self.compiled_decode = CompiledDecode(self._decode_step, options.cpu_decode, self.decode_mode)
        self.stats = {"prefill": StepStats(), "decode": StepStats()}
        self.prefill_chunks: Counter[int] = Counter()

    # ------------------------------------------------------------------ plan checks
    def _kv_format(self) -> KVFormat:
        try:
            return kv_format(self.plan.kv_cache_dtype, self.dtype, self.cfg.latent_dim)
        except KVFormatError as exc:
            if self.plan.kv_cache_dtype not in ("fp4_e2m1",):
                raise PlanMismatch(f"kv_cache_dtype: {exc}") from None
            self.substitutions["kv_cache_dtype"] = ("auto", f"{exc}; the cache stores the model dtype")
            return kv_format("auto", self.dtype, self.cfg.latent_dim)

    def _page_size(self) -> int:
        """The KV page size: the option's, unless the plan's trtllm_mla kernels will run (on
        sm100 / sm103) and cannot read it: then 64, and the report says so."""
        size = self.options.page_size
        wants = "trtllm_mla" in (self.plan.attention_prefill, self.plan.attention_decode)
        if (wants and self.tp.device.type == "cuda" and compute_capability(self.tp.device)[0] == 10
                and size not in TrtllmMLA.PAGE_SIZES):
            self.notes.append(f"KV page size {size} -> 64: the plan's trtllm_mla kernels read pages of 32 or 64 "
                              "tokens")
            return 64
        return size

    CALIBRATION_TOKENS = 256

    def _calibrate_kv_scales(self) -> list[tuple[float, float]]:
        """Static per-layer scales for an fp8 cache: the amax of the compressed latent and of
        the rotated key over a calibration prompt (seeded random tokens, the same on every
        rank), mapped to a quarter of the format's range so that larger values in real
        prompts still fit; anything beyond is clipped and counted (saturated_values)."""
        cfg, dev = self.cfg, self.tp.device
        n = min(self.CALIBRATION_TOKENS, self.max_context)
        ids = torch.randint(2, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(0)).to(dev)
        temp = LatentKVCache(cfg.num_layers, cfg.latent_dim, n, 2, kv_format("auto", self.dtype, cfg.latent_dim), dev)
        recorder = _AmaxRecorder(cfg.kv_lora_rank, cfg.num_layers)
        meta = PrefillMeta(temp.allocate(0, n), [n], [temp.context_slots(0)], temp)
        with torch.inference_mode():
            self.model(ids, torch.arange(n, device=dev), meta, recorder)
        top = torch.finfo(self.cache.dtype).max / 4
        return [(max(c, 1e-6) / top, max(r, 1e-6) / top) for c, r in recorder.amax]

    def _chunk_size(self) -> int | None:
        """Tokens per prefill step (None: whole prompts). A chunk larger than the cache could
        never be stored: it is cut to the cache's capacity, and the report says so."""
        size = self.plan.chunked_prefill_size
        if size <= 0:
            return None
        cap = self.cache.capacity_tokens
        if size > cap:
            self.substitutions["chunked_prefill_size"] = (
                cap, f"{size} tokens per chunk exceed the KV cache's {cap} token slots on this rank")
            return cap
        return size

    # ------------------------------------------------------------------ set-up
    @torch.inference_mode()  # as the steps run: compiled pieces must not recompile inside a capture
    def capture(self, decode_rows: int | None = None, on_size: Callable[[int, int], None] | None = None) -> None:
        """Capture the planned sizes (GPU). On a CPU compiled prefill pieces (dynamic shapes
        there) are compiled once here, at the smallest size, and compiled decode steps at each
        planned size a step of at most `decode_rows` rows is padded to (None: every planned
        size), so that no compile is timed as a token. `on_size(done, total)`: with 0 first,
        then after each size captured or compiled (the prefill pieces on a CPU count as one)."""
        parts = self._capture_parts(decode_rows)
        total, done = sum(p.sizes for p in parts), [0]

        def one() -> None:
            done[0] += 1
            if on_size is not None:
                on_size(done[0], total)
        if on_size is not None and total:
            on_size(0, total)
        for part in parts:
            part.run(one)

    def _capture_decode_graphs(self, each: Callable[[], None]) -> None:
        context = min(self.options.graph_context, self.max_context, self.cache.capacity_tokens)
        pages = -(-context // self.cache.page_size)
        self.decode_graphs = DecodeGraphs(self.plan.decode_bs, pages, self._decode_step, self.decode_backend,
                                          self._padding_meta, self.tp.device)
        seconds, nbytes = self.decode_graphs.capture(each)
        self._captured(self.decode_mode, sorted(self.decode_graphs.graphs), self.decode_graphs.failed, seconds, nbytes)
        if not self.decode_graphs.graphs:
            self.decode_graphs = None

    def _capture_piece_graphs(self, each: Callable[[], None]) -> None:
        self.piece_graphs = PieceGraphs(self.pieces, self.piece_fns, list(self.prefill_sizes), self.tp.device,
                                        self.model.local_heads, self.cfg.v_head_dim, self.dtype)
        seconds, nbytes = self.piece_graphs.capture(self._warm_pieces, each)
        self._captured(self.prefill_mode, sorted(self.piece_graphs.graphs), self.piece_graphs.failed, seconds, nbytes)
        if not self.piece_graphs.graphs:
            self.piece_graphs = None

    def _compile_pieces(self, each: Callable[[], None]) -> None:
        t0 = time.perf_counter()
        self._warm_pieces(self._piece_compile_size())
        self.prefill_mode.capture_seconds = time.perf_counter() - t0
        each()

    def _piece_compile_size(self) -> int:
        """The token count a CPU compiles the prefill pieces at (dynamic shapes: once serves all)."""
        return max(2, min(self.prefill_sizes, default=4))

    @staticmethod
    def _captured(mode: Any, sizes: list[int], failed: dict[int, str], seconds: float, nbytes: int) -> None:
        """Record what was captured; never claim a graph that was not: a size that failed runs
        eagerly, and a phase with no graph at all is reported as eager."""
        mode.capture_seconds, mode.capture_bytes, mode.captured_sizes = seconds, nbytes, sizes
        mode.capture_failures = {str(k): v for k, v in sorted(failed.items())}
        if failed and not sizes:
            mode.effective = "disabled"
            mode.reason = "no size could be captured: " + "; ".join(f"{k}: {v}" for k, v in sorted(failed.items()))

    def _prefill_cap(self) -> int:
        return self.plan.prefill_max_num_tokens or max(self.plan.prefill_num_tokens, default=0)

    def _reachable_prefill_sizes(self) -> list[int]:
        """Planned prefill sizes a step can have: at most max_num_tokens, the chunk size, the
        context and the cache. Larger ones are neither padded to nor captured (reported)."""
        limits = {"prefill.max_num_tokens": self._prefill_cap(), "the context": self.max_context,
                  "the KV cache": self.cache.capacity_tokens}
        if self.chunk_tokens:
            limits["chunked_prefill_size"] = self.chunk_tokens
        keep = [n for n in self.plan.prefill_num_tokens if all(n <= v for v in limits.values())]
        dropped = [n for n in self.plan.prefill_num_tokens if n not in keep]
        if dropped:
            why = ", ".join(f"{k} ({v})" for k, v in limits.items() if any(n > v for n in dropped))
            self.substitutions["prefill.num_tokens"] = (keep, f"sizes {dropped} exceed {why}: no step reaches them, "
                                                              "they are neither padded to nor captured")
        return keep

    def _warm_pieces(self, n: int) -> None:
        """One step of n tokens through the pieces (compiles them at this size), then forget it."""
        seq = -1000 - n
        slots = self.cache.allocate(seq, n)
        meta = PrefillMeta(slots, [n], [self.cache.context_slots(seq)], self.cache)
        ids = torch.zeros(n, dtype=torch.long, device=self.tp.device)
        with torch.inference_mode():
            self.pieces.run(self.piece_fns, ids, torch.arange(n, device=self.tp.device), meta, self.prefill_backend)
        self.cache.release(seq)

    WARM_UP_SEQ = -1  # the warm-up request's sequence id (a run's are 0, 1, ...)

    @torch.inference_mode()
    def warm_up(self, tokens: int) -> float:
        """One request of `tokens` prompt tokens and one decode step through the paths a run
        takes first, so that what they do once (kernels loaded lazily or JIT-compiled, library
        handles, the allocator's first blocks) is not timed as the first request's; then
        forgotten: its pages freed, the step counts and the cache's saturation count as they
        were. Every rank runs it alike (collectives). Returns its seconds, read back."""
        t0 = time.perf_counter()
        stats, saturated = self.stats, self.cache.saturated.clone()
        self.stats = {"prefill": StepStats(), "decode": StepStats()}
        seq = self.WARM_UP_SEQ
        tokens = max(1, min(tokens, self.max_context - 1, self.cache.capacity_tokens - 1))  # and its one new token
        try:
            prompt = [2 + i % max(1, self.cfg.vocab_size - 2) for i in range(tokens)]
            first = int(self.prefill([seq], [prompt])[0].argmax().item())  # .item(): the device has finished
            self.decode([seq], [first])[0].argmax().item()
        finally:
            self.release(seq)
            self.stats = stats
            self.cache.saturated.copy_(saturated)
        return time.perf_counter() - t0

    def capture_work(self, decode_rows: int | None = None) -> str:
        """What capture(decode_rows) is about to do, in words, for the log: a capture can take
        minutes (a cold compile cache on a CPU, hundreds of graphs on a GPU)."""
        nothing = (f"nothing to capture or compile (decode {self.decode_mode.effective}, prefill "
                   f"{self.prefill_mode.effective})")
        return "; ".join(p.words for p in self._capture_parts(decode_rows)) or nothing

    def _capture_parts(self, decode_rows: int | None) -> list[CapturePart]:
        """What capture(decode_rows) does, part by part: the sizes each captures or compiles, in
        words, and the work (one list, so that the count and the log say what is done)."""
        pieces, parts = self.prefill_mode.effective, []
        if self.tp.device.type == "cuda":
            if self.decode_mode.effective == "full" and self.plan.decode_bs:
                bs = self.plan.decode_bs
                parts.append(CapturePart(len(bs), f"CUDA graphs for {len(bs)} decode batch sizes "
                                                  f"({min(bs)}..{max(bs)})", self._capture_decode_graphs))
            if pieces in ("tc_piecewise", "breakable") and self.prefill_sizes:
                n = self.prefill_sizes
                parts.append(CapturePart(len(n), f"CUDA graphs of the prefill pieces at {len(n)} token counts "
                                                 f"({min(n)}..{max(n)})", self._capture_piece_graphs))
            return parts
        if pieces == "tc_piecewise_nograph":
            parts.append(CapturePart(1, f"the prefill pieces compiled with torch.compile (inductor, dynamic shapes) at "
                                        f"{self._piece_compile_size()} tokens; minutes on a cold compile cache",
                                     self._compile_pieces))
        if self.compiled_decode is not None:
            sizes = self._decode_sizes_reached(decode_rows)
            parts.append(CapturePart(len(sizes), f"decode compiled with torch.compile ({self.options.cpu_decode}) at "
                                                 f"batch sizes {', '.join(map(str, sizes))}",
                                     functools.partial(self._compile_decode, sizes)))
        return parts

    def _decode_sizes_reached(self, rows: int | None) -> list[int]:
        """The planned decode sizes a step of 1..rows rows is padded to (None: every planned size)."""
        reach = range(1, rows + 1) if rows else self.plan.decode_bs
        return sorted({size for r in reach if (size := self._decode_size(r, 1)[0]) is not None})

    @torch.inference_mode()
    def _compile_decode(self, sizes: list[int], each: Callable[[], None]) -> None:
        """One padding-only step (context 1 on the scratch page) at each of `sizes`; every rank
        runs the same sizes, in order, for the collectives."""
        assert self.compiled_decode is not None
        empty = torch.empty(0, dtype=torch.long, device=self.tp.device)
        self.compiled_decode.warming = True
        try:
            for bs in sizes:
                ids = torch.zeros(bs, dtype=torch.long, device=self.tp.device)
                meta = decode_meta(self.cache, empty, [], [], bs, CompiledDecode.MIN_PAGES)
                self.compiled_decode(bs, ids, torch.zeros_like(ids), meta)
                each()
        finally:
            self.compiled_decode.warming = False

    def _padding_meta(self, rows: int) -> DecodeMeta:
        assert self.decode_graphs is not None
        slots = torch.empty(0, dtype=torch.long, device=self.tp.device)
        return decode_meta(self.cache, slots, [], [], rows, self.decode_graphs.max_pages)

    # ------------------------------------------------------------------ prefill
    @torch.inference_mode()
    def prefill(self, seq_ids: list[int], prompts: list[list[int]],
                on_step: Callable[[int], None] | None = None) -> torch.Tensor:
        """Append the prompts to their sequences, in steps of at most chunk_tokens tokens
        (earlier sequences first); logits of each prompt's last token, [B, V]. `on_step(n)`
        after each step, n its prompt tokens (a long prompt is many steps)."""
        remaining = {s: list(p) for s, p in zip(seq_ids, prompts, strict=True)}
        order = list(seq_ids)
        last: dict[int, torch.Tensor] = {}
        while order:
            budget = self.chunk_tokens or sum(len(remaining[s]) for s in order)
            step_ids, step_tokens = [], []
            for s in order:
                if budget <= 0:
                    break
                take = remaining[s][:budget]
                remaining[s] = remaining[s][len(take):]
                step_ids.append(s)
                step_tokens.append(take)
                budget -= len(take)
                self.prefill_chunks[s] += 1
            logits = self._prefill_step(step_ids, step_tokens)
            if on_step is not None:
                on_step(sum(len(t) for t in step_tokens))
            for i, s in enumerate(step_ids):
                if not remaining[s]:
                    last[s] = logits[i]
                    order.remove(s)
        return torch.stack([last[s] for s in seq_ids])

    def _prefill_step(self, seq_ids: list[int], chunks: list[list[int]]) -> torch.Tensor:
        dev = self.tp.device
        starts = [self.cache.seqs[s].length if s in self.cache.seqs else 0 for s in seq_ids]
        lens = [len(c) for c in chunks]
        slots = torch.cat([self.cache.allocate(s, n) for s, n in zip(seq_ids, lens, strict=True)])
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(a, a + n, device=dev) for a, n in zip(starts, lens, strict=True)])
        real = int(ids.shape[0])
        size, why = self._prefill_size(real)
        stats = self.stats["prefill"]
        if size is None:
            stats.eager[why] += 1
            meta = PrefillMeta(slots, lens, [self.cache.context_slots(s) for s in seq_ids], self.cache)
            hidden = self.model(ids, positions, meta, self.prefill_backend)
        else:
            stats.by_size[size] += 1
            stats.padded_rows += size - real
            pad = size - real
            ids = torch.cat([ids, ids.new_zeros(pad)])
            positions = torch.cat([positions, positions.new_zeros(pad)])
            slots = torch.cat([slots, slots.new_full((pad,), self.cache.scratch_slot)])
            meta = PrefillMeta(slots, lens, [self.cache.context_slots(s) for s in seq_ids], self.cache)
            if self.piece_graphs is not None and size in self.piece_graphs.graphs:
                hidden = self.piece_graphs.run(size, ids, positions, meta, self.prefill_backend)
            else:
                hidden = self.pieces.run(self.piece_fns, ids, positions, meta, self.prefill_backend)
        last = torch.tensor(lens, device=dev).cumsum(0) - 1
        return self.model.logits(hidden[last]).float()

    def _prefill_size(self, tokens: int) -> tuple[int | None, str]:
        """The planned size a prefill step of `tokens` tokens runs at, or None and why eager."""
        mode = self.prefill_mode
        if mode.effective == "disabled":
            return None, mode.reason or "prefill.backend is disabled"
        if self.tp.device.type == "cuda" and self.piece_graphs is None:
            return None, "no prefill sizes were captured"
        graphs = self.piece_graphs
        cap = self._prefill_cap()
        if tokens > cap:
            return None, f"step above prefill.max_num_tokens ({cap})"
        size = next_size(self.prefill_sizes, tokens)
        if size is None:
            return None, "no planned prefill.num_tokens size fits the step"
        if graphs is not None and size not in graphs.graphs:
            return None, f"size {size} could not be captured"
        return size, ""

    # ------------------------------------------------------------------ decode
    def _decode_step(self, ids: torch.Tensor, positions: torch.Tensor, meta: DecodeMeta) -> torch.Tensor:
        """The whole decode step at fixed shapes: what a CUDA graph or a fullgraph compile captures."""
        return self.model.logits(self.model(ids, positions, meta, self.decode_backend, static=True))

    @torch.inference_mode()
    def decode(self, seq_ids: list[int], tokens: list[int]) -> torch.Tensor:
        """One token for each sequence; logits [B, V]."""
        dev, cache = self.tp.device, self.cache
        slots = torch.cat([cache.allocate(s, 1) for s in seq_ids])
        lens = [cache.seqs[s].length for s in seq_ids]
        pages = [list(cache.seqs[s].pages) for s in seq_ids]
        b = len(seq_ids)
        size, why = self._decode_size(b, max(lens))
        stats = self.stats["decode"]
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        positions = torch.tensor([n - 1 for n in lens], dtype=torch.long, device=dev)
        if size is None:
            stats.eager[why] += 1
            meta = decode_meta(cache, slots, lens, pages, b, max(len(p) for p in pages))
            self.decode_backend.plan(meta, None)
            # The same fixed-shape expert dispatch as captured steps, so that a step's result
            # does not depend on whether it was captured.
            return self.model.logits(self.model(ids, positions, meta, self.decode_backend, static=True)).float()
        stats.by_size[size] += 1
        stats.padded_rows += size - b
        ids = torch.cat([ids, ids.new_zeros(size - b)])
        positions = torch.cat([positions, positions.new_zeros(size - b)])
        if self.decode_graphs is not None:
            meta = decode_meta(cache, slots, lens, pages, size, max(len(p) for p in pages))
            # a copy: the graph's output buffer is overwritten by the next replay
            return self.decode_graphs.replay(size, ids, positions, meta)[:b].to(torch.float32, copy=True)
        need = max(len(p) for p in pages)
        meta = decode_meta(cache, slots, lens, pages, size, max(need, CompiledDecode.MIN_PAGES))
        if self.compiled_decode is None:  # CPU, static_eager: the capture-safe step, uncompiled
            return self._decode_step(ids, positions, meta)[:b].float()
        return self.compiled_decode(size, ids, positions, meta)[:b].float()

    def _decode_size(self, rows: int, context: int) -> tuple[int | None, str]:
        mode = self.decode_mode
        if mode.effective == "disabled":
            return None, mode.reason or "decode.backend is disabled"
        if not self.plan.decode_bs:
            return None, "the plan has no decode.bs sizes"
        cap = self.plan.decode_max_bs or max(self.plan.decode_bs)
        if rows > cap:
            return None, f"batch above decode.max_bs ({cap})"
        size = next_size(self.plan.decode_bs, rows)
        if size is None:
            return None, "no planned decode.bs size fits the batch"
        if self.tp.device.type == "cuda" and (self.decode_graphs is None or size not in self.decode_graphs.graphs):
            return None, f"batch size {size} could not be captured"
        if self.decode_graphs is not None and context > self.decode_graphs.max_pages * self.cache.page_size:
            return None, f"context above the captured graphs' {self.decode_graphs.max_pages * self.cache.page_size} positions"
        return size, ""

    def release(self, seq_id: int) -> None:
        self.cache.release(seq_id)
        self.prefill_chunks.pop(seq_id, None)

    # ------------------------------------------------------------------ report
    def describe(self) -> dict[str, Any]:
        from cgsvc_worker.fidelity import plan_fidelity

        cfg = self.cfg
        elem = torch.empty((), dtype=self.dtype).element_size()
        hf_cache = cfg.num_layers * cfg.num_heads * (cfg.qk_head_dim + cfg.v_head_dim) * elem
        model_dtype_bytes = cfg.num_layers * cfg.latent_dim * elem
        return {
            "model": {"architecture": cfg.architecture, "layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
                      "heads": cfg.num_heads, "kv_lora_rank": cfg.kv_lora_rank, "rope_dim": cfg.qk_rope_head_dim,
                      "routed_experts": cfg.n_routed_experts,
                      "parameters_this_rank": sum(p.numel() for p in self.model.parameters())},
            "tp": self.tp.size, "device": str(self.tp.device), "dtype": str(self.dtype).removeprefix("torch."),
            "dtype_reason": self.dtype_reason,
            "plan": {"policy_version": self.plan.policy_version, "plan_hash": self.plan.plan_hash},
            "plan_fidelity": plan_fidelity(self),
            "modes": {"prefill": self.prefill_mode.to_dict(), "decode": self.decode_mode.to_dict()},
            "attention": {"prefill": self.attention_prefill.to_dict(), "decode": self.attention_decode.to_dict()},
            "steps": {k: v.to_dict() for k, v in self.stats.items()},
            "kv_cache": {
                "dtype": self.cache.format.name,
                "stored_as": str(self.cache.dtype).removeprefix("torch."),
                "bytes_per_token": self.cache.bytes_per_token,
                "model_dtype_bytes_per_token": model_dtype_bytes,
                "ratio_vs_model_dtype": round(model_dtype_bytes / self.cache.bytes_per_token, 2),
                "values_per_token_per_layer": cfg.latent_dim,
                "scales": ((f"per layer, static: (latent, rope key), calibrated at load on "
                            f"{min(self.CALIBRATION_TOKENS, self.max_context)} seeded random tokens to a quarter of "
                            "the format's range") if self.cache.format.fp8 else
                           "e4m3 per 16-value block" if self.cache.format.name == "fp4_e2m1" else "none"),
                "scale_values": ([[float(f"{c:.4g}"), float(f"{r:.4g}")] for c, r in self.cache.scale_values]
                                 if self.cache.format.fp8 else []),
                "saturated_values": int(self.cache.saturated.item()),
                "page_size": self.cache.page_size, "pages": self.cache.num_pages,
                "budget_bytes": self.kv_budget, "budget_reason": self.kv_budget_reason,
                "decompressed_bytes_per_token": hf_cache,
                "ratio_vs_decompressed": round(hf_cache / self.cache.bytes_per_token, 2),
            },
            "load": {"seconds": round(self.load_seconds, 3), "bytes_read_this_rank": self.load_report.bytes_read,
                     "tensors": self.load_report.tensors},
            "notes": self.notes + self._late_compile_notes(),
        }

    def _late_compile_notes(self) -> list[str]:
        late = self.compiled_decode.late if self.compiled_decode is not None else []
        if not late:
            return []
        sizes = f"decode size{'s' if len(late) > 1 else ''} {', '.join(map(str, late))}"
        return [f"{sizes} compiled on first use inside the timed run (more rows than the capture was told of): "
                "that step's time includes the compile"]
