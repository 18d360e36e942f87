"""The default policy: the ordered rule table of docs/policy.md, one small rule per row.

Read top to bottom, this file is the policy. Each rule has a stable id, the stage it runs
in, its hardness, what it reads and the plan keys it may write. The engine enforces locks
and records decisions; rules never touch the draft themselves.
"""

from __future__ import annotations

from cgsvc.catalog import arch_matches
from cgsvc.resolve import sizes
from cgsvc.resolve.engine import Context, Rule, Stage

BLACKWELL = ("sm100", "sm103")
MLA_ONLY_BACKENDS = ("trtllm_mla", "flashmla", "cutlass_mla")
NO_GRAPH_ATTENTION = ("torch_native", "flex_attention")
CPU_ATTENTION = ("torch_native", "flex_attention")

# Architecture lists (prefixes, compared without underscores).
MULTIMODAL_PIECEWISE_ALLOWLIST = ("KimiK25ForConditionalGeneration",
                                  "Cohere2VisionForConditionalGeneration",
                                  "MiniMaxM3SparseForCausalLM",
                                  "MiniMaxM3SparseForConditionalGeneration")
PIECEWISE_BLOCKLIST = ("DeepseekV4", "Qwen3Next", "BailingMoeV2_5", "LLaDA")
BREAKABLE_MULTIMODAL_ALLOWLIST = ("Qwen3_5", "KimiK3", "KimiK25", "MuseGlimmer", "InternS2Mobius")

P, D = "prefill.backend", "decode.backend"
AP, AD = "attention_backend.prefill", "attention_backend.decode"


def _a2a(ctx: Context) -> str:
    return ctx.features.moe_a2a_backend or "none"


def _piecewise_allowlisted(ctx: Context) -> bool:
    return arch_matches(ctx.model.architecture, MULTIMODAL_PIECEWISE_ALLOWLIST)


def _speculative(ctx: Context) -> bool:
    return ctx.features.speculative_algorithm is not None


def attention_row(name: str, rule_id: str, when: object, reason: str, source: str = "hardware",
                  only_when_all_unset: bool = False) -> Rule:
    """An automatic attention-backend row: first match fills whichever phase is still unset
    (with only_when_all_unset, it fires only when no backend at all was given)."""
    def fires(ctx: Context) -> bool:
        if only_when_all_unset:
            unset = ctx.attn_prefill is None and ctx.attn_decode is None
        else:
            unset = ctx.attn_prefill is None or ctx.attn_decode is None
        return unset and when(ctx)  # type: ignore[operator,no-any-return]
    return Rule(id=rule_id, stage=Stage.ATTENTION, source=source,
                reads=("model.arch", "model.mla", "hardware.gpu"), writes=(AP, AD), when=fires,
                effect=lambda ctx: ctx.unset({AP: name, AD: name}), reason=reason)


def cascade_rule(backend: str, rule_id: str, reads: tuple[str, ...], cond: object, reason: str,
                  hard: bool = False) -> Rule:
    """A compatibility rule of the prefill cascade: while prefill is `backend` and cond holds,
    prefill becomes `disabled` (so the first rule that holds decides)."""
    return Rule(id=rule_id, stage=Stage.PREFILL_CASCADE, source="compatibility", reads=(P, *reads),
                writes=(P,), hard=hard, reason=reason,
                when=lambda ctx: ctx.prefill == backend and cond(ctx),  # type: ignore[operator]
                effect=lambda ctx: {P: "disabled"})


def _tc_rule(rule_id: str, reads: tuple[str, ...], cond: object, reason: str, hard: bool = False) -> Rule:
    return cascade_rule("tc_piecewise", rule_id, reads, cond, reason, hard)


def _breakable_rule(rule_id: str, reads: tuple[str, ...], cond: object, reason: str, hard: bool = False) -> Rule:
    return cascade_rule("breakable", rule_id, reads, cond, reason, hard)


RULES: tuple[Rule, ...] = (
    # ------------------------------------------------------------------ 1. defaults
    Rule(id="default.prefill.backend", stage=Stage.DEFAULTS, source="default",
         reads=("hardware.gpu",), writes=(P,),
         when=lambda ctx: ctx.prefill is None,
         effect=lambda ctx: {P: "breakable" if ctx.gpu.cuda else "disabled"},
         reason="generic prefill default: breakable on CUDA GPUs, disabled (eager) on cpu"),
    Rule(id="default.decode.backend", stage=Stage.DEFAULTS, source="default",
         reads=("hardware.gpu",), writes=(D,),
         when=lambda ctx: ctx.decode is None,
         effect=lambda ctx: {D: "full" if ctx.gpu.cuda else "disabled"},
         reason="generic decode default: full graphs on CUDA GPUs, disabled (eager) on cpu"),
    Rule(id="kv_cache.model_fp8", stage=Stage.DEFAULTS, source="model",
         reads=("model.quantization_config",), writes=("kv_cache_dtype",),
         when=lambda ctx: ctx["kv_cache_dtype"] is None and ctx.model.kv_cache_dtype is not None,
         effect=lambda ctx: {"kv_cache_dtype": ctx.model.kv_cache_dtype},
         reason="the checkpoint ships a quantized KV cache (kv_cache_quant_algo)"),
    Rule(id="default.kv_cache_dtype", stage=Stage.DEFAULTS, source="default",
         reads=(), writes=("kv_cache_dtype",),
         when=lambda ctx: ctx["kv_cache_dtype"] is None,
         effect=lambda ctx: {"kv_cache_dtype": "auto"},
         reason="KV cache in the model's activation dtype"),

    # ------------------------------------------------------------------ 2. attention
    Rule(id="attention.cpu_hardware", stage=Stage.ATTENTION, source="compatibility", hard=True,
         reads=(AP, AD, "hardware.gpu"), writes=(AP, AD),
         when=lambda ctx: not ctx.gpu.cuda and any(
             b is not None and b not in CPU_ATTENTION for b in (ctx.attn_prefill, ctx.attn_decode)),
         reason="cpu hardware runs only torch_native or flex_attention attention"),
    Rule(id="attention.trtllm_mla.requires_blackwell", stage=Stage.ATTENTION, source="compatibility",
         hard=True, reads=(AP, AD, "hardware.gpu"), writes=(AP, AD),
         when=lambda ctx: ctx.gpu.cuda and ctx.gpu.arch not in BLACKWELL
         and "trtllm_mla" in (ctx.attn_prefill, ctx.attn_decode),
         reason="trtllm_mla kernels (trtllm-gen) exist only for Blackwell sm100/sm103"),
    Rule(id="attention.mla_backend.requires_mla_model", stage=Stage.ATTENTION, source="compatibility",
         hard=True, reads=(AP, AD, "model.mla"), writes=(AP, AD),
         when=lambda ctx: not ctx.model.is_mla
         and any(b in MLA_ONLY_BACKENDS for b in (ctx.attn_prefill, ctx.attn_decode)),
         reason="MLA-only attention backends need a model with kv_lora_rank (MLA)"),
    attention_row("torch_native", "attention.cpu", lambda ctx: not ctx.gpu.cuda,
                  "cpu hardware: the torch_native reference attention"),
    attention_row("dsa", "attention.dsa.blackwell",
                  lambda ctx: ctx.model.deepseek_v3_family and ctx.model.is_dsa and ctx.gpu.arch in BLACKWELL,
                  "DeepSeek sparse-attention (DSA) variant on Blackwell"),
    attention_row("trtllm_mla", "attention.deepseek_v3.blackwell",
                  lambda ctx: ctx.model.deepseek_v3_family and ctx.gpu.arch in BLACKWELL,
                  "DeepSeek-V3 family on Blackwell sm100/sm103: TRT-LLM MLA kernels"),
    attention_row("fa3", "attention.mla.hopper", lambda ctx: ctx.model.is_mla and ctx.gpu.arch == "sm90",
                  "MLA model on Hopper sm90: FlashAttention-3 MLA"),
    attention_row("flashinfer", "attention.mla.blackwell",
                  lambda ctx: ctx.model.is_mla and ctx.gpu.arch in BLACKWELL,
                  "MLA model outside the DeepSeek-V3 family on Blackwell: flashinfer MLA"),
    attention_row("triton", "attention.mla.other_cuda",
                  lambda ctx: ctx.model.is_mla and ctx.gpu.arch in ("sm80", "sm86", "sm89", "sm120"),
                  "MLA model on sm80/sm86/sm89/sm120: triton MLA"),
    attention_row("fa3", "attention.mha.hopper", lambda ctx: not ctx.model.is_mla and ctx.gpu.arch == "sm90",
                  "MHA model on Hopper sm90: FlashAttention-3"),
    attention_row("trtllm_mha", "attention.mha.blackwell",
                  lambda ctx: not ctx.model.is_mla and ctx.gpu.arch in BLACKWELL and not _speculative(ctx),
                  "MHA model on Blackwell without speculative decoding: TRT-LLM MHA"),
    attention_row("flashinfer", "attention.mha.other_cuda",
                  lambda ctx: not ctx.model.is_mla and ctx.gpu.cuda,
                  "MHA model on other CUDA GPUs (or Blackwell with speculative decoding): flashinfer"),

    # ------------------------------------------------------------------ 3. prefill cascade
    Rule(id="prefill.upgrade.multimodal_piecewise", stage=Stage.PREFILL_CASCADE, source="model",
         reads=(P, "model.arch", "features.enable_multimodal", AP), writes=(P,),
         when=lambda ctx: ctx.prefill == "breakable" and _piecewise_allowlisted(ctx)
         and ctx.features.enable_multimodal is not False and ctx.attn_prefill != "trtllm_mla",
         effect=lambda ctx: {P: "tc_piecewise"},
         reason="validated multimodal decoder: prefill runs under tc_piecewise"),
    Rule(id="prefill.exception.trtllm_mla", stage=Stage.PREFILL_CASCADE, source="backend_exception",
         reads=(P, "model.arch", "features.enable_multimodal", AP), writes=(P,),
         when=lambda ctx: ctx.prefill == "breakable" and _piecewise_allowlisted(ctx)
         and ctx.features.enable_multimodal is not False and ctx.attn_prefill == "trtllm_mla",
         effect=lambda ctx: {P: "breakable"},
         reason="no tc_piecewise upgrade with trtllm_mla attention: the graph path would force a "
                "paged-MLA fallback that converts the whole FP8 KV cache"),
    _tc_rule("tc_piecewise.blocklisted_arch", ("model.arch",),
             lambda ctx: arch_matches(ctx.model.architecture, PIECEWISE_BLOCKLIST)
             or arch_matches(ctx.model.text_architecture, PIECEWISE_BLOCKLIST),
             "architecture is on the piecewise block-list (DeepseekV4, Qwen3Next, BailingMoeV2_5, LLaDA)"),
    _tc_rule("tc_piecewise.multimodal_not_allowlisted", ("model.arch", "features.enable_multimodal"),
             lambda ctx: ctx.multimodal and not _piecewise_allowlisted(ctx),
             "multimodal model not on the piecewise allow-list"),
    _tc_rule("tc_piecewise.dp_attention", ("parallelism.enable_dp_attention",),
             lambda ctx: ctx.dp_attention, "DP attention is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.torch_compile", ("features.enable_torch_compile",),
             lambda ctx: bool(ctx.features.enable_torch_compile),
             "enable_torch_compile already compiles the model; tc_piecewise would compile it twice"),
    _tc_rule("tc_piecewise.pipeline_parallel", ("parallelism.pp",), lambda ctx: ctx.pp > 1,
             "pipeline parallelism (pp > 1) is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.non_cuda", ("hardware.gpu",), lambda ctx: not ctx.gpu.cuda,
             "tc_piecewise needs CUDA hardware", hard=True),
    _tc_rule("tc_piecewise.moe_a2a", ("features.moe_a2a_backend",), lambda ctx: _a2a(ctx) != "none",
             "a MoE all-to-all backend is set"),
    _tc_rule("tc_piecewise.lora", ("features.lora",), lambda ctx: bool(ctx.features.lora),
             "LoRA adapters are not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.gguf", ("model.quantization",),
             lambda ctx: (ctx.spec.model.quantization or ctx.model.quantization) == "gguf",
             "GGUF quantization is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.cpu_offload_or_hicache",
             ("features.cpu_offload_gb", "features.enable_hierarchical_cache"),
             lambda ctx: (ctx.features.cpu_offload_gb or 0) > 0 or bool(ctx.features.enable_hierarchical_cache),
             "tc_piecewise cannot run with CPU offload or the hierarchical cache", hard=True),
    _tc_rule("tc_piecewise.deterministic", ("features.enable_deterministic_inference",),
             lambda ctx: bool(ctx.features.enable_deterministic_inference),
             "deterministic inference is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.pd_disaggregation", ("features.disaggregation_mode",),
             lambda ctx: (ctx.features.disaggregation_mode or "null") != "null",
             "PD disaggregation is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.eplb", ("features.enable_eplb",), lambda ctx: bool(ctx.features.enable_eplb),
             "EPLB is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.attn_cp", ("parallelism.attn_cp",), lambda ctx: ctx.attn_cp > 1,
             "attention context parallelism (attn_cp > 1) is not supported under tc_piecewise"),
    _tc_rule("tc_piecewise.dcp", ("parallelism.dcp",), lambda ctx: ctx.dcp > 1,
             "decode context parallelism (dcp > 1) is not supported under tc_piecewise"),
    _breakable_rule("breakable.deepseek_v4", ("model.arch",),
                    lambda ctx: arch_matches(ctx.model.architecture, ("DeepseekV4",))
                    or arch_matches(ctx.model.text_architecture, ("DeepseekV4",)),
                    "DeepSeek-V4 architecture cannot run breakable graphs"),
    _breakable_rule("breakable.attn_cp", ("parallelism.attn_cp",), lambda ctx: ctx.attn_cp > 1,
                    "breakable graphs do not support attention context parallelism (attn_cp > 1)",
                    hard=True),
    _breakable_rule("breakable.dcp", ("parallelism.dcp",), lambda ctx: ctx.dcp > 1,
                    "breakable graphs do not support decode context parallelism (dcp > 1)", hard=True),
    _breakable_rule("breakable.two_batch_overlap", ("features.enable_two_batch_overlap",),
                    lambda ctx: bool(ctx.features.enable_two_batch_overlap),
                    "two-batch overlap is not supported under breakable graphs"),
    _breakable_rule("breakable.moe_a2a", ("features.moe_a2a_backend",),
                    lambda ctx: _a2a(ctx) not in ("none", "deepep", "flashinfer"),
                    "MoE all-to-all backend other than none/deepep/flashinfer"),
    _breakable_rule("breakable.multimodal_not_allowlisted", ("model.arch", "features.enable_multimodal"),
                    lambda ctx: ctx.multimodal
                    and not arch_matches(ctx.model.architecture, BREAKABLE_MULTIMODAL_ALLOWLIST),
                    "multimodal model not on the breakable allow-list"),
    _breakable_rule("breakable.mla", ("model.mla",), lambda ctx: ctx.model.is_mla and not ctx.model.is_dsa,
                    "MLA attention (non-DSA) runs prefill eagerly (TRT-LLM / ragged MLA prefill)"),
    _breakable_rule("breakable.nemotron_h", ("model.arch",),
                    lambda ctx: arch_matches(ctx.model.architecture, ("NemotronH",)),
                    "NemotronH hybrid layers cannot run breakable graphs"),

    # ------------------------------------------------------------------ 4. late rules
    Rule(id="graph.cpu_hardware", stage=Stage.LATE, source="compatibility", hard=True,
         reads=(P, D, "hardware.gpu"), writes=(P, D),
         when=lambda ctx: not ctx.gpu.cuda and (ctx.prefill != "disabled" or ctx.decode != "disabled"),
         effect=lambda ctx: {P: "disabled", D: "disabled"},
         reason="CUDA graphs cannot be captured on cpu hardware"),
    Rule(id="prefill.deepseek_v3.trtllm_mla", stage=Stage.LATE, source="backend_exception",
         reads=(P, "model.arch", AP), writes=(P,),
         when=lambda ctx: ctx.model.deepseek_v3_family and ctx.attn_prefill == "trtllm_mla"
         and ctx.prefill != "disabled",
         effect=lambda ctx: {P: "disabled"},
         reason="DeepSeek-V3 architecture with trtllm_mla prefill runs eagerly"),
    Rule(id="attention.no_graph_backend", stage=Stage.LATE, source="compatibility",
         reads=(AP, AD), writes=(P, D),
         when=lambda ctx: (ctx.attn_prefill in NO_GRAPH_ATTENTION or ctx.attn_decode in NO_GRAPH_ATTENTION)
         and (ctx.prefill != "disabled" or ctx.decode != "disabled"),
         effect=lambda ctx: {P: "disabled", D: "disabled"},
         reason="torch_native / flex_attention attention cannot be captured in CUDA graphs"),
    Rule(id="pd.prefill_role", stage=Stage.LATE, source="compatibility",
         reads=("features.disaggregation_mode",), writes=(D,),
         when=lambda ctx: ctx.features.disaggregation_mode == "prefill" and ctx.decode != "disabled",
         effect=lambda ctx: {D: "disabled"},
         reason="a PD prefill server runs no decode"),
    Rule(id="pd.decode_role", stage=Stage.LATE, source="compatibility",
         reads=("features.disaggregation_mode",), writes=(P,),
         when=lambda ctx: ctx.features.disaggregation_mode == "decode" and ctx.prefill != "disabled",
         effect=lambda ctx: {P: "disabled"},
         reason="a PD decode server runs no prefill"),
    Rule(id="deepep.normal_mode", stage=Stage.LATE, source="compatibility",
         reads=("features.moe_a2a_backend", "features.deepep_mode"), writes=(P, D),
         when=lambda ctx: _a2a(ctx) == "deepep" and ctx.features.deepep_mode == "normal"
         and (ctx.prefill != "disabled" or ctx.decode != "disabled"),
         effect=lambda ctx: {P: "disabled", D: "disabled"},
         reason="DeepEP normal mode cannot be captured in CUDA graphs"),

    # ------------------------------------------------------------------ 5. sizes
    Rule(id="sizes.chunked_prefill_size.memory_tier", stage=Stage.SIZES, source="hardware",
         reads=("hardware.gpu_memory_mib",), writes=("chunked_prefill_size",),
         when=lambda ctx: ctx["chunked_prefill_size"] is None,
         effect=lambda ctx: {"chunked_prefill_size": sizes.memory_tier(ctx.memory_mib, ctx.tp)[0]},
         reason="chunked prefill size from the per-GPU memory tier"),
    Rule(id="dp_attention.chunked_prefill_split", stage=Stage.SIZES, source="clamp",
         reads=("parallelism.enable_dp_attention", "parallelism.dp"), writes=("chunked_prefill_size",),
         when=lambda ctx: ctx.dp_attention and ctx.dp > 1,
         effect=lambda ctx: {"chunked_prefill_size": max(1, ctx["chunked_prefill_size"] // ctx.dp)},
         reason="DP attention: each DP rank prefills chunked_prefill_size // dp tokens"),
    Rule(id="sizes.decode.max_bs.memory_tier", stage=Stage.SIZES, source="hardware",
         reads=(D, "hardware.gpu_memory_mib", "parallelism.tp"), writes=("decode.max_bs",),
         when=lambda ctx: ctx.decode != "disabled" and ctx["decode.max_bs"] is None,
         effect=lambda ctx: {"decode.max_bs": sizes.memory_tier(ctx.memory_mib, ctx.tp)[1]},
         reason="decode max batch size from the per-GPU memory tier"),
    Rule(id="sizes.decode.bs", stage=Stage.SIZES, source="default",
         reads=(D, "decode.max_bs", "features.speculative_algorithm", "overrides.disable_cuda_graph_padding"),
         writes=("decode.bs",),
         when=lambda ctx: ctx.decode != "disabled" and ctx["decode.bs"] is None,
         effect=lambda ctx: {"decode.bs": sizes.decode_batch_sizes(
             ctx["decode.max_bs"], _speculative(ctx), bool(ctx.spec.overrides.disable_cuda_graph_padding))},
         reason="decode batch sizes up to max_bs (padding / speculative lists per policy)"),
    Rule(id="sizes.prefill.max_num_tokens", stage=Stage.SIZES, source="model",
         reads=(P, "model.mla", "chunked_prefill_size"), writes=("prefill.max_num_tokens",),
         when=lambda ctx: ctx.prefill != "disabled" and ctx["prefill.max_num_tokens"] is None,
         effect=lambda ctx: {"prefill.max_num_tokens":
                             2048 if ctx.model.is_mla else ctx["chunked_prefill_size"]},
         reason="prefill graph tokens: 2048 for MLA models, else the chunked prefill size"),
    Rule(id="sizes.prefill.max_total_tokens_cap", stage=Stage.SIZES, source="clamp",
         reads=("prefill.max_num_tokens", "features.max_total_tokens"), writes=("prefill.max_num_tokens",),
         when=lambda ctx: ctx.prefill != "disabled" and ctx.features.max_total_tokens is not None
         and ctx["prefill.max_num_tokens"] > ctx.features.max_total_tokens,
         effect=lambda ctx: {"prefill.max_num_tokens": ctx.features.max_total_tokens},
         reason="prefill graph tokens capped by max_total_tokens"),
    Rule(id="dp_attention.prefill_max_num_tokens", stage=Stage.SIZES, source="clamp",
         reads=("prefill.max_num_tokens", "chunked_prefill_size", "parallelism.enable_dp_attention"),
         writes=("prefill.max_num_tokens",),
         when=lambda ctx: ctx.dp_attention and ctx.prefill != "disabled"
         and ctx["prefill.max_num_tokens"] > ctx["chunked_prefill_size"],
         effect=lambda ctx: {"prefill.max_num_tokens": ctx["chunked_prefill_size"]},
         reason="DP attention: prefill graph tokens clamped to the per-rank chunked prefill size"),
    Rule(id="sizes.prefill.num_tokens", stage=Stage.SIZES, source="default",
         reads=(P, "prefill.max_num_tokens"), writes=("prefill.num_tokens",),
         when=lambda ctx: ctx.prefill != "disabled" and ctx["prefill.num_tokens"] is None,
         effect=lambda ctx: {"prefill.num_tokens": sizes.prefill_token_buckets(ctx["prefill.max_num_tokens"])},
         reason="prefill token buckets up to max_num_tokens"),
    Rule(id="sizes.disabled_phase.prefill", stage=Stage.SIZES, source="compatibility", hard=True,
         reads=(P, "prefill.num_tokens"), writes=("prefill.num_tokens",),
         when=lambda ctx: ctx.prefill == "disabled" and bool(ctx["prefill.num_tokens"]),
         effect=lambda ctx: {"prefill.num_tokens": ()},
         reason="prefill resolves to disabled, so it captures nothing; explicit num_tokens cannot apply"),
    Rule(id="sizes.disabled_phase.decode", stage=Stage.SIZES, source="compatibility", hard=True,
         reads=(D, "decode.bs"), writes=("decode.bs",),
         when=lambda ctx: ctx.decode == "disabled" and bool(ctx["decode.bs"]),
         effect=lambda ctx: {"decode.bs": ()},
         reason="decode resolves to disabled, so it captures nothing; explicit bs cannot apply"),

    # ------------------------------------------------------------------ 6. warnings
    Rule(id="prefill.full.experimental", stage=Stage.WARNINGS, source="compatibility",
         reads=(P,), writes=(), when=lambda ctx: ctx.prefill == "full",
         reason="full prefill graphs are experimental",
         warning=lambda ctx: "prefill backend 'full' is experimental: one graph per token count "
                             "for the whole forward; expect long capture and large memory"),
    Rule(id="trtllm_mla.fp8_paged_fallback", stage=Stage.WARNINGS, source="backend_exception",
         reads=(P, AP, "kv_cache_dtype"), writes=(),
         when=lambda ctx: ctx.prefill != "disabled" and ctx.attn_prefill == "trtllm_mla"
         and str(ctx["kv_cache_dtype"]).startswith("fp8"),
         reason="graph prefill with trtllm_mla and an FP8 KV cache takes the paged-MLA fallback",
         warning=lambda ctx: f"prefill graph '{ctx.prefill}' with trtllm_mla attention and an "
                             f"{ctx['kv_cache_dtype']} KV cache takes the paged-MLA fallback that "
                             "converts the whole FP8 KV cache: expect a TTFT regression (measured "
                             "upstream: 122.68 ms -> 344.58 ms, Kimi-K2.6-NVFP4 on 4xGB300 TP4, "
                             "1K in / 1K out, concurrency 1)"),
)

# The stage order is structural: the table is run sorted by stage (stable within one).
RULES = tuple(sorted(RULES, key=lambda r: r.stage))
RULES_BY_ID = {r.id: r for r in RULES}
