"""Engine profiles: sglang 0.5.17, 0.5.18 and 0.5.23 as rule tables on cgsvc's engine.

Each table resolves a launch spec the way that release's own argument handling does, in
that release's order, defects included: `ServerArgs.__post_init__` in 0.5.17 and 0.5.18,
the `arg_groups` resolution pipeline in 0.5.23. The rules were written from the released
wheels (`pip download sglang==X --no-deps`; `server_args.py`, `arg_groups/`,
`configs/model_config.py`, `model_executor/cuda_graph_config.py`), not copied from them.
docs/policies.md says, per release, what each table reproduces and what it leaves out.

A table is read top to bottom: unlike `cgsvc` (sorted by stage, attention first), a
profile runs in the release's own order, and that order is the point — 0.5.17 decides the
prefill graph before it picks the attention backend.

Where a rule has the same meaning as one of `cgsvc`'s it has the same id (and where the
text is the same, it is the same object), so a diff between policies names only the rules
that differ.
"""

from __future__ import annotations

from dataclasses import dataclass

from cgsvc.errors import FieldViolation
from cgsvc.resolve import sizes
from cgsvc.resolve.engine import Context, Policy, Rule, Stage, Value
from cgsvc.resolve.policy import RULES_BY_ID, attention_row, cascade_rule
from cgsvc.spec import LaunchSpec

P, D = "prefill.backend", "decode.backend"
AP, AD = "attention_backend.prefill", "attention_backend.decode"
SM100_FAMILY = ("sm100", "sm103")  # is_sm100_supported(): compute capability 10.x

# configs/model_config.py, exact architecture names (sglang compares hf_config.architectures).
PIECEWISE_DISABLED = ("DeepseekV4ForCausalLM", "DeepseekV4ForCausalLMNextN", "DeepseekV4ForCausalLMDSpark",
                      "Qwen3NextForCausalLM", "BailingMoeV2_5ForCausalLM", "LLaDAModelLM")
MM_PIECEWISE_0517 = ("Cohere2VisionForConditionalGeneration", "KimiK25ForConditionalGeneration",
                     "MiniMaxM3SparseForCausalLM", "MiniMaxM3SparseForConditionalGeneration")
MM_BREAKABLE_0517 = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")
MM_BREAKABLE_0518 = ("InternS2MobiusForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                     "Qwen3_5MoeForConditionalGeneration", "MuseGlimmerForConditionalGeneration",
                     "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration")
MM_BREAKABLE_0523 = ("MiniMaxM3SparseForConditionalGeneration", "Cohere2VisionForConditionalGeneration",
                     "Glm5NextForConditionalGeneration", "InternS2MobiusForConditionalGeneration",
                     "PaddleOCRVLForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                     "Qwen3_5MoeForConditionalGeneration", "Qwen4ExpForConditionalGeneration",
                     "MuseGlimmerForConditionalGeneration", "MuseSparkForConditionalGeneration",
                     "KimiK3ForConditionalGeneration", "KimiK25ForConditionalGeneration",
                     "MiniMaxM3SparseForCausalLM")
# arg_groups/overrides.py: _deepseek_family_overrides is registered for these.
DEEPSEEK_FAMILY = ("DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "KimiK25ForConditionalGeneration",
                   "MistralLarge3ForCausalLM", "PixtralForConditionalGeneration", "GlmMoeDsaForCausalLM",
                   "LongcatFlashForCausalLM", "LongcatFlashForCausalLMNextN")
BREAKABLE_A2A = ("none", "deepep", "megamoe", "flashinfer")
PP_PREFILL_MAX_TOKENS_0523 = 8192  # memory_hook._DEFAULT_PP_PREFILL_CUDA_GRAPH_MAX_TOKENS


@dataclass(frozen=True)
class Release:
    """What differs between the releases, in one place."""

    version: str
    tc_piecewise: bool  # the backend exists (0.5.23 removed it)
    non_cuda_prefill_default: str  # default_prefill_backend() off CUDA
    upgrade: str  # the multimodal tc_piecewise upgrade: "allowlist", "guarded" or "" (none)
    attention_before_cascade: bool  # the cascade can read the attention backend (0.5.18)
    mla_disables_breakable: bool  # breakable incompatible with (non-DSA) MLA (0.5.17)
    pp_disables_breakable: bool  # breakable off by default under pipeline parallelism (0.5.23)
    mm_piecewise: tuple[str, ...]
    mm_breakable: tuple[str, ...]
    sizes_0523: bool  # 0.5.23's memory tiers, MLA prefill size and running-request cap


def _arch(ctx: Context, names: tuple[str, ...]) -> bool:
    return ctx.model.architecture in names


def _mm_on(ctx: Context) -> bool:
    """ModelConfig's enable_multimodal: the *_supported flags are False when multimodal is off."""
    return ctx.model.is_multimodal and ctx.features.enable_multimodal is not False


def _a2a(ctx: Context) -> str:
    return ctx.features.moe_a2a_backend or "none"


def _speculative(ctx: Context) -> bool:
    return ctx.features.speculative_algorithm is not None


def _defaults(r: Release) -> tuple[Rule, ...]:
    return (
        Rule(id="default.prefill.backend", stage=Stage.DEFAULTS, source="default", reads=("hardware.gpu",),
             writes=(P,), when=lambda ctx: ctx.prefill is None,
             effect=lambda ctx: {P: "breakable" if ctx.gpu.cuda else r.non_cuda_prefill_default},
             reason=f"default_prefill_backend(): breakable on CUDA, {r.non_cuda_prefill_default} elsewhere"),
        Rule(id="default.decode.backend", stage=Stage.DEFAULTS, source="default", reads=(), writes=(D,),
             when=lambda ctx: ctx.decode is None, effect=lambda ctx: {D: "full"},
             reason="CudaGraphConfig(): decode backend full"),
        RULES_BY_ID["kv_cache.model_fp8"],
        RULES_BY_ID["default.kv_cache_dtype"],
    )


def _attention_rows(r: Release) -> tuple[Rule, ...]:
    """_handle_cpu_backends, the DeepSeek-family model override, then get_default_attn_backend."""
    return (
        attention_row("torch_native", "attention.cpu", lambda ctx: not ctx.gpu.cuda,
                      "_handle_cpu_backends: torch_native on the host CPU (intel_amx on x86 servers is "
                      "not in the plan vocabulary)"),
        attention_row("dsa", "attention.deepseek_family.dsa",
                      lambda ctx: _arch(ctx, DEEPSEEK_FAMILY) and ctx.model.is_dsa,
                      "_deepseek_family_overrides: the DSA variants use the dsa backend", "model",
                      only_when_all_unset=True),
        attention_row("trtllm_mla", "attention.deepseek_v3.blackwell",
                      lambda ctx: _arch(ctx, DEEPSEEK_FAMILY) and not ctx.model.is_dsa and ctx.gpu.arch in SM100_FAMILY,
                      "_deepseek_family_overrides: trtllm_mla on sm100 for the DeepSeek-V3 family", "model",
                      only_when_all_unset=True),
        attention_row("fa3", "attention.mla.hopper", lambda ctx: ctx.model.is_mla and ctx.gpu.arch == "sm90",
                      "get_default_attn_backend: MLA on Hopper, fa3"),
        attention_row("flashinfer", "attention.mla.blackwell",
                      lambda ctx: ctx.model.is_mla and ctx.gpu.arch in SM100_FAMILY,
                      "get_default_attn_backend: MLA on sm100, flashinfer"),
        attention_row("triton", "attention.mla.other_cuda", lambda ctx: ctx.model.is_mla and ctx.gpu.cuda,
                      "get_default_attn_backend: MLA elsewhere, triton"),
        attention_row("fa3", "attention.mha.hopper",
                      lambda ctx: not ctx.model.is_mla and ctx.gpu.arch == "sm90" and not _speculative(ctx),
                      "get_default_attn_backend: MHA on Hopper without speculative decoding (top-k unknown), fa3"),
        attention_row("trtllm_mha", "attention.mha.blackwell",
                      lambda ctx: not ctx.model.is_mla and ctx.gpu.arch in SM100_FAMILY and not _speculative(ctx),
                      "get_default_attn_backend: MHA on sm100 without speculative decoding, trtllm_mha"),
        attention_row("flashinfer", "attention.mha.other_cuda", lambda ctx: not ctx.model.is_mla and ctx.gpu.cuda,
                      "get_default_attn_backend: MHA elsewhere, flashinfer"),
    )


def _upgrade_rows(r: Release) -> tuple[Rule, ...]:
    """The multimodal upgrade at the top of _apply_cuda_graph_compatibility."""
    if not r.upgrade:
        return ()

    def allowlisted(ctx: Context) -> bool:
        return ctx.prefill == "breakable" and _mm_on(ctx) and _arch(ctx, r.mm_piecewise)

    if r.upgrade == "allowlist":  # 0.5.17: no look at the attention backend (it is not chosen yet)
        return (Rule(id="prefill.upgrade.multimodal_piecewise", stage=Stage.PREFILL_CASCADE, source="model",
                     reads=(P, "model.arch", "features.enable_multimodal"), writes=(P,), when=allowlisted,
                     effect=lambda ctx: {P: "tc_piecewise"},
                     reason="validated multimodal decoder: prefill upgraded from breakable to tc_piecewise "
                            "(before any attention backend is chosen)"),)
    # 0.5.18: not for archs also on the breakable allow-list, nor with trtllm_mla attention
    return (
        Rule(id="prefill.keep_breakable.multimodal_allowlist", stage=Stage.PREFILL_CASCADE, source="model",
             reads=(P, "model.arch", "features.enable_multimodal"), writes=(P,),
             when=lambda ctx: allowlisted(ctx) and _arch(ctx, r.mm_breakable),
             effect=lambda ctx: {P: "breakable"},
             reason="on the multimodal breakable allow-list too: keeps breakable (no tc_piecewise upgrade)"),
        Rule(id="prefill.exception.trtllm_mla", stage=Stage.PREFILL_CASCADE, source="backend_exception",
             reads=(P, "model.arch", AP), writes=(P,),
             when=lambda ctx: allowlisted(ctx) and not _arch(ctx, r.mm_breakable) and ctx.attn_prefill == "trtllm_mla",
             effect=lambda ctx: {P: "breakable"},
             reason="trtllm_mla attention stays on the breakable path (MLA extend falls back to flashinfer)"),
        Rule(id="prefill.upgrade.multimodal_piecewise", stage=Stage.PREFILL_CASCADE, source="model",
             reads=(P, "model.arch", "features.enable_multimodal", AP), writes=(P,),
             when=lambda ctx: allowlisted(ctx) and not _arch(ctx, r.mm_breakable) and ctx.attn_prefill != "trtllm_mla",
             effect=lambda ctx: {P: "tc_piecewise"},
             reason="validated multimodal decoder: prefill upgraded from breakable to tc_piecewise"),
    )


def _tc_piecewise_rows(r: Release) -> tuple[Rule, ...]:
    """_disable_tc_piecewise_cudagraph_if_incompatible, in its order (rows whose input the
    launch spec has no field for — DLLM, symmetric memory, debug mode — are left out)."""
    if not r.tc_piecewise:
        return ()
    t = "tc_piecewise"
    return (
        cascade_rule(t, "tc_piecewise.blocklisted_arch", ("model.arch", "features.enable_multimodal"),
                     lambda ctx: _arch(ctx, PIECEWISE_DISABLED) or (_mm_on(ctx) and not _arch(ctx, r.mm_piecewise)),
                     "is_piecewise_cuda_graph_disabled_model: block-listed architecture, or multimodal "
                     "and not on the piecewise allow-list"),
        cascade_rule(t, "tc_piecewise.dp_attention", ("parallelism.enable_dp_attention",),
                     lambda ctx: ctx.dp_attention, "DP attention"),
        cascade_rule(t, "tc_piecewise.torch_compile", ("features.enable_torch_compile",),
                     lambda ctx: bool(ctx.features.enable_torch_compile), "full torch.compile mode"),
        cascade_rule(t, "tc_piecewise.pipeline_parallel", ("parallelism.pp",), lambda ctx: ctx.pp > 1,
                     "pipeline parallelism (pp_size > 1)"),
        cascade_rule(t, "tc_piecewise.non_cuda", ("hardware.gpu",), lambda ctx: not ctx.gpu.cuda,
                     "non-CUDA hardware"),
        cascade_rule(t, "tc_piecewise.moe_a2a", ("features.moe_a2a_backend",), lambda ctx: _a2a(ctx) != "none",
                     "MoE A2A backend"),
        cascade_rule(t, "tc_piecewise.lora", ("features.lora",), lambda ctx: bool(ctx.features.lora), "LoRA"),
        cascade_rule(t, "tc_piecewise.gguf", ("model.quantization",),
                     lambda ctx: (ctx.spec.model.quantization or ctx.model.quantization) == "gguf",
                     "GGUF quantization"),
        cascade_rule(t, "tc_piecewise.cpu_offload_or_hicache",
                     ("features.cpu_offload_gb", "features.enable_hierarchical_cache"),
                     lambda ctx: (ctx.features.cpu_offload_gb or 0) > 0 or bool(ctx.features.enable_hierarchical_cache),
                     "CPU offload / hierarchical cache"),
        cascade_rule(t, "tc_piecewise.deterministic", ("features.enable_deterministic_inference",),
                     lambda ctx: bool(ctx.features.enable_deterministic_inference), "deterministic inference"),
        cascade_rule(t, "tc_piecewise.pd_disaggregation", ("features.disaggregation_mode",),
                     lambda ctx: (ctx.features.disaggregation_mode or "null") != "null", "PD disaggregation"),
        cascade_rule(t, "tc_piecewise.eplb", ("features.enable_eplb",), lambda ctx: bool(ctx.features.enable_eplb),
                     "expert distribution recorder (EPLB)"),
        cascade_rule(t, "tc_piecewise.attn_cp", ("parallelism.attn_cp",), lambda ctx: ctx.attn_cp > 1,
                     "context parallel (attn_cp_size > 1)"),
        cascade_rule(t, "tc_piecewise.dcp", ("parallelism.dcp",), lambda ctx: ctx.dcp > 1,
                     "decode context parallel (dcp_size > 1)"),
    )


def _breakable_rows(r: Release) -> tuple[Rule, ...]:
    """_disable_breakable_cudagraph_if_incompatible, in its order (0.5.23: the PP default first)."""
    b = "breakable"
    rows: list[Rule] = []
    if r.pp_disables_breakable:
        rows.append(cascade_rule(b, "breakable.pipeline_parallel", ("parallelism.pp",), lambda ctx: ctx.pp > 1,
                                 "pipeline parallelism: breakable prefill graphs are opt-in "
                                 "(--cuda-graph-backend-prefill=breakable)"))
    if r.mla_disables_breakable:
        rows.append(cascade_rule(b, "breakable.mla", ("model.mla",),
                                 lambda ctx: ctx.model.is_mla and not ctx.model.is_dsa,
                                 "MLA attention (non-DSA): MLA prefill under breakable takes forward_mha, "
                                 "which has no eager breaks"))
        rows.append(cascade_rule(b, "breakable.nemotron_h", ("model.arch",),
                                 lambda ctx: ctx.model.architecture.startswith("NemotronH"),
                                 "NemotronH (hybrid Mamba2 prefill)"))
    rows += [
        cascade_rule(b, "breakable.deepseek_v4", ("model.arch",),
                     lambda ctx: ctx.model.architecture.startswith("DeepseekV4"),
                     "DeepSeek-V4 (heavy capture-pool memory pressure)"),
        cascade_rule(b, "breakable.attn_cp", ("parallelism.attn_cp",), lambda ctx: ctx.attn_cp > 1,
                     "context parallel (attn_cp_size > 1)"),
        cascade_rule(b, "breakable.dcp", ("parallelism.dcp",), lambda ctx: ctx.dcp > 1,
                     "decode context parallel (dcp_size > 1)"),
        cascade_rule(b, "breakable.two_batch_overlap", ("features.enable_two_batch_overlap",),
                     lambda ctx: bool(ctx.features.enable_two_batch_overlap), "two-batch overlap"),
        cascade_rule(b, "breakable.moe_a2a", ("features.moe_a2a_backend",),
                     lambda ctx: _a2a(ctx) not in BREAKABLE_A2A, "unvalidated a2a backend"),
        cascade_rule(b, "breakable.multimodal_not_allowlisted", ("model.arch", "features.enable_multimodal"),
                     lambda ctx: _mm_on(ctx) and not _arch(ctx, r.mm_breakable), "multimodal model"),
    ]
    return tuple(rows)


def _aligned_prefill_buckets(ctx: Context) -> dict[str, Value]:
    buckets = ctx["prefill.num_tokens"] or sizes.prefill_token_buckets(ctx["prefill.max_num_tokens"] or 2048)
    aligned = tuple(sorted({-(-b // 8) * 8 for b in buckets}))
    return {"prefill.num_tokens": aligned, "prefill.max_num_tokens": aligned[-1]}


DEEPEP_ALIGNMENT = Rule(
    id="deepep.prefill_buckets_aligned", stage=Stage.SIZES, source="compatibility",
    reads=(P, "features.moe_a2a_backend", "prefill.num_tokens"), writes=("prefill.num_tokens", "prefill.max_num_tokens"),
    when=lambda ctx: _a2a(ctx) == "deepep" and ctx.prefill == "breakable",
    effect=_aligned_prefill_buckets,
    reason="_apply_deepep_adjustments: breakable prefill with DeepEP captures token counts divisible by 8 "
           "(from max 2048 unless given)")


def memory_tier_0523(memory_mib: int, tp: int) -> tuple[int, int]:
    """0.5.23's (chunked_prefill_size, decode max_bs): the 20-35 GiB tier grew (4096; 48 or 160)."""
    if 20 * sizes.GIB <= memory_mib < 35 * sizes.GIB:
        return 4096, 48 if tp < 4 else 160
    return sizes.memory_tier(memory_mib, tp)


def _size_rows(r: Release) -> tuple[Rule, ...]:
    """_handle_gpu_memory_settings (0.5.23: arg_groups/memory_hook.py)."""
    if not r.sizes_0523:
        return tuple(RULES_BY_ID[i] for i in (
            "sizes.chunked_prefill_size.memory_tier", "sizes.decode.max_bs.memory_tier", "sizes.decode.bs",
            "sizes.prefill.max_num_tokens", "sizes.prefill.max_total_tokens_cap", "sizes.prefill.num_tokens"))
    default = RULES_BY_ID
    return (
        Rule(id="sizes.chunked_prefill_size.memory_tier", stage=Stage.SIZES, source="hardware",
             reads=("hardware.gpu_memory_mib",), writes=("chunked_prefill_size",),
             when=lambda ctx: ctx["chunked_prefill_size"] is None,
             effect=lambda ctx: {"chunked_prefill_size": memory_tier_0523(ctx.memory_mib, ctx.tp)[0]},
             reason="chunked prefill size from the per-GPU memory tier (0.5.23 tiers)"),
        Rule(id="sizes.decode.max_bs.memory_tier", stage=Stage.SIZES, source="hardware",
             reads=(D, "hardware.gpu_memory_mib", "parallelism.tp"), writes=("decode.max_bs",),
             when=lambda ctx: ctx.decode != "disabled" and ctx["decode.max_bs"] is None,
             effect=lambda ctx: {"decode.max_bs": memory_tier_0523(ctx.memory_mib, ctx.tp)[1]},
             reason="decode max batch size from the per-GPU memory tier (0.5.23 tiers)"),
        Rule(id="sizes.decode.max_bs.running_requests_cap", stage=Stage.SIZES, source="clamp",
             reads=("decode.max_bs", "features.max_running_requests"), writes=("decode.max_bs",),
             when=lambda ctx: ctx.decode != "disabled" and ctx.features.max_running_requests is not None
             and "decode.max_bs" not in ctx.locked and ctx["decode.max_bs"] > ctx.features.max_running_requests,
             effect=lambda ctx: {"decode.max_bs": ctx.features.max_running_requests},
             reason="a default decode max_bs is capped by max_running_requests"),
        default["sizes.decode.bs"],
        Rule(id="sizes.prefill.max_num_tokens", stage=Stage.SIZES, source="model",
             reads=(P, "model.mla", "chunked_prefill_size"), writes=("prefill.max_num_tokens",),
             when=lambda ctx: ctx.prefill != "disabled" and ctx["prefill.max_num_tokens"] is None,
             effect=lambda ctx: {"prefill.max_num_tokens": min(8192, ctx["chunked_prefill_size"])
                                 if ctx.model.is_mla else ctx["chunked_prefill_size"]},
             reason="prefill graph tokens: the chunked prefill size (MLA: at most 8192)"),
        Rule(id="sizes.prefill.pipeline_parallel_cap", stage=Stage.SIZES, source="clamp",
             reads=(P, "parallelism.pp", "prefill.max_num_tokens"), writes=("prefill.max_num_tokens",),
             when=lambda ctx: ctx.pp > 1 and ctx.prefill == "breakable" and "prefill.num_tokens" not in ctx.locked
             and "prefill.max_num_tokens" not in ctx.locked
             and ctx["prefill.max_num_tokens"] > PP_PREFILL_MAX_TOKENS_0523,
             effect=lambda ctx: {"prefill.max_num_tokens": PP_PREFILL_MAX_TOKENS_0523},
             reason=f"opt-in PP breakable graphs capture at most {PP_PREFILL_MAX_TOKENS_0523} tokens"),
        default["sizes.prefill.max_total_tokens_cap"],
        default["sizes.prefill.num_tokens"],
    )


def _late_rows(r: Release) -> tuple[Rule, ...]:
    """After the attention backend: graphs it cannot run under, the DeepSeek-V3 trtllm_mla
    prefill rule, then _handle_data_parallelism's DP-attention split."""
    return (
        RULES_BY_ID["graph.cpu_hardware"],
        RULES_BY_ID["attention.no_graph_backend"],
        Rule(id="prefill.deepseek_v3.trtllm_mla", stage=Stage.LATE, source="backend_exception",
             reads=(P, "model.arch", AP), writes=(P,),
             when=lambda ctx: ctx.prefill != "disabled" and ctx.model.architecture == "DeepseekV3ForCausalLM"
             and ctx.attn_prefill == "trtllm_mla",
             effect=lambda ctx: {P: "disabled"},
             reason="_disable_prefill_cuda_graph_for_deepseek_trtllm_mla: DeepseekV3ForCausalLM (that "
                    "architecture name only) with trtllm_mla prefill runs eagerly"),
        RULES_BY_ID["dp_attention.chunked_prefill_split"],
        RULES_BY_ID["dp_attention.prefill_max_num_tokens"],
        Rule(id="dp_attention.prefill_num_tokens", stage=Stage.SIZES, source="clamp",
             reads=("prefill.max_num_tokens", "parallelism.enable_dp_attention"), writes=("prefill.num_tokens",),
             when=lambda ctx: ctx.dp_attention and ctx.prefill != "disabled" and bool(ctx["prefill.num_tokens"])
             and max(ctx["prefill.num_tokens"]) > ctx["prefill.max_num_tokens"],
             effect=lambda ctx: {"prefill.num_tokens": sizes.prefill_token_buckets(ctx["prefill.max_num_tokens"])},
             reason="DP attention: the prefill token buckets regenerated for the clamped max"),
    )


def _tail() -> tuple[Rule, ...]:
    return (RULES_BY_ID["pd.prefill_role"], RULES_BY_ID["pd.decode_role"])


def _check(r: Release):  # type: ignore[no-untyped-def]
    def check(spec: LaunchSpec) -> list[FieldViolation]:
        out: list[FieldViolation] = []
        if r.tc_piecewise:
            return out
        if spec.overrides.cuda_graph.prefill.backend == "tc_piecewise":
            out.append(FieldViolation("overrides.cuda_graph.prefill.backend",
                                      f"sglang-{r.version} has no tc_piecewise backend (removed); valid: full, "
                                      "breakable, disabled"))
        if spec.overrides.enforce_piecewise_cuda_graph:
            out.append(FieldViolation("overrides.enforce_piecewise_cuda_graph",
                                      f"sglang-{r.version} has no --enforce-piecewise-cuda-graph flag (tc_piecewise "
                                      "was removed); drop it, or resolve under sglang-0.5.18 or cgsvc"))
        return out
    return check


def table(r: Release) -> tuple[Rule, ...]:
    """The release's rules in its own evaluation order."""
    graph = (*_upgrade_rows(r), *_tc_piecewise_rows(r), *_breakable_rows(r), DEEPEP_ALIGNMENT, *_tail())
    if r.attention_before_cascade:
        return (*_defaults(r), *_attention_rows(r), *graph, *_size_rows(r), *_late_rows(r),
                RULES_BY_ID["prefill.full.experimental"])
    return (*_defaults(r), *graph, *_size_rows(r), *_attention_rows(r), *_late_rows(r),
            RULES_BY_ID["prefill.full.experimental"])


RELEASES = (
    Release("0.5.17", tc_piecewise=True, non_cuda_prefill_default="tc_piecewise", upgrade="allowlist",
            attention_before_cascade=False, mla_disables_breakable=True, pp_disables_breakable=False,
            mm_piecewise=MM_PIECEWISE_0517, mm_breakable=MM_BREAKABLE_0517, sizes_0523=False),
    Release("0.5.18", tc_piecewise=True, non_cuda_prefill_default="tc_piecewise", upgrade="guarded",
            attention_before_cascade=True, mla_disables_breakable=False, pp_disables_breakable=False,
            mm_piecewise=MM_PIECEWISE_0517, mm_breakable=MM_BREAKABLE_0518, sizes_0523=False),
    Release("0.5.23", tc_piecewise=False, non_cuda_prefill_default="disabled", upgrade="",
            attention_before_cascade=False, mla_disables_breakable=False, pp_disables_breakable=True,
            mm_piecewise=(), mm_breakable=MM_BREAKABLE_0523, sizes_0523=True),
)

SUMMARIES = {
    "0.5.17": "sglang 0.5.17: prefill graph decided before the attention backend; Kimi-K2.x on Blackwell "
              "gets tc_piecewise",
    "0.5.18": "sglang 0.5.18: the tc_piecewise upgrade reads the declared attention backend and spares "
              "breakable-allow-listed archs",
    "0.5.23": "sglang 0.5.23: tc_piecewise removed; breakable serves MLA; new memory tiers and prefill sizes",
}

PROFILES = tuple(
    Policy(name=f"sglang-{r.version}", summary=SUMMARIES[r.version], rules=table(r),
           sources=("policy.py", "profiles/sglang.py"), doc="docs/policies.md", check=_check(r))
    for r in RELEASES)
