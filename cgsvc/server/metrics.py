"""Prometheus metrics of the service."""

from __future__ import annotations

import gc

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.gc_collector import GCCollector

REGISTRY = CollectorRegistry()
GCCollector(registry=REGISTRY)  # python_gc_*: collections and objects collected, per generation
GC_FROZEN = Gauge("cgsvc_gc_frozen_objects", "Objects alive after start-up that the garbage collector never walks "
                  "(gc.freeze; docs/decisions.md)", registry=REGISTRY)
GC_FROZEN.set_function(gc.get_freeze_count)
RPC_TOTAL = Counter("cgsvc_rpc_total", "RPCs answered", ["method", "code"], registry=REGISTRY)
RPC_SECONDS = Histogram("cgsvc_rpc_seconds", "RPC latency", ["method"], registry=REGISTRY,
                        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5))
AUDIT_APPEND_SECONDS = Histogram("cgsvc_audit_append_seconds", "Audit group-commit transaction time",
                                 registry=REGISTRY,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
AUDIT_BATCH_RECORDS = Histogram("cgsvc_audit_batch_records", "Records per group commit", registry=REGISTRY,
                                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
PLANS_TOTAL = Counter("cgsvc_plans_total", "Plans resolved", ["prefill_backend", "decode_backend"],
                      registry=REGISTRY)


def observe_batch(records: int, seconds: float) -> None:
    AUDIT_APPEND_SECONDS.observe(seconds)
    AUDIT_BATCH_RECORDS.observe(records)
