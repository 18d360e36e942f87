"""The control plane installs and runs without torch: importing it must not import torch."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

BLOCK_TORCH = """
import sys
class _Block:
    def find_spec(self, name, path=None, target=None):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("torch is blocked: the control plane must not need it")
        return None
sys.meta_path.insert(0, _Block())
"""


def test_control_plane_imports_without_torch() -> None:
    code = BLOCK_TORCH + """
import cgsvc.server.main, cgsvc.server.app, cgsvc.resolve, cgsvc.audit.store, cgsvc_client.cli, cgsvc.demo
from cgsvc.resolve import resolve
from cgsvc.spec import parse_spec
plan = resolve(parse_spec({"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300"}}))
assert plan.prefill_backend == "disabled"
assert "torch" not in sys.modules
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr


def test_dependencies_keep_torch_out_of_the_control_plane() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith(("torch", "flashinfer", "tensorrt")) for d in project["dependencies"])
    assert not any(d.startswith("tensorrt") for extra in project["optional-dependencies"].values() for d in extra)
