"""The durable-path target line of bench/resolve_load.py names each row that misses it."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

spec = importlib.util.spec_from_file_location("resolve_load", Path(__file__).parents[2] / "bench" / "resolve_load.py")
assert spec is not None and spec.loader is not None
resolve_load = importlib.util.module_from_spec(spec)
spec.loader.exec_module(resolve_load)
sys.modules.setdefault("resolve_load", resolve_load)  # resolve_cpu imports it by that name
cpu_spec = importlib.util.spec_from_file_location("resolve_cpu", Path(__file__).parents[2] / "bench" / "resolve_cpu.py")
assert cpu_spec is not None and cpu_spec.loader is not None
resolve_cpu = importlib.util.module_from_spec(cpu_spec)
sys.modules.setdefault("resolve_cpu", resolve_cpu)  # its dataclass looks its module up there
cpu_spec.loader.exec_module(resolve_cpu)


def test_rows_that_miss_the_target_are_named() -> None:
    echo = (2000.0, 3.0, 10.0, 0)
    assert resolve_load.target_misses("sqlite", 8, echo, (1000.0, 6.0, 30.0, 0)) == []  # 50 %: met
    assert resolve_load.target_misses("sqlite", 8, echo, (990.0, 6.0, 30.0, 0)) == [
        "sqlite at 8 callers 49.5% of Echo"]
    assert resolve_load.target_misses("postgresql", 32, echo, (1200.0, 9.0, 20.0, 0)) == []  # 20 ms floor
    assert resolve_load.target_misses("postgresql", 32, (2000.0, 3.0, 30.0, 0), (900.0, 9.0, 61.0, 0)) == [
        "postgresql at 32 callers 45.0% of Echo", "postgresql p99 at 32 callers 61.0 ms > 60.0"]
    assert resolve_load.target_misses("sqlite", 1, echo, (100.0, 1.0, 99.0, 0)) == []  # not a target row


def test_a_throughput_miss_says_how_busy_the_cores_were_where_that_was_measured() -> None:
    echo = (2000.0, 3.0, 10.0, 0, 0.914)
    assert resolve_load.target_misses("postgresql", 8, echo, (940.0, 6.0, 30.0, 0, 0.776)) == [
        "postgresql at 8 callers 47.0% of Echo (cores busy 91% / 78%)"]
    assert resolve_load.target_misses("postgresql", 8, echo, (940.0, 6.0, 30.0, 0, None)) == [
        "postgresql at 8 callers 47.0% of Echo (cores busy 91% / -)"]
    assert resolve_load.busy_pair((1.0, 0, 0, 0, None), (1.0, 0, 0, 0)) == "- / -"


def test_cores_busy_is_read_from_proc_stat_without_idle_iowait_or_steal(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    #                user nice system idle iowait irq softirq steal guest guest_nice
    stat.write_text("cpu  100 5 40 300 20 3 2 30 0 0\ncpu0 50 2 20 150 10 1 1 15 0 0\n")
    assert resolve_load.cpu_times(str(stat)) == (150, 470)  # busy 100+5+40+3+2; all without steal
    assert resolve_load.busy_share((150, 470), (250, 670)) == (100, 200)
    assert resolve_load.busy_share(None, (250, 670)) == (0, 0)
    assert resolve_load.cpu_times(str(tmp_path / "absent")) is None
    stat.write_text("intr 1 2 3\n")
    assert resolve_load.cpu_times(str(stat)) is None


def test_several_runs_end_with_each_rows_spread_and_the_runs_that_met() -> None:
    echo = (2000.0, 3.0, 10.0, 0)
    rows = [(1, "sqlite", 1, echo, (500.0, 1.0, 2.0, 0)),  # not a target row: left out of the summary
            (1, "sqlite", 8, echo, (1100.0, 5.0, 9.0, 0)), (1, "sqlite", 32, echo, (1200.0, 9.0, 19.0, 0)),
            (2, "sqlite", 8, echo, (900.0, 5.0, 9.0, 0)), (2, "sqlite", 32, echo, (1300.0, 9.0, 25.0, 0)),
            (3, "sqlite", 8, echo, (1000.0, 5.0, 8.0, 0)), (3, "sqlite", 32, echo, (1400.0, 9.0, 18.0, 0))]
    lines = resolve_load.summary(rows, 3)
    assert "| sqlite | 8 | 3 | 45% / 50% / 55% | 8.0 / 9.0 / 9.0 | 2 of 3 |" in lines
    assert "| sqlite | 32 | 3 | 60% / 65% / 70% | 18.0 / 19.0 / 25.0 | 2 of 3 |" in lines
    assert not any(line.startswith("| sqlite | 1 |") for line in lines)
    assert "# run 2: missed: sqlite at 8 callers 45.0% of Echo; sqlite p99 at 32 callers 25.0 ms > 20.0" in lines
    assert lines[-1].endswith("): met in 2 of 3 runs")
    # one run keeps the line a single run has always printed
    assert resolve_load.summary(rows[:3], 1) == [f"# {resolve_load.TARGET}: met"]


@pytest.mark.parametrize("base", ["", "postgresql+psycopg://postgres@/test?host=/var/run/postgresql"],
                         ids=["CGSVC_BENCH_PG", "a URL with a query of its own"])
def test_postgresql_settings_reach_the_servers_connections(base: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if base:
        monkeypatch.setattr(resolve_load, "PG", base)
    url = resolve_load.pg_schema_url(["synchronous_commit=off", "application_name=cgsvc_bench"])
    if url is None:
        pytest.skip(f"no PostgreSQL server answers at {resolve_load.PG}")
    try:
        eng = sa.create_engine(url)
        with eng.connect() as conn:
            assert conn.exec_driver_sql("SHOW synchronous_commit").scalar() == "off"
            assert conn.exec_driver_sql("SHOW application_name").scalar() == "cgsvc_bench"
            schema = conn.exec_driver_sql("SELECT current_schema()").scalar()
        eng.dispose()
        assert schema is not None and schema.startswith("bench_")
    finally:
        resolve_load.drop_schema(url)
    eng = sa.create_engine(resolve_load.PG)
    with eng.connect() as conn:
        assert conn.exec_driver_sql("SELECT count(*) FROM pg_namespace WHERE nspname = %s", (schema,)).scalar() == 0
    eng.dispose()


def test_resolve_cpu_runs_its_rows_on_resolve_loads_driver() -> None:
    """bench/resolve_cpu.py reads four figures from resolve_load.drive (a regression: the cores
    column made drive's tuple longer and broke it), and with two variants ends with the second
    against the first."""
    root = Path(__file__).parents[2]
    proc = subprocess.run([sys.executable, str(root / "bench" / "resolve_cpu.py"), "--seconds", "0.3", "--rounds", "1",
                           "--levels", "echo@2,resolve@2", "--variant", "now=", "--variant", "nowait=--audit-cohort-wait-ms=0"],
                          capture_output=True, text=True, timeout=180, cwd=root)
    assert proc.returncode == 0, proc.stderr
    for name in ("now", "nowait"):
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith(f"| 1 | {name} |")]
        assert [r[3].strip() for r in rows] == ["echo", "resolve"], proc.stdout
        assert all(r[-2].strip() == "0" for r in rows), proc.stdout  # no errors
    summary = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines()
               if line.startswith(("| echo | 2 | nowait |", "| resolve | 2 | nowait |"))]
    assert [r[0] for r in summary] == ["echo", "resolve"], proc.stdout
    assert all(r[3] == "1" and float(r[5]) > 0 for r in summary), proc.stdout


def _row(op: str, rate: float, server: float | None = 0.4, client: float | None = 0.2) -> Any:
    return resolve_cpu.Row(op, 8, rate, server, client, "")


def test_resolve_cpus_paired_summary_takes_the_median_of_each_rounds_ratio() -> None:
    """Each round's rows are compared with the same round's rows of the first variant: a round
    in which the machine was slow for both reads as no change."""
    results = {"base": [[_row("resolve", 1000)], [_row("resolve", 500)], [_row("resolve", 1000)]],
               "new": [[_row("resolve", 1100, 0.3)], [_row("resolve", 550, 0.3)], [_row("resolve", 900, 0.5)]]}
    lines = resolve_cpu.paired(results)
    assert lines[0] == "# each variant against base, round by round (median of the rounds' ratios)"
    assert lines[3] == "| resolve | 8 | new | 3 | 1.10, 1.10, 0.90 | 1.10 | 1.50 / 2.00 |"
    # one variant: nothing to compare; a row that served nothing has no ratio
    assert resolve_cpu.paired({"base": results["base"]}) == []
    empty = resolve_cpu.paired({"base": [[_row("echo", 0, None, None)]], "new": [[_row("echo", 10, None, None)]]})
    assert empty[3] == "| echo | 8 | new | 1 | - | - | - / - |"


def test_pg_append_measures_both_variants_and_the_flush_on_a_real_server() -> None:
    """bench/pg_append.py appends real records to PostgreSQL with audit_records' secondary
    indexes and without, and drops every schema it made."""
    url = resolve_load.pg_schema_url()
    if url is None:
        pytest.skip(f"no PostgreSQL server answers at {resolve_load.PG}")
    resolve_load.drop_schema(url)
    root = Path(__file__).parents[2]
    proc = subprocess.run([sys.executable, str(root / "bench" / "pg_append.py"), "--history", "64", "--commits", "40",
                           "--batches", "1,4", "--rounds", "1"], capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in proc.stdout.splitlines() if line.startswith("| 1 |")]
    assert [(r[1], r[2]) for r in rows] == [("defaults", "1"), ("defaults", "4"),
                                          ("no secondary indexes on audit_records", "1"),
                                          ("no secondary indexes on audit_records", "4")], proc.stdout
    assert all(float(r[3]) > 0 and float(r[4]) > 0 for r in rows), proc.stdout
    assert "ms a statement +" in proc.stdout  # the database's CPU split (this machine runs the server)
    assert "a commit's WAL flush costs about" in proc.stdout
    schemas = re.findall(r"# schema (bench_\w+): dropped", proc.stderr)
    assert len(schemas) == 3, proc.stderr  # two runs and the flush probe
    eng = sa.create_engine(resolve_load.PG)
    with eng.connect() as conn:
        left = conn.exec_driver_sql("SELECT nspname FROM pg_namespace WHERE nspname = ANY(%(s)s)", {"s": schemas}).all()
    eng.dispose()
    assert left == []


class Interrupted(Exception):
    """Stands for whatever stops a benchmark between a batch's rows and its commit."""


def test_a_failed_pg_append_run_gives_its_batch_back_and_closes_before_dropping_its_schema(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """A run stopped with a batch open (the store's append lock held) rolls the batch back and
    closes every connection it made before its schema is dropped, and returns rather than hangs."""
    if (probe := resolve_load.pg_schema_url()) is None:
        pytest.skip(f"no PostgreSQL server answers at {resolve_load.PG}")
    resolve_load.drop_schema(probe)
    pa_spec = importlib.util.spec_from_file_location("pg_append", Path(__file__).parents[2] / "bench" / "pg_append.py")
    assert pa_spec is not None and pa_spec.loader is not None
    pg_append = importlib.util.module_from_spec(pa_spec)
    pa_spec.loader.exec_module(pg_append)
    from cgsvc.audit.store import AppendBatch

    add = AppendBatch.add

    def interrupted(self: Any, items: Any) -> None:
        add(self, items)
        if len(items) == 2:  # a measured batch (the history goes in 64 at a time), not the store's own
            raise Interrupted
    monkeypatch.setattr(AppendBatch, "add", interrupted)
    monkeypatch.setattr(pg_append, "WARM_UP", 0)
    app = f"pg_append_probe_{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("PGAPPNAME", app)  # libpq names every connection the run makes
    outcome: list[BaseException | None] = []

    def go() -> None:
        try:
            pg_append.run(64, 4, [2], False)
        except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
            outcome.append(exc)
        else:
            outcome.append(None)
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "the failed run hung: its batch still held the store's append lock"
    assert len(outcome) == 1 and isinstance(outcome[0], Interrupted), outcome
    schemas = re.findall(r"# schema (bench_\w+): dropped", capsys.readouterr().err)
    assert len(schemas) == 1, schemas
    eng = sa.create_engine(resolve_load.PG, connect_args={"application_name": "pg_append_test"})  # not PGAPPNAME's
    with eng.connect() as conn:
        for _ in range(100):  # a backend leaves pg_stat_activity a moment after its client hangs up
            still = conn.exec_driver_sql("SELECT count(*) FROM pg_stat_activity WHERE application_name = %(a)s",
                                         {"a": app}).scalar()
            if still == 0:
                break
            time.sleep(0.05)
        left = conn.exec_driver_sql("SELECT nspname FROM pg_namespace WHERE nspname = %(s)s",
                                    {"s": schemas[0]}).all()
    eng.dispose()
    assert still == 0  # the store's connections were closed, not left to the garbage collector
    assert left == []


def test_the_filter_bench_runs_each_filter_and_finds_what_it_says(tmp_path: Path) -> None:
    """bench/filter_bench.py's filters stay ones the store takes (a grammar change would break
    the bench, not a test), and each finds the records the fill put there: every rare principal's
    record and only those for the rare rows."""
    bench_spec = importlib.util.spec_from_file_location("filter_bench",
                                                        Path(__file__).parents[2] / "bench" / "filter_bench.py")
    assert bench_spec is not None and bench_spec.loader is not None
    filter_bench = importlib.util.module_from_spec(bench_spec)
    bench_spec.loader.exec_module(filter_bench)
    import random

    from cgsvc.audit.store import AuditStore

    store = AuditStore(f"sqlite:///{tmp_path / 'audit.db'}")
    try:
        filter_bench.fill(store, 300, random.Random(7))
        found = {text: filter_bench.timed(store, text)[1] for _, text in filter_bench.FILTERS}
        assert all(found[text] > 0 for _, text in filter_bench.FILTERS), found
        assert found['principal = "rare-*"'] == 20 and found['principal = "rare-1"'] == 7, found
        assert found[filter_bench.FILTERS[-1][1]] == 20, found  # NOT of every other principal: the rare ones
    finally:
        store.close()
