"""Catalogs of GPUs and models, and the reader that derives model facts from a config.json.

The catalogs are data files (`data/gpus.json`, `data/models.json`). A catalog model entry
holds the parts of the model's hub `config.json` the resolver needs, so that the very same
reader (`model_facts_from_config`) serves catalog models and local checkpoints.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from cgsvc.errors import FieldViolation, ServiceError, clip

# Architecture sets, compared after `normalize_arch` (underscores dropped), as prefixes.
DEEPSEEK_V3_FAMILY = ("DeepseekV3ForCausalLM", "KimiK25ForConditionalGeneration", "DeepseekV32",
                      "MistralLarge3", "Pixtral", "GlmMoeDsa", "LongcatFlash")
DSA_ARCHS = ("DeepseekV32", "GlmMoeDsa")


def normalize_arch(name: str) -> str:
    """Architecture names without underscores, so `Kimi_K25…` and `KimiK25…` compare equal."""
    return name.replace("_", "")


def arch_matches(arch: str, prefixes: tuple[str, ...]) -> bool:
    """True when the architecture starts with one of the (normalized) prefixes."""
    a = normalize_arch(arch)
    return any(a.startswith(normalize_arch(p)) for p in prefixes)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str
    arch: str  # "sm100", "sm90", ..., or "cpu"
    family: str
    memory_mib: int
    cuda: bool


@dataclass(frozen=True)
class ModelFacts:
    """What the policy needs to know about a model, derived from its config.json."""

    name: str
    architecture: str
    text_architecture: str
    model_type: str
    text_model_type: str
    is_mla: bool
    is_dsa: bool
    is_multimodal: bool
    is_moe: bool
    quantization: str | None
    kv_cache_dtype: str | None
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    kv_lora_rank: int | None
    qk_rope_head_dim: int | None
    max_position_embeddings: int | None
    vocab_size: int = 0
    routed_experts: int = 0  # n_routed_experts (DeepSeek) or num_experts; 0 for a dense model

    @property
    def deepseek_v3_family(self) -> bool:
        return arch_matches(self.architecture, DEEPSEEK_V3_FAMILY) or (
            arch_matches(self.text_architecture, DEEPSEEK_V3_FAMILY)
        )


def _quantization_label(qc: dict[str, Any] | None) -> str | None:
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    algo = str(qc.get("quant_algo", "")).lower()
    if algo == "nvfp4" or method in ("modelopt_fp4", "nvfp4"):
        return "nvfp4"
    if algo == "fp8" or method in ("fp8", "modelopt_fp8"):
        return "fp8"
    if method == "compressed-tensors" and qc.get("bits") == 4:
        return "int4"
    return method or None


def _kv_cache_dtype(qc: dict[str, Any] | None) -> str | None:
    algo = str((qc or {}).get("kv_cache_quant_algo") or "").upper()
    return "fp8_e4m3" if algo == "FP8" else None


def model_facts_from_config(config: dict[str, Any], name: str) -> ModelFacts:
    """Derive model facts from a config.json dict (text_config for multimodal wrappers)."""
    if not isinstance(config, dict):
        raise ValueError("config must be a JSON object")
    archs = config.get("architectures") or []
    if not isinstance(archs, list) or not archs or not isinstance(archs[0], str):
        raise ValueError("config.json has no 'architectures' list")
    text = config.get("text_config") or config.get("llm_config") or config
    if not isinstance(text, dict):
        raise ValueError("config.json 'text_config' is not an object")
    text_archs = text.get("architectures") or archs
    qc = config.get("quantization_config") or text.get("quantization_config")
    hf_qc = config.get("hf_quant_config") or {}  # ModelOpt's separate file, merged by the reader
    qc = {**(hf_qc.get("quantization") or {}), **(qc or {})} if (qc or hf_qc) else None

    def num(key: str, default: int = 0) -> int:
        v = text.get(key, default)
        return int(v) if isinstance(v, int | float) and not isinstance(v, bool) else default

    kv_lora = text.get("kv_lora_rank")
    arch = archs[0]
    return ModelFacts(
        name=name,
        architecture=arch,
        text_architecture=str(text_archs[0]),
        model_type=str(config.get("model_type", "")),
        text_model_type=str(text.get("model_type", config.get("model_type", ""))),
        is_mla=isinstance(kv_lora, int) and kv_lora > 0,
        is_dsa=arch_matches(arch, DSA_ARCHS) or "index_topk" in text,
        is_multimodal=isinstance(config.get("vision_config"), dict),
        is_moe=num("n_routed_experts") > 0 or num("num_experts") > 0,
        quantization=_quantization_label(qc),
        kv_cache_dtype=_kv_cache_dtype(qc),
        num_layers=num("num_hidden_layers"),
        hidden_size=num("hidden_size"),
        num_attention_heads=num("num_attention_heads"),
        kv_lora_rank=kv_lora if isinstance(kv_lora, int) else None,
        qk_rope_head_dim=num("qk_rope_head_dim") or None,
        max_position_embeddings=num("max_position_embeddings") or None,
        vocab_size=num("vocab_size"),
        routed_experts=num("n_routed_experts") or num("num_experts"),
    )


@dataclass(frozen=True)
class ModelRoots:
    """The directories a server's callers' checkpoint paths must lie under, resolved (symlinks
    and '..' followed); none: any directory the process can read. Each server holds its own
    (from --model-roots), so two servers in one process confine their callers apart."""

    dirs: tuple[str, ...] = ()

    @classmethod
    def of(cls, roots: Sequence[str]) -> ModelRoots:
        """Roots from directory names (ValueError naming one that is not a directory)."""
        resolved = []
        for root in roots:
            real = os.path.realpath(root)
            if not os.path.isdir(real):
                raise ValueError(f"{root!r} is not a directory")
            resolved.append(real)
        return cls(tuple(resolved))

    def admit(self, path: str) -> bool:
        """Whether `path` (symlinks followed) lies under a root; always, with none."""
        if not self.dirs:
            return True
        real = os.path.realpath(path)
        return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in self.dirs)


ANYWHERE = ModelRoots()


def read_model_dir(path: str, label: str | None = None, roots: ModelRoots = ANYWHERE) -> ModelFacts:
    """Read `path/config.json` (and `hf_quant_config.json` if present) into model facts.

    Raises ServiceError(INVALID_ARGUMENT) on `model.path` when it cannot be read, or when it
    (or a file read in it) lies outside the model roots: that answer says nothing of what is
    there.
    """
    cfg_path = os.path.join(path, "config.json")
    hq = os.path.join(path, "hf_quant_config.json")
    if not all(roots.admit(p) for p in (path, cfg_path, hq)):
        raise ServiceError.invalid([FieldViolation(
            "model.path", f"must lie under {', '.join(roots.dirs)} (the server's model roots, symlinks "
                          "followed); give a checkpoint directory there")])
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            config = json.load(fh)
        if os.path.exists(hq):
            with open(hq, encoding="utf-8") as fh:
                config = {**config, "hf_quant_config": json.load(fh)}
        return model_facts_from_config(config, label or path)
    except FileNotFoundError:
        problem = f"no readable config.json at {cfg_path!r}; give a checkpoint directory"
    except (OSError, UnicodeDecodeError) as exc:
        problem = f"cannot read {cfg_path!r}: {exc}"
    except json.JSONDecodeError as exc:
        problem = f"{cfg_path!r} is not valid JSON: {exc}"
    except ValueError as exc:
        problem = f"{cfg_path!r}: {exc}"
    raise ServiceError.invalid([FieldViolation("model.path", problem)])


def _load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files("cgsvc.catalog").joinpath("data", name).read_text())
    return data


@cache
def gpus() -> dict[str, GpuInfo]:
    """The GPU catalog, by product name."""
    return {n: GpuInfo(name=n, **v) for n, v in _load("gpus.json")["gpus"].items()}


@cache
def models() -> dict[str, ModelFacts]:
    """The model catalog, by canonical name and by every alias."""
    out: dict[str, ModelFacts] = {}
    for n, entry in _load("models.json")["models"].items():
        facts = model_facts_from_config(entry["config"], n)
        out[n] = facts
        for alias in entry.get("aliases", []):
            out[alias] = facts
    return out


def facts_for_spec(spec: dict[str, Any]) -> ModelFacts | None:
    """The model a spec's JSON form names: its model.path read (ServiceError when unreadable),
    else its model.name looked up in the catalog (None when unknown)."""
    model = spec.get("model") or {}
    if model.get("path"):
        return read_model_dir(model["path"], model.get("name"))
    return find_model(model["name"]) if model.get("name") else None


def canonical_model_names() -> list[str]:
    return sorted({m.name for m in models().values()})


@cache
def model_aliases() -> dict[str, tuple[str, ...]]:
    """Every catalog id with its aliases, in the catalog file's order."""
    return {n: tuple(entry.get("aliases", [])) for n, entry in _load("models.json")["models"].items()}


def closest_models(name: str, limit: int = 3) -> list[str]:
    """The catalog ids whose id or alias is nearest to `name` (a mistyped or half-remembered
    name), best first; none when nothing is close. Compared case-insensitively, and the id's
    part after the organisation counts as an alias (`Kimi-K2.7` is near `moonshotai/Kimi-K2.6`);
    names that contain what was typed come first (`qwen3-next`), then those that look alike."""
    if len(name) > 200:  # far longer than any id: nothing is near, and a caller's value costs no more
        return []
    names: dict[str, str] = {}
    for canonical, aliases in model_aliases().items():
        for n in (canonical, canonical.rsplit("/", 1)[-1], *aliases):
            names.setdefault(n.lower(), canonical)
    want = name.lower().strip()
    out: list[str] = []
    # a name that holds what was typed (a prefix, a short form) before any that merely looks alike
    holding = sorted((n for n in names if len(want) >= 3 and want in n), key=len)
    for n in (*holding, *difflib.get_close_matches(want, list(names), n=len(names), cutoff=0.6)):
        if names[n] not in out:
            out.append(names[n])
    return out[:limit]


def unknown_model(name: str, limit: int = 200) -> str:
    """What a refusal of an unknown model.name says, in at most `limit` characters (what a
    field violation may carry on the wire): the nearest catalog ids first, as many as fit, then
    what would be valid and where the whole list is (the catalog outgrew one line)."""
    shown = clip(name, 32)  # the spec in the audit record keeps it whole
    valid = (f"valid: one of {len(model_aliases())} catalog ids or their aliases (cgsvc-cli models), or "
             "model.path, a directory with config.json")
    near = closest_models(name)
    while True:
        hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
        text = f"unknown model {shown!r}; {hint}{valid}"
        if len(text) <= limit or not near:
            return text
        near = near[:-1]


def find_gpu(name: str) -> GpuInfo | None:
    """Look a GPU up by name, case-insensitively."""
    table = gpus()
    if name in table:
        return table[name]
    low = name.lower()
    return next((g for n, g in table.items() if n.lower() == low), None)


def find_model(name: str) -> ModelFacts | None:
    """Look a model up by catalog id or alias, case-insensitively."""
    table = models()
    if name in table:
        return table[name]
    low = name.lower()
    return next((m for n, m in table.items() if n.lower() == low), None)


@cache
def catalog_digest() -> str:
    """Content hash of both catalog files; part of the policy version."""
    h = hashlib.sha256()
    for name in ("gpus.json", "models.json"):
        h.update(json.dumps(_load(name), sort_keys=True, separators=(",", ":")).encode())
    return h.hexdigest()
