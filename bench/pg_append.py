"""The PostgreSQL append statement alone: what a group commit costs this process and the
database, by records a commit, with audit_records' secondary indexes and without, and what a
commit's WAL flush costs on this server.

    .venv/bin/python bench/pg_append.py [--history 12000] [--commits 600] [--batches 1,4,16] [--rounds 2]

The PostgreSQL counterpart of bench/wal_frames.py. Each run fills a fresh schema with
`--history` real ResolvePlan records (the Kimi-K2.6 plan, fresh request and plan ids), then
appends `--commits` commits of each batch size through `AuditStore.open_batch` / `add` /
`commit`, as the writer process does (the optimistic path: one statement a commit, in
autocommit), one after another with no pause, after a few unmeasured ones. CPU is user + system time: of this process (the
chaining, the rows' JSON, the driver) and of every PostgreSQL process on this machine (its
backends and WAL writer, from /proc; "-" where the server runs elsewhere), per record. Rounds
alternate the variants' order, so a noisy machine affects both alike.

It ends with the database's CPU a commit split into a part per statement and a part per record
(least squares over the defaults' rows), and the commit's flush: 2,000 one-row inserts in
autocommit, durable and with `synchronous_commit=off`, median latency each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from commit_tail import records  # noqa: E402
from resolve_cpu import cpu_of, postgres_pids  # noqa: E402
from resolve_load import drop_schema, pg_schema_url  # noqa: E402

from cgsvc.audit.store import AuditStore  # noqa: E402

VARIANTS = {"defaults": False, "no secondary indexes on audit_records": True}
WARM_UP = 20  # unmeasured commits before each batch size's


def database_cpu() -> float | None:
    """CPU seconds of every PostgreSQL process on this machine, None where there are none."""
    pids = postgres_pids()
    return sum(cpu_of(pids).values()) if pids else None


def dropped(url: str) -> None:
    """Drop the schema a run used, and say which (progress, on stderr)."""
    print(f"# schema {drop_schema(url)}: dropped", file=sys.stderr, flush=True)


def secondary_indexes(conn: sa.Connection) -> list[str]:
    return list(conn.exec_driver_sql(
        "SELECT c.relname FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
        "WHERE i.indrelid = 'audit_records'::regclass AND NOT i.indisprimary").scalars())


def run(history: int, commits: int, batches: list[int], drop_indexes: bool) -> list[tuple[int, float, float, float | None]]:
    """(records a commit, wall ms a commit, this process's CPU ms a record, the database's CPU
    ms a record or None) per batch size."""
    url = pg_schema_url()
    if url is None:
        raise SystemExit("no PostgreSQL server answers (set CGSVC_BENCH_PG to point at one)")
    store = batch_open = None
    try:
        store = AuditStore(url)
        items = records(history)
        for i in range(0, history, 64):
            store.append_batch(items[i:i + 64])
        if drop_indexes:
            eng = sa.create_engine(url)
            with eng.begin() as conn:
                for name in secondary_indexes(conn):
                    conn.exec_driver_sql(f'DROP INDEX "{name}"')
            eng.dispose()
        out = []
        for batch in batches:
            warm, todo = records(WARM_UP * batch), records(commits * batch)
            for i in range(0, len(warm), batch):  # the driver prepares a statement on its fifth run
                store.append_batch(warm[i:i + batch])
            d0, c0, t0 = database_cpu(), time.process_time(), time.perf_counter()
            for i in range(0, len(todo), batch):
                batch_open = store.open_batch()
                batch_open.add(todo[i:i + batch])
                batch_open.commit()
                batch_open = None
                store.after_commit()
            took, spent, d1 = time.perf_counter() - t0, time.process_time() - c0, database_cpu()
            db = None if d0 is None or d1 is None else (d1 - d0) / len(todo) * 1000
            out.append((batch, took / commits * 1000, spent / len(todo) * 1000, db))
        return out
    finally:  # a run that failed mid-way rolls back and closes before its schema is dropped
        if batch_open is not None:
            batch_open.abort()
        if store is not None:
            store.close()
        dropped(url)


def per_statement(rows: list[tuple[int, float]]) -> tuple[float, float] | None:
    """(ms a statement, ms a record) of the database's CPU a commit, by least squares over
    (records a commit, CPU ms a commit); None without two batch sizes."""
    if len({n for n, _ in rows}) < 2:
        return None
    slope, intercept = statistics.linear_regression([n for n, _ in rows], [ms for _, ms in rows])
    return intercept, slope


def flush_cost(count: int = 2000) -> tuple[float, float]:
    """Median ms of a one-row insert in autocommit: durable, and with synchronous_commit=off."""
    url = pg_schema_url()
    if url is None:
        raise SystemExit("no PostgreSQL server answers (set CGSVC_BENCH_PG to point at one)")
    eng = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    try:
        medians = []
        with eng.connect() as conn:
            conn.exec_driver_sql("CREATE TABLE flush_probe (a integer)")
            for setting in ("on", "off"):
                conn.exec_driver_sql(f"SET synchronous_commit = {setting}")
                times = []
                for _ in range(count):
                    t0 = time.perf_counter()
                    conn.exec_driver_sql("INSERT INTO flush_probe VALUES (1)")
                    times.append(time.perf_counter() - t0)
                medians.append(statistics.median(times) * 1000)
        return medians[0], medians[1]
    finally:
        eng.dispose()
        dropped(url)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=int, default=12000, help="records in the log before the measured commits")
    ap.add_argument("--commits", type=int, default=600, help="measured commits per batch size and run")
    ap.add_argument("--batches", default="1,4,16", help="records a commit, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    ns = ap.parse_args()
    batches = [int(b) for b in ns.batches.split(",")]
    if not batches or min(batches) < 1:
        ap.error(f"--batches takes record counts of 1 or more, got {ns.batches!r}")
    names = list(VARIANTS)
    table: list[str] = []
    fit: list[tuple[int, float]] = []
    for rnd in range(1, ns.rounds + 1):
        for name in names if rnd % 2 else names[::-1]:
            for batch, wall, own, db in run(ns.history, ns.commits, batches, VARIANTS[name]):
                table.append(f"| {rnd} | {name} | {batch} | {wall:.3f} | {own:.3f} | "
                             f"{'-' if db is None else f'{db:.3f}'} |")
                if db is not None and not VARIANTS[name]:
                    fit.append((batch, db * batch))
            print(f"# round {rnd}, {name}: done", file=sys.stderr, flush=True)
    print(f"# {ns.history} records of history, then {ns.commits} commits of each size, one after another; "
          "CPU is user + system, this process's and every PostgreSQL process's on this machine")
    print("| round | variant | records a commit | wall ms a commit | this process CPU ms a record | "
          "PostgreSQL CPU ms a record |")
    print("|---|---|---|---|---|---|")
    print("\n".join(table))
    if (split := per_statement(fit)) is not None:
        print(f"# the database's CPU a commit (defaults, least squares): {split[0]:.3f} ms a statement "
              f"+ {split[1]:.3f} ms a record")
    durable, lazy = flush_cost()
    print(f"# a one-row insert in autocommit, median: {durable:.3f} ms durable, {lazy:.3f} ms with "
          f"synchronous_commit=off: a commit's WAL flush costs about {durable - lazy:.3f} ms here")


if __name__ == "__main__":
    main()
