"""Instructions a record costs on the SQLite append path, counted by valgrind's callgrind:
the same on a noisy machine run after run, so a change of a few percent shows, where CPU
seconds here move by tens of percent from minute to minute.

    .venv/bin/python bench/append_instructions.py [--records 800] [--batch 8] [--baseline REV]

Runs itself under `valgrind --tool=callgrind` twice, appending no records and then
`--records` real ResolvePlan records (the Kimi-K2.6 plan, fresh ids) in batches of `--batch`
through AuditStore.open_batch / add / commit, as the writer process does, and prints the
difference per record. The records are built before the count starts in both runs, so only
the appends differ. valgrind hides the CPU's SHA extensions, so hashing weighs more than it
does on the machine itself. `--baseline REV` counts another commit's store the same way.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

ROOT = Path(__file__).resolve().parent.parent


def inner(count: int, total: int, batch: int) -> None:
    """Append `count` of `total` prepared records (what valgrind counts)."""
    from commit_tail import records

    from cgsvc.audit.store import AuditStore

    tmp = tempfile.mkdtemp(prefix="cgsvc-instr-")
    try:
        store = AuditStore(f"sqlite:///{tmp}/audit.db")
        items = [pickle.loads(pickle.dumps(i)) for i in records(total)]  # as the writer receives them
        for i in range(0, count, batch):
            b = store.open_batch()
            for item in items[i:i + batch]:
                b.add([item])
            b.commit()
        store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def counted(root: Path, count: int, total: int, batch: int) -> int:
    """Instructions of one run of `inner` with the cgsvc of the checkout at `root` (first on
    the path; this script and its record builder are this checkout's)."""
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                          str(Path(__file__).resolve()), "--inner", str(count), "--records",
                          str(total), "--batch", str(batch)], capture_output=True, text=True, env=env, cwd=root)
    m = re.search(r"refs:\s+([\d,]+)", out.stderr)
    if out.returncode != 0 or m is None:
        raise SystemExit(f"valgrind run failed: {out.stderr[-2000:]}")
    return int(m.group(1).replace(",", ""))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=800, help="records appended in the counted run")
    ap.add_argument("--batch", type=int, default=8, help="records per commit")
    ap.add_argument("--baseline", default="", metavar="REV", help="also count the store of this git revision")
    ap.add_argument("--inner", type=int, default=-1, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.inner >= 0:
        inner(ns.inner, ns.records, ns.batch)
        return
    from resolve_cpu import worktree

    with contextlib.ExitStack() as stack:
        runs = [("this checkout", ROOT)]
        if ns.baseline:
            base, commit = stack.enter_context(worktree(ns.baseline))
            runs.append((f"@{commit}", base))
        print(f"# {ns.records} records in commits of {ns.batch}, SQLite WAL; instructions from callgrind")
        print("| store | instructions a record |")
        print("|---|---|")
        for name, root in runs:
            per = (counted(root, ns.records, ns.records, ns.batch) - counted(root, 0, ns.records, ns.batch)) / ns.records
            print(f"| {name} | {per:,.0f} |", flush=True)


if __name__ == "__main__":
    main()
