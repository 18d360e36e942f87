"""The resolver: a pure function from LaunchSpec to Plan (docs/policy.md).

    resolve(spec, policy):  ctx = validate_and_lock(spec, policy)  # INVALID_ARGUMENT on bad input
                            engine.run(policy.rules, ctx)          # the policy's order
                            return build_plan(ctx, policy)         # sizes, warnings, hashes

`policy` names a rule table of `policies.POLICIES` (docs/policies.md): `cgsvc` by default,
or an engine profile such as `sglang-0.5.17`.

No I/O (beyond reading `model.path`'s config.json), no clock, no randomness: the same
spec gives a byte-identical plan.
"""

from __future__ import annotations

import dataclasses
import hashlib
from functools import cache
from pathlib import Path

from cgsvc import catalog
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.plan import Plan, canonical_json, sha256_hex
from cgsvc.resolve import engine, estimates
from cgsvc.resolve.engine import KEYS, Context, Policy
from cgsvc.resolve.policies import DEFAULT_POLICY, get_policy
from cgsvc.spec import LaunchSpec

__all__ = ["DEFAULT_POLICY", "get_policy", "resolve", "policy_version", "validate_and_lock"]


@cache
def policy_version(name: str = DEFAULT_POLICY) -> str:
    """Content hash of a policy: its rule table (source and declarations), the engine
    modules every policy shares, and the catalogs."""
    policy = get_policy(name)
    h = hashlib.sha256()
    here = Path(__file__).parent
    for source in (*policy.sources, "sizes.py", "engine.py", "estimates.py", "__init__.py"):
        h.update((here / source).read_bytes())
    h.update(canonical_json([r.describe() for r in policy.rules]).encode())
    h.update(catalog.catalog_digest().encode())
    return h.hexdigest()[:16]


def _model_facts(spec: LaunchSpec, out: list[FieldViolation],
                 roots: catalog.ModelRoots) -> catalog.ModelFacts | None:
    m = spec.model
    if m.path is not None:
        try:
            return catalog.read_model_dir(m.path, m.name, roots)
        except ServiceError as exc:
            out.extend(exc.violations)
            return None
    if m.name is None:
        out.append(FieldViolation("model", "give model.name (a catalog id) or model.path (a checkpoint "
                                           "directory with config.json)"))
        return None
    facts = catalog.find_model(m.name)
    if facts is None:
        out.append(FieldViolation("model.name", catalog.unknown_model(m.name)))
    return facts


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _listed(values: list[int]) -> str:
    return ", ".join(map(str, values))


def validate_and_lock(spec: LaunchSpec, policy: Policy | None = None,
                      roots: catalog.ModelRoots = catalog.ANYWHERE) -> Context:
    """Cross-field validation and the user layer: every explicit key is set and locked.
    `roots`: where a model.path may lie (the server's --model-roots).

    Precedence, lowest to highest: policy defaults < disable_cuda_graph <
    enforce_piecewise_cuda_graph < cuda_graph.{phase}.*. A policy that cannot express a
    field (an engine release without that flag) refuses it here, by name.
    """
    out: list[FieldViolation] = list(policy.check(spec)) if policy is not None and policy.check else []
    model = _model_facts(spec, out, roots)
    hw = spec.hardware
    gpu = None
    if hw.gpu is None:
        out.append(FieldViolation("hardware.gpu", f"required; one of {', '.join(catalog.gpus())}"))
    else:
        gpu = catalog.find_gpu(hw.gpu)
        if gpu is None:
            out.append(FieldViolation("hardware.gpu", f"unknown GPU {hw.gpu!r}; valid: "
                                                      f"{', '.join(catalog.gpus())}"))
    par = spec.parallelism
    tp, pp, dp = par.tp or 1, par.pp or 1, par.dp or 1
    nodes = hw.nodes or 1
    per_node = hw.gpu_count if hw.gpu_count is not None else -(-(tp * pp) // nodes)
    gpus = per_node * nodes
    if tp * pp > gpus:
        out.append(FieldViolation("parallelism.tp", f"tp x pp = {tp * pp} exceeds the {gpus} GPUs given "
                                                    f"(hardware.gpu_count x hardware.nodes); valid: tp x pp at most "
                                                    f"{gpus}: lower tp/pp or add GPUs"))
    if par.enable_dp_attention and tp % dp != 0:
        out.append(FieldViolation("parallelism.dp", f"with DP attention dp must divide tp ({tp}); got {dp}; valid: "
                                                    f"{_listed(_divisors(tp))}"))
    if par.dp is not None and par.dp > 1 and not par.enable_dp_attention and dp * tp * pp > gpus:
        out.append(FieldViolation("parallelism.dp", f"dp x tp x pp = {dp * tp * pp} exceeds the {gpus} GPUs "
                                                    f"given; valid: dp at most {max(1, gpus // (tp * pp))}, "
                                                    "or add GPUs"))
    heads = model.num_attention_heads if model is not None else 0
    if heads and not par.enable_dp_attention and heads % tp != 0:
        fits = [d for d in _divisors(heads) if d * pp <= gpus]
        out.append(FieldViolation("parallelism.tp", f"tp={tp} does not divide the model's {heads} attention heads; "
                                                    f"valid: {_listed(fits)} (the divisors of {heads} that fit "
                                                    f"the {gpus} GPUs given at pp={pp})"))

    ov = spec.overrides
    cg_p, cg_d = ov.cuda_graph.prefill, ov.cuda_graph.decode
    if ov.enforce_piecewise_cuda_graph and cg_p.backend not in (None, "tc_piecewise"):
        out.append(FieldViolation("overrides.enforce_piecewise_cuda_graph",
                                  f"contradicts overrides.cuda_graph.prefill.backend={cg_p.backend!r}; "
                                  "drop one, or set the backend to 'tc_piecewise'"))
    if cg_d.bs and cg_d.max_bs is not None and cg_d.max_bs != max(cg_d.bs):
        out.append(FieldViolation("overrides.cuda_graph.decode.max_bs",
                                  f"{cg_d.max_bs} disagrees with max(bs) = {max(cg_d.bs)}; "
                                  "give one of them or make them agree"))
    if cg_p.num_tokens and cg_p.max_num_tokens is not None and cg_p.max_num_tokens != max(cg_p.num_tokens):
        out.append(FieldViolation("overrides.cuda_graph.prefill.max_num_tokens",
                                  f"{cg_p.max_num_tokens} disagrees with max(num_tokens) = "
                                  f"{max(cg_p.num_tokens)}; give one of them or make them agree"))
    if out:
        raise ServiceError.invalid(out)
    assert model is not None and gpu is not None

    ctx = Context(spec=spec, model=model, gpu=gpu,
                  memory_mib=hw.gpu_memory_mib or gpu.memory_mib, tp=tp, pp=pp, dp=dp,
                  attn_cp=par.attn_cp or 1, dcp=par.dcp or 1,
                  dp_attention=bool(par.enable_dp_attention))
    if ov.disable_cuda_graph:
        for key in ("prefill.backend", "decode.backend"):
            ctx.set_user("user.disable_cuda_graph", key, "disabled", "disable_cuda_graph=true")
    if ov.enforce_piecewise_cuda_graph:
        ctx.set_user("user.enforce_piecewise_cuda_graph", "prefill.backend", "tc_piecewise",
                     "enforce_piecewise_cuda_graph=true")
    explicit = {
        "prefill.backend": cg_p.backend, "prefill.num_tokens": cg_p.num_tokens,
        "prefill.max_num_tokens": cg_p.max_num_tokens or (max(cg_p.num_tokens) if cg_p.num_tokens else None),
        "decode.backend": cg_d.backend, "decode.bs": cg_d.bs,
        "decode.max_bs": cg_d.max_bs or (max(cg_d.bs) if cg_d.bs else None),
        "attention_backend.prefill": ov.prefill_attention_backend or ov.attention_backend,
        "attention_backend.decode": ov.decode_attention_backend or ov.attention_backend,
        "kv_cache_dtype": spec.features.kv_cache_dtype,
        "chunked_prefill_size": spec.features.chunked_prefill_size,
    }
    for key, value in explicit.items():
        if value is not None:
            ctx.set_user(f"user.{key}", key, value, "explicit in the launch spec")
    return ctx


def resolve(spec: LaunchSpec, policy: str = DEFAULT_POLICY, roots: catalog.ModelRoots = catalog.ANYWHERE) -> Plan:
    """Resolve a launch spec into a plan under the named policy. Raises ServiceError on
    refusal (an unknown policy included: the error lists the known ones). `roots`: the
    directories a model.path must lie under (a server's --model-roots; anywhere by default)."""
    table = get_policy(policy)
    ctx = validate_and_lock(spec, table, roots)
    engine.run(table.rules, ctx)
    return build_plan(ctx, table)


def build_plan(ctx: Context, policy: Policy) -> Plan:
    """Freeze the draft into a Plan: a disabled phase captures nothing; hash the body last."""
    prefill_on, decode_on = ctx.prefill != "disabled", ctx.decode != "disabled"
    draft = Plan(
        policy=policy.name, policy_version=policy_version(policy.name), plan_hash="",
        attention_prefill=ctx.attn_prefill, attention_decode=ctx.attn_decode,
        prefill_backend=ctx.prefill,
        prefill_max_num_tokens=(ctx["prefill.max_num_tokens"] or 0)
        if prefill_on or "prefill.max_num_tokens" in ctx.locked else 0,
        prefill_num_tokens=tuple(ctx["prefill.num_tokens"] or ()) if prefill_on else (),
        decode_backend=ctx.decode,
        decode_max_bs=(ctx["decode.max_bs"] or 0) if decode_on or "decode.max_bs" in ctx.locked else 0,
        decode_bs=tuple(ctx["decode.bs"] or ()) if decode_on else (),
        kv_cache_dtype=ctx["kv_cache_dtype"], chunked_prefill_size=ctx["chunked_prefill_size"],
        locked=tuple(k for k in KEYS if k in ctx.locked),
        decisions=tuple(ctx.decisions), warnings=tuple(ctx.warnings),
        estimates=estimates.estimate(ctx),
    )
    return dataclasses.replace(draft, plan_hash=sha256_hex(canonical_json(draft.body())))
