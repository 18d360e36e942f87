"""Taking over a gone replica's experiments: one replica wins each, the experiment ends FAILED
saying why, and the replica that lost it can no longer write it (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore
from cgsvc.audit.writer import AuditWriter
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.launches import Launches, TakenOver
from cgsvc.domain.plans import Plans
from cgsvc.launch.devices import Inventory
from cgsvc.launch.dispatch import LocalDispatcher
from cgsvc.launch.store import ExperimentRow, ExperimentStore, LaunchStore, Lease
from tests.integration.pg import pg_url_or_skip


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditStore]:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}" if request.param == "sqlite" \
        else pg_url_or_skip(f"takeover_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)
    yield s
    s.close()


def test_a_gone_replicas_experiment_is_ended_once_and_fenced(store: AuditStore, tmp_path: Path) -> None:
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            auditor = Auditor(store, writer)
            replicas = [Experiments(ExperimentStore(store), Launches(
                LaunchStore(store), auditor, tmp_path / f"runs{i}", [LocalDispatcher(Inventory(("cpu0",), "test"))],
                instance=f"r{i}", shared=True), Plans(auditor)) for i in (1, 2)]
            request = {"plans": ["plans/a", "plans/b"], "workload": {}, "model_path": "/m", "repeats": 2,
                       "dispatcher": "local"}
            row = await asyncio.to_thread(ExperimentStore(store).create, ExperimentRow(
                "exp1", "RUNNING", "alice", request, runs=({"arm": "A", "repeat": 1, "launch": "launches/x",
                                                            "state": "SUCCEEDED"},), owner="gone"))
            lease = Lease("gone", "host-x", "2026-12-03T00:00:00Z", 42.0)
            notes = await asyncio.gather(*(r.take_over(lease) for r in replicas))
            assert sorted(len(n) for n in notes) == [0, 1], notes  # one replica won it
            ended = await replicas[0].get("exp1")
            assert ended.state == "FAILED" and ended.owner in ("r1", "r2")
            assert "replica gone on host-x, which ran it, stopped renewing its lease (42 s ago)" in ended.error
            assert ended.runs == row.runs  # what it had run is kept
            records = store.list_records('method = "experiment.state"')[0]
            assert len(records) == 1 and "experiments/exp1: FAILED" in records[0].outcome_message
            # the replica that ran it, back from a stall, can no longer write it
            with pytest.raises(TakenOver):
                await replicas[0]._save(row)
            assert (await replicas[0].get("exp1")).state == "FAILED"
        finally:
            writer.close()

    asyncio.run(scenario())
