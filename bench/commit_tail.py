"""How long a SQLite group commit takes, with the log's checkpoints inside the commits (SQLite's
default) and beside them (the store's checkpointer thread, at its old and its current cadence),
side by side.

    .venv/bin/python bench/commit_tail.py [--batches 1500] [--batch 5] [--rounds 2]

Appends batches of real ResolvePlan records (the Kimi-K2.6 plan, a fresh request id each)
through `AuditStore.append_batch`, one after another with no pause, to a fresh database per run
(WAL, synchronous=FULL), and prints commit-time percentiles per variant as a Markdown table.
Rounds alternate the order, so a noisy machine affects both alike.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resolve_load import KIMI  # noqa: E402

from cgsvc.audit.auditor import Auditor  # noqa: E402
from cgsvc.audit.store import AuditStore, PendingAppend  # noqa: E402
from cgsvc.domain.plans import RESOLVE_METHOD, resolve_spec  # noqa: E402
from cgsvc.ids import new_id  # noqa: E402

# name -> (records between the thread's checkpoints, 0 for none; log pages at which it starts over)
VARIANTS = {"in the commit (SQLite's default)": (0, 0),
            "thread, every 256 records, restart at 4,096 pages": (256, 4096),
            "thread, every 2,048 records, restart at 8,192 pages (default)": (2048, 8192)}


def records(count: int) -> list[PendingAppend]:
    res = resolve_spec(KIMI)
    auditor = Auditor(None, None)  # type: ignore[arg-type]  # only builds entries
    out = []
    for _ in range(count):
        e = auditor.entry(RESOLVE_METHOD, "local", "ipv4:127.0.0.1:50000", uuid.uuid4().hex, uuid.uuid4().hex,
                          None, "OK", "", **res.audit_fields, plan_json=res.plan_json, plan_hash=res.plan.plan_hash,
                          rule_ids=res.rule_ids, plan_id=new_id())  # as the server names plans
        out.append(PendingAppend(e, res.listing, uuid.uuid4().hex))
    return out


def run(cadence: tuple[int, int], batches: int, batch: int) -> list[float]:
    """Commit times (ms) of `batches` batches of `batch` records."""
    every, restart_frames = cadence
    tmp = tempfile.mkdtemp(prefix="cgsvc-commit-")
    try:
        store = AuditStore(f"sqlite:///{tmp}/audit.db", wal_checkpoint_every=every,
                           wal_restart_frames=restart_frames or 8192)
        items = records(batches * batch)
        times = []
        for i in range(0, len(items), batch):
            t0 = time.perf_counter()
            store.append_batch(items[i:i + batch])
            times.append((time.perf_counter() - t0) * 1000)
        store.close()
        return times
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", type=int, default=1500, help="commits per run")
    ap.add_argument("--batch", type=int, default=5, help="records per commit")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each variant, alternating")
    ns = ap.parse_args()
    print(f"# {ns.batches} commits of {ns.batch} records per run, SQLite WAL, synchronous=FULL")
    print("| round | checkpoints | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | commits > 5 ms | total s |")
    print("|---|---|---|---|---|---|---|---|---|")
    names = list(VARIANTS)
    for rnd in range(1, ns.rounds + 1):
        for name in names if rnd % 2 else names[::-1]:
            t = sorted(run(VARIANTS[name], ns.batches, ns.batch))

            def pct(q: float, t: list[float] = t) -> float:
                return t[min(len(t) - 1, int(len(t) * q))]
            print(f"| {rnd} | {name} | {pct(0.5):.2f} | {pct(0.9):.2f} | {pct(0.99):.2f} | {pct(0.999):.2f} | "
                  f"{t[-1]:.2f} | {sum(x > 5 for x in t)} | {sum(t) / 1000:.2f} |", flush=True)


if __name__ == "__main__":
    main()
