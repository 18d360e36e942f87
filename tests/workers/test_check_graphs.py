"""`cgsvc-worker check-graphs` on the MoE checkpoint: every planned size compiles with
fullgraph=True (no graph break, no host synchronisation) and matches eager; a step that does
synchronise with the host is caught and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cgsvc_worker import tp
from cgsvc_worker.check_graphs import check_graphs
from cgsvc_worker.engine import Engine, EngineOptions, PlanView
from cgsvc_worker.model import MoE

from tests.conftest import ROOT


def test_check_graphs_cli_on_moe_checkpoint(checkpoints: dict[str, str], tmp_path: Path) -> None:
    plan = {"plan": {"attention_backend": {"prefill": "torch_native", "decode": "torch_native"},
                     "prefill": {"backend": "tc_piecewise", "max_num_tokens": 16, "num_tokens": [16]},
                     "decode": {"backend": "full", "max_bs": 8, "bs": [1, 8]},  # gather and dense expert dispatch
                     "kv_cache_dtype": "fp8_e4m3", "chunked_prefill_size": 16}}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    out = tmp_path / "graphs.json"
    proc = subprocess.run([sys.executable, "-m", "cgsvc_worker.cli", "check-graphs", "--model-path",
                           checkpoints["tiny-2-layers"], "--plan", str(tmp_path / "plan.json"), "--device", "cpu",
                           "--output", str(out)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["device"] == "cpu" and "fullgraph=True" in r["method"] and "inductor" in r["method"]
    assert [d["bs"] for d in r["decode"]] == [1, 8] and [p["num_tokens"] for p in r["prefill"]] == [16]
    for row in r["decode"] + r["prefill"]:
        assert row["capturable"] and row["reason"] == "" and row["max_abs_diff"] < 1e-3, row
    assert "3 of 3 planned sizes capturable on cpu" in proc.stderr


def test_a_host_synchronising_step_is_not_capturable(checkpoints: dict[str, str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The MoE dispatch of the first worker (torch.unique(...).tolist(), boolean masks) put
    back into the captured step: the checker must refuse it and say why."""
    monkeypatch.setattr(MoE, "dispatch_static", MoE.dispatch_sparse)
    plan = PlanView(decode_backend="full", decode_bs=[2], decode_max_bs=2)
    engine = Engine(checkpoints["tiny"], tp.single(), plan, EngineOptions(cpu_decode="eager"))
    r = check_graphs(engine, "trace")
    (row,) = r["decode"]
    assert not r["capturable"] and not row["capturable"] and row["max_abs_diff"] is None
    assert any(w in row["reason"].lower() for w in ("data-dependent", "graph break", "unsupported")), row["reason"]
