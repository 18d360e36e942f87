"""The store suite, run against SQLite and against the PostgreSQL server on this machine."""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from cgsvc.audit import filters
from cgsvc.audit.records import AuditEntry, mask_secrets
from cgsvc.audit.store import AuditStore, PageTokenError, PendingAppend, PlanListing
from cgsvc.audit.writer import AuditWriter
from tests.integration.pg import PG_BASE, pg_url_or_skip


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[AuditStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'audit.db'}"
    else:
        url = pg_url_or_skip(f"store_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)
    yield s
    s.close()


def entry(i: int, **kw: object) -> AuditEntry:
    base: dict[str, object] = dict(principal="alice", peer="ipv4:127.0.0.1:1", method="/cgsvc.v1.PlanService/ResolvePlan",
                                   model="deepseek-ai/DeepSeek-V3" if i % 2 else "Qwen/Qwen3-8B", gpu="H100",
                                   spec_json=f'{{"i":{i}}}', rule_ids=("breakable.mla",) if i % 2 else ("attention.mha.hopper",))
    base.update(kw)
    return AuditEntry(**base)  # type: ignore[arg-type]


def test_append_chain_and_verify(store: AuditStore) -> None:
    for i in range(1, 6):
        rec = store.append(entry(i)).record
        assert rec.sequence == i
    v = store.verify()
    assert v.ok and v.records_checked == 5
    heard: list[tuple[int, int]] = []  # a million records take 40 s: the caller hears how far it has got
    assert store.verify(progress=lambda done, total: heard.append((done, total)), every=2).ok
    assert heard == [(2, 5), (4, 5), (5, 5)]
    got = store.get_record(3)
    assert got is not None and got.prev_hash == store.get_record(2).record_hash  # type: ignore[union-attr]
    assert store.schema_version() == 27
    assert store.migrate() == []  # idempotent


def test_migration_15_adds_the_cancel_column_to_existing_experiments(store: AuditStore) -> None:
    """An experiments table of schema 14 (no cancel_requested_by) gains the column, its rows
    reading as not cancelled; a cancel is then stored for a running experiment only."""
    from cgsvc.launch.store import ExperimentRow, ExperimentStore

    experiments = ExperimentStore(store)
    experiments.create(ExperimentRow("e1", "RUNNING", "alice", {"plans": []}))
    experiments.create(ExperimentRow("e2", "SUCCEEDED", "alice", {"plans": []}))
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE experiments DROP COLUMN cancel_requested_by"))
        conn.execute(sa.text("DELETE FROM schema_migrations WHERE version = 15"))
    assert store.migrate() == [15]
    assert [r.cancel_requested_by for r in experiments.list_rows()[0]] == ["", ""]
    assert experiments.request_cancel("e1", "bob") and not experiments.request_cancel("e2", "bob")
    assert experiments.get("e1").cancel_requested_by == "bob"  # type: ignore[union-attr]


def test_migration_21_adds_the_rerun_column_to_existing_experiments(store: AuditStore) -> None:
    """Experiments of schema 20 (no rerun_of) read as runs of their own; a rerun is then found by
    the one it runs again, by name or bare ID."""
    from cgsvc.launch.store import ExperimentRow, ExperimentStore

    experiments = ExperimentStore(store)
    experiments.create(ExperimentRow("e1", "SUCCEEDED", "alice", {"plans": []}))
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE experiments DROP COLUMN rerun_of"))
        conn.execute(sa.text("DELETE FROM schema_migrations WHERE version = 21"))
    assert store.migrate() == [21]
    assert [r.rerun_of for r in experiments.list_rows()[0]] == [""]
    experiments.create(ExperimentRow("e2", "RUNNING", "alice", {"plans": []}, rerun_of="e1"))
    for name in ("experiments/e1", "e1"):
        assert [r.experiment_id for r in experiments.list_rows(f'rerun_of = "{name}"')[0]] == ["e2"]
    assert [r.experiment_id for r in experiments.list_rows('rerun_of = ""')[0]] == ["e1"]


def test_migration_25_gives_experiments_labels_found_by_labels_key(store: AuditStore) -> None:
    """Experiments of schema 24 read as unlabelled; labels given later are found whole by
    `labels.KEY = VALUE`, as a launch's are."""
    from cgsvc.audit.filters import labels_cell
    from cgsvc.launch.store import ExperimentRow, ExperimentStore

    experiments = ExperimentStore(store)
    experiments.create(ExperimentRow("e1", "SUCCEEDED", "alice", {"plans": []}))
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE experiments DROP COLUMN labels"))
        conn.execute(sa.text("DELETE FROM schema_migrations WHERE version = 25"))
    assert store.migrate() == [25]
    assert [r.labels for r in experiments.list_rows()[0]] == [""]
    experiments.create(ExperimentRow("e2", "RUNNING", "alice", {"plans": []},
                                     labels=labels_cell({"ticket": "inc_42", "team": "infra"})))
    experiments.create(ExperimentRow("e3", "RUNNING", "alice", {"plans": []}, labels=labels_cell({"team": "infra2"})))

    def found(text: str) -> list[str]:
        return [r.experiment_id for r in experiments.list_rows(text)[0]]

    assert found('labels.team = "infra"') == ["e2"] and found('labels.team != "infra"') == ["e1", "e3"]
    assert found('labels.ticket = "inc_42" AND state = "RUNNING"') == ["e2"] and found('labels.ticket = "inc-42"') == []
    assert found("labels.team:*") == ["e2", "e3"] and found("labels.ticket:*") == ["e2"]
    assert experiments.get("e2").labels == ",team=infra,ticket=inc_42,"  # type: ignore[union-attr]
    assert experiments.relabel("e3", ",team=infra2,", "") and not experiments.relabel("e3", ",team=infra2,", ",a=b,")
    assert found('labels.team != "infra"') == ["e1", "e3"] and experiments.get("e3").labels == ""  # type: ignore[union-attr]
    with pytest.raises(filters.FilterError):
        experiments.list_rows('labels.team > "a"')


def test_migration_26_lets_experiments_be_found_by_the_plans_they_measured(store: AuditStore) -> None:
    """`plan = "plans/P"` finds the experiments with P as either arm, those made before the
    column (migration 26 fills it from their requests) and after."""
    from cgsvc.launch.store import ExperimentRow, ExperimentStore

    experiments = ExperimentStore(store)
    experiments.create(ExperimentRow("e1", "SUCCEEDED", "alice", {"plans": ["plans/p_1", "plans/p2"]}))
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("ALTER TABLE experiments DROP COLUMN plans"))
        conn.execute(sa.text("DELETE FROM schema_migrations WHERE version = 26"))
    assert store.migrate() == [26]
    experiments.create(ExperimentRow("e2", "RUNNING", "alice", {"plans": ["plans/p2", "plans/p3"]}))

    def found(text: str) -> list[str]:
        return [r.experiment_id for r in experiments.list_rows(text)[0]]

    assert found('plan = "plans/p2"') == ["e1", "e2"] and found('plan = "p3"') == ["e2"]
    assert found('plan = "plans/p_1"') == ["e1"] and found('plan = "plans/pX1"') == []  # _ as written
    assert found('plan != "plans/p3"') == ["e1"] and found('plan = "plans/p2" AND state = "RUNNING"') == ["e2"]
    for bad in ('plan = "launches/p2"', 'plan > "plans/p2"'):
        with pytest.raises(filters.FilterError):
            found(bad)


def test_an_experiment_is_made_once_per_principal_and_request_id(store: AuditStore) -> None:
    """The store's side of an idempotent CreateExperiment: a second insert under the same
    (principal, request_id) gets the first experiment, and says whether it asked for another."""
    from cgsvc.launch.store import ExperimentRow, ExperimentStore

    experiments = ExperimentStore(store)
    first, new, _ = experiments.create_once(ExperimentRow("e1", "RUNNING", "alice", {"plans": []}), "r1", "h1")
    assert new and first.sequence == 1
    again, new, conflicts = experiments.create_once(ExperimentRow("e2", "RUNNING", "alice", {"plans": []}), "r1", "h1")
    assert (again.experiment_id, new, conflicts) == ("e1", False, False)
    other = experiments.create_once(ExperimentRow("e3", "RUNNING", "alice", {"plans": []}), "r1", "h2")
    assert (other[0].experiment_id, other[1], other[2]) == ("e1", False, True)
    bob, new, _ = experiments.create_once(ExperimentRow("e4", "RUNNING", "bob", {"plans": []}), "r1", "h1")
    assert new and bob.experiment_id == "e4"  # a key is the principal's own
    assert experiments.by_request("alice", "r1") == (experiments.get("e1"), "h1")
    assert experiments.by_request("alice", "r2") is None
    assert [r.experiment_id for r in experiments.list_rows()[0]] == ["e1", "e4"]


def test_launches_are_found_by_their_labels_whole(store: AuditStore) -> None:
    """`labels.KEY = VALUE` matches that pair, not a pattern or a part of another pair; a filter
    naming a label no launch could have is refused, as CreateLaunch refuses one."""
    from cgsvc.audit.filters import FilterError, labels_cell, labels_of
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    rows = LaunchStore(store)
    for launch_id, labels in (("l1", {"team": "infra", "ticket": "inc_42"}), ("l2", {"team": "infra2"}), ("l3", {})):
        rows.create(LaunchRow(launch_id, "p", "SUCCEEDED", "alice", "local", 1, "/m", Workload(1, 1, 1, 1), "/r",
                              labels=labels_cell(labels)))
    assert labels_of(labels_cell({"b": "2", "a": ""})) == {"a": "", "b": "2"} and labels_cell({}) == ""

    def found(text: str) -> list[str]:
        return [r.launch_id for r in rows.list_rows(text)[0]]

    assert found('labels.team = "infra"') == ["l1"] and found('labels.team != "infra"') == ["l2", "l3"]
    assert found('labels.ticket = "inc_42"') == ["l1"] and found('labels.ticket = "inc-42"') == []  # _ as written
    assert found('labels.team = "infra" AND labels.ticket = "inc_42"') == ["l1"]
    assert found("labels.team:*") == ["l1", "l2"] and found("labels.ticket:*") == ["l1"]  # has the key
    assert found("labels.tea:*") == [] and found("labels.team:* AND labels.ticket:*") == ["l1"]
    assert found("NOT labels.ticket:*") == ["l2", "l3"] and found("NOT labels.team:* AND NOT labels.x:*") == ["l3"]
    assert found('plan = "plans/p"') == found('plan = "p"') == ["l1", "l2", "l3"]  # a name, or its bare ID
    assert found('plan != "plans/p"') == [] and found('rerun_of = "launches/l1"') == []
    # relabelled only from the labels read: a relabel that read before another's was stored loses
    before = labels_cell({"team": "infra", "ticket": "inc_42"})
    assert rows.relabel("l1", before, labels_cell({"team": "ml"})) and found('labels.team = "ml"') == ["l1"]
    assert not rows.relabel("l1", before, labels_cell({"team": "x"})) and found('labels.team = "x"') == []
    for bad in ('labels.team = "%"', 'labels.team = "infra,ticket=inc_42"', 'labels.Team = "infra"',
                'labels.team > "a"', 'labels = "x"'):
        with pytest.raises(FilterError):
            rows.list_rows(bad)


def test_launches_are_found_by_the_experiment_that_made_them(store: AuditStore) -> None:
    """`experiment = "experiments/E"` (or its bare ID) finds the launches E made; `experiment =
    ""` those asked for on their own."""
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    rows = LaunchStore(store)
    for launch_id, experiment in (("l1", "e1"), ("l2", ""), ("l3", "e1"), ("l4", "e2")):
        rows.create(LaunchRow(launch_id, "p", "SUCCEEDED", "alice", "local", 1, "/m", Workload(1, 1, 1, 1), "/r",
                              experiment=experiment))

    def found(text: str) -> list[str]:
        return [r.launch_id for r in rows.list_rows(text)[0]]

    assert found('experiment = "experiments/e1"') == found('experiment = "e1"') == ["l1", "l3"]
    assert found('experiment = ""') == ["l2"] and found('experiment != ""') == ["l1", "l3", "l4"]
    assert found('experiment = "experiments/e3"') == [] and rows.get("l4").experiment == "e2"  # type: ignore[union-attr]
    with pytest.raises(filters.FilterError, match="experiment takes experiments/ID or the bare ID"):
        found('experiment = "launches/l1"')  # a launch's name where an experiment's is asked: no silent empty page
    # the audit log's launch_id and plan_id read a resource name as its ID too
    store.append(entry(1, launch_id="l1", plan_id="p1"))
    for text in ('launch_id = "launches/l1"', 'launch_id = "l1"', 'plan_id = "plans/p1"'):
        assert [r.launch_id for r in store.list_records(text)[0]] == ["l1"], text
    with pytest.raises(filters.FilterError, match="plan_id takes plans/ID"):
        store.list_records('plan_id = "launches/l1"')


def test_a_relabel_that_read_before_another_replicas_was_stored_is_aborted_and_recorded(store: AuditStore) -> None:
    """Two replicas relabel one launch: the one whose read went stale first records its change,
    then finds the labels moved, records that it was not applied and answers ABORTED; the
    labels are the winner's."""
    import asyncio
    import functools

    from cgsvc.audit.filters import labels_cell, labels_of
    from cgsvc.domain.labels import change_labels, read_change
    from cgsvc.errors import ServiceError
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    rows = LaunchStore(store)
    rows.create(LaunchRow("l1", "p", "SUCCEEDED", "alice", "local", 1, "/m", Workload(1, 1, 1, 1), "/r",
                          labels=labels_cell({"team": "infra"})))
    read = rows.get("l1").labels  # type: ignore[union-attr]  # what the loser read ...
    assert rows.relabel("l1", read, labels_cell({"team": "ml"}))  # ... before the winner's change was stored

    async def record(code: str, message: str) -> None:
        await asyncio.to_thread(store.append, entry(1, launch_id="l1", outcome_code=10 if code == "ABORTED" else 0,
                                                    outcome_message=message))

    change = read_change({"owner": "ana"}, ["labels.owner"], "launch")
    with pytest.raises(ServiceError) as err:
        asyncio.run(change_labels("launches/l1", read, change, "launch.labels", record,
                                  functools.partial(rows.relabel, "l1")))
    assert err.value.code == "ABORTED" and "read them again" in err.value.message, err.value
    said = [(r.outcome_code, r.outcome_message) for r in store.list_records('launch_id = "l1"')[0]]
    assert said == [(0, "labels: owner=ana added"),
                    (10, "not applied: labels: owner=ana added (they changed meanwhile, on another replica)")], said
    assert labels_of(rows.get("l1").labels) == {"team": "ml"}  # type: ignore[union-attr]


def test_migrations_upgrade_an_older_schema(store: AuditStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A schema-2 database (launches without devices, placement and request ids; records and plans
    without a policy; no experiments) with a launch and a record-schema-1 record in it is upgraded
    in place: the old launch stays readable, the old record is cgsvc's and still verifies."""
    from cgsvc.audit import records
    from cgsvc.audit.store import (
        LAUNCH_COLUMNS_3,
        LAUNCH_COLUMNS_9,
        LAUNCH_COLUMNS_11,
        LAUNCH_COLUMNS_16,
        LAUNCH_COLUMNS_17,
        LAUNCH_COLUMNS_18,
        LAUNCH_COLUMNS_19,
        LAUNCH_COLUMNS_20,
        LAUNCH_COLUMNS_23,
        LAUNCH_COLUMNS_24,
        LAUNCH_COLUMNS_27,
        launches,
    )
    from cgsvc.contract import EngineSettings
    from cgsvc.launch.store import ExperimentStore, LaunchStore

    monkeypatch.setattr(records, "SCHEMA_VERSION", 1)  # written before named policies
    store.append(entry(1))
    monkeypatch.undo()
    new = {c.name for c in LAUNCH_COLUMNS_3 + LAUNCH_COLUMNS_9 + LAUNCH_COLUMNS_11 + LAUNCH_COLUMNS_16
           + LAUNCH_COLUMNS_17 + LAUNCH_COLUMNS_18 + LAUNCH_COLUMNS_19 + LAUNCH_COLUMNS_20
           + LAUNCH_COLUMNS_23 + LAUNCH_COLUMNS_24 + LAUNCH_COLUMNS_27}
    with store.write_engine.begin() as conn:
        _layout_before_7(store, conn)
        conn.execute(sa.text("DROP TABLE replica_leases"))
        conn.execute(sa.text("DROP TABLE experiments"))
        conn.execute(sa.text("ALTER TABLE audit_records DROP COLUMN policy"))
        conn.execute(sa.text("ALTER TABLE plans DROP COLUMN policy"))
        conn.execute(sa.text("DROP TABLE launch_requests"))
        conn.execute(sa.text("DROP TABLE launches"))
        conn.execute(sa.text("DELETE FROM schema_migrations WHERE version >= 3"))
        conn.execute(sa.text("DROP TABLE merkle_nodes"))
        conn.execute(sa.text("DROP TABLE rule_set_members"))
        conn.execute(sa.text("DROP TABLE rule_sets"))
        old = sa.Table("launches", sa.MetaData(), *[sa.Column(c.name, c.type, primary_key=c.primary_key)
                                                    for c in launches.columns if c.name not in new])
        old.create(conn)
        conn.execute(old.insert().values(
            launch_id="old1", sequence=1, plan_id="p", state="SUCCEEDED", principal="alice", dispatcher="local",
            tp=4, model_path="/m", workload_json='{"input_len": 1, "output_len": 1, "requests": 1, "concurrency": 1}',
            create_time="2026-01-01T00:00:00Z", update_time="2026-01-01T00:00:00Z", tokens_done=1, tokens_total=1,
            error="", report_json="", run_dir="/r", handle_json="", owner=""))
        conn.execute(old.insert().values(  # one with a report: migration 19 reads what it substituted
            launch_id="old2", sequence=2, plan_id="p", state="SUCCEEDED", principal="alice", dispatcher="local",
            tp=4, model_path="/m", workload_json='{"input_len": 1, "output_len": 1, "requests": 1, "concurrency": 1}',
            create_time="2026-01-01T00:00:01Z", update_time="2026-01-01T00:00:01Z", tokens_done=1, tokens_total=1,
            error="", report_json=json.dumps(measured_report(fidelity_report({"decode.backend": "substituted"}),
                                                             ttft=(40.0, 90.0))), run_dir="/r", handle_json="", owner=""))
    assert store.migrate() == list(range(3, 28))  # 4 builds the Merkle tree, 5 the rule sets, of the records there
    assert store.schema_version() == 27
    old = store.get_record(1)
    assert old is not None and old.schema_version == 1 and old.policy == "cgsvc"
    assert ExperimentStore(store).list_rows() == ([], "")
    assert [r.sequence for r in store.list_records('rule_id = "breakable.mla"')[0]] == [1]
    row = LaunchStore(store).list_rows()[0][0]
    assert [r.launch_id for r in LaunchStore(store).list_rows('substituted = "decode.backend"')[0]] == ["old2"]
    assert LaunchStore(store).list_rows('substituted = "none"')[0] == []  # old1 has no report: unknown
    assert [r.launch_id for r in LaunchStore(store).list_rows('dtype = "float32"')[0]] == ["old2"]
    assert row.launch_id == "old1" and row.devices == () and row.request_id == "" and row.placement == ""
    assert (row.prompt_tokens_done, row.prompt_tokens_total) == (0, 0)  # migration 16's columns, for a launch before it
    assert row.cancel_requested_by == ""
    assert row.engine == EngineSettings()  # migration 17's: a launch before it ran every default
    assert (row.capture_done, row.capture_total) == (0, 0)  # migration 18's
    assert row.rerun_of == "" and LaunchStore(store).list_rows('rerun_of = "launches/old1"')[0] == []  # 20's
    assert row.labels == "" and LaunchStore(store).list_rows('labels.team != "x"')[0] != []  # 23's: no labels
    assert row.experiment == "" and LaunchStore(store).list_rows('experiment = ""')[0] != []  # 24's: on its own
    assert [r.launch_id for r in LaunchStore(store).list_rows("ttft_ms_p99 > 50")[0]] == ["old2"]  # 27's, filled
    assert store.get_record(1) is not None and store.verify().ok


def fidelity_report(status: dict[str, str], dtype: str = "float32") -> dict[str, Any]:
    """A worker report's plan fidelity: every plan field honoured but those `status` gives."""
    from cgsvc.contract import PLAN_FIELDS

    return {"dtype": dtype,
            "plan_fidelity": [{"field": f, "status": status.get(f, "honoured")} for f in PLAN_FIELDS]}


def measured_report(report: dict[str, Any], ttft: tuple[float, float] | None = None,
                    tpot: tuple[float, float] | None = None, throughput: float | None = None) -> dict[str, Any]:
    """`report` with what its run measured, as the workers' aggregate says it (p50, p99): a
    percentile of no samples is left out, as the workers leave it."""
    def pct(pair: tuple[float, float] | None) -> dict[str, float]:
        return {"p50": pair[0], "p99": pair[1]} if pair else {}

    aggregate: dict[str, Any] = {"ttft_ms": pct(ttft), "tpot_ms": pct(tpot)}
    if throughput is not None:
        aggregate["throughput_tok_s"] = throughput
    return {**report, "status": "ok", "aggregate": aggregate}


def test_launches_are_found_by_what_they_measured(store: AuditStore) -> None:
    """"Which launches took over 200 ms to the first token?": `ttft_ms_p50 > 200` (and the other
    measures a report gives: ttft_ms_p99, tpot_ms_p50, tpot_ms_p99, throughput_tok_s) compares
    what the launch's report says it measured. A launch that measured nothing (no report yet, a
    failed group, TPOT of requests that ended at their first token) matches no comparison, = and
    != alike; a report that lands later is found from then on."""
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    launches = LaunchStore(store)
    planned = fidelity_report({})
    for launch_id, report in (
            ("fast", measured_report(planned, ttft=(80.0, 120.0), tpot=(9.5, 12.0), throughput=410.0)),
            ("slow", measured_report(planned, ttft=(250.0, 600.0), tpot=(30.0, 45.5), throughput=95.0)),
            ("one-token", measured_report(planned, ttft=(150.0, 160.0), throughput=20.0)),  # no second token
            ("failed", {"status": "failed", "error": "rank 1 exited"}),
            ("running", None)):
        launches.create(LaunchRow(launch_id, "p1", "RUNNING" if report is None else "SUCCEEDED", "alice", "local", 1,
                                  "/m", Workload(8, 8, 1, 1), "/r", report_json=json.dumps(report) if report else ""))

    def found(text: str) -> list[str]:
        return [r.launch_id for r in launches.list_rows(text)[0]]

    assert found("ttft_ms_p50 > 200") == ["slow"] and found("ttft_ms_p50 <= 150") == ["fast", "one-token"]
    assert found("ttft_ms_p99 >= 120.0 AND ttft_ms_p99 < 600") == ["fast", "one-token"]
    assert found("tpot_ms_p99 > 1") == ["fast", "slow"] and found("tpot_ms_p50 != 9.5") == ["slow"]  # measured only
    assert found("throughput_tok_s < 100") == ["slow", "one-token"] and found("throughput_tok_s = 410") == ["fast"]
    assert found("ttft_ms_p50 > 200 OR throughput_tok_s < 50") == ["slow", "one-token"]
    assert found("ttft_ms_p50 >= 0") == ["fast", "slow", "one-token"]  # not the failed one, nor the running one
    assert launches.update("running", state="SUCCEEDED", report_json=json.dumps(
        measured_report(planned, ttft=(300.0, 310.0), tpot=(5.0, 6.0), throughput=50.0)))
    assert found("ttft_ms_p50 > 200") == ["slow", "running"]
    for text, said in (('ttft_ms_p50 > "fast"', "ttft_ms_p50 takes a number"), ("tpot_ms_p99 < nan", "takes a number"),
                       ("throughput_tok_s > inf", "takes a number"),
                       ("ttft_ms > 1", "unknown field 'ttft_ms'; did you mean 'ttft_ms_p50'"),
                       ("stat = FAILED", "unknown field 'stat'; did you mean 'state'")):
        with pytest.raises(filters.FilterError, match=said):
            launches.list_rows(text)


def test_launches_are_listed_by_what_they_measured_slowest_first(store: AuditStore) -> None:
    """`order_by = "ttft_ms_p50 desc"`: the slowest starts first, ties in the order the launches
    were made, and those that measured nothing last whichever way; a page token goes on through
    ties and through those last ones, and is bound to the order."""
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    launches = LaunchStore(store)
    for launch_id, ttft in (("a", 100.0), ("b", 300.0), ("c", 100.0), ("d", None), ("e", 200.0), ("f", None)):
        report = measured_report(fidelity_report({}), ttft=(ttft, ttft), tpot=(1.0, 1.0)) if ttft else None
        launches.create(LaunchRow(launch_id, "p1", "SUCCEEDED" if report else "RUNNING", "alice", "local", 1, "/m",
                                  Workload(8, 8, 1, 1), "/r", report_json=json.dumps(report) if report else ""))

    def listed(order_by: str, text: str = "", page_size: int = 0) -> list[str]:
        out, token = [], ""
        while True:
            rows, token = launches.list_rows(text, page_size, token, order_by)
            out += [r.launch_id for r in rows]
            if not token:
                return out

    for size in (0, 1, 2):
        assert listed("ttft_ms_p50 desc", page_size=size) == ["b", "e", "a", "c", "d", "f"], size
        assert listed("TTFT_ms_p50", page_size=size) == listed("ttft_ms_p50 asc") == ["a", "c", "e", "b", "d", "f"]
    assert listed("ttft_ms_p99 desc", 'state = "SUCCEEDED" AND ttft_ms_p50 < 300', 1) == ["e", "a", "c"]
    assert listed("create_time desc") == ["f", "e", "d", "c", "b", "a"]
    _, slowest_first = launches.list_rows("", 2, "", "ttft_ms_p50 desc")
    for other in ("ttft_ms_p50 asc", "ttft_ms_p99 desc", "create_time desc"):
        with pytest.raises(PageTokenError, match="different filter or order"):
            launches.list_rows("", 2, slowest_first, other)
    for bad in ("ttft_ms_p50 down", "state desc", "ttft_ms_p50 desc, create_time"):
        with pytest.raises(filters.OrderError, match="or by one of ttft_ms_p50, ttft_ms_p99, tpot_ms_p50"):
            launches.list_rows(order_by=bad)

    # a page cut short because it would not fit in one message goes on from its last launch kept
    import asyncio

    from cgsvc import codec
    from cgsvc.server.services import list_page
    from cgsvc.v1 import launch_pb2

    got, token = [], ""
    while True:
        request = launch_pb2.ListLaunchesRequest(page_size=1000, page_token=token, order_by="ttft_ms_p50 desc")
        items, token = asyncio.run(list_page(launches.list_rows, request, codec.launch_proto, 1, launches.token_after))
        got += [item.name.removeprefix("launches/") for item in items]
        if not token:
            break
    assert got == ["b", "e", "a", "c", "d", "f"]


def test_launches_are_found_by_what_their_workers_ran(store: AuditStore) -> None:
    """"Which launches did not run as planned, and which ran a substituted decode backend?":
    `substituted = FIELD` finds the launches whose reports say that plan field ran as something
    else, `substituted = "none"` those that ran every field as planned; a launch with no report
    yet is in neither, nor in their `!=`. A report that lands later is found from then on."""
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    launches = LaunchStore(store)

    def made(launch_id: str, report: dict[str, Any] | None) -> None:
        state = "RUNNING" if not report else "FAILED" if report.get("status") == "failed" else "SUCCEEDED"
        launches.create(LaunchRow(launch_id, "p1", state, "alice", "local", 1, "/m",
                                  Workload(8, 8, 1, 1), f"/runs/{launch_id}",
                                  report_json=json.dumps(report) if report else ""))

    made("both", fidelity_report({"decode.backend": "substituted", "attention_backend.decode": "substituted"}))
    made("prefill", fidelity_report({"prefill.backend": "substituted", "prefill.num_tokens": "not_applicable"}))
    made("planned", fidelity_report({"chunked_prefill_size": "not_applicable"}, dtype="bfloat16"))
    made("running", None)
    made("failed", {"status": "failed", "error": "rank 1 exited", "plan_fidelity": []})  # ran nothing to compare

    def found(text: str) -> list[str]:
        return [r.launch_id for r in launches.list_rows(text)[0]]

    assert found('substituted = "decode.backend"') == ["both"]
    assert found('substituted = "Attention_Backend.Decode"') == ["both"]  # a closed set: any case
    assert found('substituted = "none"') == ["planned"]
    assert found('substituted != "none"') == ["both", "prefill"]  # every launch that did not run as planned
    assert found('substituted != "decode.backend"') == ["prefill", "planned"]
    assert found('substituted = "prefill.num_tokens"') == []  # not applicable is not a substitution
    assert found('substituted = "prefill.backend" AND state = "SUCCEEDED"') == ["prefill"]
    # and the dtype the model ran in, as the report says (not the engine setting asked for)
    assert found('dtype = "BFloat16"') == found('dtype = "bf16"') == ["planned"]  # as --dtype reads it
    assert found('dtype != "bfloat16"') == ["both", "prefill"]  # reported launches only
    assert launches.update("running", state="SUCCEEDED", report_json=json.dumps(fidelity_report(
        {"kv_cache_dtype": "substituted"})))
    assert found('substituted = "kv_cache_dtype"') == ["running"]
    for text, said in (('substituted = "decode"', "valid: none, attention_backend.prefill"),
                       ('substituted > "decode.backend"', "substituted takes = or !="),
                       ('dtype = "fp64"', "valid: float32, bfloat16, float16 \\(or half, fp16")):
        with pytest.raises(filters.FilterError, match=said):
            launches.list_rows(text)


def test_or_finds_what_matches_either_term_in_every_collection(store: AuditStore) -> None:
    """"Every launch that failed or was cancelled", "plans on GB300 or B200": terms joined by OR,
    binding tighter than AND (AIP-160), on each collection's fields of every kind: a plain
    column, a closed set, a label, a plan field of a launch (its plan's record), what a report
    says ran, an experiment's arm; page tokens carry on as for AND."""
    from cgsvc.launch.store import ExperimentRow, ExperimentStore, LaunchRow, LaunchStore, Workload

    for i, gpu in ((1, "H100"), (2, "GB300"), (3, "B200"), (4, "GB300")):
        store.append(entry(i, gpu=gpu, plan_id=f"p{i}", outcome_code=3 if i == 3 else 0), LISTING)
    assert [r.sequence for r in store.list_records('gpu = "gb300" OR gpu = "B200"')[0]] == [2, 3, 4]
    assert [r.sequence for r in store.list_records('(gpu = "gb300" OR gpu = "B200") AND outcome = "OK"')[0]] == [2, 4]
    assert [r.sequence for r in store.list_records('outcome != "OK" OR sequence = 1 OR rule_id = "nope"')[0]] == [1, 3]
    assert [p.row.plan_id for p in store.list_plans('gpu = "B200" OR model = "Qwen/Qwen3-8B"')[0]] == ["p2", "p3", "p4"]
    page, token = store.list_records('gpu = "GB300" OR gpu = "B200"', page_size=2)
    assert [r.sequence for r in page] == [2, 3] and [r.sequence for r in store.list_records(
        'gpu = "GB300" OR gpu = "B200"', page_size=2, page_token=token)[0]] == [4]

    launches = LaunchStore(store)
    for launch_id, plan, state, labels, report in (
            ("l1", "p1", "FAILED", "", ""), ("l2", "p2", "CANCELLED", ",team=infra,", ""),
            ("l3", "p3", "SUCCEEDED", ",team=ml,", json.dumps(fidelity_report({"decode.backend": "substituted"}))),
            ("l4", "p4", "SUCCEEDED", "", json.dumps(fidelity_report({})))):
        launches.create(LaunchRow(launch_id, plan, state, "alice", "local", 1, "/m", Workload(1, 1, 1, 1), "/r",
                                  labels=labels, report_json=report))

    def found(text: str) -> list[str]:
        return [r.launch_id for r in launches.list_rows(text)[0]]

    assert found('state = "FAILED" OR state = "cancelled"') == ["l1", "l2"]
    assert found("tp = 1 AND NOT tp > 1") == ["l1", "l2", "l3", "l4"] and found("tp >= 2") == []  # its TP group's size
    assert found('gpu = "H100" OR labels.team = "ml"') == ["l1", "l3"]  # a plan field or a label
    assert found('substituted != "none" OR NOT labels.team:*') == ["l1", "l3", "l4"]
    assert found('gpu = "GB300" OR gpu = "B200" AND state = "SUCCEEDED"') == ["l3", "l4"]
    assert found('rule_id = "breakable.mla" OR plan = "plans/p2"') == ["l1", "l2", "l3"]  # odd entries carry the rule
    assert found('(state = "FAILED" OR labels.team = "infra") AND (gpu = "H100" OR gpu = "GB300")') == ["l1", "l2"]

    # NOT: the opposite term, and of a group each term's opposite
    assert found('NOT rule_id = "breakable.mla"') == ["l2", "l4"]  # their plans' resolutions did not use it
    assert found('NOT (state = "FAILED" OR state = "CANCELLED")') == ["l3", "l4"]
    assert found('NOT (state = "SUCCEEDED" AND labels.team:*)') == ["l1", "l2", "l4"]
    assert found("NOT substituted = \"none\"") == ["l3"]  # as != reads it: launches with a report only
    store.append(entry(9, method="launch.state", rule_ids=()))  # no resolution: in neither rule_id = X nor !=
    assert [r.sequence for r in store.list_records('NOT rule_id = "breakable.mla"')[0]] == [2, 4]
    assert [r.sequence for r in store.list_records('rule_id != "attention.mha.hopper"')[0]] == [1, 3]

    experiments = ExperimentStore(store)
    experiments.create(ExperimentRow("e1", "SUCCEEDED", "alice", {"plans": ["plans/p1", "plans/p2"]}))
    experiments.create(ExperimentRow("e2", "FAILED", "bob", {"plans": ["plans/p3", "plans/p4"]}, labels=",team=ml,"))
    experiments.create(ExperimentRow("e3", "RUNNING", "bob", {"plans": ["plans/p2", "plans/p4"]}))
    assert [e.experiment_id for e in experiments.list_rows('plan = "p1" OR labels.team = "ml"')[0]] == ["e1", "e2"]
    assert [e.experiment_id for e in experiments.list_rows(
        'principal = "bob" AND (plan = "p2" OR state = "FAILED")')[0]] == ["e2", "e3"]
    with pytest.raises(filters.FilterError, match=r"\(a OR c\) AND \(b OR c\)"):
        launches.list_rows('(state = "FAILED" AND gpu = "H100") OR labels.team:*')


def test_a_prefix_finds_a_family_of_names(store: AuditStore) -> None:
    """`model = "deepseek-ai/*"` (in any case, as a model is named), `principal = "ci-*"` (as
    written), `rule_id = "breakable.*"` (any rule of the family), `method =
    "/cgsvc.v1.LaunchService/*"`, `labels.team = "infra_*"` (its _ as written, not a pattern)."""
    from cgsvc.launch.store import LaunchRow, LaunchStore, Workload

    store.append(entry(1, principal="ci-nightly"))  # DeepSeek-V3, breakable.mla
    store.append(entry(2, principal="CI-manual"))  # Qwen3-8B, attention.mha.hopper
    store.append(entry(3, principal="alice", method="/cgsvc.v1.LaunchService/CreateLaunch"))
    store.append(entry(4, principal="ci-", rule_ids=("breakable.gdn", "attention.mha.hopper")))

    def seqs(text: str) -> list[int]:
        return [r.sequence for r in store.list_records(text)[0]]

    assert seqs('principal = "ci-*"') == [1, 4] and seqs('principal != "ci-*"') == [2, 3]  # case as written
    assert seqs('model = "DEEPSEEK-ai/*"') == [1, 3] and seqs('model = "qwen/*" OR model = "x/*"') == [2, 4]
    assert seqs('rule_id = "breakable.*"') == [1, 3, 4] and seqs('rule_id = "attention.*"') == [2, 4]
    assert seqs('NOT rule_id = "breakable.*"') == [2]
    assert seqs('method = "/cgsvc.v1.LaunchService/*"') == [3] and seqs('principal = "*"') == [1, 2, 3, 4]
    assert seqs('method = "create*"') == [3] and seqs('method != "Resolve*"') == [3]  # RPCs by name, any case
    assert seqs('principal = "ci_*"') == []  # not a pattern
    launches = LaunchStore(store)
    for launch_id, labels in (("l1", ",team=infra_a,"), ("l2", ",team=infrax,"), ("l3", "")):
        launches.create(LaunchRow(launch_id, "p", "SUCCEEDED", "alice", "local", 1, "/m/kimi-k2.6", Workload(1, 1, 1, 1),
                                  "/r", labels=labels))
    found = [r.launch_id for r in launches.list_rows('labels.team = "infra_*"')[0]]
    assert found == ["l1"] and [r.launch_id for r in launches.list_rows('labels.team != "infra*"')[0]] == ["l3"]
    assert [r.launch_id for r in launches.list_rows('model_path = "/m/kimi*"')[0]] == ["l1", "l2", "l3"]
    with pytest.raises(filters.FilterError, match="outcome: a prefix"):
        store.list_records('outcome = "IN*"')


def test_filters_name_gpus_models_and_states_as_specs_do(store: AuditStore) -> None:
    """`gpu = "h100"` found nothing where `--gpu h100` resolves: a filter value of a closed set
    is matched as a spec's is (any case, a model by its alias too), a label kept as written
    (model.name beside model.path) is still found by what was written, and a state or backend
    outside its set is refused naming the set rather than answered with an empty page."""
    from cgsvc.launch.store import ExperimentStore, LaunchStore

    for i in range(1, 5):
        store.append(entry(i))
    store.append(entry(5, model="deepseek-v3"))  # a checkpoint labelled so (model.path): kept as given
    assert [r.sequence for r in store.list_records('gpu = "h100"')[0]] == [1, 2, 3, 4, 5]
    assert store.list_records('gpu != "H100"')[0] == []
    assert [r.sequence for r in store.list_records('model = "deepseek-v3"')[0]] == [1, 3, 5]
    assert [r.sequence for r in store.list_records('model = "DeepSeek-AI/deepseek-v3"')[0]] == [1, 3]
    assert [r.sequence for r in store.list_records('model != "DeepSeek-V3"')[0]] == [2, 4, 5]  # a label as written
    assert [r.sequence for r in store.list_records('model = "my/own-model"')[0]] == []  # unknown: as typed
    launches = LaunchStore(store)
    assert launches.list_rows('state = "running" AND dispatcher = "Local"') == ([], "")
    for text, field in (('state = "RUNING"', "state"), ('dispatcher = "slurm"', "dispatcher")):
        with pytest.raises(filters.FilterError, match=f"^{field}: unknown value .*valid: "):
            launches.list_rows(text)
    with pytest.raises(filters.FilterError, match="valid: RUNNING, SUCCEEDED, FAILED"):
        ExperimentStore(store).list_rows('state = "LOST"')
    with pytest.raises(filters.FilterError, match="valid: disabled, breakable, tc_piecewise, full"):
        store.list_plans('prefill_backend = "piecewise"')
    assert store.list_plans('prefill_backend = "TC_PIECEWISE" AND attention_decode = "FlashInfer"') == ([], "")


def test_a_time_in_a_filter_is_read_as_a_moment_whatever_its_offset(store: AuditStore) -> None:
    """Regression: `time > "2026-12-06T17:15:00+01:00"` compared the text with the stored UTC
    text, so an offset gave the wrong records, and `time > "yesterday"` answered an empty page.
    A time (records' `time`; launches', experiments' and plans' `create_time`) is now an RFC 3339
    moment, compared in UTC, and anything else is refused naming the form."""
    from cgsvc.launch.store import ExperimentStore, LaunchStore

    for i in range(1, 4):
        store.append(entry(i))
    times = [r.time for r in store.list_records()[0]]
    second = dt.datetime.fromisoformat(times[1])
    in_paris = second.astimezone(dt.timezone(dt.timedelta(hours=1))).isoformat()  # the same moment, +01:00
    assert [r.sequence for r in store.list_records(f'time >= "{in_paris}"')[0]] == [2, 3]
    assert [r.sequence for r in store.list_records(f'time = "{in_paris}"')[0]] == [2]
    assert [r.sequence for r in store.list_records(f'time < "{second.isoformat()}"')[0]] == [1]
    for text, lister in (('time > "yesterday"', store.list_records), ('create_time > "2026-12-06"', store.list_plans),
                         ('create_time < "2026-12-06T08:00:00"', LaunchStore(store).list_rows),
                         ('create_time < "12/06/2026"', ExperimentStore(store).list_rows)):
        with pytest.raises(filters.FilterError, match=r"time: an RFC 3339 time with an offset "
                                                      r"\(2026-12-06T08:00:00Z\); got "):
            lister(text)


def test_newest_first_pages_back_through_the_log(store: AuditStore) -> None:
    """AIP-132 order_by: `sequence desc` lists the most recent first and pages backwards; a page
    token is bound to its order as to its filter; any other order is refused, naming the valid
    ones."""
    from cgsvc.launch.store import ExperimentStore, LaunchStore

    for i in range(1, 12):
        store.append(entry(i))
    seen, token = [], ""
    while True:
        recs, token = store.list_records("", page_size=4, page_token=token, order_by="sequence desc")
        seen.append([r.sequence for r in recs])
        if not token:
            break
    assert seen == [[11, 10, 9, 8], [7, 6, 5, 4], [3, 2, 1]]
    assert [r.sequence for r in store.list_records('model = "Qwen/Qwen3-8B"', 3, "", "SEQUENCE  DESC")[0]] == [10, 8, 6]
    assert [r.sequence for r in store.list_records("", 2, "", "sequence asc")[0]] == [1, 2]
    _, oldest_first = store.list_records("", page_size=2)
    with pytest.raises(PageTokenError, match="different filter or order"):
        store.list_records("", page_size=2, page_token=oldest_first, order_by="sequence desc")
    for bad in ("time desc", "sequence descending", "sequence desc, time"):
        with pytest.raises(filters.OrderError, match=r"ordered by sequence only; give 'sequence' .* 'sequence desc'"):
            store.list_records("", order_by=bad)
    with pytest.raises(filters.OrderError, match="ordered by create_time only"):
        ExperimentStore(store).list_rows(order_by="ttft_ms_p50 desc")
    with pytest.raises(filters.OrderError, match="the order is by create_time or by one of ttft_ms_p50, "):
        LaunchStore(store).list_rows(order_by="sequence desc")
    with pytest.raises(filters.OrderError, match="did you mean 'ttft_ms_p50'"):
        LaunchStore(store).list_rows(order_by="ttft desc")


def test_filters_and_pagination(store: AuditStore) -> None:
    for i in range(1, 12):
        store.append(entry(i, outcome_code=3 if i == 4 else 0, principal="bob" if i > 8 else "alice"))
    recs, tok = store.list_records('rule_id = "breakable.mla"', page_size=2)
    seen = [r.sequence for r in recs]
    while tok:
        recs, tok = store.list_records('rule_id = "breakable.mla"', page_size=2, page_token=tok)
        seen += [r.sequence for r in recs]
    assert seen == [1, 3, 5, 7, 9, 11]
    assert [r.sequence for r in store.list_records("outcome = INVALID_ARGUMENT")[0]] == [4]
    assert [r.sequence for r in store.list_records('principal = "bob" AND model = "Qwen/Qwen3-8B"')[0]] == [10]
    assert [r.sequence for r in store.list_records("sequence >= 10")[0]] == [10, 11]
    t = store.get_record(5).time  # type: ignore[union-attr]
    assert [r.sequence for r in store.list_records(f'time > "{t}"', page_size=100)[0]] == list(range(6, 12))
    with pytest.raises(filters.FilterError, match="filterable fields"):
        store.list_records("colour = red")
    with pytest.raises(filters.FilterError, match="upper case; got 'or'"):
        store.list_records('model = "x" or gpu = "y"')
    with pytest.raises(filters.FilterError, match="outcome"):
        store.list_records("outcome = MAYBE")
    # an RPC by the name the listings show stands for its full name; a misspelt one is refused
    store.append(entry(12, method="/cgsvc.v1.LaunchService/CreateLaunch"))
    store.append(entry(13, method="launch.state", rule_ids=()))
    for text in ('method = "CreateLaunch"', 'method = createlaunch', 'method = "/cgsvc.v1.LaunchService/CreateLaunch"'):
        assert [r.sequence for r in store.list_records(text)[0]] == [12], text
    assert [r.sequence for r in store.list_records('method != "ResolvePlan"')[0]] == [12, 13]
    assert [r.sequence for r in store.list_records('method = "launch.state"')[0]] == [13]
    assert store.list_records('method = "/cgsvc.v1.Other/CreateLaunch"')[0] == []  # a full name as it is
    with pytest.raises(filters.FilterError, match="did you mean 'CreateLaunch'"):
        store.list_records('method = "CreateLanch"')
    with pytest.raises(filters.FilterError, match="only = and !="):
        store.list_records('method > "CreateLaunch"')
    with pytest.raises(PageTokenError):
        store.list_records("", page_token="garbage!")
    _, tok = store.list_records("", page_size=1)
    with pytest.raises(PageTokenError, match="different filter"):
        store.list_records('gpu = "H100"', page_token=tok)
    # Regression: a crafted token with the right filter digest and an "after" past int64 (or not
    # an integer) reached the driver: an INTERNAL OverflowError.
    import base64
    import json
    digest = json.loads(base64.urlsafe_b64decode(tok + "=" * (-len(tok) % 4)))["f"]
    for after in (1 << 63, 10 ** 30, -1, 2.5, "3", True):
        forged = base64.urlsafe_b64encode(json.dumps({"after": after, "f": digest}).encode()).decode()
        with pytest.raises(PageTokenError, match="not one this server issued"):
            store.list_records("", page_token=forged)


# The listing fields of a plan the appended record creates (its id is the entry's plan_id).
LISTING = PlanListing(prefill_backend="breakable", decode_backend="full", attention_prefill="fa3",
                      attention_decode="fa3")


def test_idempotency_replays_and_conflicts(store: AuditStore) -> None:
    first = store.append(entry(1, plan_id="p1"), LISTING, request_id="r-1")
    again = store.append(entry(1, plan_id="p2"), LISTING, request_id="r-1")
    assert again.replay_of is not None and again.replay_of.sequence == first.record.sequence
    assert again.record.plan_id == "p1" and store.get_plan("p2") is None
    other = store.append(entry(2, plan_id="p3"), LISTING, request_id="r-1")
    assert other.conflict and other.record.outcome_code == 3
    assert [p.row.plan_id for p in store.list_plans()[0]] == ["p1"]
    assert store.verify().ok


def _unique_record_hash_indexes(store: AuditStore) -> list[str]:
    with store.write_engine.begin() as conn:
        return [ix["name"] or "" for ix in sa.inspect(conn).get_indexes("audit_records")
                if ix["unique"] and ix["column_names"] == ["record_hash"]] + \
               [uc["name"] or "" for uc in sa.inspect(conn).get_unique_constraints("audit_records")
                if uc["column_names"] == ["record_hash"]]


def _layout_before_7(store: AuditStore, conn: sa.Connection) -> None:
    """Turn a current log back into the layout migration 7 found: idempotency keys in three
    B-trees, plans in a table of their own, a UNIQUE constraint on record_hash, Merkle nodes
    keyed by (level, idx), and on SQLite a sequence that is not the rowid."""
    from cgsvc.audit import merkle
    from cgsvc.audit.store import PLAN_COLUMNS, audit_records, idempotency_v1, plans_v1

    idempotency_v1.create(conn)
    conn.execute(sa.text("INSERT INTO idempotency (principal, method, request_id, sequence) "
                         "SELECT principal, method, request_id, sequence FROM idempotency_keys"))
    conn.execute(sa.text("DROP TABLE idempotency_keys"))
    plans_v1.create(conn)
    conn.execute(sa.text(
        "INSERT INTO plans (plan_id, sequence, create_time, principal, model, gpu, prefill_backend, decode_backend, "
        "attention_prefill, attention_decode, policy_version, plan_hash, spec_json, plan_json, policy) "
        "SELECT plan_id, sequence, time, principal, model, gpu, prefill_backend, decode_backend, attention_prefill, "
        "attention_decode, policy_version, plan_hash, '', '', policy FROM audit_records WHERE plan_created = 1"))
    for name in ("plan_created", *PLAN_COLUMNS):
        conn.execute(sa.text(f"ALTER TABLE audit_records DROP COLUMN {name}"))
    nodes = [(*merkle.node_at(pos), h) for pos, h in conn.execute(sa.text("SELECT pos, hash FROM merkle_nodes"))]
    conn.execute(sa.text("DROP TABLE merkle_nodes"))
    conn.execute(sa.text("CREATE TABLE merkle_nodes (level INTEGER NOT NULL, idx BIGINT NOT NULL, hash TEXT NOT NULL, "
                         "PRIMARY KEY (level, idx))"))
    for level, idx, h in nodes:
        conn.execute(sa.text("INSERT INTO merkle_nodes (level, idx, hash) VALUES (:l, :i, :h)"),
                     {"l": level, "i": idx, "h": h})
    if store.dialect == "postgresql":
        conn.execute(sa.text("ALTER TABLE audit_records ADD CONSTRAINT audit_records_record_hash_key "
                             "UNIQUE (record_hash)"))
    else:
        ddl = conn.execute(sa.text("SELECT sql FROM sqlite_master WHERE name = 'audit_records'")).scalar_one()
        conn.execute(sa.text(ddl.replace("sequence INTEGER", "sequence BIGINT", 1).rstrip().rstrip(")")
                             .replace("audit_records", "audit_records_old", 1) + ", UNIQUE (record_hash))"))
        conn.execute(sa.text("INSERT INTO audit_records_old SELECT * FROM audit_records"))
        conn.execute(sa.text("DROP TABLE audit_records"))
        conn.execute(sa.text("ALTER TABLE audit_records_old RENAME TO audit_records"))
        for index in audit_records.indexes:
            index.create(conn)
    conn.execute(sa.text("DELETE FROM schema_migrations WHERE version = 7"))


def test_migration_7_folds_plans_into_records_and_trims_the_append_path(store: AuditStore) -> None:
    """A log made before migration 7 is upgraded in place: its plans are read off the records
    that created them (listing fields and filters included), its idempotency keys still replay,
    its records still verify and filter, and the random-keyed record-hash index is gone."""
    first = store.append(entry(1, plan_id="p1"), LISTING, request_id="r-1")
    store.append(entry(2))
    with store.write_engine.begin() as conn:
        _layout_before_7(store, conn)
    assert _unique_record_hash_indexes(store)
    assert store.migrate() == [7]
    assert _unique_record_hash_indexes(store) == []
    with store.write_engine.begin() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        assert "plans" not in tables and "idempotency" not in tables
        assert [c["name"] for c in sa.inspect(conn).get_columns("merkle_nodes")] == ["pos", "hash"]
        if store.dialect == "sqlite":
            assert store._sqlite_rowid_sequence(conn)
    plan = store.get_plan("p1")
    assert plan is not None and plan.sequence == 1 and plan.row.prefill_backend == "breakable"
    assert plan.row.plan_json == first.record.plan_json and plan.row.model == "deepseek-ai/DeepSeek-V3"
    assert [p.row.plan_id for p in store.list_plans('decode_backend = "full"')[0]] == ["p1"]
    assert store.list_plans('create_time < "2000-01-01T00:00:00Z"')[0] == []
    again = store.append(entry(1, plan_id="p9"), LISTING, request_id="r-1")
    assert again.replay_of is not None and again.replay_of.sequence == first.record.sequence
    assert store.get_plan("p9") is None
    assert [r.sequence for r in store.list_records('model = "Qwen/Qwen3-8B"')[0]] == [2]
    assert [r.sequence for r in store.list_records('rule_id = "breakable.mla"')[0]] == [1, 3]
    v = store.verify()
    assert v.ok and v.records_checked == 3
    fresh = store.append(entry(5, plan_id="p5"), LISTING)
    assert store.get_plan("p5") is not None and fresh.record.sequence == 4 and store.verify().ok


PLAN_JSON = '{"decisions":[],"plan_hash":"ab12","policy":"cgsvc"}'


def test_a_plan_body_is_stored_once_and_read_back_whole(store: AuditStore) -> None:
    """Records of one plan share one stored body (migration 8): the record's column holds a
    reference, every read gives the plan JSON back, replays copy the body (not the reference),
    a second store on the same log reads it from the database, and the chain verifies."""
    first = store.append(entry(1, plan_id="p1", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING, request_id="r-1")
    store.append(entry(3, plan_id="p3", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING)
    replay = store.append(entry(1, plan_id="p9", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING, request_id="r-1")
    store.append(entry(2))  # no plan: nothing stored for it
    with store.write_engine.begin() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM plan_bodies")).scalar_one() == 1
        stored = list(conn.execute(sa.text("SELECT plan_json FROM audit_records ORDER BY sequence")).scalars())
    assert stored[0] == stored[1] == stored[2] and stored[0].startswith("@") and stored[3] == ""
    assert replay.replay_of is not None and replay.record.plan_json == PLAN_JSON
    other = AuditStore(store.url)
    try:
        for reader in (store, other):
            assert [r.plan_json for r in reader.list_records()[0]] == [PLAN_JSON] * 3 + [""]
            plan = reader.get_plan("p1")
            assert plan is not None and plan.row.plan_json == PLAN_JSON == first.record.plan_json
            assert reader.verify().ok
    finally:
        other.close()


def test_a_tampered_plan_body_is_caught_at_the_first_record_that_refers_to_it(store: AuditStore) -> None:
    store.append(entry(2))
    store.append(entry(1, plan_id="p1", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING)
    store.append(entry(3, plan_id="p3", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING)
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("UPDATE plan_bodies SET plan_json = :j"), {"j": PLAN_JSON.replace("cgsvc", "other")})
    fresh = AuditStore(store.url)  # one that has not read the body yet
    try:
        v = fresh.verify()
        assert not v.ok and v.first_bad_sequence == 2 and "modified" in v.reason
    finally:
        fresh.close()


def test_records_written_before_migration_8_keep_their_inline_plan(store: AuditStore) -> None:
    """A record whose column still holds the plan JSON itself (written before migration 8)
    reads and verifies as before, beside records that refer to a stored body."""
    store.append(entry(1, plan_id="p1", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING)
    with store.write_engine.begin() as conn:
        conn.execute(sa.text("UPDATE audit_records SET plan_json = :j WHERE sequence = 1"), {"j": PLAN_JSON})
        conn.execute(sa.text("DELETE FROM plan_bodies"))
    fresh = AuditStore(store.url)  # as after an upgrade: no body stored yet
    try:
        fresh.append(entry(3, plan_id="p3", plan_json=PLAN_JSON, plan_hash="ab12"), LISTING)
        assert [r.plan_json for r in fresh.list_records()[0]] == [PLAN_JSON, PLAN_JSON]
        assert fresh.verify().ok
    finally:
        fresh.close()


def test_tampering_is_located(store: AuditStore) -> None:
    for i in range(1, 8):
        store.append(entry(i))
    t = sa.Table("audit_records", sa.MetaData(), autoload_with=store.write_engine)
    with store.write_engine.begin() as conn:
        conn.execute(t.update().where(t.c.sequence == 4).values(model="edited"))
    v = store.verify()
    assert not v.ok and v.first_bad_sequence == 4 and "modified" in v.reason
    with store.write_engine.begin() as conn:  # undo, then delete a row in the middle
        conn.execute(t.update().where(t.c.sequence == 4).values(model="deepseek-ai/DeepSeek-V3" if 4 % 2 else "Qwen/Qwen3-8B"))
    assert store.verify().ok
    with store.write_engine.begin() as conn:
        conn.execute(t.delete().where(t.c.sequence == 3))
    v = store.verify()
    assert not v.ok and v.first_bad_sequence == 3 and "missing" in v.reason


def test_swapped_and_truncated_rows_are_located(store: AuditStore) -> None:
    for i in range(1, 8):
        store.append(entry(i))
    t = sa.Table("audit_records", sa.MetaData(), autoload_with=store.write_engine)
    with store.write_engine.begin() as conn:
        conn.execute(t.update().where(t.c.sequence == 5).values(sequence=-5))
        conn.execute(t.update().where(t.c.sequence == 6).values(sequence=5))
        conn.execute(t.update().where(t.c.sequence == -5).values(sequence=6))
    v = store.verify()
    assert not v.ok and v.first_bad_sequence == 5
    with store.write_engine.begin() as conn:
        conn.execute(t.update().where(t.c.sequence == 5).values(sequence=-5))
        conn.execute(t.update().where(t.c.sequence == 6).values(sequence=5))
        conn.execute(t.update().where(t.c.sequence == -5).values(sequence=6))
        conn.execute(t.delete().where(t.c.sequence == 7))
    v = store.verify()
    assert not v.ok and v.first_bad_sequence == 7 and "chain head" in v.reason


def test_group_commit_writer_concurrent(store: AuditStore) -> None:
    batches: list[int] = []
    writer = AuditWriter(store, observe=lambda n, _s: batches.append(n))
    futures = []
    lock = threading.Lock()

    def client(k: int) -> None:
        for i in range(25):
            f = writer.submit(PendingAppend(entry(k * 100 + i)))
            with lock:
                futures.append(f)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    seqs = sorted(f.result(timeout=60).record.sequence for f in futures)
    writer.close()
    assert seqs == list(range(1, 201))
    assert sum(batches) == 200
    assert store.verify().ok


def test_process_writer_keeps_a_cohort_in_one_commit(store: AuditStore) -> None:
    """The writer process holds a commit open for as many records as its previous commit
    answered (up to cohort_wait, and cohort_gap after the last append), so callers answered
    together are committed together again; a lone caller's cohort is one, so it never waits;
    with cohort_wait 0 nothing waits, and a straggler later than the gap is not waited for."""
    import asyncio

    from cgsvc.audit.writer import ProcessAuditWriter

    async def run(cohort_wait: float, cohort_gap: float) -> list[int]:
        batches: list[int] = []
        writer = ProcessAuditWriter(store, observe=lambda n, _s: batches.append(n), cohort_wait=cohort_wait,
                                    cohort_gap=cohort_gap)
        try:
            # A lone caller (the first commit's cohort is one) is answered without waiting.
            await asyncio.wait_for(writer.submit_async(PendingAppend(entry(1))), timeout=20)
            first = [writer.submit_async(PendingAppend(entry(i))) for i in range(2, 5)]  # one turn: one message
            await asyncio.gather(*first)
            # The cohort of three comes back one at a time.
            second = [writer.submit_async(PendingAppend(entry(5)))]
            await asyncio.sleep(0.2)
            second += [writer.submit_async(PendingAppend(entry(i))) for i in (6, 7)]
            await asyncio.wait_for(asyncio.gather(*second), timeout=20)
        finally:
            await writer.aclose()
        return batches

    assert asyncio.run(run(cohort_wait=30.0, cohort_gap=30.0)) == [1, 3, 3]
    assert asyncio.run(run(cohort_wait=0.0, cohort_gap=30.0)) == [1, 3, 1, 2]
    assert asyncio.run(run(cohort_wait=30.0, cohort_gap=0.05)) == [1, 3, 1, 2]
    v = store.verify()
    assert v.ok and v.records_checked == 21


def test_process_writer_answers_each_record_as_the_store_holds_it(store: AuditStore) -> None:
    """Results cross the writer's socket as the chain's four values for an append recorded as
    sent, and whole otherwise; either way the caller's record is the stored one (spec and plan
    JSON included): a plain append, a replay, a reused request id and a NUL written `\\u0000`."""
    import asyncio

    from cgsvc.audit.writer import ProcessAuditWriter

    plan = dict(plan_id="p1", plan_json='{"p":1}', plan_hash="ab12")
    items = [PendingAppend(entry(1, **plan), LISTING, "r-1"),
             PendingAppend(entry(1, **plan), LISTING, "r-1"),  # the same request again: a replay
             PendingAppend(entry(3, plan_id="p3"), None, "r-1"),  # same id, other spec: a conflict
             PendingAppend(entry(5, outcome_message="bad\x00byte"), None, "")]

    frozen: list[int] = []

    async def run_and_look() -> list[Any]:
        writer = ProcessAuditWriter(store)
        # The child froze what start-up made out of its collector (a full collection walking it
        # stalled a commit 45 ms every few seconds); it says how much when it is ready.
        frozen.append(writer.child_frozen_objects)
        try:
            return list(await asyncio.gather(*(writer.submit_async(i) for i in items)))
        finally:
            await writer.aclose()

    results = asyncio.run(run_and_look())
    assert frozen[0] > 10_000
    for result in results:
        assert result.record == store.get_record(result.record.sequence)
    assert results[0].record.plan_json == '{"p":1}' and results[0].replay_of is None
    assert results[1].replay_of is not None and results[1].replay_of.sequence == results[0].record.sequence
    assert results[2].conflict and results[2].record.outcome_code == 3
    assert results[3].record.outcome_message == "bad\\u0000byte"
    assert store.verify().ok


def test_writer_process_commits_once_half_the_waiting_appends_have_joined(tmp_path: Path) -> None:
    """The child holds a commit open until half of the appends the parent has waiting for an
    answer are in it (the other half fill the next commit meanwhile): a lone caller's append
    is committed at once; with four waiting, the first is held (for the wait given, 30 s
    here) until the second joins, and the two are one commit. With that many waiting lately,
    a lone append is held again, until the gap after it ends."""
    import multiprocessing as mp
    import socket

    from cgsvc.audit.writer import _Channel, _frame, _to_wire, _writer_process

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    AuditStore(url).close()
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_writer_process, args=(url, child, 256, 30.0, 3.0), daemon=True)
    proc.start()
    child.close()
    assert parent.recv()[0] == "ready"
    sock = socket.socket(fileno=os.dup(parent.fileno()))
    chan = _Channel(sock.fileno())
    sock.close()

    def send(waiting: int, *seqs: int) -> None:
        os.write(parent.fileno(), _frame((waiting, [_to_wire(PendingAppend(entry(i), None, "")) for i in seqs])))

    try:
        send(1, 1)
        assert chan.poll(20.0)
        status, results, stats = chan.recv()
        assert status == "ok" and stats[0] == 1 and results[0][0] == 1
        send(3, 2)  # three waiting lately: this one waits for a second
        assert not chan.poll(0.3)
        send(4, 3)
        assert chan.poll(20.0)
        first, second = chan.recv(), chan.recv()
        assert first[2][0] == 2 and second[2] is None  # one commit answered both messages
        assert [r[0] for r in first[1] + second[1]] == [2, 3]
        send(1, 4)  # alone now, but four were waiting a moment ago: held until the 3 s gap ends
        assert not chan.poll(0.3)
        assert chan.poll(20.0) and chan.recv()[2][0] == 1
    finally:
        os.write(parent.fileno(), _frame(None))
        proc.join(20)
        chan.close()
        parent.close()
    assert AuditStore(url).verify().records_checked == 4


def test_writer_channel_reads_frames_however_the_socket_cuts_them() -> None:
    """The writer process's end of the socket parses the parent's framing from a buffer: a
    frame split across reads, several frames in one read, a frame larger than a read, and end
    of file (EOFError, also after half a frame); every answer of a commit leaves in one write."""
    import pickle
    import socket
    import struct

    from cgsvc.audit.writer import _Channel

    parent, child = socket.socketpair()
    chan = _Channel(child.fileno())
    child.close()
    frames = [struct.pack("!i", len(d)) + d for d in (pickle.dumps(m) for m in ("one", ["two"], None))]
    data = b"".join(frames)
    parent.sendall(data[:3])  # not even a whole length yet
    assert not chan.poll(0.01)
    parent.sendall(data[3:len(frames[0]) + 2])
    assert chan.poll(1.0) and chan.recv() == "one"
    parent.sendall(data[len(frames[0]) + 2:])  # the rest of the second and all of the third
    assert chan.recv() == ["two"] and chan.poll(0) and chan.recv() is None
    assert not chan.poll(0)
    chan.send_all([("ok", [1], None), ("ok", [2], None)])
    got = parent.recv(1 << 16)
    first = struct.unpack_from("!i", got)[0]
    assert pickle.loads(got[4:4 + first]) == ("ok", [1], None)
    assert pickle.loads(got[8 + first:]) == ("ok", [2], None)
    big = pickle.dumps("x" * (3 << 20))  # three times the area a read goes through
    sender = threading.Thread(target=parent.sendall, args=(struct.pack("!i", len(big)) + big,))
    sender.start()
    assert chan.recv() == "x" * (3 << 20)
    sender.join()
    parent.sendall(frames[0][:5])
    parent.close()
    assert chan.poll(1.0)  # end of file is something to take
    with pytest.raises(EOFError):
        chan.recv()
    chan.close()


def test_an_open_batch_chains_appends_as_they_arrive_and_commits_them_together(store: AuditStore) -> None:
    """AuditStore.open_batch: appends added one message at a time form one commit with one
    time, contiguous sequences and replays honoured across messages; nothing is visible
    before the commit, and a batch that fails is rolled back whole and the store goes on."""
    store.append(entry(1, plan_id="p1"), LISTING, request_id="r-old")
    batch = store.open_batch()
    batch.add([PendingAppend(entry(2, plan_id="p2"), LISTING, "r-a")])
    batch.add([PendingAppend(entry(3, plan_id="p3"), LISTING, "r-b"),
               PendingAppend(entry(2, plan_id="p9"), LISTING, "r-a")])  # the same request as the first
    batch.add([PendingAppend(entry(1, plan_id="p8"), LISTING, "r-old")])  # a request committed before
    assert store.tree_head()[0] == 1  # nothing committed yet
    results = batch.commit()
    assert [r.record.sequence for r in results] == [2, 3, 4, 5]
    assert len({r.record.time for r in results}) == 1
    assert results[2].replay_of is not None and results[2].replay_of.sequence == 2
    assert results[2].record.plan_id == "p2"
    assert results[3].replay_of is not None and results[3].replay_of.sequence == 1
    assert store.get_plan("p9") is None and store.get_plan("p3") is not None

    failing = store.open_batch()
    failing.add([PendingAppend(entry(4))])
    with pytest.raises(TypeError):
        failing.add([PendingAppend(entry(5, rule_ids=(object(),)))])  # type: ignore[arg-type]
        failing.commit()
    assert store.tree_head()[0] == 5  # the failed batch left nothing
    assert store.append(entry(6)).record.sequence == 6
    v = store.verify()
    assert v.ok and v.records_checked == 6


def test_secrets_are_masked() -> None:
    masked = mask_secrets({"model": {"path": "https://user:hunter2@hub.example/m"}, "api_token": "abc",
                           "x": [{"password": "p"}]})
    assert masked == {"model": {"path": "https://***@hub.example/m"}, "api_token": "***", "x": [{"password": "***"}]}


def test_cancelled_waiter_is_still_audited_and_writer_survives(store: AuditStore) -> None:
    """Regression: a caller whose deadline expired cancelled its future, set_result raised in the
    writer thread, and every later append hung."""
    writer = AuditWriter(store)
    fut = writer.submit(PendingAppend(entry(1)))
    fut.cancel()
    assert writer.submit(PendingAppend(entry(2))).result(timeout=30).record.sequence == 2
    writer.close()
    assert store.get_record(1) is not None and store.verify().ok


def test_postgresql_appends_in_one_round_trip_and_falls_back_when_it_must() -> None:
    """With the head it last committed, a PostgreSQL store appends without reading first; when
    another replica moved the head, or a request id was seen before, that transaction aborts
    whole and the batch is appended the locked way: one chain, replays honoured."""
    url = pg_url_or_skip(f"store_{uuid.uuid4().hex[:10]}")
    a, b = AuditStore(url), AuditStore(url)
    try:
        a.append(entry(1))
        a.append(entry(2))  # optimistic, on the head a just committed
        assert a._pg_head is not None and a._pg_stale == 0
        b.append(entry(3))  # another replica moves the head
        a.append(entry(4))  # a's remembered head is stale: aborted, then appended after 3
        assert a._pg_stale == 1
        first = a.append(entry(5, plan_id="p5"), LISTING, request_id="r-5")
        again = a.append(entry(5, plan_id="p6"), LISTING, request_id="r-5")  # a known key: aborted, replayed
        assert a._pg_stale == 2
        assert again.replay_of is not None and again.replay_of.sequence == first.record.sequence
        assert [r.sequence for r in a.list_records()[0]] == [1, 2, 3, 4, 5, 6]
        assert a.get_plan("p6") is None and a.verify().ok and b.verify().ok
    finally:
        a.close()
        b.close()


def test_postgresql_one_statement_append_writes_every_table() -> None:
    """Regression for the one-statement append (the optimistic path): a batch that brings a new
    plan body, a new rule set, a plan listing, an idempotency key and its replay in the same
    batch writes them all, exactly as the locked path would, and nothing shows stale."""
    url = pg_url_or_skip(f"store_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)
    try:
        s.append(entry(1))  # the first batch reads the head; the rest extend it without reading
        plan = '{"plan": "one"}'
        first, replay, other = s.append_batch([
            PendingAppend(entry(2, plan_id="p2", plan_json=plan, plan_hash="h2", rule_ids=("new.rule", "b.rule")),
                          LISTING, request_id="r-2"),
            PendingAppend(entry(2, plan_id="p3", plan_json=plan, plan_hash="h2", rule_ids=("new.rule", "b.rule")),
                          LISTING, request_id="r-2"),
            PendingAppend(entry(3), None, request_id="r-3")])
        assert s._pg_stale == 0 and s._pg_head is not None and s._pg_head[0] == 4
        assert replay.replay_of is not None and replay.replay_of.sequence == first.record.sequence == 2
        stored = s.get_plan("p2")
        assert stored is not None and stored.row.plan_json == plan and stored.row.prefill_backend == LISTING.prefill_backend
        assert s.get_plan("p3") is None
        assert [r.sequence for r in s.list_records('rule_id = "new.rule"')[0]] == [2, 3]
        again = s.append(entry(3), request_id="r-3")  # the key of record 4 was stored: a replay
        assert again.replay_of is not None and again.replay_of.sequence == other.record.sequence == 4
        assert s.verify().ok and s.tree_head()[0] == 5
    finally:
        s.close()


def _cut(application_name: str) -> None:
    """What a PostgreSQL restart, a failover or an idle timeout does to a store's connections:
    every backend of the sessions named `application_name` ended, from another session."""
    eng = sa.create_engine(PG_BASE)
    with eng.begin() as conn:
        ended = conn.exec_driver_sql("SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                     "WHERE application_name = %(n)s) AS t", {"n": application_name}).scalar()
    eng.dispose()
    assert ended, f"no session of {application_name} was found to end"


def _named(schema: str) -> tuple[str, str]:
    """A PostgreSQL URL whose sessions carry a name of their own (application_name), and the name."""
    name = f"cgsvc-test-{uuid.uuid4().hex[:10]}"
    return f"{pg_url_or_skip(schema)}&application_name={name}", name


def test_postgresql_appends_again_after_its_connection_was_cut() -> None:
    """Regression: the first batch after the server ended the store's append connection (a
    restart, a failover, an idle timeout) failed every caller in it, INTERNAL and unaudited.
    Nothing of that batch was written, so it is appended once more on a new connection, on the
    one-statement path (the head known) and the locked one (the head read first)."""
    url, name = _named(f"store_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)
    try:
        s.append(entry(1))
        assert s._pg_head is not None  # the next append is the one-statement kind
        _cut(name)
        assert s.append(entry(2)).record.sequence == 2
        s._pg_head = None  # the locked path's turn
        _cut(name)
        first = s.append(entry(3), request_id="r-3")
        assert first.record.sequence == 3 and first.replay_of is None
        assert s.append(entry(3), request_id="r-3").replay_of is not None  # its key was stored once
        assert [r.sequence for r in s.list_records()[0]] == [1, 2, 3, 4] and s.verify().ok
    finally:
        s.close()


def test_a_batch_whose_commit_landed_is_not_appended_again() -> None:
    """Where the answer to the COMMIT is what the lost connection took, the batch is in the log:
    its own results answer, and nothing is appended twice. Other failures are not guessed at."""
    import psycopg

    url = pg_url_or_skip(f"store_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)
    try:
        s.append(entry(1))
        items = [PendingAppend(entry(2)), PendingAppend(entry(3))]
        batch = s.open_batch()
        batch.add(items)
        landed = batch.commit()
        lost = psycopg.OperationalError("server closed the connection unexpectedly")
        again = s.append_again(items, batch, lost)
        assert [r.record.record_hash for r in again] == [r.record.record_hash for r in landed]
        assert s.tree_head()[0] == 3 and s.verify().ok
        with pytest.raises(ValueError):  # not a lost connection: raised as it was
            s.append_again(items, batch, ValueError("a bug"))
        assert s.tree_head()[0] == 3
    finally:
        s.close()


def test_the_writer_process_appends_again_after_its_connection_was_cut() -> None:
    """The server's writer process, whose connection the database ended: the callers of the next
    batch are answered with their records, as if nothing had happened."""
    import asyncio

    from cgsvc.audit.writer import ProcessAuditWriter

    url, name = _named(f"store_{uuid.uuid4().hex[:10]}")
    s = AuditStore(url)

    async def run() -> list[int]:
        writer = ProcessAuditWriter(s)
        try:
            first = await asyncio.wait_for(writer.submit_async(PendingAppend(entry(1))), timeout=20)
            _cut(name)
            later = await asyncio.wait_for(asyncio.gather(*(writer.submit_async(PendingAppend(entry(i)))
                                                            for i in (2, 3))), timeout=20)
        finally:
            await writer.aclose()
        return [r.record.sequence for r in (first, *later)]

    try:
        assert asyncio.run(run()) == [1, 2, 3]
        assert s.verify().ok and s.tree_head()[0] == 3
    finally:
        s.close()


def test_a_nul_character_is_recorded_escaped_and_fails_no_one_else(store: AuditStore) -> None:
    """Regression: on PostgreSQL (text cannot hold U+0000) one caller's NUL failed the whole
    batch — its own record and every other caller's with it. Both stores now record a NUL as
    the six characters \\u0000, so the batch commits, the hash is the same on either store, and
    the key still replays."""
    from cgsvc.audit.store import NUL_MARK

    clean, dirty = store.append_batch([
        PendingAppend(entry(1)),
        PendingAppend(entry(2, model="deep\x00seek", outcome_message="bad \x00", rule_ids=("r\x00",),
                            request_id="id\x00x"), None, request_id="id\x00x")])
    assert clean.record.sequence == 1 and dirty.record.sequence == 2
    got = store.get_record(2)
    assert got is not None and got.model == f"deep{NUL_MARK}seek" and got.outcome_message == f"bad {NUL_MARK}"
    assert got.rule_ids == (f"r{NUL_MARK}",) and got.request_id == f"id{NUL_MARK}x"
    assert got.record_hash == dirty.record.record_hash and store.verify().ok
    again = store.append(entry(2, model="deep\x00seek"), request_id="id\x00x")
    assert again.replay_of is not None and again.replay_of.sequence == 2


def _largest_wal(tmp_path: Path, name: str, restart_frames: int, records: int = 800) -> tuple[int, Any]:
    """Append `records` records four to a commit with no pause: the largest the write-ahead log
    file grew (bytes), and the store's checkpointer."""
    import os
    url = f"sqlite:///{tmp_path / name}"
    store = AuditStore(url, wal_checkpoint_every=16, wal_restart_frames=restart_frames)
    largest = 0
    try:
        for i in range(1, records + 1, 4):
            store.append_batch([PendingAppend(entry(j)) for j in range(i, i + 4)])
            largest = max(largest, os.path.getsize(tmp_path / f"{name}-wal"))
        v = store.verify()
        assert v.ok and v.records_checked == records
        checkpointer = store._checkpointer
    finally:
        store.close()
    return largest, checkpointer


def test_sqlite_checkpoints_run_beside_the_commits_and_keep_the_log_bounded(tmp_path: Path) -> None:
    """The append connection never checkpoints inside a commit (wal_autocheckpoint=0: a commit
    that crossed SQLite's threshold waited 5-20 ms for it, and every caller of its batch with
    it); a thread of the store's copies the log into the database beside the commits. Under
    appends that never pause, a passive checkpoint never finds the log wholly copied between two
    commits, so the log only grows; past `wal_restart_frames` the thread restarts it, and it
    stays bounded."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    store = AuditStore(url)
    try:
        store.append(entry(1))
        assert store._append_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        checkpointer = store._checkpointer
        assert checkpointer is not None
    finally:
        store.close()
    assert not checkpointer._thread.is_alive()

    unbounded, passive_only = _largest_wal(tmp_path, "passive.db", restart_frames=1 << 40)
    bounded, restarting = _largest_wal(tmp_path, "restart.db", restart_frames=64)
    assert passive_only.checkpoints >= 1 and passive_only.restarts == 0
    assert restarting.restarts >= 1
    assert bounded < unbounded * 0.6, f"the log grew to {bounded} bytes with restarts, {unbounded} without"


def test_sqlite_checkpoints_can_stay_inside_the_commits(tmp_path: Path) -> None:
    """wal_checkpoint_every=0: no thread; SQLite checkpoints inside the commits, as it does by
    default (bench/commit_tail.py measures one against the other)."""
    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}", wal_checkpoint_every=0)
    try:
        store.append(entry(1))
        assert store._checkpointer is None
        assert store._append_conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 1000
    finally:
        store.close()


def test_leases_are_renewed_and_lapse_on_the_database_clock(store: AuditStore) -> None:
    from cgsvc.domain.launches import ACTIVE
    from cgsvc.launch.store import (
        ExperimentRow,
        ExperimentStore,
        LaunchRow,
        LaunchStore,
        LeaseStore,
        Workload,
    )
    leases = LeaseStore(store)
    assert leases.renew("r0", "host-a") is None  # the first renewal makes the lease
    assert leases.renew("r1", "host-b") is None
    gap = leases.renew("r0", "host-a")
    assert gap is not None and 0 <= gap < 5
    launch = LaunchStore(store).create(LaunchRow("l1", "p1", "RUNNING", "alice", "local", 1, "/m",
                                                 Workload(8, 8, 1, 1), "/runs/l1", owner="r1")).row
    assert leases.lapsed(5.0, "r1", ACTIVE) == []  # both were renewed just now
    # r1 stops renewing: after a lease time it has lapsed, for everyone but itself
    with store.write_engine.begin() as conn:
        conn.exec_driver_sql("UPDATE replica_leases SET renewed_at = renewed_at - 60 WHERE owner = 'r1'")
    lapsed = leases.lapsed(30.0, "r0", ACTIVE)
    assert [(x.owner, x.host) for x in lapsed] == [("r1", "host-b")] and 60 <= lapsed[0].age < 70
    assert leases.lapsed(30.0, "r1", ACTIVE) == []
    assert leases.lapsed(90.0, "r0", ACTIVE) == []
    assert [x.owner for x in leases.leases()] == ["r0", "r1"]  # the most recently renewed first
    # a lapsed replica that supervises nothing active is not worth taking over ...
    assert LaunchStore(store).update(launch.launch_id, state="SUCCEEDED")
    assert leases.lapsed(30.0, "r0", ACTIVE) == []
    # ... unless an experiment of its still runs
    ExperimentStore(store).create(ExperimentRow("e1", "RUNNING", "alice", {}, owner="r1"))
    assert [x.owner for x in leases.lapsed(30.0, "r0", ACTIVE)] == ["r1"]
    assert leases.forget(30.0, ACTIVE) == []  # it still holds something: kept
    assert ExperimentStore(store).update(ExperimentRow("e1", "FAILED", "alice", {}, owner="r1")) is not None
    assert leases.forget(90.0, ACTIVE) == []  # not lapsed long enough
    assert leases.forget(30.0, ACTIVE) == ["r1"]  # lapsed, holding nothing: forgotten
    assert [x.owner for x in leases.leases()] == ["r0"]
    assert leases.renew("r1", "host-c") is None  # it comes back: a new lease
    with store.write_engine.begin() as conn:
        conn.exec_driver_sql("UPDATE replica_leases SET renewed_at = renewed_at - 60 WHERE owner = 'r1'")
    again = leases.renew("r1", "host-c")  # renewing says how long it was away
    assert again is not None and again >= 60 and leases.lapsed(30.0, "r0", ACTIVE) == []


@pytest.mark.parametrize(("version", "column"), [(13, "version"), (14, "address")])
def test_migrations_13_and_14_add_the_release_and_address_to_leases_that_predate_them(
        store: AuditStore, version: int, column: str) -> None:
    """A lease written before migration 13 (14) reads with no release (address); the next
    renewal says it."""
    from cgsvc import __version__
    from cgsvc.launch.store import LeaseStore

    leases = LeaseStore(store)
    leases.renew("r1", "host-a", "host-a:50051")
    with store.write_engine.begin() as conn:
        conn.execute(sa.text(f"ALTER TABLE replica_leases DROP COLUMN {column}"))
        conn.execute(sa.text(f"DELETE FROM schema_migrations WHERE version = {version}"))
    assert store.migrate() == [version]
    (lease,) = leases.leases()
    assert (lease.owner, lease.host, getattr(lease, column)) == ("r1", "host-a", "")
    leases.renew("r1", "host-a", "host-a:50051")
    assert (leases.leases()[0].version, leases.leases()[0].address) == (__version__, "host-a:50051")


def test_an_interrupt_between_a_commits_steps_gives_the_store_back(store: AuditStore,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal (Ctrl-C, a KeyboardInterrupt) landing after append_batch has opened its commit
    and before `add` guards itself left the append lock held: every later append waited for ever.
    Here `add` raises at its first line, as such an interrupt would."""
    from cgsvc.audit.store import AppendBatch

    assert store.append(entry(1)).record.sequence == 1

    def interrupted(self: AppendBatch, items: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(AppendBatch, "add", interrupted)
    with pytest.raises(KeyboardInterrupt):
        store.append_batch([PendingAppend(entry(2))])
    monkeypatch.undo()
    done: list[int] = []
    later = threading.Thread(target=lambda: done.append(store.append(entry(2)).record.sequence), daemon=True)
    later.start()
    later.join(30)
    if not done:  # the bug: free the lock, so that the failure is reported rather than the close hanging
        store._append_lock.release()  # noqa: SLF001
    assert done == [2], "the next append waited on a lock the interrupted commit kept"
    assert store.verify().ok and store.verify().records_checked == 2
