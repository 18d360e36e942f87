"""How long `cgsvc store copy` takes for a large log: the copy, then the read-back verification, timed apart.

    .venv/bin/python bench/store_copy_bench.py [--records 200000] [--targets sqlite,postgresql]

Fills a SQLite log (as the server writes it: ResolvePlan records over a few models, GPUs,
principals and rule sets, with their Merkle nodes and rule sets; bench/filter_bench.py's fill)
and copies it into a fresh SQLite file and a fresh PostgreSQL schema (skipped where no server
answers) with cgsvc/audit/copy.py's copy_rows and then the target's verify, which together are
copy_store, what `cgsvc store copy` runs: the verification recomputes every record's hash and the
tree, and is what `audit verify` costs on that store. Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from filter_bench import fill  # noqa: E402
from resolve_load import drop_schema, pg_schema_url  # noqa: E402

from cgsvc.audit import copy  # noqa: E402
from cgsvc.audit.store import AuditStore  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000, help="records in the source log (default 200000)")
    ap.add_argument("--targets", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        source = AuditStore(f"sqlite:///{Path(tmp) / 'source.db'}", wal_checkpoint_every=0)
        t0 = time.perf_counter()
        fill(source, ns.records, random.Random(7))
        print(f"# a SQLite log of {ns.records} records (filled in {time.perf_counter() - t0:.0f} s), copied whole")
        print("| target | rows copied | copy s | records/s | verify s | verified |")
        print("|---|---|---|---|---|---|")
        for target in ns.targets.split(","):
            url = f"sqlite:///{Path(tmp) / 'target.db'}" if target == "sqlite" else pg_schema_url()
            if url is None:
                print(f"| {target} | skipped: no server answers | | | | |")
                continue
            store = AuditStore(url, wal_checkpoint_every=0)
            try:
                t0 = time.perf_counter()
                rows = copy.copy_rows(source, store)
                copy_s = time.perf_counter() - t0
                t1 = time.perf_counter()
                verified = store.verify()
                verify_s = time.perf_counter() - t1
                print(f"| {target} | {sum(rows.values()):,} | {copy_s:.1f} | {ns.records / copy_s:,.0f} | "
                      f"{verify_s:.1f} | {verified.ok} ({verified.records_checked:,} records) |")
            finally:
                store.close()
                if target != "sqlite":
                    drop_schema(url)
        source.close()


if __name__ == "__main__":
    main()
