"""Reading the whole audit log through ListAuditRecords, view FULL against view BASIC.

    .venv/bin/python bench/record_view_bench.py [--records 5000] [--repeats 3]

Starts `cgsvc serve` (SQLite), appends `--records` ResolvePlan records through the API (a few
distinct specs, as a fleet resolves the same ones again and again), then pages through every
record, 1,000 a page, as `audit list --all` and `audit summary` do: once whole (FULL, what `-o
json` reads) and once without each record's plan JSON and hashed bytes (BASIC, what a table or a
count reads), taking turns `--repeats` times. Prints each view's median seconds and the bytes
it answered, and their ratio, as Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cgsvc_client.client import Client  # noqa: E402
from resolve_load import KIMI, start_server, stop_server  # noqa: E402

from cgsvc.v1 import audit_pb2  # noqa: E402

VIEWS = {"FULL": audit_pb2.AUDIT_RECORD_VIEW_FULL, "BASIC": audit_pb2.AUDIT_RECORD_VIEW_BASIC}


def read_all(c: Client, view: audit_pb2.AuditRecordView) -> tuple[float, int, int]:
    """(seconds, records, bytes answered) of paging through the whole log in `view`."""
    t0, records, size, token = time.perf_counter(), 0, 0, ""
    while True:
        page = c.list_audit_records(page_size=1000, page_token=token, view=view)
        records, size, token = records + len(page.records), size + page.ByteSize(), page.next_page_token
        if not token:
            return time.perf_counter() - t0, records, size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=5000, help="records to append first (default 5000)")
    ap.add_argument("--repeats", type=int, default=3, help="reads of the whole log in each view; the median is shown")
    ns = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="cgsvc-bench-")
    proc, address, _ = start_server(tmp, "")
    try:
        with Client(address, timeout=120) as c:
            specs = [{**KIMI, "hardware": {"gpu": gpu, "gpu_count": 4}} for gpu in ("GB300", "B200", "H200", "H100")]
            for i in range(ns.records):
                c.resolve(specs[i % len(specs)])
            runs: dict[str, list[float]] = {name: [] for name in VIEWS}
            answered: dict[str, tuple[int, int]] = {}
            for k in range(ns.repeats):
                for name in VIEWS if k % 2 == 0 else list(VIEWS)[::-1]:
                    seconds, records, size = read_all(c, VIEWS[name])
                    runs[name].append(seconds)
                    answered[name] = (records, size)
        print(f"# {ns.records} ResolvePlan records (GB300, B200, H200, H100 specs in turn), SQLite, pages of 1,000; "
              f"median of {ns.repeats} reads each")
        print("| view | records | bytes answered | bytes a record | seconds, whole log | x BASIC |")
        print("|---|---|---|---|---|---|")
        basic = statistics.median(runs["BASIC"])
        for name in VIEWS:
            records, size = answered[name]
            seconds = statistics.median(runs[name])
            print(f"| {name} | {records} | {size:,} | {size // max(records, 1):,} | {seconds:.2f} | "
                  f"{seconds / basic:.1f}x |")
    finally:
        stop_server(proc, tmp, "")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
