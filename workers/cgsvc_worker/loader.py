"""Load a Hugging Face safetensors checkpoint (hub tensor names) into a rank's shard.

Each rank reads only its slice of a sharded tensor through safetensors' lazy slices, never
the full tensor; replicated tensors (norms, the MLA down-projections, the router) are read
whole. A multimodal wrapper's language-model prefix (Kimi-K2.5/K2.6) is found
automatically; its vision tower is not loaded, and the loader says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from safetensors import safe_open

from cgsvc_worker.config import CheckpointError
from cgsvc_worker.model import DeepseekV3Model, MLAAttention, MoE


@dataclass
class LoadReport:
    tensors: int = 0
    bytes_read: int = 0
    skipped_prefixes: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


class Checkpoint:
    """Name -> file index over a directory of safetensors files."""

    def __init__(self, path: str) -> None:
        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        self.files: dict[str, str] = {}
        if os.path.exists(index):
            with open(index, encoding="utf-8") as fh:
                self.files = {k: os.path.join(path, v) for k, v in json.load(fh)["weight_map"].items()}
        else:
            shards = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
            if not shards:
                raise CheckpointError(f"no *.safetensors files in {path!r}")
            for shard in shards:
                with safe_open(os.path.join(path, shard), framework="pt") as fh:
                    for k in fh.keys():  # noqa: SIM118 - safe_open handles are not mappings
                        self.files[k] = os.path.join(path, shard)
        self._handles: dict[str, Any] = {}
        embed = [k for k in self.files if k.endswith("model.embed_tokens.weight")]
        if not embed:
            raise CheckpointError(f"{path!r} has no '*model.embed_tokens.weight' tensor")
        self.prefix = embed[0][: -len("model.embed_tokens.weight")]

    def handle(self, name: str) -> Any:
        file = self.files[name]
        if file not in self._handles:
            self._handles[file] = safe_open(file, framework="pt")
        return self._handles[file]

    def read(self, name: str, shard: str | None, rank: int, size: int, expect: tuple[int, ...]) -> torch.Tensor:
        full = self.prefix + name
        if full not in self.files:
            raise CheckpointError(f"missing tensor {full!r} in {self.path!r}")
        sl = self.handle(full).get_slice(full)
        shape = tuple(sl.get_shape())
        dim = {"rows": 0, "cols": 1}.get(shard or "", -1)
        if dim >= 0:
            if shape[dim] % size:
                raise CheckpointError(f"{full}: dimension {dim} ({shape[dim]}) does not split across tp={size}")
            k = shape[dim] // size
            t = sl[rank * k:(rank + 1) * k] if dim == 0 else sl[:, rank * k:(rank + 1) * k]
        else:
            t = sl[:]
        if tuple(t.shape) != expect:
            raise CheckpointError(f"{full}: shape {list(shape)} gives a rank-{rank} shard of {list(t.shape)}, "
                                  f"the model expects {list(expect)} (does config.json match the weights?)")
        return t


def _targets(model: DeepseekV3Model) -> Iterator[tuple[torch.Tensor, str, str | None, tuple[tuple[str, int], ...]]]:
    """(parameter, hub name without prefix, shard, fused parts) for every plain parameter."""
    for name, module in model.named_modules():
        if isinstance(module, MoE):
            continue  # expert tensors are stacked; handled in load()
        for pname, p in module.named_parameters(recurse=False):
            hub = f"{name}.{pname}" if name else pname
            if not hub.startswith("lm_head"):
                hub = "model." + hub
            if pname == "weight":
                yield p, hub, getattr(module, "shard", None), getattr(module, "parts", ())
            else:
                yield p, hub, None, ()


def load(model: DeepseekV3Model, path: str) -> LoadReport:
    """Fill the model's parameters from the checkpoint; raises CheckpointError on any mismatch."""
    ckpt = Checkpoint(path)
    tp, cfg = model.tp, model.cfg
    report = LoadReport()
    if ckpt.prefix:
        other: dict[str, int] = {}
        for k in ckpt.files:
            if not k.startswith(ckpt.prefix):
                head = k.split(".", 1)[0]
                other[head] = other.get(head, 0) + 1
        report.skipped_prefixes = other
        if other:
            left = ", ".join(f"{k} ({v} tensor{'' if v == 1 else 's'})" for k, v in other.items())
            report.notes.append(f"multimodal wrapper: loaded the language model under {ckpt.prefix!r}; "
                                f"not loaded (out of scope): {left}")

    def put(p: torch.Tensor, t: torch.Tensor) -> None:
        with torch.no_grad():
            p.copy_(t.to(p.dtype))
        report.tensors += 1
        report.bytes_read += t.numel() * t.element_size()

    for p, hub, shard, parts in _targets(model):
        if hub == "lm_head.weight" and cfg.tie_word_embeddings and ckpt.prefix + hub not in ckpt.files:
            hub = "model.embed_tokens.weight"
        if hub in ("model.embed_tokens.weight", "lm_head.weight"):
            shard = "rows"
        if parts:  # a fused matrix: each hub tensor read (and sharded) on its own, stacked by rows
            module = hub.rsplit(".", 2)[0]
            per_rank = tp.size if shard == "rows" else 1
            pieces = [ckpt.read(f"{module}.{part}.weight", shard, tp.rank, tp.size, (n // per_rank, p.shape[1]))
                      for part, n in parts]
            put(p, torch.cat(pieces))
        else:
            put(p, ckpt.read(hub, shard, tp.rank, tp.size, tuple(p.shape)))
    for i, layer in enumerate(model.layers):
        mlp = layer.mlp
        if not isinstance(mlp, MoE):
            continue
        base = f"model.layers.{i}.mlp"
        put(mlp.gate_weight, ckpt.read(f"{base}.gate.weight", None, 0, 1, tuple(mlp.gate_weight.shape)))
        if cfg.topk_method == "noaux_tc":  # V2 checkpoints have no correction bias
            put(mlp.e_score_correction_bias, ckpt.read(f"{base}.gate.e_score_correction_bias", None, 0, 1,
                                                       tuple(mlp.e_score_correction_bias.shape)))
        inter, D = cfg.moe_intermediate_size, cfg.hidden_size
        for le, e in enumerate(range(mlp.expert_start, mlp.expert_end)):
            g = ckpt.read(f"{base}.experts.{e}.gate_proj.weight", None, 0, 1, (inter, D))
            u = ckpt.read(f"{base}.experts.{e}.up_proj.weight", None, 0, 1, (inter, D))
            d = ckpt.read(f"{base}.experts.{e}.down_proj.weight", None, 0, 1, (D, inter))
            with torch.no_grad():
                mlp.w_gate_up[le].copy_(torch.cat([g, u]).to(mlp.w_gate_up.dtype))
                mlp.w_down[le].copy_(d.to(mlp.w_down.dtype))
            report.tensors += 3
            report.bytes_read += sum(t.numel() * t.element_size() for t in (g, u, d))
    for m in model.modules():
        if isinstance(m, MLAAttention):
            w_uk, w_uv = m.w_uk_uv()
            # fp32 copies for the absorbed decode path, which accumulates in fp32 (attention.py)
            m.w_uk, m.w_uv = w_uk.float().contiguous(), w_uv.float().contiguous()
    return report
