"""Taking over a gone replica's experiments: one replica wins each, the experiment ends FAILED
saying why, and the replica that lost it can no longer write it (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from cgsvc_worker.checkpoint import make_checkpoint

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore
from cgsvc.audit.writer import AuditWriter
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.launches import Launches, TakenOver
from cgsvc.domain.plans import Caller, Plans
from cgsvc.launch.devices import Inventory
from cgsvc.launch.dispatch import HOST, LocalDispatcher, RunHandle
from cgsvc.launch.store import (
    ExperimentRow,
    ExperimentStore,
    LaunchRow,
    LaunchStore,
    Lease,
    Workload,
)
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


class Interleaved(LaunchStore):
    """A launch store that lets another replica act right after a read or a claim of this
    one's (`after[method]()`): the windows a restarting replica's recovery must survive."""

    def __init__(self, audit: AuditStore, after: dict[str, Callable[[str], object]]) -> None:
        super().__init__(audit)
        self.after = after

    def in_states(self, states: Sequence[str]) -> list[LaunchRow]:
        rows = super().in_states(states)
        self.after.get("in_states", str)("")
        return rows

    def claim(self, launch_id: str, state: str, from_owner: str, to_owner: str) -> bool:
        done = super().claim(launch_id, state, from_owner, to_owner)
        self.after.get("claim", str)(launch_id)
        return done


class InterleavedExperiments(ExperimentStore):
    def __init__(self, audit: AuditStore, after: dict[str, Callable[[], object]]) -> None:
        super().__init__(audit)
        self.after = after

    def claim(self, experiment_id: str, from_owner: str, to_owner: str) -> bool:
        done = super().claim(experiment_id, from_owner, to_owner)
        self.after.get("claim", str)()
        return done

    def get(self, experiment_id: str) -> ExperimentRow | None:
        row = super().get(experiment_id)
        self.after.pop("get", str)()  # once
        return row


def running(launch_id: str, owner: str, dispatcher: str = "local", host: str = HOST) -> LaunchRow:
    handle = RunHandle(dispatcher, launch_id, 999_999, 999_999, host).to_json()
    return LaunchRow(launch_id, "p1", "RUNNING", "alice", dispatcher, 1, "/m", Workload(8, 8, 1, 1),
                     f"/nonexistent/{launch_id}", handle_json=handle, owner=owner)


def test_a_restarting_replica_keeps_off_launches_taken_over_while_it_recovers(
        store: AuditStore, tmp_path: Path) -> None:
    """Replica r1 restarts just as r2, having seen r1's lease lapse, takes its launches over:
    one (l1) is claimed by r2 after r1 read it, one (l2) after r1 claimed it. r1 neither takes
    l1 back nor settles it, and lets l2 go when its first write is fenced; it does not fail to start."""
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            auditor, other = Auditor(store, writer), LaunchStore(store)
            for launch_id in ("l1", "l2"):  # on a dispatcher r1 lacks: recovering either settles it LOST
                other.create(running(launch_id, "r1", dispatcher="ray"))
            after: dict[str, Callable[[str], object]] = {
                "in_states": lambda _: other.claim("l1", "RUNNING", "r1", "r2"),
                "claim": lambda claimed: claimed == "l2" and other.claim("l2", "RUNNING", "r1", "r2")}
            r1 = Launches(Interleaved(store, after), auditor, tmp_path / "runs",
                          [LocalDispatcher(Inventory(("cpu0",), "test"))], instance="r1", shared=True)
            notes = await r1.recover()
            assert notes == ["let go of launches/l2: another replica took it over meanwhile"], notes
            for launch_id in ("l1", "l2"):
                row = other.get(launch_id)
                assert row is not None and (row.state, row.owner) == ("RUNNING", "r2"), row
            # l2's LOST was recorded first (write-ahead), then not applied; l1 has no record at all
            assert store.list_records('launch_id = "l1"')[0] == []
        finally:
            writer.close()

    asyncio.run(scenario())


def test_a_replica_restarted_on_another_machine_settles_its_old_groups_lost(
        store: AuditStore, tmp_path: Path) -> None:
    """The same data directory (the same replica name) on another machine: a group whose handle
    names the old machine cannot be followed from here, so it is settled LOST saying where it ran,
    instead of probing a local pid that means nothing."""
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            LaunchStore(store).create(running("l1", "r1", host="old-machine"))
            r1 = Launches(LaunchStore(store), Auditor(store, writer), tmp_path / "runs",
                          [LocalDispatcher(Inventory(("cpu0",), "test"))], instance="r1", shared=True)
            assert await r1.recover() == []
            row = await r1.get("l1")
            assert row.state == "LOST" and row.owner == "r1", row
            assert row.error == (f"its worker group ran on old-machine and cannot be followed from {HOST}: "
                                 "it may still run there"), row.error
        finally:
            writer.close()

    asyncio.run(scenario())


def test_a_restarting_replica_lets_go_of_an_experiment_taken_over_as_it_recovers(
        store: AuditStore, tmp_path: Path) -> None:
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            auditor, other = Auditor(store, writer), ExperimentStore(store)
            other.create(ExperimentRow("exp1", "RUNNING", "alice", {"plans": ["plans/a", "plans/b"]}, owner="r1"))
            launches = Launches(LaunchStore(store), auditor, tmp_path / "runs",
                                [LocalDispatcher(Inventory(("cpu0",), "test"))], instance="r1", shared=True)
            r1 = Experiments(InterleavedExperiments(store, {"claim": lambda: other.claim("exp1", "r1", "r2")}),
                             launches, Plans(auditor))
            assert await r1.recover() == ["let go of experiments/exp1: another replica took it over"]
            row = other.get("exp1")
            assert row is not None and (row.state, row.owner) == ("RUNNING", "r2"), row
            assert store.list_records('method = "experiment.state"')[0] == []  # ended by nobody yet
        finally:
            writer.close()

    asyncio.run(scenario())


def test_an_experiment_ended_by_a_takeover_leaves_none_of_its_launches_running(
        store: AuditStore, tmp_path: Path) -> None:
    """Replica r2 ends a gone replica's experiment and cancels the launch it was running (here
    still queued: cancelled at once); the gone replica, resumed, finds the experiment taken over
    and cancels the launch it had started for it, which r2 never heard of."""
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            auditor, other, launch_rows = Auditor(store, writer), ExperimentStore(store), LaunchStore(store)
            for launch_id in ("l1", "l2"):
                launch_rows.create(running(launch_id, "r1").replace(state="PLACING", handle_json=""))
            request = {"plans": ["plans/a", "plans/b"], "workload": {"input_len": 8, "output_len": 8, "requests": 1,
                                                                      "concurrency": 1}, "model_path": "/nonexistent",
                       "repeats": 1, "dispatcher": "local"}
            other.create(ExperimentRow("exp1", "RUNNING", "alice", request, owner="r1", runs=(
                {"arm": "A", "repeat": 1, "launch": "launches/l1", "state": "PLACING"},)))

            def replica(name: str, experiments: ExperimentStore) -> Experiments:
                launches = Launches(LaunchStore(store), auditor, tmp_path / f"runs-{name}",
                                    [LocalDispatcher(Inventory(("cpu0",), "test"))], instance=name, shared=True)
                return Experiments(experiments, launches, Plans(auditor))

            r2 = replica("r2", ExperimentStore(store))
            assert await r2.take_over(Lease("r1", "host-x", "2026-12-03T00:00:00Z", 42.0)) == [
                "ended experiments/exp1 (taken over from replica r1)"]
            ended = await r2.get("exp1")
            assert (ended.state, ended.owner) == ("FAILED", "r2"), ended
            assert "launches/l1, which it ran, is cancelled" in ended.error, ended.error
            # r1 resumes in another experiment's schedule, which r2 takes over as r1 reads it
            other.create(ExperimentRow("exp2", "RUNNING", "alice", request, owner="r1"))
            stalled = replica("r1", InterleavedExperiments(store, {"get": lambda: other.claim("exp2", "r1", "r2")}))
            stalled.current["exp2"] = "l2"  # it had started l2 and stalled before storing it in the experiment
            await stalled.run("exp2", Caller("alice"))
            assert other.get("exp2") == (await r2.get("exp2")) and (await r2.get("exp2")).state == "RUNNING"
            for launch_id, why in (("l1", "experiments/exp1, which ran it, ended FAILED: replica r1 on host-x"),
                                   ("l2", "experiments/exp2, which started it, was taken over by another replica")):
                row = launch_rows.get(launch_id)
                assert row is not None and row.state == "CANCELLED", row
                assert row.error.startswith(f"cancelled by cgsvc: {why}"), row.error
                said = [r.outcome_message for r in store.list_records(f'launch_id = "{launch_id}"')[0]]
                reason = row.error.removeprefix("cancelled by cgsvc: ")
                assert said == [f"PLACING -> CANCELLED: cancelled by cgsvc before it started: {reason}"], said
            assert "exp2" not in stalled.current
        finally:
            writer.close()

    asyncio.run(scenario())


class FailsOnce(ExperimentStore):
    """An experiment store whose first save of a new run fails, as a database that went away
    for a moment would: the schedule ends inside, with its launch just started."""

    def __init__(self, audit: AuditStore) -> None:
        super().__init__(audit)
        self.failed = False

    def update(self, row: ExperimentRow) -> ExperimentRow | None:
        if row.runs and row.state == "RUNNING" and not self.failed:
            self.failed = True
            raise RuntimeError("the database went away")
        return super().update(row)


async def two_plans(plans: Plans, tmp_path: Path) -> tuple[str, list[str]]:
    """A tiny checkpoint, and two plans of it (arms A and B) resolved by alice."""
    tiny = make_checkpoint(str(tmp_path / "tiny"), "tiny")
    spec = {"model": {"path": tiny}, "hardware": {"gpu": "cpu"}, "parallelism": {"tp": 1}}
    return tiny, [f"plans/{(await plans.resolve_and_record(spec, Caller('alice'))).plan_id}" for _ in "AB"]


def test_an_experiment_that_fails_inside_cancels_the_launch_it_started(store: AuditStore, tmp_path: Path) -> None:
    """An internal failure ends the experiment FAILED saying so, and the launch it had just
    started (queued here: its one device is held) is cancelled with a record naming it."""
    async def scenario() -> None:
        writer = AuditWriter(store)
        try:
            auditor = Auditor(store, writer)
            plans = Plans(auditor)
            tiny, names = await two_plans(plans, tmp_path)
            launch_rows = LaunchStore(store)
            launch_rows.create(running("holder", "r1").replace(devices=("cpu0",)))  # cpu0 is taken
            launches = Launches(launch_rows, auditor, tmp_path / "runs",
                                [LocalDispatcher(Inventory(("cpu0",), "test"))], instance="r1")
            experiments = Experiments(FailsOnce(store), launches, plans)
            exp = await experiments.create(names, Workload(4, 4, 1, 1), tiny, 1, "local", Caller("alice"))
            await experiments.tasks[exp.experiment_id]
            ended = await experiments.get(exp.experiment_id)
            assert ended.state == "FAILED" and "internal error: the database went away" in ended.error, ended
            started = [r for r in launch_rows.list_rows()[0] if r.launch_id != "holder"]
            assert [r.state for r in started] == ["CANCELLED"], started
            why = f"experiments/{exp.experiment_id}, which started it, has ended"
            assert started[0].error == f"cancelled by cgsvc: {why}", started[0].error
            said = [r.outcome_message for r in store.list_records(f'launch_id = "{started[0].launch_id}"')[0]]
            assert f"PLACING -> CANCELLED: cancelled by cgsvc before it started: {why}" in said, said
            assert launch_rows.get("holder").state == "RUNNING"  # type: ignore[union-attr]
        finally:
            writer.close()

    asyncio.run(scenario())
