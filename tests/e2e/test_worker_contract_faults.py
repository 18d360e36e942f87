"""A worker group that breaks the contract — a malformed event, an unreadable report — fails
its launch with the reason; the lifecycle (and so the server) carries on. The group here is a
small script standing in for the worker, started by the real local dispatcher machinery."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore
from cgsvc.audit.writer import AuditWriter
from cgsvc.contract import RunDir
from cgsvc.domain.launches import Launches, LaunchOrder
from cgsvc.domain.plans import Caller
from cgsvc.launch.devices import Inventory
from cgsvc.launch.dispatch import LocalDispatcher
from cgsvc.launch.store import LaunchRow, LaunchStore, Workload


class ScriptedDispatcher(LocalDispatcher):
    """Runs a Python snippet as the worker group (with the run directory as argv[1])."""

    def __init__(self, snippet: str) -> None:
        super().__init__(Inventory(("cpu0", "cpu1"), "test"))
        self.snippet = snippet

    def command(self, row: LaunchRow, run: RunDir, gpu_plan: bool) -> list[str]:
        return [sys.executable, "-c", self.snippet, str(run.path), row.launch_id]


async def run_launch(tmp_path: Path, snippet: str) -> LaunchRow:
    store = AuditStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    writer = AuditWriter(store)
    try:
        launches = Launches(LaunchStore(store), Auditor(store, writer), tmp_path / "runs",
                            [ScriptedDispatcher(snippet)])
        launches.poll_seconds = 0.02
        spec = {"model": {"name": "deepseek-ai/DeepSeek-V3"}, "hardware": {"gpu": "cpu"}}
        order = LaunchOrder(plan_id="p1", plan_json="{}", spec_json=json.dumps(spec), plan_audit="auditRecords/0",
                            tp=1, model_path=str(tmp_path), workload=Workload(4, 2, 1, 1), dispatcher="local",
                            wait=False)
        row, new = await launches.create(order, Caller("tester"))
        assert new
        for _ in range(500):
            row = await launches.get(row.launch_id)
            if row.state in ("SUCCEEDED", "FAILED", "CANCELLED", "LOST"):
                break
            await asyncio.sleep(0.02)
        await launches.close()
        return row
    finally:
        writer.close()
        store.close()


WRITE = "import sys, pathlib; d = pathlib.Path(sys.argv[1]); "


@pytest.mark.parametrize(("snippet", "reason"), [
    (WRITE + "(d / 'events.jsonl').write_text('{\"event\": \"state\", \"state\": \"exploded\"}\\n'); "
             "import time; time.sleep(30)", "malformed event (event.state: 'exploded' is not one of"),
    (WRITE + "(d / 'events.jsonl').write_text('this is not json\\n'); import time; time.sleep(30)",
     "malformed event (event: not JSON"),
    (WRITE + "(d / 'report.json').write_text('{\"status\": \"ok\"}')", "no readable report (report.plan_fidelity: "
                                                                      "missing)"),
    (WRITE + "(d / 'report.json').write_text('{\"status\": \"ok\", ')", "no readable report (report: not JSON"),
])
def test_a_contract_breach_is_a_clear_launch_failure(tmp_path: Path, snippet: str, reason: str) -> None:
    row = asyncio.run(run_launch(tmp_path, snippet))
    assert row.state == "FAILED" and reason in row.error, row.error
