"""The launch spec: typed, strictly parsed, with field presence kept.

A field that is `None` was absent and is resolved by policy; a field that is set was
explicit and its key is locked. `parse_spec` turns the JSON form (docs/launch-spec.md) into a
`LaunchSpec`, collecting every problem as a `FieldViolation` that names the field path
and what would be valid. The gRPC form reaches this same parser through
`cgsvc.codec.spec_from_proto`, so there is one set of rules for both.
"""

from __future__ import annotations

import dataclasses
import json
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The plan's closed sets are the workers' contract too (plan.json in a run directory): kept there.
from cgsvc.contract import (
    ATTENTION_BACKENDS,
    DECODE_GRAPH_BACKENDS,
    KV_CACHE_DTYPES,
    PREFILL_GRAPH_BACKENDS,
)
from cgsvc.errors import FieldViolation, ServiceError, one_spelling

# Closed sets. Names are the JSON values; the proto carries the same strings.
SPECULATIVE_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
DISAGGREGATION_MODES = ("null", "prefill", "decode")
MOE_A2A_BACKENDS = ("none", "deepep", "flashinfer", "mooncake")
DEEPEP_MODES = ("auto", "normal", "low_latency")
QUANTIZATIONS = (
    "none", "fp8", "nvfp4", "mxfp4", "int4", "awq", "gptq", "gguf", "w4afp8",
    "compressed-tensors",
)


def _opt(**meta: Any) -> Any:
    """An optional spec field (absent = None) with validation metadata."""
    return field(default=None, metadata=meta)


@dataclass(frozen=True)
class ModelSpec:
    name: str | None = _opt(nonempty=True)
    path: str | None = _opt(nonempty=True)
    quantization: str | None = _opt(choices=QUANTIZATIONS)


@dataclass(frozen=True)
class HardwareSpec:
    gpu: str | None = _opt(nonempty=True)
    gpu_count: int | None = _opt(min=1, max=4096)
    nodes: int | None = _opt(min=1, max=1024)
    gpu_memory_mib: int | None = _opt(min=1, max=16 * 1024 * 1024)


@dataclass(frozen=True)
class ParallelismSpec:
    tp: int | None = _opt(min=1, max=4096)
    pp: int | None = _opt(min=1, max=1024)
    dp: int | None = _opt(min=1, max=4096)
    enable_dp_attention: bool | None = _opt()
    ep: int | None = _opt(min=1, max=4096)
    attn_cp: int | None = _opt(min=1, max=1024)
    dcp: int | None = _opt(min=1, max=1024)


@dataclass(frozen=True)
class FeatureSpec:
    speculative_algorithm: str | None = _opt(choices=SPECULATIVE_ALGORITHMS)
    lora: bool | None = _opt()
    disaggregation_mode: str | None = _opt(choices=DISAGGREGATION_MODES)
    kv_cache_dtype: str | None = _opt(choices=KV_CACHE_DTYPES)
    chunked_prefill_size: int | None = _opt(min=1, max=1 << 24)
    max_running_requests: int | None = _opt(min=1, max=1 << 20)
    max_total_tokens: int | None = _opt(min=1, max=1 << 30)
    context_length: int | None = _opt(min=1, max=1 << 24)
    enable_torch_compile: bool | None = _opt()
    enable_hierarchical_cache: bool | None = _opt()
    cpu_offload_gb: int | None = _opt(min=0, max=1 << 20)
    enable_deterministic_inference: bool | None = _opt()
    moe_a2a_backend: str | None = _opt(choices=MOE_A2A_BACKENDS)
    deepep_mode: str | None = _opt(choices=DEEPEP_MODES)
    enable_two_batch_overlap: bool | None = _opt()
    enable_eplb: bool | None = _opt()
    enable_multimodal: bool | None = _opt()


@dataclass(frozen=True)
class PrefillGraphOverride:
    backend: str | None = _opt(choices=PREFILL_GRAPH_BACKENDS)
    max_num_tokens: int | None = _opt(min=1, max=1 << 24)
    num_tokens: tuple[int, ...] | None = _opt(min=1, max=1 << 24)


@dataclass(frozen=True)
class DecodeGraphOverride:
    backend: str | None = _opt(choices=DECODE_GRAPH_BACKENDS)
    max_bs: int | None = _opt(min=1, max=1 << 16)
    bs: tuple[int, ...] | None = _opt(min=1, max=1 << 16)


@dataclass(frozen=True)
class CudaGraphOverrides:
    prefill: PrefillGraphOverride = field(default_factory=PrefillGraphOverride)
    decode: DecodeGraphOverride = field(default_factory=DecodeGraphOverride)


@dataclass(frozen=True)
class OverrideSpec:
    attention_backend: str | None = _opt(choices=ATTENTION_BACKENDS)
    prefill_attention_backend: str | None = _opt(choices=ATTENTION_BACKENDS)
    decode_attention_backend: str | None = _opt(choices=ATTENTION_BACKENDS)
    disable_cuda_graph: bool | None = _opt()
    disable_cuda_graph_padding: bool | None = _opt()
    enforce_piecewise_cuda_graph: bool | None = _opt()
    cuda_graph: CudaGraphOverrides = field(default_factory=CudaGraphOverrides)


@dataclass(frozen=True)
class LaunchSpec:
    model: ModelSpec = field(default_factory=ModelSpec)
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    parallelism: ParallelismSpec = field(default_factory=ParallelismSpec)
    features: FeatureSpec = field(default_factory=FeatureSpec)
    overrides: OverrideSpec = field(default_factory=OverrideSpec)


# ---------------------------------------------------------------------------- parsing

_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls]


# The longest list a spec field takes (graph sizes: real engines capture tens to hundreds). A
# list of 500,000 sizes was checked entry by entry, about two seconds of the event loop.
MAX_LIST = 1024


def _type_name(v: Any) -> str:
    if v is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string",
            list: "array", dict: "object"}.get(type(v), type(v).__name__)


def _check_scalar(path: str, value: Any, kind: type, meta: Mapping[str, Any],
                  out: list[FieldViolation]) -> Any:
    if kind is bool:
        if not isinstance(value, bool):
            out.append(FieldViolation(path, f"must be true or false, got {_type_name(value)}"))
            return None
        return value
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            out.append(FieldViolation(path, f"must be an integer, got {_type_name(value)}"))
            return None
        lo, hi = meta.get("min"), meta.get("max")
        if lo is not None and value < lo:
            out.append(FieldViolation(path, f"must be at least {lo}, got {value}"))
            return None
        if hi is not None and value > hi:
            out.append(FieldViolation(path, f"must be at most {hi}, got {value}"))
            return None
        return value
    # str
    if not isinstance(value, str):
        out.append(FieldViolation(path, f"must be a string, got {_type_name(value)}"))
        return None
    choices = meta.get("choices")
    if choices is not None and value not in choices:
        # Closed sets match case-insensitively on input; what is kept is the one canonical
        # spelling, so plans, the audit log and errors never see another.
        canonical = one_spelling(value, choices)
        if canonical is None:
            out.append(FieldViolation(path, f"unknown value {value!r}; valid: {', '.join(choices)}"))
            return None
        value = canonical
    if meta.get("nonempty") and not value.strip():
        out.append(FieldViolation(path, "must not be empty"))
        return None
    return value


def _parse_section(cls: type, data: Any, path: str, out: list[FieldViolation]) -> Any:
    if not isinstance(data, dict):
        out.append(FieldViolation(path or "spec", f"must be an object, got {_type_name(data)}"))
        return cls()
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        fpath = f"{path}.{key}" if path else str(key)
        f = fields.get(key)
        if f is None:
            out.append(FieldViolation(fpath, f"unknown field; valid fields here: {', '.join(fields)}"))
            continue
        hint = hints[key]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[key] = _parse_section(hint, value, fpath, out)
            continue
        if value is None:
            continue  # JSON null is the same as absent
        args = typing.get_args(hint)
        inner = next(a for a in args if a is not type(None))
        if typing.get_origin(inner) is tuple:
            if not isinstance(value, list):
                out.append(FieldViolation(fpath, f"must be an array of integers, got {_type_name(value)}"))
                continue
            if not value:
                continue  # an empty list is the same as absent
            if len(value) > MAX_LIST:
                out.append(FieldViolation(fpath, f"at most {MAX_LIST} entries, got {len(value)}"))
                continue
            items = [_check_scalar(f"{fpath}[{i}]", v, int, f.metadata, out) for i, v in enumerate(value)]
            if all(i is not None for i in items):
                kwargs[key] = tuple(sorted(set(items)))
            continue
        checked = _check_scalar(fpath, value, inner, f.metadata, out)
        if checked is not None:
            kwargs[key] = checked
    return cls(**kwargs)


def parse_spec(data: Any) -> LaunchSpec:
    """Parse the JSON form of a launch spec; raise ServiceError(INVALID_ARGUMENT) listing every problem."""
    violations: list[FieldViolation] = []
    spec = _parse_section(LaunchSpec, data, "", violations)
    if violations:
        raise ServiceError.invalid(violations)
    from cgsvc.catalog import find_gpu, find_model

    if spec.hardware.gpu is not None:  # GPU names are the catalog's closed set: its spelling
        gpu = find_gpu(spec.hardware.gpu)
        if gpu is not None and gpu.name != spec.hardware.gpu:
            spec = dataclasses.replace(spec, hardware=dataclasses.replace(spec.hardware, gpu=gpu.name))
    # A catalog model by an alias or in another case is kept as its id, so that one filter
    # (`model = "moonshotai/Kimi-K2.6"`) finds every plan and launch of it. With model.path
    # the name is only a label and stays as given.
    if spec.model.name is not None and spec.model.path is None:
        model = find_model(spec.model.name)
        if model is not None and model.name != spec.model.name:
            spec = dataclasses.replace(spec, model=dataclasses.replace(spec.model, name=model.name))
    return spec


def parse_spec_json(text: str | bytes) -> LaunchSpec:
    """Parse spec JSON text; malformed JSON is INVALID_ARGUMENT naming the position."""
    try:
        data = json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ServiceError.invalid([FieldViolation("spec", f"malformed JSON: {exc}")]) from None
    return parse_spec(data)


def spec_to_dict(spec: Any) -> dict[str, Any]:
    """The JSON form of a spec with only the fields that are present (explicit)."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if dataclasses.is_dataclass(value):
            sub = spec_to_dict(value)
            if sub:
                out[f.name] = sub
        elif value is not None:
            out[f.name] = list(value) if isinstance(value, tuple) else value
    return out
