"""Prometheus metrics of the service."""

from __future__ import annotations

import collections
import gc
import time
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector

from cgsvc.audit.store import reported_cells
from cgsvc.contract import PLAN_FIELDS
from cgsvc.domain.experiments import Experiments
from cgsvc.domain.launches import ACTIVE, TERMINAL, UNRECORDED_OUTCOMES, Launches
from cgsvc.launch.store import EXPERIMENT_STATES, LaunchRow

REGISTRY = CollectorRegistry()
GCCollector(registry=REGISTRY)  # python_gc_*: collections and objects collected, per generation
GC_FROZEN = Gauge("cgsvc_gc_frozen_objects", "Objects alive after start-up that the garbage collector never walks "
                  "(gc.freeze; docs/decisions.md)", registry=REGISTRY)
GC_FROZEN.set_function(gc.get_freeze_count)
GC_PAUSE = Histogram("cgsvc_gc_pause_seconds", "How long each garbage collection of generation 1 or 2 held the "
                     "process (generation 0's, many a second, are not timed)", ["generation"], registry=REGISTRY,
                     buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
RPC_TOTAL = Counter("cgsvc_rpc_total", "RPCs answered", ["method", "code"], registry=REGISTRY)
RPC_SECONDS = Histogram("cgsvc_rpc_seconds", "RPC latency", ["method"], registry=REGISTRY,
                        buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1, 5))
AUDIT_APPEND_SECONDS = Histogram("cgsvc_audit_append_seconds", "Audit group-commit transaction time",
                                 registry=REGISTRY,
                                 buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.5))
AUDIT_BATCH_RECORDS = Histogram("cgsvc_audit_batch_records", "Records per group commit", registry=REGISTRY,
                                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256))
REPLICA_TAKEOVERS = Counter("cgsvc_replica_takeovers", "Launches and experiments this replica took over from "
                            "replicas whose lease had lapsed", ["kind"], registry=REGISTRY)
LEASE_LAPSES = Counter("cgsvc_replica_lease_lapses", "Times this replica, renewing its lease, found it had lapsed (other "
                       "replicas may have taken over its launches)", registry=REGISTRY)
LEASE_GAP = Gauge("cgsvc_replica_lease_renewal_gap_seconds", "Seconds between this replica's last two lease renewals, "
                  "on the database's clock (a lease lapses at --lease-seconds)", registry=REGISTRY)
LOGS_REMOVED = Counter("cgsvc_launch_logs_removed", "Ended launches whose logs and events this replica removed "
                       "(--launch-retention-days)", registry=REGISTRY)
CREDENTIAL_RELOADS = Counter("cgsvc_credential_reloads", "Reloads of the token file and TLS files (SIGHUP, or "
                             "--credentials-poll-seconds), applied or refused", ["outcome"], registry=REGISTRY)
TLS_EXPIRY = Gauge("cgsvc_tls_certificate_expiry_timestamp_seconds", "When the certificate in use stops being valid: "
                   "tls_cert's first certificate, and tls_client_ca's earliest (alert well before it)", ["setting"],
                   registry=REGISTRY)
SERVER_INFO = Gauge("cgsvc_server_info", "Always 1: the labels say this server's version and the event loop it runs "
                    "on (--event-loop; read from the running loop)", ["version", "event_loop"], registry=REGISTRY)
PLANS_TOTAL = Counter("cgsvc_plans_total", "Plans resolved", ["prefill_backend", "decode_backend"],
                      registry=REGISTRY)
LAUNCH_SUBSTITUTIONS = Counter("cgsvc_launch_substitutions", "Plan fields that the workers of launches ended on this "
                               "replica ran as something other than planned (their reports' plan fidelity), by "
                               "dispatcher and field", ["dispatcher", "field"], registry=REGISTRY)
LAUNCH_TTFT = Histogram("cgsvc_launch_ttft_seconds", "Each launch ended on this replica: the median time to first "
                        "token its workers measured (none for a launch that measured nothing)", ["dispatcher"],
                        registry=REGISTRY, buckets=(.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60))
LAUNCH_TPOT = Histogram("cgsvc_launch_tpot_seconds", "Each launch ended on this replica: the median time per output "
                        "token after the first its workers measured (none where no request got a second token)",
                        ["dispatcher"], registry=REGISTRY,
                        buckets=(.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5))


def launch_series(dispatchers: Iterable[str]) -> None:
    """Every dispatcher's launch series at 0 before any launch ends, so that an alert on one
    (`increase(cgsvc_launch_substitutions_total{field="decode.backend"}[1h]) > 0`) needs no
    absent-series care."""
    for name in dispatchers:
        for field in PLAN_FIELDS:
            LAUNCH_SUBSTITUTIONS.labels(name, field)
        LAUNCH_TTFT.labels(name)
        LAUNCH_TPOT.labels(name)


def observe_launch(row: LaunchRow) -> None:
    """What an ended launch's report says: each field it substituted, and its median latencies."""
    said = reported_cells(row.report_json)
    for field in filter(None, said["substituted"].split(",")):
        LAUNCH_SUBSTITUTIONS.labels(row.dispatcher, field).inc()
    for histogram, measure in ((LAUNCH_TTFT, "ttft_ms_p50"), (LAUNCH_TPOT, "tpot_ms_p50")):
        if said[measure] is not None:
            histogram.labels(row.dispatcher).observe(said[measure] / 1000)


class LaunchCollector:
    """The launches and devices of the replica serving now (`launches`, set at start), read
    from the store when scraped; every dispatcher and state has a series, 0 included, so that
    an alert on one needs no absent-series care."""

    def __init__(self) -> None:
        self.launches: Launches | None = None
        self.experiments: Experiments | None = None

    def collect(self) -> Iterator[Metric]:
        launches, experiments = self.launches, self.experiments
        if launches is None or experiments is None:
            return
        running = GaugeMetricFamily("cgsvc_experiments_running", "Experiments this replica runs now")
        running.add_metric([], experiments.running())
        finished = CounterMetricFamily("cgsvc_experiments_ended", "Experiments that ended on this replica, by how "
                                       "(since it started)", labels=["state"])
        for state in EXPERIMENT_STATES[1:]:
            finished.add_metric([state], experiments.ended[state])
        yield from (running, finished)
        mine, devices = launches.occupancy()
        active = GaugeMetricFamily("cgsvc_launches_active", "Launches this replica supervises now, by state",
                                   labels=["dispatcher", "state"])
        now = collections.Counter((r.dispatcher, r.state) for r in mine)
        ended = CounterMetricFamily("cgsvc_launches_ended", "Launches that ended while this replica supervised "
                                    "them, by how (since it started)", labels=["dispatcher", "state"])
        for name in launches.dispatchers:
            for state in ACTIVE:
                active.add_metric([name, state], now[(name, state)])
            for state in TERMINAL:
                ended.add_metric([name, state], launches.ended[(name, state)])
        unrecorded = CounterMetricFamily(
            "cgsvc_launches_unrecorded", "Launches this replica stored whose accepted record did not commit (the "
            "database went away between the two), by what became of them (since it started): finished by the "
            "caller's retry, placed (the record had committed after all), or failed (ended unstarted)",
            labels=["outcome"])
        for outcome in UNRECORDED_OUTCOMES:
            unrecorded.add_metric([outcome], launches.unrecorded[outcome])
        waiting = GaugeMetricFamily("cgsvc_launches_awaiting_record", "Launches stored without their accepted "
                                    "record, not placed, waiting for their caller's retry", len(launches.unfinished))
        yield from (unrecorded, waiting)
        held = GaugeMetricFamily("cgsvc_devices", "Each dispatcher's devices, busy (held by an active launch) or free",
                                 labels=["dispatcher", "status"])
        for name, (busy, slots) in devices.items():
            held.add_metric([name, "busy"], busy)
            held.add_metric([name, "free"], slots - busy)
        yield from (active, ended, held)


LAUNCHES = LaunchCollector()
REGISTRY.register(LAUNCHES)


def observe_batch(records: int, seconds: float) -> None:
    AUDIT_APPEND_SECONDS.observe(seconds)
    AUDIT_BATCH_RECORDS.observe(records)


def time_gc_pauses() -> None:
    """Time the collections that can stall the event loop (generations 1 and 2) into GC_PAUSE."""
    started = [0.0]
    by_generation = {g: GC_PAUSE.labels(str(g)) for g in (1, 2)}

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if info["generation"] == 0:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            by_generation[info["generation"]].observe(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
