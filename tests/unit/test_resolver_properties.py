"""Property tests over generated specs: determinism, locks, provenance, no crash."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf import json_format
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cgsvc import catalog, codec
from cgsvc.errors import ServiceError
from cgsvc.plan import canonical_json
from cgsvc.resolve import resolve
from cgsvc.spec import (
    ATTENTION_BACKENDS,
    DECODE_GRAPH_BACKENDS,
    DEEPEP_MODES,
    DISAGGREGATION_MODES,
    KV_CACHE_DTYPES,
    MOE_A2A_BACKENDS,
    PREFILL_GRAPH_BACKENDS,
    SPECULATIVE_ALGORITHMS,
    parse_spec,
)
from cgsvc.v1 import launch_spec_pb2

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def optional(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


sizes = st.lists(st.integers(1, 600), min_size=1, max_size=6)
spec_strategy = st.fixed_dictionaries({
    "model": st.fixed_dictionaries({"name": st.sampled_from(catalog.canonical_model_names())}),
    "hardware": st.fixed_dictionaries({"gpu": st.sampled_from(sorted(catalog.gpus()))},
                                      optional={"gpu_count": st.integers(1, 16),
                                                "gpu_memory_mib": st.integers(1000, 300_000)}),
}, optional={
    "parallelism": optional(tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2]),
                            dp=st.sampled_from([1, 2, 4]), enable_dp_attention=st.booleans(),
                            attn_cp=st.sampled_from([1, 2]), dcp=st.sampled_from([1, 2])),
    "features": optional(
        speculative_algorithm=st.sampled_from(SPECULATIVE_ALGORITHMS), lora=st.booleans(),
        disaggregation_mode=st.sampled_from(DISAGGREGATION_MODES),
        kv_cache_dtype=st.sampled_from(KV_CACHE_DTYPES), chunked_prefill_size=st.integers(1, 20000),
        max_total_tokens=st.integers(1, 20000), enable_torch_compile=st.booleans(),
        enable_hierarchical_cache=st.booleans(), cpu_offload_gb=st.integers(0, 4),
        enable_deterministic_inference=st.booleans(), moe_a2a_backend=st.sampled_from(MOE_A2A_BACKENDS),
        deepep_mode=st.sampled_from(DEEPEP_MODES), enable_two_batch_overlap=st.booleans(),
        enable_eplb=st.booleans(), enable_multimodal=st.booleans()),
    "overrides": optional(
        attention_backend=st.sampled_from(ATTENTION_BACKENDS),
        prefill_attention_backend=st.sampled_from(ATTENTION_BACKENDS),
        disable_cuda_graph=st.booleans(), disable_cuda_graph_padding=st.booleans(),
        enforce_piecewise_cuda_graph=st.booleans(),
        cuda_graph=optional(
            prefill=optional(backend=st.sampled_from(PREFILL_GRAPH_BACKENDS), max_num_tokens=st.integers(1, 9000),
                             num_tokens=sizes),
            decode=optional(backend=st.sampled_from(DECODE_GRAPH_BACKENDS), max_bs=st.integers(1, 600), bs=sizes))),
})

FIELD_VALUES = {
    "attention_backend.prefill": lambda p: p.attention_prefill,
    "attention_backend.decode": lambda p: p.attention_decode,
    "prefill.backend": lambda p: p.prefill_backend,
    "decode.backend": lambda p: p.decode_backend,
    "kv_cache_dtype": lambda p: p.kv_cache_dtype,
    "chunked_prefill_size": lambda p: str(p.chunked_prefill_size),
}


def try_resolve(data: dict[str, Any]) -> Any:
    try:
        return resolve(parse_spec(data))
    except ServiceError as exc:
        assert exc.code in ("INVALID_ARGUMENT", "FAILED_PRECONDITION")
        assert exc.violations and all(v.field and v.description for v in exc.violations)
        return None


@SETTINGS
@given(spec_strategy)
def test_deterministic(data: dict[str, Any]) -> None:
    a, b = try_resolve(data), try_resolve(json.loads(json.dumps(data)))
    if a is not None:
        assert canonical_json(a.to_dict()) == canonical_json(b.to_dict())


@SETTINGS
@given(spec_strategy)
def test_locked_keys_keep_the_user_value(data: dict[str, Any]) -> None:
    plan = try_resolve(data)
    if plan is None:
        return
    for d in plan.decisions:
        if d.forced:
            assert d.field in plan.locked and d.before == d.after
    for key in plan.locked:
        user = [d for d in plan.decisions if d.field == key and d.source == "user"]
        assert user, f"{key} locked without a user decision"
        changes = [d for d in plan.decisions if d.field == key and d.seq > user[-1].seq and d.before != d.after]
        assert not changes, f"locked {key} changed by {[c.rule_id for c in changes]}"


@SETTINGS
@given(spec_strategy)
def test_every_value_has_a_decision(data: dict[str, Any]) -> None:
    plan = try_resolve(data)
    if plan is None:
        return
    for key, value in FIELD_VALUES.items():
        setters = [d for d in plan.decisions if d.field == key and not d.forced]
        assert setters, f"{key} has no decision"
        assert setters[-1].after == value(plan), f"{key}: last decision {setters[-1]} != {value(plan)}"
    if plan.decode_bs:
        assert any(d.field == "decode.bs" for d in plan.decisions)
        assert max(plan.decode_bs) == plan.decode_max_bs
        assert list(plan.decode_bs) == sorted(set(plan.decode_bs))
    if plan.prefill_num_tokens:
        assert max(plan.prefill_num_tokens) <= plan.prefill_max_num_tokens
    if plan.prefill_backend == "disabled":
        assert plan.prefill_num_tokens == ()
    if plan.decode_backend == "disabled":
        assert plan.decode_bs == ()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5000) | st.text(max_size=12) | st.floats(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(
        st.sampled_from(["model", "hardware", "name", "gpu", "tp", "parallelism", "overrides",
                         "cuda_graph", "prefill", "decode", "backend", "bs", "features", "x"]),
        children, max_size=5),
    max_leaves=20)


@SETTINGS
@given(json_values)
def test_no_input_crashes_the_resolver(data: Any) -> None:
    try_resolve(data)


@SETTINGS
@given(spec_strategy, st.sampled_from(["model", "hardware", "parallelism", "features", "overrides"]),
       st.text(min_size=1, max_size=8))
def test_unknown_fields_are_named(data: dict[str, Any], section: str, key: str) -> None:
    sec = data.setdefault(section, {})
    if not isinstance(sec, dict) or key in sec or key in {"name", "path", "quantization"} or \
            key in parse_spec.__globals__[{"model": "ModelSpec", "hardware": "HardwareSpec",
                                           "parallelism": "ParallelismSpec", "features": "FeatureSpec",
                                           "overrides": "OverrideSpec"}[section]].__dataclass_fields__:
        return
    sec[key] = 1
    try:
        resolve(parse_spec(data))
    except ServiceError as exc:
        assert exc.code == "INVALID_ARGUMENT"
        assert f"{section}.{key}" in [v.field for v in exc.violations]
    else:
        raise AssertionError("unknown field accepted")


@SETTINGS
@given(spec_strategy)
def test_the_memoised_wire_decoding_gives_what_message_to_dict_gives(data: dict[str, Any]) -> None:
    """ResolvePlan reads a spec through codec.spec_json_from_proto (memoised by wire bytes): the
    same dict as MessageToDict, and a fresh one per call, so a caller may change its own."""
    msg = json_format.ParseDict(data, launch_spec_pb2.LaunchSpec())
    direct = codec.spec_dict_from_proto(msg)
    assert codec.spec_json_from_proto(msg) == canonical_json(direct)
    first = json.loads(codec.spec_json_from_proto(launch_spec_pb2.LaunchSpec.FromString(msg.SerializeToString())))
    assert first == direct
    first["model"]["name"] = "changed"
    assert json.loads(codec.spec_json_from_proto(msg)) == direct
