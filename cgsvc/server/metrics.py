"""Prometheus metrics of the service."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

REGISTRY = CollectorRegistry()
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
