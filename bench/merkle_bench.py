"""The audit log's Merkle tree at a million records: appends stay O(log n), proofs are small
and fast, and a full verification is measured.

    .venv/bin/python bench/merkle_bench.py [--records 1000000] [--batch 512]

Appends records in group-commit batches to a fresh SQLite log (durable: WAL, synchronous=FULL)
and times, side by side: the append cost per record near the start and near the end (O(log n):
they should match), the full `verify` (chain and tree recomputed from every record), proof
generation on the server side, and proof verification on the client side. Prints Markdown
for bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from cgsvc.audit import merkle
from cgsvc.audit.records import AuditEntry
from cgsvc.audit.store import AuditStore, PendingAppend


def entry(i: int) -> AuditEntry:
    return AuditEntry(principal="bench", peer="ipv4:127.0.0.1:1", method="/cgsvc.v1.PlanService/ResolvePlan",
                      request_id=f"r{i}", model="deepseek-ai/DeepSeek-V3", gpu="H200",
                      spec_json='{"model":{"name":"deepseek-ai/DeepSeek-V3"}}', rule_ids=("breakable.mla",))


def timed_append(store: AuditStore, start: int, count: int, batch: int) -> float:
    """Seconds per record for `count` records from sequence start + 1."""
    t0 = time.perf_counter()
    for b in range(start, start + count, batch):
        store.append_batch([PendingAppend(entry(i)) for i in range(b, min(b + batch, start + count))])
    return (time.perf_counter() - t0) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="log size (default 1,000,000)")
    ap.add_argument("--batch", type=int, default=512, help="records per group commit while filling")
    ns = ap.parse_args()
    store = AuditStore(f"sqlite:///{Path(tempfile.mkdtemp(prefix='cgsvc-merkle-')) / 'audit.db'}")
    sample = 2000
    early = timed_append(store, 0, sample, 64)
    t0 = time.perf_counter()
    timed_append(store, sample, ns.records - 2 * sample, ns.batch)
    fill = time.perf_counter() - t0
    late = timed_append(store, ns.records - sample, sample, 64)
    size, root = store.tree_head()
    assert size == ns.records
    t0 = time.perf_counter()
    v = store.verify()
    verify_s = time.perf_counter() - t0
    assert v.ok, v.reason
    rng = random.Random(0)
    gen, check, lengths = [], [], []
    for _ in range(200):
        seq = rng.randrange(1, size + 1)
        t0 = time.perf_counter()
        _, proof, rec = store.inclusion_proof(seq, size)
        gen.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        ok = merkle.verify_inclusion(seq - 1, size, merkle.leaf_hash(bytes.fromhex(rec.compute_hash())), proof, root)
        check.append(time.perf_counter() - t0)
        assert ok
        lengths.append(len(proof))
    cgen, ccheck = [], []
    for _ in range(50):
        first = rng.randrange(1, size)
        old_root = store.root_at(first)
        t0 = time.perf_counter()
        _, proof = store.consistency_proof(first, size)
        cgen.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        assert merkle.verify_consistency(first, size, old_root, root, proof)
        ccheck.append(time.perf_counter() - t0)
    ms = statistics.median
    print(f"# {size:,} records in one SQLite log (WAL, synchronous=FULL); filled in {fill:.0f} s "
          f"({fill / (size - 2 * sample) * 1e6:.0f} us per record at batch {ns.batch})")
    print("| measure | value |")
    print("|---|---|")
    print(f"| append, records 1-{sample} (batch 64) | {early * 1e6:.0f} us per record |")
    print(f"| append, records {size - sample + 1:,}-{size:,} (batch 64) | {late * 1e6:.0f} us per record |")
    print(f"| full verify (chain and Merkle tree recomputed from every record) | {verify_s:.1f} s |")
    print(f"| inclusion proof: server, median | {ms(gen) * 1e3:.2f} ms ({ms(lengths):.0f} hashes) |")
    print(f"| inclusion proof: client check, median | {ms(check) * 1e6:.0f} us |")
    print(f"| consistency proof: server, median | {ms(cgen) * 1e3:.2f} ms |")
    print(f"| consistency proof: client check, median | {ms(ccheck) * 1e6:.0f} us |")


if __name__ == "__main__":
    main()
