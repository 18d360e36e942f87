"""A list filter's first page over a large audit log: equality, OR, NOT and prefix terms side by side.

    .venv/bin/python bench/filter_bench.py [--records 200000] [--backends sqlite,postgresql] [--repeats 5]

Fills a fresh log per store (SQLite, durable as the server writes it; PostgreSQL in a schema of
its own, skipped where no server answers) with ResolvePlan records over a few models, GPUs,
principals and rule sets, the last 20 of them by a principal seen nowhere else ("rare-..."),
then times `AuditStore.list_records` (what ListAuditRecords runs) for the first page of 50,
oldest first, of each filter: the median of `--repeats` runs, in one process, the filters
taking turns (PostgreSQL after an ANALYZE, as autovacuum makes one after such a fill). An equality on an indexed column is the yardstick. A prefix (`model =
"deepseek-ai/*"`) cannot use the column's index, so it reads records in sequence order until it
has a page: fast for a common prefix, a scan of the log for a rare one (the "rare" rows say
how long). Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resolve_load import drop_schema, pg_schema_url  # noqa: E402

from cgsvc.audit.records import AuditEntry  # noqa: E402
from cgsvc.audit.store import AuditStore, PendingAppend  # noqa: E402
from cgsvc.domain.plans import RESOLVE_METHOD  # noqa: E402

MODELS = ("deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-R1", "moonshotai/Kimi-K2.6", "Qwen/Qwen3-8B",
          "meta-llama/Llama-3.1-8B-Instruct")
GPUS = ("H100", "H200", "B200", "GB300")
PRINCIPALS = ("ci-nightly", "ci-manual", "alice", "bob")
RULE_SETS = (("default.prefill.backend", "breakable.mla"), ("default.prefill.backend", "attention.mha.hopper"),
             ("default.prefill.backend", "breakable.gdn"), ("default.prefill.backend",))
FILTERS = (
    ("equality, indexed", 'model = "deepseek-ai/DeepSeek-V3"'),
    ("prefix, common", 'model = "deepseek-ai/*"'),
    ("OR of two", 'model = "deepseek-ai/DeepSeek-V3" OR model = "Qwen/Qwen3-8B"'),
    ("rule", 'rule_id = "breakable.mla"'),
    ("rule family (prefix)", 'rule_id = "breakable.*"'),
    ("NOT rule", 'NOT rule_id = "breakable.mla"'),
    ("equality, rare", 'principal = "rare-1"'),
    ("prefix, rare", 'principal = "rare-*"'),
    ("NOT of a group, rare", 'NOT (principal = "ci-nightly" OR principal = "ci-manual" OR principal = "alice" '
                             'OR principal = "bob")'),
)


def fill(store: AuditStore, records: int, rng: random.Random) -> None:
    batch = 2000
    for start in range(0, records, batch):
        items = []
        for i in range(start, min(records, start + batch)):
            rare = i >= records - 20
            items.append(PendingAppend(AuditEntry(
                principal=f"rare-{i % 3}" if rare else rng.choice(PRINCIPALS), peer="", method=RESOLVE_METHOD,
                model=rng.choice(MODELS), gpu=rng.choice(GPUS), spec_json=f'{{"i":{i}}}',
                rule_ids=rng.choice(RULE_SETS), policy="cgsvc", policy_version="bench")))
        store.append_batch(items)


def timed(store: AuditStore, text: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows, _ = store.list_records(text, page_size=50)
    return (time.perf_counter() - t0) * 1000, len(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=200_000, help="records in each log (default 200000)")
    ap.add_argument("--backends", default="sqlite,postgresql", help="comma-separated: sqlite, postgresql")
    ap.add_argument("--repeats", type=int, default=5, help="timed runs of each filter; the median is shown")
    ns = ap.parse_args()
    print(f"# {ns.records} records a log; first page of 50, oldest first; median of {ns.repeats} runs, ms")
    print("| store | filter | text | ms | records on the page | x equality |")
    print("|---|---|---|---|---|---|")
    for backend in ns.backends.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'audit.db'}" if backend == "sqlite" else pg_schema_url()
            if url is None:
                print(f"| {backend} | skipped: no server answers | | | | |")
                continue
            store = AuditStore(url)
            try:
                t0 = time.perf_counter()
                fill(store, ns.records, random.Random(7))
                if backend == "postgresql":  # as autovacuum would after a fill this size: the planner's statistics
                    with store.write_engine.begin() as conn:
                        conn.exec_driver_sql("ANALYZE")
                print(f"<!-- {backend}: filled in {time.perf_counter() - t0:.0f} s -->", flush=True)
                times: dict[str, list[float]] = {text: [] for _, text in FILTERS}
                found: dict[str, int] = {}
                for _ in range(ns.repeats):
                    for _, text in FILTERS:
                        ms, found[text] = timed(store, text)
                        times[text].append(ms)
                base = statistics.median(times[FILTERS[0][1]])
                for name, text in FILTERS:
                    ms = statistics.median(times[text])
                    print(f"| {backend} | {name} | `{text}` | {ms:.1f} | {found[text]} | {ms / base:.1f}x |", flush=True)
            finally:
                store.close()
                if backend == "postgresql":
                    drop_schema(url)


if __name__ == "__main__":
    main()
