"""Which B-trees a SQLite group commit writes, and what audit_records' secondary indexes cost a
commit, side by side.

    .venv/bin/python bench/wal_frames.py [--history 12000] [--commits 300] [--batch 4] [--rounds 2]

Fills a fresh log (WAL, synchronous=FULL) with `--history` real ResolvePlan records (the
Kimi-K2.6 plan, fresh request and plan ids), then appends `--commits` commits of `--batch`
records through `AuditStore.open_batch` as the writer process does, and reads the write-ahead
log: every frame is one page a commit wrote (a 24-byte header, then the page), and SQLite's
dbstat table names the B-tree each page belongs to. Prints the frames a commit wrote per
B-tree, then, for the defaults and with audit_records' secondary indexes dropped, the CPU a
commit cost this process (user + system: it does the whole append, hashing, rows and COMMIT)
and its wall time. Rounds alternate the variants' order, so a noisy machine affects both alike.
"""

from __future__ import annotations

import argparse
import collections
import resource
import shutil
import sqlite3
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from commit_tail import records  # noqa: E402

from cgsvc.audit.store import AuditStore  # noqa: E402

WAL_HEADER, FRAME_HEADER = 32, 24


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def wal_pages(db: Path) -> tuple[list[int], int]:
    """The page number of every frame of the log's current generation (frames whose salts
    match the header's: a log that started over keeps older frames after its end), and how
    many of them end a commit (a non-zero database size in the frame's header)."""
    data = (db.parent / (db.name + "-wal")).read_bytes()
    page_size = struct.unpack(">I", data[8:12])[0]
    salts = data[16:24]
    pages, commits, off = [], 0, WAL_HEADER
    while off + FRAME_HEADER + page_size <= len(data):
        page, size_after = struct.unpack(">II", data[off:off + 8])
        if data[off + 8:off + 16] != salts:
            break
        pages.append(page)
        commits += size_after != 0
        off += FRAME_HEADER + page_size
    return pages, commits


def owners(db: Path) -> dict[int, str]:
    """Page number -> the table or index it belongs to (page 1 holds the schema and the file's header)."""
    conn = sqlite3.connect(db)
    try:
        return dict(conn.execute("SELECT pageno, name FROM dbstat"))
    finally:
        conn.close()


def secondary_indexes(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return [n for (n,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index' AND "
                                           "tbl_name = 'audit_records' AND sql IS NOT NULL")]
    finally:
        conn.close()


def run(history: int, commits: int, batch: int, drop_indexes: bool) -> tuple[float, float, collections.Counter[str], int]:
    """(CPU ms a commit, wall ms a commit, frames per B-tree, commits seen in the log)."""
    tmp = Path(tempfile.mkdtemp(prefix="cgsvc-wal-"))
    db = tmp / "audit.db"
    url = f"sqlite:///{db}"
    try:
        store = AuditStore(url)
        items = records(history)
        for i in range(0, history, 64):
            store.append_batch(items[i:i + 64])
        store.close()
        conn = sqlite3.connect(db)
        if drop_indexes:
            for name in secondary_indexes(db):
                conn.execute(f'DROP INDEX "{name}"')
            conn.commit()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # the measured commits start an empty log
        conn.close()
        # The store's checkpoint thread copies the log (it never restarts it at these sizes);
        # if a copy lets SQLite start the log over, wal_pages reads the newest generation only.
        store = AuditStore(url, wal_checkpoint_every=1 << 30, wal_restart_frames=1 << 30)
        todo = records(commits * batch)
        c0, t0 = cpu(), time.perf_counter()
        for i in range(0, len(todo), batch):
            b = store.open_batch()
            b.add(todo[i:i + batch])
            b.commit()
            store.after_commit()
        spent, took = cpu() - c0, time.perf_counter() - t0
        pages, seen = wal_pages(db)
        store.close()
        named = owners(db)
        counts = collections.Counter(named.get(p, "(a page on no B-tree: the freelist)") for p in pages)
        return spent / commits * 1000, took / commits * 1000, counts, seen
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=int, default=12000, help="records in the log before the measured commits")
    ap.add_argument("--commits", type=int, default=300, help="measured commits per run")
    ap.add_argument("--batch", type=int, default=4, help="records per measured commit")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    ns = ap.parse_args()
    variants = {"defaults": False, "no secondary indexes on audit_records": True}
    rows: list[str] = []
    frames: dict[str, tuple[collections.Counter[str], int]] = {}
    names = list(variants)
    for rnd in range(1, ns.rounds + 1):
        for name in names if rnd % 2 else names[::-1]:
            cpu_ms, wall_ms, counts, seen = run(ns.history, ns.commits, ns.batch, variants[name])
            total = sum(counts.values())
            rows.append(f"| {rnd} | {name} | {total / seen:.1f} | {cpu_ms:.3f} | {cpu_ms / ns.batch:.3f} | {wall_ms:.3f} |")
            frames.setdefault(name, (counts, seen))
            print(f"# round {rnd}, {name}: done", file=sys.stderr, flush=True)
    print(f"# {ns.history} records of history, then {ns.commits} commits of {ns.batch} records; SQLite WAL, "
          "synchronous=FULL; CPU of this process (user + system)")
    print("| round | variant | frames a commit | CPU ms a commit | CPU ms a record | wall ms a commit |")
    print("|---|---|---|---|---|---|")
    print("\n".join(rows))
    counts, seen = frames["defaults"]
    print(f"\n# frames a commit by B-tree (defaults, {seen} commits in the log)")
    print("| B-tree | frames a commit |")
    print("|---|---|")
    for name, n in counts.most_common():
        print(f"| {name} | {n / seen:.2f} |")


if __name__ == "__main__":
    main()
