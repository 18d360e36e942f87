"""The engine of one TP rank: loads the model, sizes the latent cache, picks attention
backends and graph modes from the plan, and runs prefill and decode steps.

Every rank runs the same steps on the same inputs; logits are gathered to every rank, so
sampling (greedy, or seeded temperature sampling) agrees across ranks without a broadcast.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from cgsvc_worker import loader
from cgsvc_worker.attention import StepBatch, select_backend
from cgsvc_worker.config import ModelConfig, load_model_config
from cgsvc_worker.graphs import (
    CompiledPieces,
    DecodeGraphs,
    effective_decode,
    effective_prefill,
)
from cgsvc_worker.kv_cache import LatentKVCache
from cgsvc_worker.model import DeepseekV3Model
from cgsvc_worker.tp import TPGroup

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class PlanMismatch(ValueError):
    """A plan that cannot be run with the loaded checkpoint."""


@dataclass
class EngineOptions:
    dtype: str = "float32"
    kv_cache_bytes: int = 256 * 1024 * 1024
    page_size: int = 16
    allow_compile: bool = True
    max_context: int = 0  # 0: the model's max_position_embeddings


@dataclass
class PlanView:
    """The parts of a plan (DESIGN.md JSON form) a worker honours."""

    prefill_backend: str = "disabled"
    decode_backend: str = "disabled"
    attention_prefill: str = "torch_native"
    attention_decode: str = "torch_native"
    decode_bs: list[int] = field(default_factory=list)
    prefill_num_tokens: list[int] = field(default_factory=list)
    policy_version: str = ""
    plan_hash: str = ""
    model_architecture: str = ""  # the text architecture the plan was resolved for, when known

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PlanView:
        plan = data.get("plan", data)
        try:
            view = cls(prefill_backend=plan["prefill"]["backend"], decode_backend=plan["decode"]["backend"],
                       attention_prefill=plan["attention_backend"]["prefill"],
                       attention_decode=plan["attention_backend"]["decode"],
                       decode_bs=list(plan["decode"].get("bs", [])),
                       prefill_num_tokens=list(plan["prefill"].get("num_tokens", [])),
                       policy_version=plan.get("policy_version", ""), plan_hash=plan.get("plan_hash", ""))
        except (KeyError, TypeError) as exc:
            raise PlanMismatch(f"not a cgsvc plan (missing {exc}); expected the JSON form of DESIGN.md") from None
        spec = data.get("spec") or plan.get("spec")
        if spec:
            view.model_architecture = _plan_architecture(spec)
        return view


def _plan_architecture(spec: dict[str, Any]) -> str:
    """The text architecture of the model a plan's spec names (through the catalog), or ''."""
    from cgsvc import catalog
    from cgsvc.errors import ResolveError

    try:
        facts = catalog.facts_for_spec(spec)
    except ResolveError:  # an unreadable model.path just means "unknown" here
        return ""
    return facts.text_architecture if facts else ""


def check_plan_matches(plan: PlanView, cfg: ModelConfig) -> list[str]:
    """Raise PlanMismatch when the plan was resolved for another model family; return notes."""
    notes: list[str] = []
    text_arch = "DeepseekV3ForCausalLM"  # what this worker runs, also inside the Kimi wrapper
    if plan.model_architecture and plan.model_architecture != text_arch:
        raise PlanMismatch(f"the plan was resolved for a {plan.model_architecture} model, the checkpoint is "
                           f"{cfg.architecture} ({text_arch} text model); resolve a plan for this model")
    if not plan.model_architecture:
        notes.append("the plan carries no spec: its model was not checked against the checkpoint")
    return notes


class Engine:
    def __init__(self, model_path: str, tp: TPGroup, plan: PlanView, options: EngineOptions) -> None:
        t0 = time.perf_counter()
        self.tp, self.plan, self.options = tp, plan, options
        self.cfg = load_model_config(model_path)
        self.notes = check_plan_matches(plan, self.cfg)
        if self.cfg.multimodal_wrapper:
            self.notes.append("multimodal checkpoint: the vision tower is out of scope; the text model runs")
        self.dtype = DTYPES[options.dtype]
        with torch.device(tp.device):
            self.model = DeepseekV3Model(self.cfg, tp, self.dtype)
        self.load_report = loader.load(self.model, model_path)
        self.notes += self.load_report.notes
        self.load_seconds = time.perf_counter() - t0
        self.max_context = options.max_context or self.cfg.max_position_embeddings
        self.cache = LatentKVCache.from_budget(options.kv_cache_bytes, self.cfg.num_layers, self.cfg.latent_dim,
                                               options.page_size, self.dtype, tp.device)
        self.prefill_backend, self.attention_prefill = select_backend(
            plan.attention_prefill, tp.device, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim)
        self.decode_backend, self.attention_decode = select_backend(
            plan.attention_decode, tp.device, self.cfg.kv_lora_rank, self.cfg.qk_rope_head_dim)
        self.prefill_mode = effective_prefill(plan.prefill_backend, tp.device, options.allow_compile)
        self.decode_mode = effective_decode(plan.decode_backend, tp.device)
        self.pieces = CompiledPieces(tp.device) if self.prefill_mode.effective.startswith("tc_piecewise") else None
        self.decode_graphs: DecodeGraphs | None = None

    # ------------------------------------------------------------------ set-up
    def capture(self) -> None:
        """Capture decode graphs (GPU) or time the compile warm-up of prefill pieces."""
        if self.decode_mode.effective == "full" and self.plan.decode_bs:
            scratch = self.cache.allocate(-1, 1)[0].item()  # a slot padding rows write to
            self.decode_graphs = DecodeGraphs(self.plan.decode_bs, min(self.max_context, 4096), self._decode_raw,
                                              self.tp.device, int(scratch))
            seconds, nbytes = self.decode_graphs.capture()
            self.decode_mode.capture_seconds, self.decode_mode.capture_bytes = seconds, nbytes
            self.decode_mode.captured_sizes = list(self.plan.decode_bs)
        if self.pieces is not None:
            t0 = time.perf_counter()
            self.prefill([-2], [[1, 2, 3, 4]])  # compiles both pieces (dynamic shapes: once)
            self.release(-2)
            self.prefill_mode.capture_seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ steps
    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, batch: StepBatch, backend: Any,
                 pieces: CompiledPieces | None = None) -> torch.Tensor:
        m = self.model
        if pieces is None:
            return m(ids, positions, batch, backend)
        x = m.embed_tokens(ids)
        cos, sin = m.rotary.cos_sin(positions, x.dtype)
        layers: list[Any] = list(m.layers)
        for layer in layers:
            h = pieces.pre(layer.input_layernorm, x)
            a = layer.self_attn(h, m.rotary, cos, sin, batch, backend)
            x = pieces.post(layer, x, a)
        return m.norm(x)  # type: ignore[no-any-return]

    @torch.inference_mode()
    def prefill(self, seq_ids: list[int], prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts (a ragged batch) through the model; logits of each last token [B, V]."""
        dev = self.tp.device
        lens = [len(p) for p in prompts]
        slots = torch.cat([self.cache.allocate(s, n) for s, n in zip(seq_ids, lens, strict=True)])
        ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
        positions = torch.cat([torch.arange(n, device=dev) for n in lens])
        batch = StepBatch("prefill", seq_ids, lens, lens, slots,
                          [self.cache.context_slots(s) for s in seq_ids], self.cache)
        hidden = self._forward(ids, positions, batch, self.prefill_backend, self.pieces)
        last = torch.tensor(lens, device=dev).cumsum(0) - 1
        return self.model.logits(hidden[last]).float()

    def _decode_raw(self, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, ctx_idx: torch.Tensor,
                    ctx_mask: torch.Tensor) -> torch.Tensor:
        batch = StepBatch("decode", [], [1] * ids.shape[0], [ctx_idx.shape[1]] * ids.shape[0], slots, [], self.cache,
                          extras={"padded": (ctx_idx, ctx_mask)})
        return self.model.logits(self.model(ids, positions, batch, self.decode_backend))

    @torch.inference_mode()
    def decode(self, seq_ids: list[int], tokens: list[int]) -> torch.Tensor:
        """One token for each sequence; logits [B, V]."""
        dev = self.tp.device
        slots = torch.cat([self.cache.allocate(s, 1) for s in seq_ids])
        ctx_lens = [self.cache.seqs[s].length for s in seq_ids]
        ids = torch.tensor(tokens, dtype=torch.long, device=dev)
        positions = torch.tensor([n - 1 for n in ctx_lens], dtype=torch.long, device=dev)
        batch = StepBatch("decode", seq_ids, [1] * len(seq_ids), ctx_lens, slots,
                          [self.cache.context_slots(s) for s in seq_ids], self.cache)
        graphs = self.decode_graphs
        if graphs is not None and graphs.size_for(len(seq_ids)) is not None and max(ctx_lens) <= graphs.max_context:
            idx, mask = batch.padded_context()
            return graphs.replay(ids, positions, slots, idx, mask).float()
        hidden = self.model(ids, positions, batch, self.decode_backend)
        return self.model.logits(hidden).float()

    def release(self, seq_id: int) -> None:
        self.cache.release(seq_id)

    # ------------------------------------------------------------------ report
    def describe(self) -> dict[str, Any]:
        cfg = self.cfg
        elem = torch.empty((), dtype=self.dtype).element_size()
        hf_cache = cfg.num_layers * cfg.num_heads * (cfg.qk_head_dim + cfg.v_head_dim) * elem
        return {
            "model": {"architecture": cfg.architecture, "layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
                      "heads": cfg.num_heads, "kv_lora_rank": cfg.kv_lora_rank, "rope_dim": cfg.qk_rope_head_dim,
                      "routed_experts": cfg.n_routed_experts,
                      "parameters_this_rank": sum(p.numel() for p in self.model.parameters())},
            "tp": self.tp.size, "device": str(self.tp.device), "dtype": self.options.dtype,
            "plan": {"policy_version": self.plan.policy_version, "plan_hash": self.plan.plan_hash},
            "modes": {"prefill": self.prefill_mode.to_dict(), "decode": self.decode_mode.to_dict()},
            "attention": {"prefill": self.attention_prefill.to_dict(), "decode": self.attention_decode.to_dict()},
            "kv_cache": {
                "bytes_per_token": self.cache.bytes_per_token,
                "values_per_token_per_layer": cfg.latent_dim,
                "page_size": self.cache.page_size, "pages": self.cache.num_pages,
                "decompressed_bytes_per_token": hf_cache,
                "ratio_vs_decompressed": round(hf_cache / self.cache.bytes_per_token, 2),
            },
            "load": {"seconds": round(self.load_seconds, 3), "bytes_read_this_rank": self.load_report.bytes_read,
                     "tensors": self.load_report.tensors},
            "notes": self.notes,
        }
