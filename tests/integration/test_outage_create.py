"""The database going away in the middle of making a launch: the launch row stored, its accepted
record not. An experiment waits the outage out and its retry (the run's request_id) finishes that
launch, recorded once, rather than failing the experiment or making a second launch; until then
nothing places it (PostgreSQL, reached through a proxy the test stops and starts)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore, database_unavailable
from cgsvc.audit.writer import AuditWriter
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.launches import (
    CREATE_METHOD,
    Launches,
    PlanSource,
    order_for,
    patiently,
    read_checkpoint,
)
from cgsvc.domain.plans import Caller, Plans
from cgsvc.launch.devices import Inventory
from cgsvc.launch.dispatch import LocalDispatcher
from cgsvc.launch.store import Created, ExperimentStore, LaunchRow, LaunchStore, Workload
from cgsvc.server.auth import Principal
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.launch_service import LaunchService
from cgsvc.server.metrics import LaunchCollector
from cgsvc.v1 import launch_pb2
from tests.integration.pg import Proxy
from tests.integration.test_takeover import running, two_plans


class CutAfterCreate(LaunchStore):
    """A launch store whose first new row is followed at once by the database going away (the
    proxy stopped) for `outage` seconds: the window between storing a launch and recording it."""

    def __init__(self, audit: AuditStore, proxy: Proxy, outage: float) -> None:
        super().__init__(audit)
        self.proxy, self.outage = proxy, outage
        self.cut = threading.Event()

    def create(self, row: LaunchRow) -> Created:
        made = super().create(row)
        if made.new and row.launch_id != "holder" and not self.cut.is_set():
            self.cut.set()
            self.proxy.stop()
            threading.Timer(self.outage, self.proxy.start).start()
        return made


@dataclass
class Queued:
    """Two plans of a tiny checkpoint, and launches on one device (cpu0) that a holder occupies, so
    that a launch made waits for it (nothing starts); its store cuts the database after the first
    launch row it stores."""

    plans: Plans
    tiny: str
    names: list[str]
    rows: CutAfterCreate
    launches: Launches


async def queued(auditor: Auditor, store: AuditStore, proxy: Proxy, tmp_path: Path, outage: float) -> Queued:
    plans = Plans(auditor)
    tiny, names = await two_plans(plans, tmp_path)
    rows = CutAfterCreate(store, proxy, outage)
    rows.create(running("holder", "r1").replace(devices=("cpu0",)))
    launches = Launches(rows, auditor, tmp_path / "runs", [LocalDispatcher(Inventory(("cpu0",), "test"))],
                        instance="r1")
    return Queued(plans, tiny, names, rows, launches)


async def made_in_the_outage(q: Queued, create: Callable[[], Awaitable[object]]) -> LaunchRow:
    """create(), which fails as the database goes away after storing the launch; the launch stored."""
    with pytest.raises(Exception) as failed:  # its record could not be written: the caller hears so
        await create()
    assert database_unavailable(failed.value), failed.value
    listed, _ = await patiently(lambda: asyncio.to_thread(q.rows.list_rows), "reading")  # until the database is back
    [made] = [r for r in listed if r.launch_id != "holder"]
    return made


def unrecorded_series(launches: Launches) -> dict[str, float]:
    """The metrics a scrape of this replica gives of launches stored without their record."""
    collector = LaunchCollector()
    collector.launches, collector.experiments = launches, Experiments(ExperimentStore(launches.store.audit), launches,
                                                                      Plans(launches.auditor))
    found = {}
    for family in collector.collect():
        for sample in family.samples:
            if sample.name == "cgsvc_launches_unrecorded_total":
                found[sample.labels["outcome"]] = sample.value
            elif sample.name == "cgsvc_launches_awaiting_record":
                found["awaiting"] = sample.value
    return found


def with_auditor(store: AuditStore, scenario: Callable[[Auditor], Awaitable[None]]) -> None:
    """Run `scenario` with an auditor on `store` (its writer stopped, the store closed, after)."""
    async def main() -> None:
        writer = AuditWriter(store)
        try:
            await scenario(Auditor(store, writer))
        finally:
            writer.close()

    try:
        asyncio.run(main())
    finally:
        store.close()


def test_an_experiment_whose_database_goes_away_as_it_makes_a_launch_finishes_that_launch(
        away: tuple[Proxy, str], tmp_path: Path) -> None:
    """Regression: the experiment failed ("internal error: ... OperationalError") at the first
    write its launch's making could not do, and a retry could not have told a launch made from
    none. Now each run's launch is asked for with the request_id experiments/ID/runs/N."""
    proxy, through = away
    store = AuditStore(through)

    async def scenario(auditor: Auditor) -> None:
        q = await queued(auditor, store, proxy, tmp_path, outage=2.0)
        rows, launches = q.rows, q.launches
        experiments = Experiments(ExperimentStore(store), launches, q.plans)
        exp = await experiments.create(q.names, Workload(4, 4, 1, 1), q.tiny, 1, "local", Caller("alice"))
        deadline = asyncio.get_running_loop().time() + 60
        while True:
            assert asyncio.get_running_loop().time() < deadline, "the experiment never made its launch"
            await asyncio.sleep(0.2)
            try:  # this reader too finds no database for a while
                now = await experiments.get(exp.experiment_id)
            except sa.exc.OperationalError:
                continue
            assert now.state == "RUNNING", now.error
            if now.runs:
                break
        assert rows.cut.is_set()  # the database did go away between the row and its record
        made = [r for r in rows.list_rows()[0] if r.launch_id != "holder"]
        assert len(made) == 1, made  # the retry found the launch the first try stored
        launch = made[0]
        assert now.runs[0]["launch"] == f"launches/{launch.launch_id}"
        assert (launch.request_id, launch.experiment) == (f"experiments/{exp.experiment_id}/runs/1",
                                                          exp.experiment_id)
        records = store.list_records(f'launch_id = "{launch.launch_id}" AND method = "{CREATE_METHOD}"')[0]
        assert len(records) == 1 and records[0].request_id == launch.request_id, records
        assert f"arm A, repeat 1 of experiments/{exp.experiment_id}" in records[0].outcome_message
        assert not launches.unfinished and launches.unrecorded == {"finished": 1}  # placed once cpu0 is free
        await experiments.cancel(exp.experiment_id, Caller("alice"))
        await asyncio.wait_for(experiments.tasks[exp.experiment_id], 60)
        ended = await experiments.get(exp.experiment_id)
        assert ended.state == "CANCELLED", (ended.state, ended.error)
        assert store.verify().ok

    with_auditor(store, scenario)


def test_a_launch_stored_without_its_record_is_not_started_by_a_restart(tmp_path: Path) -> None:
    """A server that stopped (or lost its database for good) between storing a launch and
    recording it left a PLACING row with no accepted record: the restart's recovery used to
    place it, a worker group that no record accounts for. It ends FAILED, saying why, with a
    record; a launch recorded as accepted still waits for its devices."""
    store = AuditStore(f"sqlite:///{tmp_path / 'cgsvc.db'}")

    async def scenario(auditor: Auditor) -> None:
        rows = LaunchStore(store)
        launches = Launches(rows, auditor, tmp_path / "runs", [LocalDispatcher(Inventory(("cpu0",), "test"))],
                            instance="r1")
        unrecorded = rows.create(LaunchRow("l1", "p1", "PLACING", "alice", "local", 1, "/m", Workload(4, 4, 1, 1),
                                           str(tmp_path / "runs" / "l1"), owner="r1", request_id="try-1")).row
        recorded = rows.create(LaunchRow("l2", "p1", "PLACING", "alice", "local", 2, "/m", Workload(4, 4, 1, 1),
                                         str(tmp_path / "runs" / "l2"), owner="r1")).row  # 2 ranks: waits
        for row in (unrecorded, recorded):
            (tmp_path / "runs" / row.launch_id).mkdir(parents=True)
            (tmp_path / "runs" / row.launch_id / "plan.json").write_text('{"plan": {}, "spec": {}}')
        await launches.audit(recorded, "alice", CREATE_METHOD, "OK", "launch of plans/p1 on 2 local ranks")
        await launches.recover()
        failed = rows.get("l1")
        assert failed is not None and failed.state == "FAILED" and not failed.handle_json, failed
        assert "no record of it was accepted" in failed.error and "not started" in failed.error, failed.error
        said = [r.outcome_message for r in store.list_records('launch_id = "l1"')[0]]
        assert any("PLACING -> FAILED" in m and "no record of it was accepted" in m for m in said), said
        assert rows.get("l2").state == "PLACING" and launches.unrecorded == {"failed": 1}  # type: ignore[union-attr]
        assert store.verify().ok

    with_auditor(store, scenario)


def test_a_launch_stored_without_its_record_and_never_retried_is_ended_after_the_grace(
        away: tuple[Proxy, str], tmp_path: Path) -> None:
    """A caller that gives up after its CreateLaunch failed in the outage leaves a launch stored,
    unrecorded and unplaced: after the grace its retry would have had, it ends FAILED with a
    record saying why, rather than waiting unplaced until a restart; a late retry finds it so."""
    proxy, through = away
    store = AuditStore(through)

    async def scenario(auditor: Auditor) -> None:
        q = await queued(auditor, store, proxy, tmp_path, outage=1.0)
        rows, launches = q.rows, q.launches
        launches.unfinished_grace = 2.0
        work = Workload(4, 4, 1, 1)
        plan = PlanSource.stored(await q.plans.get(q.names[0].removeprefix("plans/")))
        order = order_for(plan, read_checkpoint(q.tiny, work, q.plans.model_roots), q.tiny, work, "local", True,
                          request_id="try-1", request_hash="h1")
        made = await made_in_the_outage(q, lambda: launches.create(order, Caller("alice", request_id="try-1")))
        deadline = asyncio.get_running_loop().time() + 60
        # its end is stored, then recorded (the winner of a race out of PLACING records it): wait for both
        while not (said := [r.outcome_message for r in store.list_records(f'launch_id = "{made.launch_id}"')[0]]):
            assert asyncio.get_running_loop().time() < deadline, "the unrecorded launch was never ended"
            await asyncio.sleep(0.3)
        assert len(said) == 1 and said[0].startswith("PLACING -> FAILED: no retry of request_id"), said
        now = rows.get(made.launch_id)
        assert now is not None and now.state == "FAILED" and not now.handle_json, now
        assert now.error.startswith("no retry of request_id 'try-1' came within 2 s; no record of it was accepted"), \
            now.error
        late, new = await launches.create(order, Caller("alice", request_id="try-1"))
        assert (late.launch_id, late.state, new) == (made.launch_id, "FAILED", False)
        assert not launches.unfinished and launches.unrecorded == {"failed": 1} and store.verify().ok
        assert unrecorded_series(launches) == {"finished": 0, "placed": 0, "failed": 1, "awaiting": 0}

    with_auditor(store, scenario)


def test_a_create_launch_retried_after_the_outage_finishes_the_launch_its_first_try_stored(
        away: tuple[Proxy, str], tmp_path: Path) -> None:
    """A client's CreateLaunch failed in the outage after the launch was stored; its retry (the
    same request_id) is answered with that launch, now recorded as accepted once, not with a
    "replay" of a launch no record accounts for (which would never have been placed)."""
    proxy, through = away
    store = AuditStore(through)

    async def scenario(auditor: Auditor) -> None:
        q = await queued(auditor, store, proxy, tmp_path, outage=1.0)
        rows, launches = q.rows, q.launches
        service = LaunchService(launches, q.plans)
        request = launch_pb2.CreateLaunchRequest(
            plan=q.names[0], model_path=q.tiny,
            workload=launch_pb2.LaunchWorkload(input_len=4, output_len=4, requests=1, concurrency=1),
            dispatcher="local", wait_for_resources=True, request_id="try-1")
        rc = RequestContext(CREATE_METHOD, Principal("alice", ("admin",)), "test", "try-1", "", None)
        made = await made_in_the_outage(q, lambda: service.CreateLaunch(request, rc))
        again = await service.CreateLaunch(request, rc)
        assert again.metadata.name == f"launches/{made.launch_id}" and again.metadata.state == "PLACING", again
        assert [r.launch_id for r in rows.list_rows()[0] if r.launch_id != "holder"] == [made.launch_id]
        said = [r.outcome_message for r in store.list_records(
            f'launch_id = "{made.launch_id}" AND method = "{CREATE_METHOD}"')[0]]
        assert len(said) == 1 and said[0].startswith("launch of auditRecords/"), said  # accepted, not a replay
        assert not launches.unfinished and launches.unrecorded == {"finished": 1}  # placed once cpu0 is free
        replay = await service.CreateLaunch(request, rc)  # a third try is a replay, as before
        assert replay.metadata.name == again.metadata.name
        assert store.verify().ok

    with_auditor(store, scenario)
