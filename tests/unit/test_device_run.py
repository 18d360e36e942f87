"""The prepared device check (bench/device_run.sh) and the wheels it carries
(scripts/device_wheels.sh): the GPU machine has no network, so a dependency the control plane
gains and the wheel list lacks would only show there, in device time."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib

from tests.conftest import ROOT

# In the GPU machine's image already, or not needed there (no PostgreSQL server runs on it).
NOT_CARRIED = {"numpy", "scipy", "prometheus-client", "psycopg"}


def _carried() -> set[str]:
    text = (ROOT / "scripts" / "device_wheels.sh").read_text()
    block = re.search(r"^CONTROL=\((.*?)\)", text, re.S | re.M)
    assert block, "scripts/device_wheels.sh has no CONTROL=(...) list"
    return set(block.group(1).split())


def test_every_control_plane_dependency_is_carried_or_in_the_image() -> None:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() for d in deps}
    missing = names - _carried() - NOT_CARRIED
    assert not missing, f"scripts/device_wheels.sh CONTROL lacks {sorted(missing)}"


def test_device_run_measures_the_durable_path_and_skips_what_the_limit_leaves_no_time_for(tmp_path) -> None:
    """With no wheels it uses the given python's packages; a 1 s limit leaves no time for the
    GPU check, which it says instead of starting it."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable, LOAD_SECONDS="0.5")
    proc = subprocess.run(["bash", str(ROOT / "bench" / "device_run.sh"), str(out), "1"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    table = (out / "resolve_load.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| sqlite |")]
    assert [r.split("|")[2].strip() for r in rows] == ["8", "32"], table
    assert all(r.split("|")[-2].strip() == "0" for r in rows), table  # no errors in either row
    summary = (out / "summary.txt").read_text()
    assert "resolve_load: rc=0" in summary and "durable-path target" in summary
    assert re.search(r"gpu_check: skipped, -?\d+s left", summary), summary
    assert "cores: " in (out / "machine.txt").read_text()
