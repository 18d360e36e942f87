"""`policy impact` over a million-record audit history: time, and memory that does not grow
with the log.

    .venv/bin/python bench/impact_bench.py [--records 1000000] [--specs 2000] [--checkpoints 100000] [--recorded]

Fills a fresh SQLite log (durable, as the server writes it) with ResolvePlan records drawn from
`--specs` distinct launch specs (catalog models x GPUs x parallelism x a few features; those
whose tp does not divide the model's heads are refused by every policy; Zipf-like popularity), then runs the same computation the server's
ComputePolicyImpact runs (cgsvc.domain.impact.policy_impact, baseline cgsvc, candidate
sglang-0.5.17) at each checkpoint size, side by side in one process: wall time, records per
second, and the peak Python heap during the run (tracemalloc). With --recorded the records carry
the plan or refusal cgsvc resolved, and `--baseline recorded` (cgsvc now against what the log
holds) is measured beside it. Prints Markdown for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import itertools
import random
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

from cgsvc import catalog
from cgsvc.audit.records import AuditEntry
from cgsvc.audit.store import AuditStore, PendingAppend
from cgsvc.domain.impact import policy_impact
from cgsvc.domain.plans import RESOLVE_METHOD
from cgsvc.errors import CODE_NUMBERS, ServiceError
from cgsvc.plan import canonical_json, rule_ids
from cgsvc.resolve import resolve
from cgsvc.spec import parse_spec, spec_to_dict


def spec_pool(n: int, seed: int) -> list[dict[str, Any]]:
    """n distinct specs (canonical form), some of which every policy refuses."""
    gpus = [g for g in catalog.gpus() if g != "cpu"]
    grid = itertools.product(catalog.canonical_model_names(), gpus, (1, 2, 4, 8), (None, "fp8_e4m3"),
                             (None, True), (None, "EAGLE"))
    out: list[dict[str, Any]] = []
    for model, gpu, tp, kv, dpa, spec_alg in grid:
        spec: dict[str, Any] = {"model": {"name": model}, "hardware": {"gpu": gpu, "gpu_count": 8},
                                "parallelism": {"tp": tp}, "features": {}}
        if kv:
            spec["features"]["kv_cache_dtype"] = kv
        if dpa:
            spec["parallelism"].update(dp=tp, enable_dp_attention=True)
        if spec_alg:
            spec["features"]["speculative_algorithm"] = spec_alg
        out.append(spec_to_dict(parse_spec(spec)))
    random.Random(seed).shuffle(out)
    return out[:n]


def outcomes(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """What the cgsvc policy records for each spec, as a server's ResolvePlan record holds it: its
    plan (JSON, hash, rule ids) or its refusal."""
    out: list[dict[str, Any]] = []
    for s in specs:
        try:
            plan = resolve(parse_spec(s), "cgsvc")
        except ServiceError as err:
            out.append({"outcome_code": CODE_NUMBERS[err.code], "outcome_message": err.message,
                        "rule_ids": (err.rule_id,) if err.rule_id else ()})
            continue
        out.append({"plan_json": canonical_json(plan.to_dict()), "plan_hash": plan.plan_hash,
                    "rule_ids": tuple(rule_ids(plan))})
    return out


def fill(store: AuditStore, specs: list[dict[str, Any]], start: int, count: int, rng: random.Random,
         recorded: list[dict[str, Any]] | None = None) -> None:
    """`recorded`: what each spec's records carry besides the spec (outcomes()); none when None."""
    texts = [canonical_json(s) for s in specs]
    weights = [1.0 / (i + 1) for i in range(len(specs))]  # a few popular specs, a long tail
    batch = 2000
    for b in range(start, start + count, batch):
        items = []
        for i in rng.choices(range(len(specs)), weights, k=min(batch, start + count - b)):
            s = specs[i]
            items.append(PendingAppend(AuditEntry(principal="fleet", peer="", method=RESOLVE_METHOD,
                                                  model=s["model"]["name"], gpu=s["hardware"]["gpu"],
                                                  spec_json=texts[i], policy="cgsvc", policy_version="bench",
                                                  **(recorded[i] if recorded else {}))))
        store.append_batch(items)


def measure(store: AuditStore, candidate: str = "sglang-0.5.17",
            baseline: str = "") -> tuple[float, int, dict[str, Any]]:
    tracemalloc.start()
    t0 = time.perf_counter()
    out = policy_impact(store, candidate, baseline or "cgsvc")
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return seconds, peak, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="final log size (default 1,000,000)")
    ap.add_argument("--specs", type=int, default=2000, help="distinct specs in the history (default 2000)")
    ap.add_argument("--checkpoints", type=int, default=100_000,
                    help="also measure at this size (default 100,000), to compare against the final size")
    ap.add_argument("--recorded", action="store_true",
                    help="records carry the plan (or refusal) cgsvc resolved, as a server's do, and each size is "
                         "measured twice, side by side: sglang-0.5.17 against cgsvc, and cgsvc against --baseline "
                         "recorded")
    ns = ap.parse_args()
    rng = random.Random(1)
    specs = spec_pool(ns.specs, 1)
    recorded = outcomes(specs) if ns.recorded else None
    store = AuditStore(f"sqlite:///{Path(tempfile.mkdtemp(prefix='cgsvc-impact-')) / 'audit.db'}")
    rows = []
    done = 0
    runs = [("sglang-0.5.17", "cgsvc")] + ([("cgsvc", "recorded")] if ns.recorded else [])
    for size in sorted({ns.checkpoints, ns.records}):
        t0 = time.perf_counter()
        fill(store, specs, done, size - done, rng, recorded)
        print(f"filled {size} records in {time.perf_counter() - t0:.0f} s", flush=True)
        done = size
        for candidate, baseline in runs:
            seconds, peak, out = measure(store, candidate, baseline)
            assert out["records_examined"] == size, out["records_examined"]
            rows.append((size, f"{baseline} -> {candidate}", out["specs_examined"], seconds, peak, out))
    print("\n| records | baseline -> candidate | distinct specs | changed | newly refused | newly accepted | unchanged "
          "| wall s | records/s | peak Python heap |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for size, which, nspecs, seconds, peak, out in rows:
        print(f"| {size:,} | {which} | {nspecs:,} | {len(out['changed']):,} | {len(out['newly_refused'])} | "
              f"{len(out['newly_accepted'])} | {out['unchanged']:,} | {seconds:.1f} | {size / seconds:,.0f} | "
              f"{peak / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
