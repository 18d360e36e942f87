"""The engine's guarantees and the catalog reader, tested as plain functions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cgsvc import catalog, codec
from cgsvc.errors import ServiceError
from cgsvc.resolve import engine, policy_version, resolve, validate_and_lock
from cgsvc.resolve.engine import Rule, Stage
from cgsvc.resolve.policy import RULES
from cgsvc.spec import parse_spec
from tests.conftest import llama_dir

KIMI = {"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300", "gpu_count": 4},
        "parallelism": {"tp": 4}}


def test_rule_ids_are_unique_and_stages_ordered() -> None:
    ids = [r.id for r in RULES]
    assert len(ids) == len(set(ids))
    assert [r.stage for r in RULES] == sorted(r.stage for r in RULES)
    first_graph = min(i for i, r in enumerate(RULES) if r.stage >= Stage.PREFILL_CASCADE)
    assert all(r.stage == Stage.ATTENTION or i > first_graph or r.stage == Stage.DEFAULTS
               for i, r in enumerate(RULES) if r.stage <= Stage.ATTENTION)
    for r in RULES:
        assert set(r.writes) <= set(engine.KEYS), r.id
        assert r.source in engine.SOURCES, r.id
        assert r.effect is not None or r.hard or r.warning is not None, r.id


def test_engine_rejects_undeclared_writes() -> None:
    ctx = validate_and_lock(parse_spec(KIMI))
    rogue = Rule(id="rogue", stage=Stage.LATE, source="default", reads=(), writes=("prefill.backend",),
                 when=lambda c: True, effect=lambda c: {"decode.backend": "disabled"}, reason="test")
    with pytest.raises(AssertionError, match="undeclared"):
        engine.apply(rogue, ctx)


def test_engine_keeps_locks_and_records_forced_decisions() -> None:
    spec = parse_spec({**KIMI, "overrides": {"cuda_graph": {"decode": {"backend": "disabled"}}}})
    ctx = validate_and_lock(spec)
    soft = Rule(id="soft.test", stage=Stage.LATE, source="compatibility", reads=(), writes=("decode.backend",),
                when=lambda c: True, effect=lambda c: {"decode.backend": "full"}, reason="test")
    engine.apply(soft, ctx)
    assert ctx.values["decode.backend"] == "disabled"
    assert ctx.decisions[-1].forced and ctx.decisions[-1].rule_id == "soft.test"
    hard = Rule(id="hard.test", stage=Stage.LATE, source="compatibility", reads=(), writes=("decode.backend",),
                when=lambda c: True, effect=lambda c: {"decode.backend": "full"}, reason="cannot work", hard=True)
    with pytest.raises(ServiceError) as err:
        engine.apply(hard, ctx)
    assert err.value.code == "FAILED_PRECONDITION" and err.value.rule_id == "hard.test"
    assert [v.field for v in err.value.violations] == ["decode.backend"]


def test_plan_is_byte_identical_and_hash_covers_body() -> None:
    a, b = resolve(parse_spec(KIMI)), resolve(parse_spec(json.loads(json.dumps(KIMI))))
    assert json.dumps(a.to_dict()) == json.dumps(b.to_dict())
    other = resolve(parse_spec({**KIMI, "features": {"kv_cache_dtype": "bfloat16"}}))
    assert other.plan_hash != a.plan_hash
    assert a.policy_version == policy_version() and len(a.policy_version) == 16


def test_proto_codec_round_trips_plans_and_specs() -> None:
    plan = resolve(parse_spec({**KIMI, "overrides": {"enforce_piecewise_cuda_graph": True}}))
    again = codec.plan_from_proto(codec.plan_to_proto(plan))
    assert json.dumps(again.to_dict()) == json.dumps(plan.to_dict())
    spec = parse_spec({**KIMI, "overrides": {"cuda_graph": {"decode": {"bs": [4, 1]}}, "disable_cuda_graph": False}})
    assert codec.spec_from_proto(codec.spec_to_proto(spec)) == spec


def test_estimates_follow_the_documented_formula() -> None:
    plan = resolve(parse_spec({"model": {"name": "moonshotai/Kimi-K2.6"}, "hardware": {"gpu": "H200", "gpu_count": 4},
                               "parallelism": {"tp": 4}}))
    layers, hidden = 61, 7168
    pieces = (layers + 1) * len(plan.prefill_num_tokens)
    assert plan.estimates.graphs == pieces + len(plan.decode_bs)
    pool = (max(plan.prefill_num_tokens) + max(plan.decode_bs)) * hidden * 16
    assert plan.estimates.capture_memory_bytes == pool + plan.estimates.graphs * 256 * 1024
    assert plan.estimates.capture_seconds > 30  # includes the tc_piecewise compile


def test_catalog_has_the_required_entries() -> None:
    for gpu in ("GB300", "B300", "GB200", "B200", "H200", "H100", "H20", "A100-80G", "A100-40G", "A30",
                "L40S", "RTX-PRO-6000", "cpu"):
        assert catalog.find_gpu(gpu) is not None, gpu
    assert catalog.find_gpu("gb300") == catalog.find_gpu("GB300")
    kimi = catalog.find_model("nvidia/Kimi-K2.6-NVFP4")
    assert kimi is not None and kimi.is_mla and kimi.is_multimodal and kimi.deepseek_v3_family
    assert kimi.quantization == "nvfp4" and kimi.kv_cache_dtype == "fp8_e4m3"
    for name in ("moonshotai/Kimi-K2.6", "Kimi-K2.5", "deepseek-ai/DeepSeek-V3", "DeepSeek-R1", "DeepSeek-V2-Lite",
                 "DeepSeek-V3.2", "Qwen2.5-VL", "Cohere2Vision", "Llama-3.1-8B-Instruct", "Qwen3-8B"):
        assert catalog.find_model(name) is not None, name
    v32 = catalog.find_model("DeepSeek-V3.2")
    assert v32 is not None and v32.is_dsa
    llama = catalog.find_model("Llama-3.1-8B-Instruct")
    assert llama is not None and not llama.is_mla and not llama.is_multimodal


def test_an_unknown_model_is_refused_with_the_nearest_ids_in_what_fits_on_the_wire() -> None:
    from cgsvc.server.status import MAX_DESCRIPTION

    cases = {"Kimi-K2.7": "moonshotai/Kimi-K2.6", "nvidia/Kimi-K2.6-FP4": "nvidia/Kimi-K2.6-NVFP4",
             "llama-3.1-8b": "meta-llama/Llama-3.1-8B-Instruct", "qwen3-next": "Qwen/Qwen3-Next-80B-A3B-Instruct",
             "DeepSeek-V3.1": "deepseek-ai/DeepSeek-V3.2"}
    for typed, nearest in cases.items():
        assert catalog.closest_models(typed)[0] == nearest, typed
        with pytest.raises(ServiceError) as err:
            resolve(parse_spec({"model": {"name": typed}, "hardware": {"gpu": "H200"}}))
        (v,) = err.value.violations
        assert v.field == "model.name" and f"did you mean {nearest!r}" in v.description, v.description
        assert "cgsvc-cli models" in v.description and "model.path" in v.description
        assert len(v.description) <= MAX_DESCRIPTION  # whole on the wire, never cut mid-list
    assert catalog.closest_models("zzzz") == []
    far = catalog.unknown_model("z" * 5000)
    assert "did you mean" not in far and len(far) <= MAX_DESCRIPTION and far.startswith("unknown model 'zzz")
    n = len(catalog.canonical_model_names())
    assert f"one of {n} catalog ids" in far and "(cut at 32 of 5000 characters)" in far


def test_the_catalog_listing_names_every_id_once_with_its_aliases_and_facts() -> None:
    infos = {m.name: m for m in codec.model_infos()}
    assert sorted(infos) == catalog.canonical_model_names()
    for name, m in infos.items():  # every alias finds its own id
        assert all(catalog.find_model(a) is catalog.find_model(name) for a in m.aliases), name
    kimi = infos["nvidia/Kimi-K2.6-NVFP4"]
    assert kimi.mla and kimi.moe and kimi.multimodal and not kimi.dsa
    assert (kimi.quantization, kimi.kv_cache_dtype, kimi.num_layers) == ("nvfp4", "fp8_e4m3", 61)
    assert infos["deepseek-ai/DeepSeek-V3.2"].dsa and not infos["Qwen/Qwen3-8B"].moe
    assert infos["Qwen/Qwen3-Next-80B-A3B-Instruct"].moe  # 512 routed experts (regression: shown as dense)


def test_reader_derives_the_same_facts_from_a_local_config(tmp_path: Path) -> None:
    entry = json.loads((Path(catalog.__file__).parent / "data" / "models.json").read_text())["models"]
    config = dict(entry["nvidia/Kimi-K2.6-NVFP4"]["config"])
    qc = config.pop("quantization_config")
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": qc}))
    local = catalog.read_model_dir(str(tmp_path), "nvidia/Kimi-K2.6-NVFP4")
    assert local == catalog.find_model("nvidia/Kimi-K2.6-NVFP4")
    spec_path = {"model": {"path": str(tmp_path)}, "hardware": {"gpu": "GB300", "gpu_count": 4}, "parallelism": {"tp": 4}}
    a, b = resolve(parse_spec(spec_path)), resolve(parse_spec(KIMI))
    assert (a.prefill_backend, a.attention_prefill, a.kv_cache_dtype) == (b.prefill_backend, b.attention_prefill, b.kv_cache_dtype)


def test_path_is_authoritative_over_name(tmp_path: Path) -> None:
    llama_dir(tmp_path)
    plan = resolve(parse_spec({"model": {"name": "nvidia/Kimi-K2.6-NVFP4", "path": str(tmp_path)},
                               "hardware": {"gpu": "H100"}}))
    assert plan.attention_prefill == "fa3" and plan.prefill_backend == "breakable"  # a Llama, not Kimi


def test_plan_dict_round_trip() -> None:
    plan = resolve(parse_spec({**KIMI, "overrides": {"enforce_piecewise_cuda_graph": True}}))
    assert codec.plan_from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    from google.protobuf import json_format

    from cgsvc.v1 import plan_pb2
    assert codec.plan_to_proto(plan) == json_format.ParseDict(plan.to_dict(), plan_pb2.Plan())


def test_giant_specs_are_refused_cheaply_and_never_memoised() -> None:
    """Regressions: a list of 500,000 graph sizes was checked entry by entry (seconds of the
    event loop, a violation per entry), and every distinct spec, however large, went into the
    memo keyed by its wire bytes (thousands of 4 MB specs: gigabytes)."""
    from cgsvc.codec import MEMO_SPEC_BYTES, _spec_json_of_bytes, spec_json_from_proto
    from cgsvc.spec import MAX_LIST

    big = {"model": {"name": "Qwen/Qwen3-8B"}, "hardware": {"gpu": "H100"},
           "overrides": {"cuda_graph": {"decode": {"bs": list(range(1, 500_001))}}}}
    with pytest.raises(ServiceError) as err:
        parse_spec(big)
    assert [(v.field, v.description) for v in err.value.violations] == [
        ("overrides.cuda_graph.decode.bs", f"at most {MAX_LIST} entries, got 500000")]
    proto = codec.spec_to_proto(parse_spec({**big, "overrides": {"cuda_graph": {"decode": {"bs": [1, 2]}}}}))
    proto.overrides.cuda_graph.decode.bs.extend(range(3, 5000))  # past the memo's size, under the cap
    assert proto.ByteSize() > MEMO_SPEC_BYTES
    before = _spec_json_of_bytes.cache_info().currsize
    assert json.loads(spec_json_from_proto(proto))["overrides"]["cuda_graph"]["decode"]["bs"][-1] == 4999
    assert _spec_json_of_bytes.cache_info().currsize == before
