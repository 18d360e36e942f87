"""Plan fidelity: for every field of the plan, what was requested, what ran, and why they differ.

Each entry is {"field", "requested", "effective", "status", "reason"}, status one of
    honoured        the worker ran what the plan says
    substituted     it ran something else; `reason` says what and why
    not_applicable  the field has nothing to act on in this run (a size limit of a phase that
                    runs eagerly, chunking turned off); `reason` says why
`PLAN_FIELDS` (cgsvc.contract's) must name every setting of the plan type
(tests/workers/test_plan_fidelity.py derives that list from cgsvc.plan.Plan and fails when a new
field has no entry there).
"""

from __future__ import annotations

from typing import Any

from cgsvc.contract import FIDELITY_STATUSES, PLAN_FIELDS, FidelityEntry

__all__ = ["PLAN_FIELDS", "STATUSES", "entry", "plan_fidelity"]
STATUSES = FIDELITY_STATUSES


def entry(field: str, requested: Any, effective: Any, status: str = "", reason: str = "") -> dict[str, Any]:
    if not status:
        status = "honoured" if requested == effective else "substituted"
    return FidelityEntry(field, requested, effective, status, reason).to_dict()  # checks the reason is there


def plan_fidelity(engine: Any) -> list[dict[str, Any]]:
    """One entry per plan field for a built (and possibly run) Engine."""
    plan, cuda = engine.plan, engine.tp.device.type == "cuda"
    out = [entry("attention_backend.prefill", plan.attention_prefill, engine.attention_prefill.effective,
                 reason=engine.attention_prefill.reason),
           entry("attention_backend.decode", plan.attention_decode, engine.attention_decode.effective,
                 reason=engine.attention_decode.reason)]
    out += _phase(engine, "prefill", plan.prefill_backend, engine.prefill_mode, "max_num_tokens",
                  plan.prefill_max_num_tokens, engine._prefill_cap(), "num_tokens", plan.prefill_num_tokens, cuda)
    unreachable = engine.substitutions.get("prefill.num_tokens")
    if unreachable and out[-1]["status"] == "honoured":
        out[-1] = entry("prefill.num_tokens", plan.prefill_num_tokens, unreachable[0], "substituted", unreachable[1])
    out += _phase(engine, "decode", plan.decode_backend, engine.decode_mode, "max_bs", plan.decode_max_bs,
                  plan.decode_max_bs or max(plan.decode_bs, default=0), "bs", plan.decode_bs, cuda)
    kv_effective, kv_reason = engine.substitutions.get("kv_cache_dtype", (engine.cache.format.name, ""))
    stored = str(engine.cache.dtype).removeprefix("torch.")
    note = kv_reason or (f"stored as {stored}" + (" (the model dtype)" if engine.cache.format.name == "auto" else "")
                         + (", packed two per byte with e4m3 block scales" if kv_effective == "fp4_e2m1" else ""))
    out.append(entry("kv_cache_dtype", plan.kv_cache_dtype, kv_effective, reason=note))
    size = plan.chunked_prefill_size
    if size <= 0:
        out.append(entry("chunked_prefill_size", size, size, "not_applicable",
                         "chunking is off in the plan: each prompt is prefilled in one step"))
    else:
        eff, why = engine.substitutions.get("chunked_prefill_size", (engine.chunk_tokens, ""))
        out.append(entry("chunked_prefill_size", size, eff, reason=why or "prompts longer than this are prefilled "
                                                                            "in chunks (prefill_chunks per request)"))
    return out


def _phase(engine: Any, phase: str, requested: str, mode: Any, cap_name: str, cap_requested: int, cap_effective: int,
           sizes_name: str, sizes: list[int], cuda: bool) -> list[dict[str, Any]]:
    backend = entry(f"{phase}.backend", requested, mode.effective, reason=mode.reason)
    if mode.effective == "disabled":
        why = (f"{phase} runs eagerly (plan: {requested})" if requested == "disabled" else
               f"{phase} runs eagerly ({mode.reason})")
        return [backend, entry(f"{phase}.{cap_name}", cap_requested, None, "not_applicable", f"{why}: no step is "
                                                                                              "captured or padded"),
                entry(f"{phase}.{sizes_name}", sizes, [], "not_applicable", f"{why}: no step is captured or padded")]
    limit = entry(f"{phase}.{cap_name}", cap_requested, cap_effective,
                  reason=f"the plan's {cap_name} is {cap_requested or 'unset'}; steps up to {cap_effective} run at "
                         "planned sizes, larger ones eagerly" if cap_requested != cap_effective else
                  "larger steps run eagerly")
    if cuda:
        captured = list(mode.captured_sizes)
        missing = [s for s in sizes if s not in captured]
        failures = "; ".join(f"{k}: {v}" for k, v in mode.capture_failures.items())
        why = (f"not captured: {missing}" + (f" ({failures})" if failures else " (unreachable, see above)")
               if missing else "captured as CUDA graphs")
        return [backend, limit, entry(f"{phase}.{sizes_name}", sizes, captured, reason=why)]
    how = {"static_compiled": "compiled on first use; no graphs (see decode.backend)",
           "static_eager": "the capture-safe step run eagerly; no graphs (see decode.backend)"}.get(
        mode.effective, "compiled pieces, no graphs (see prefill.backend)")
    return [backend, limit, entry(f"{phase}.{sizes_name}", sizes, list(sizes), reason=f"steps padded to these sizes, "
                                                                                        f"{how}")]
