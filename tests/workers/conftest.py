"""Checkpoints generated once per test session (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest
from cgsvc_worker.checkpoint import make_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = Path(tmp_path_factory.mktemp("ckpt"))
    out = {name: make_checkpoint(str(root / name), name, seed=0) for name in ("tiny", "tiny-qproj", "tiny-kimi")}
    # bf16: a smaller init keeps activations where bf16's own rounding (transformers bf16 vs
    # fp32 differ by ~1e-2 here, ~2.6e-2 at init 0.1) stays below the 2e-2 bound.
    out["tiny-bf16"] = make_checkpoint(str(root / "tiny-bf16"), "tiny", seed=0, dtype="bfloat16",
                                       overrides={"initializer_range": 0.03})
    # Dense (no MoE routing, whose top-k can flip on a rounding difference): for comparing
    # attention backends through whole forwards.
    out["tiny-dense-bf16"] = make_checkpoint(str(root / "tiny-dense-bf16"), "tiny", seed=0, dtype="bfloat16",
                                             overrides={"initializer_range": 0.03, "n_routed_experts": 0,
                                                        "first_k_dense_replace": 4})
    # One dense layer and one MoE layer: every kind of layer the tiny model has, at about 60 %
    # of the inductor compile time of four (tests/workers/test_check_graphs.py).
    out["tiny-2-layers"] = make_checkpoint(str(root / "tiny-2-layers"), "tiny", seed=0,
                                           overrides={"num_hidden_layers": 2})
    return out
