"""The audit store: one SQLAlchemy Core code path for SQLite and PostgreSQL.

Appends are linearised on the `chain_head` row: PostgreSQL takes it `FOR UPDATE`, SQLite
starts every write transaction with `BEGIN IMMEDIATE`. Several server replicas on one
PostgreSQL database therefore append to one chain with no forks (sequence is the primary
key), no gaps and no duplicates. A batch of appends shares one transaction: group commit,
one fsync for the batch, and nobody is answered before that commit.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import difflib
import functools
import hashlib
import json
import logging
import math
import operator
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from cgsvc import catalog
from cgsvc.audit import filters, merkle
from cgsvc.audit.records import GENESIS, AuditEntry, AuditRecord, chain, mask_secrets, utc_now
from cgsvc.contract import REPORT_MEASURES, substituted
from cgsvc.errors import CODE_NUMBERS, clip
from cgsvc.spec import ATTENTION_BACKENDS, DECODE_GRAPH_BACKENDS, PREFILL_GRAPH_BACKENDS

log = logging.getLogger("cgsvc.audit.store")
metadata = sa.MetaData()

schema_migrations = sa.Table(
    "schema_migrations", metadata,
    sa.Column("version", sa.Integer, primary_key=True),
    sa.Column("description", sa.Text, nullable=False),
    sa.Column("applied_at", sa.Text, nullable=False),
)
audit_records = sa.Table(
    "audit_records", metadata,
    # On SQLite the sequence is the rowid (INTEGER PRIMARY KEY, migration 7): one B-tree, not two.
    sa.Column("sequence", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True,
              autoincrement=False),
    sa.Column("schema_version", sa.Integer, nullable=False),
    sa.Column("time", sa.Text, nullable=False, index=True),
    sa.Column("principal", sa.Text, nullable=False, index=True),
    sa.Column("peer", sa.Text, nullable=False),
    sa.Column("method", sa.Text, nullable=False, index=True),
    sa.Column("request_id", sa.Text, nullable=False),
    sa.Column("trace_id", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False, index=True),
    sa.Column("gpu", sa.Text, nullable=False, index=True),
    sa.Column("spec_json", sa.Text, nullable=False),
    sa.Column("spec_hash", sa.Text, nullable=False),
    sa.Column("plan_json", sa.Text, nullable=False),
    sa.Column("plan_hash", sa.Text, nullable=False),
    sa.Column("rule_ids", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("service_version", sa.Text, nullable=False),
    sa.Column("outcome_code", sa.Integer, nullable=False, index=True),
    sa.Column("outcome_message", sa.Text, nullable=False),
    sa.Column("launch_id", sa.Text, nullable=False, index=True),
    sa.Column("plan_id", sa.Text, nullable=False, index=True),
    sa.Column("prev_hash", sa.Text, nullable=False),
    # Not unique-indexed (migration 7): the chain makes hashes distinct, and a B-tree keyed by
    # a random hash cost a page per record per commit.
    sa.Column("record_hash", sa.Text, nullable=False),
)
audit_rule_ids = sa.Table(
    "audit_rule_ids", metadata,
    sa.Column("sequence", sa.BigInteger, primary_key=True),
    sa.Column("rule_id", sa.Text, primary_key=True, index=True),
)
# Rule sets (migration 5): the rule ids of a record are one of few distinct sets, so a record
# carries its set's id and the set's members are stored once; `rule_id = X` finds the sets
# with X, then their records. (Before: one index row per rule per record, ~10 per append.)
rule_sets = sa.Table(
    "rule_sets", metadata,
    sa.Column("set_id", sa.Text, primary_key=True),
    sa.Column("rule_ids", sa.Text, nullable=False),
)
rule_set_members = sa.Table(
    "rule_set_members", metadata,
    sa.Column("rule_id", sa.Text, primary_key=True),
    sa.Column("set_id", sa.Text, primary_key=True),
)
AUDIT_COLUMNS_5 = (sa.Column("rule_set", sa.Text, nullable=False, server_default="", index=True),)
for _column in AUDIT_COLUMNS_5:
    audit_records.append_column(_column)
# Migration 6: the policy's name (records written before named policies were all cgsvc's; a
# version-1 record's hash does not cover it).
AUDIT_COLUMNS_6 = (sa.Column("policy", sa.Text, nullable=False, server_default="cgsvc"),)
for _column in AUDIT_COLUMNS_6:
    audit_records.append_column(_column)
# Migration 7: a plan is the record that created it. These columns are the plan's listing
# fields that the record does not already carry (they are read off its plan_json, which the
# record's hash covers); plan_created marks the record that made the plan (not a replay, not a
# launch that names it). Before: a `plans` table with seven B-trees of its own per append.
AUDIT_COLUMNS_7: tuple[sa.Column[Any], ...] = (
    sa.Column("plan_created", sa.Integer, nullable=False, server_default="0"),
    sa.Column("prefill_backend", sa.Text, nullable=False, server_default=""),
    sa.Column("decode_backend", sa.Text, nullable=False, server_default=""),
    sa.Column("attention_prefill", sa.Text, nullable=False, server_default=""),
    sa.Column("attention_decode", sa.Text, nullable=False, server_default=""),
)
for _column in AUDIT_COLUMNS_7:
    audit_records.append_column(_column)
PLAN_COLUMNS = tuple(c.name for c in AUDIT_COLUMNS_7[1:])  # PlanListing's fields
chain_head = sa.Table(
    "chain_head", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("sequence", sa.BigInteger, nullable=False),
    sa.Column("record_hash", sa.Text, nullable=False),
)
# Added by migration 4: the Merkle tree's right edge, {level: hex hash}, one per set bit of
# the tree size; with it an append reads nothing but this row.
CHAIN_HEAD_COLUMNS_4 = (sa.Column("frontier", sa.Text, nullable=False, server_default="{}"),)
for _column in CHAIN_HEAD_COLUMNS_4:
    chain_head.append_column(_column)
# Every complete, aligned subtree of the Merkle tree: level L, index i covers leaves
# [i * 2**L, (i + 1) * 2**L) (leaf k is record sequence k + 1). Proofs read O(log n) of them.
# Keyed by the subtree's in-order position (merkle.node_position), so an append's new nodes
# land on the table's last page (migration 7; before, keyed by (level, idx), they landed on
# one page per level).
merkle_nodes = sa.Table(
    "merkle_nodes", metadata,
    sa.Column("pos", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=False),
    sa.Column("hash", sa.Text, nullable=False),
)
# Plans before migration 7, when a plan was a row of its own beside the record that created it.
# Created by migration 1, folded into audit_records and dropped by migration 7.
plans_v1 = sa.Table(
    "plans", metadata,
    sa.Column("plan_id", sa.Text, primary_key=True),
    sa.Column("sequence", sa.BigInteger, nullable=False, unique=True),
    sa.Column("create_time", sa.Text, nullable=False, index=True),
    sa.Column("principal", sa.Text, nullable=False),
    sa.Column("model", sa.Text, nullable=False, index=True),
    sa.Column("gpu", sa.Text, nullable=False, index=True),
    sa.Column("prefill_backend", sa.Text, nullable=False),
    sa.Column("decode_backend", sa.Text, nullable=False),
    sa.Column("attention_prefill", sa.Text, nullable=False),
    sa.Column("attention_decode", sa.Text, nullable=False),
    sa.Column("policy_version", sa.Text, nullable=False),
    sa.Column("plan_hash", sa.Text, nullable=False, index=True),
    sa.Column("spec_json", sa.Text, nullable=False),
    sa.Column("plan_json", sa.Text, nullable=False),
)
PLAN_COLUMNS_6 = (sa.Column("policy", sa.Text, nullable=False, server_default="cgsvc"),)
for _column in PLAN_COLUMNS_6:
    plans_v1.append_column(_column)
# Idempotency keys before migration 7: a rowid table, its primary key and a request_id index —
# three B-trees, two of them keyed by the caller's random request id. Created by migration 1,
# dropped by migration 7 after its rows move to idempotency_keys.
idempotency_v1 = sa.Table(
    "idempotency", metadata,
    sa.Column("principal", sa.Text, primary_key=True),
    sa.Column("method", sa.Text, primary_key=True),
    sa.Column("request_id", sa.Text, primary_key=True, index=True),
    sa.Column("sequence", sa.BigInteger, nullable=False),
)
# The first record of each (request_id, principal, method): one B-tree (WITHOUT ROWID on
# SQLite), looked up by its leading column for a batch's request ids.
idempotency = sa.Table(
    "idempotency_keys", metadata,
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("principal", sa.Text, primary_key=True),
    sa.Column("method", sa.Text, primary_key=True),
    sa.Column("sequence", sa.BigInteger, nullable=False),
    sqlite_with_rowid=False,
)

# Migration 8: each distinct plan JSON stored once, keyed by its SHA-256. A record whose
# plan_json column holds "@" + that hash carries its plan by reference (a plan's JSON always
# starts with "{"); the record and its hash are the same either way.
plan_bodies = sa.Table(
    "plan_bodies", metadata,
    sa.Column("body_hash", sa.Text, primary_key=True),
    sa.Column("plan_json", sa.Text, nullable=False),
    sqlite_with_rowid=False,
)
BODY_REF = "@"

launches = sa.Table(
    "launches", metadata,
    sa.Column("launch_id", sa.Text, primary_key=True),
    sa.Column("sequence", sa.BigInteger, nullable=False, unique=True),  # order of creation
    sa.Column("plan_id", sa.Text, nullable=False, index=True),
    sa.Column("state", sa.Text, nullable=False, index=True),
    sa.Column("principal", sa.Text, nullable=False),
    sa.Column("dispatcher", sa.Text, nullable=False),
    sa.Column("tp", sa.Integer, nullable=False),
    sa.Column("model_path", sa.Text, nullable=False),
    sa.Column("workload_json", sa.Text, nullable=False),
    sa.Column("create_time", sa.Text, nullable=False, index=True),
    sa.Column("update_time", sa.Text, nullable=False),
    sa.Column("tokens_done", sa.BigInteger, nullable=False, default=0),
    sa.Column("tokens_total", sa.BigInteger, nullable=False, default=0),
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("report_json", sa.Text, nullable=False, default=""),
    sa.Column("run_dir", sa.Text, nullable=False),
    sa.Column("handle_json", sa.Text, nullable=False, default=""),  # how to find the running group again
    sa.Column("owner", sa.Text, nullable=False, default=""),  # the server instance supervising it
)
# Added by migration 3 (to launches tables that predate them).
LAUNCH_COLUMNS_3 = (
    sa.Column("devices_json", sa.Text, nullable=False, server_default="[]"),  # one device per rank, rank order
    sa.Column("placement", sa.Text, nullable=False, server_default=""),  # how they were chosen; substitutions
    sa.Column("request_id", sa.Text, nullable=False, server_default=""),
    sa.Column("request_hash", sa.Text, nullable=False, server_default=""),
)
for _column in LAUNCH_COLUMNS_3:
    launches.append_column(_column)


def _counts(*names: str) -> tuple[sa.Column[Any], ...]:
    """Counters added to a table that has rows already: 0 for those."""
    return tuple(sa.Column(name, sa.BigInteger, nullable=False, server_default=sa.text("0")) for name in names)


# Migration 9: a cancel asked of any replica, for the one that supervises the launch to act on.
LAUNCH_COLUMNS_9 = (sa.Column("cancel_requested_by", sa.Text, nullable=False, server_default=""),)
# Migration 11: why the service itself asked for a cancel (an ended experiment's launch, say).
LAUNCH_COLUMNS_11 = (sa.Column("cancel_reason", sa.Text, nullable=False, server_default=""),)
# Migration 16: prompt tokens prefilled, beside the tokens generated.
LAUNCH_COLUMNS_16 = _counts("prompt_tokens_done", "prompt_tokens_total")
# Migration 17: the engine settings a launch was asked to run with ("{}": every default).
LAUNCH_COLUMNS_17 = (sa.Column("engine_json", sa.Text, nullable=False, server_default="{}"),)
# Migration 18: sizes captured or compiled before the run, of how many.
LAUNCH_COLUMNS_18 = _counts("capture_done", "capture_total")
# Migration 19: what its report says the workers ran, to filter on (reported_cells): the plan
# fields they substituted (`substituted = FIELD`, `substituted = "none"`) and the dtype.
LAUNCH_COLUMNS_19 = (sa.Column("substituted", sa.Text, nullable=False, server_default=""),
                     sa.Column("dtype", sa.Text, nullable=False, server_default=""))
# Migration 20: the launch a launch runs again (CreateLaunch's rerun_of), by ID; "" for none.
LAUNCH_COLUMNS_20 = (sa.Column("rerun_of", sa.Text, nullable=False, server_default=""),)
# Migration 23: the caller's labels, each key=value between commas, sorted by key (",team=infra,"),
# "" for none: `labels.team = "infra"` is one LIKE on the row (keys and values hold no , or =).
LAUNCH_COLUMNS_23 = (sa.Column("labels", sa.Text, nullable=False, server_default=""),)
# Migration 24: the experiment that made a launch (one of its arms' runs), by ID; "" for a launch
# asked for on its own.
LAUNCH_COLUMNS_24 = (sa.Column("experiment", sa.Text, nullable=False, server_default=""),)
# Migration 27: what its report says the run measured, to filter on (`ttft_ms_p50 > 200`):
# NULL where it measured nothing (no report yet, a failed group, TPOT with no second token), so
# that no comparison matches it.
LAUNCH_COLUMNS_27 = tuple(sa.Column(name, sa.Float, nullable=True) for name in REPORT_MEASURES)
_ADDED: tuple[sa.Column[Any], ...] = (*LAUNCH_COLUMNS_9, *LAUNCH_COLUMNS_11, *LAUNCH_COLUMNS_16, *LAUNCH_COLUMNS_17,
                                      *LAUNCH_COLUMNS_18, *LAUNCH_COLUMNS_19, *LAUNCH_COLUMNS_20, *LAUNCH_COLUMNS_23,
                                      *LAUNCH_COLUMNS_24, *LAUNCH_COLUMNS_27)
for _column in _ADDED:
    launches.append_column(_column)


def plans_cell(plans: Sequence[str]) -> str:
    """experiments.plans for an experiment's plans ("plans/A", "plans/B"): ",A,B,"."""
    return filters.delimited(p.removeprefix("plans/") for p in plans) if plans else ""


def reported_cells(report_json: str) -> dict[str, Any]:
    """launches.substituted, .dtype and the measures (REPORT_MEASURES) for a launch's stored
    report; "" in each text cell and None in each measure while there is none, or it does not
    say (a group that failed before it ran: nothing is known). `substituted`: each plan field
    the workers substituted between commas (",decode.backend,"), just "," for a launch that ran
    every field as planned (or as not applicable)."""
    report: Any = {}
    if report_json:
        try:
            report = json.loads(report_json)
        except ValueError:
            report = {}
    if not report or not isinstance(report, dict):
        return {"substituted": "", "dtype": "", **dict.fromkeys(REPORT_MEASURES)}
    said = filters.delimited(substituted(report)) if report.get("plan_fidelity") else ""  # a failure may say none
    return {"substituted": said, "dtype": str(report.get("dtype") or ""), **_measures(report)}


def _measures(report: dict[str, Any]) -> dict[str, float | None]:
    """What a succeeded run's report aggregate says it measured (REPORT_MEASURES), None for
    each it does not (a percentile of no samples is left out by the workers)."""
    aggregate = report.get("aggregate") if report.get("status") == "ok" else None
    aggregate = aggregate if isinstance(aggregate, dict) else {}

    def number(value: Any) -> float | None:
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        return float(value) if ok else None

    out: dict[str, float | None] = {"throughput_tok_s": number(aggregate.get("throughput_tok_s"))}
    for metric in ("ttft_ms", "tpot_ms"):
        section = aggregate.get(metric)
        for pct in ("p50", "p99"):
            out[f"{metric}_{pct}"] = number(section.get(pct)) if isinstance(section, dict) else None
    return out


# One launch per (principal, request_id): a retried CreateLaunch finds the launch it started.
launch_requests = sa.Table(
    "launch_requests", metadata,
    sa.Column("principal", sa.Text, primary_key=True),
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("launch_id", sa.Text, nullable=False),
)
# One experiment per (principal, request_id) (migration 22): a retried CreateExperiment finds the
# experiment it started; request_hash tells a retry from another request under the same key.
experiment_requests = sa.Table(
    "experiment_requests", metadata,
    sa.Column("principal", sa.Text, primary_key=True),
    sa.Column("request_id", sa.Text, primary_key=True),
    sa.Column("experiment_id", sa.Text, nullable=False),
    sa.Column("request_hash", sa.Text, nullable=False),
)
# A/B experiments (migration 6): two plans run as interleaved launches, and what they measured.
experiments = sa.Table(
    "experiments", metadata,
    sa.Column("experiment_id", sa.Text, primary_key=True),
    sa.Column("sequence", sa.BigInteger, nullable=False, unique=True),  # order of creation
    sa.Column("state", sa.Text, nullable=False, index=True),
    sa.Column("principal", sa.Text, nullable=False),
    sa.Column("create_time", sa.Text, nullable=False, index=True),
    sa.Column("update_time", sa.Text, nullable=False),
    sa.Column("request_json", sa.Text, nullable=False),  # plans, workload, repeats, model path, dispatcher
    sa.Column("launches_json", sa.Text, nullable=False, default="[]"),  # [{"arm", "repeat", "launch"}], run order
    sa.Column("result_json", sa.Text, nullable=False, default=""),  # per-arm statistics, difference, verdict
    sa.Column("error", sa.Text, nullable=False, default=""),
    sa.Column("audit_records_json", sa.Text, nullable=False, default="[]"),
    sa.Column("owner", sa.Text, nullable=False, default=""),  # the server instance running it
)
# Migration 15: a cancel asked of any replica, for the one that runs the experiment to act on.
EXPERIMENT_COLUMNS_15 = (sa.Column("cancel_requested_by", sa.Text, nullable=False, server_default=""),)
# Migration 21: the experiment an experiment runs again (CreateExperiment's rerun_of), by ID; "" for none.
EXPERIMENT_COLUMNS_21 = (sa.Column("rerun_of", sa.Text, nullable=False, server_default=""),)
# Migration 25: the caller's labels of an experiment, in launches.labels' form (",team=infra,").
EXPERIMENT_COLUMNS_25 = (sa.Column("labels", sa.Text, nullable=False, server_default=""),)
# Migration 26: the IDs of its two plans between commas (",A,B,"), for `plan = "plans/ID"`.
EXPERIMENT_COLUMNS_26 = (sa.Column("plans", sa.Text, nullable=False, server_default=""),)
for _column in EXPERIMENT_COLUMNS_15 + EXPERIMENT_COLUMNS_21 + EXPERIMENT_COLUMNS_25 + EXPERIMENT_COLUMNS_26:
    experiments.append_column(_column)
# One lease per server instance (migration 10), renewed while the server runs, on the database's
# clock (db_epoch): on a shared database a replica whose lease has lapsed is taken to be gone, and
# another replica takes over its launches and experiments.
replica_leases = sa.Table(
    "replica_leases", metadata,
    sa.Column("owner", sa.Text, primary_key=True),  # the server instance (launches.owner)
    sa.Column("host", sa.Text, nullable=False),  # the machine it runs on: where its worker groups run
    sa.Column("started_at", sa.Text, nullable=False),
    sa.Column("renewed_at", sa.Float, nullable=False),  # seconds since the epoch, the database's clock
)
# Migration 13: the cgsvc release each replica runs, written with each renewal ("" for a replica
# of an earlier release), so that a rolling upgrade's mixed fleet shows.
REPLICA_COLUMNS_13 = (sa.Column("version", sa.Text, nullable=False, server_default=""),)
# Migration 14: HOST:PORT a replica's clients reach it at (--advertise-address), written with
# each renewal ("" for a replica of an earlier release): where a launch's logs are to be asked.
REPLICA_COLUMNS_14 = (sa.Column("address", sa.Text, nullable=False, server_default=""),)
for _column in REPLICA_COLUMNS_13 + REPLICA_COLUMNS_14:
    replica_leases.append_column(_column)
# The log's signing keys, one generation each (the highest signs today). Not evidence: a
# replica's check at start and before each checkpoint that it signs with the log's key. The
# evidence is the rotation records in the log itself (cgsvc/audit/keys.py).
signing_keys = sa.Table(
    "signing_keys", metadata,
    sa.Column("generation", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("key_id", sa.Text, nullable=False),
    sa.Column("public_key", sa.Text, nullable=False),
    sa.Column("sequence", sa.BigInteger, nullable=False),  # the rotation record; 0 for the first key
    sa.Column("added_at", sa.Text, nullable=False),
)

# Migrations, in order. Each is (version, description, tables it creates, columns it adds to
# existing tables); the applied set is recorded in schema_migrations.
MIGRATIONS: tuple[tuple[int, str, tuple[sa.Table, ...], tuple[tuple[sa.Table, sa.Column], ...]], ...] = (
    (1, "audit log, chain head, plans and idempotency keys",
     (audit_records, audit_rule_ids, chain_head, plans_v1, idempotency_v1), ()),
    (2, "launches", (launches,), ()),
    (3, "launch devices and placement, idempotent CreateLaunch", (launch_requests,),
     tuple((launches, c) for c in LAUNCH_COLUMNS_3)),
    (4, "Merkle tree over the audit records (RFC 9162)", (merkle_nodes,),
     tuple((chain_head, c) for c in CHAIN_HEAD_COLUMNS_4)),
    (5, "rule sets instead of one index row per rule per record; idempotency keys indexed by request id",
     (rule_sets, rule_set_members),
     tuple((audit_records, c) for c in AUDIT_COLUMNS_5)),
    (6, "named policies on records and plans; A/B experiments", (experiments,),
     tuple((audit_records, c) for c in AUDIT_COLUMNS_6) + tuple((plans_v1, c) for c in PLAN_COLUMNS_6)),
    (7, "fewer B-trees and pages on the append path: a plan is the record that created it, idempotency "
        "keys in one B-tree, the sequence as SQLite's rowid, no unique index on record hashes, Merkle nodes "
        "keyed by in-order position", (idempotency,), ()),
    (8, "each distinct plan JSON stored once (plan_bodies); new records carry it by reference", (plan_bodies,), ()),
    (9, "a launch's cancel asked of any replica (launches.cancel_requested_by)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_9)),
    (10, "a lease per replica, for the others to take over a gone replica's launches (replica_leases)",
     (replica_leases,), ()),
    (11, "why a cancel was asked, where the service asked it (launches.cancel_reason)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_11)),
    (12, "the log's signing key, one generation at a time (signing_keys)", (signing_keys,), ()),
    (13, "the release each replica runs (replica_leases.version)", (),
     tuple((replica_leases, c) for c in REPLICA_COLUMNS_13)),
    (14, "the address each replica's clients reach it at (replica_leases.address)", (),
     tuple((replica_leases, c) for c in REPLICA_COLUMNS_14)),
    (15, "who asked for an experiment to be cancelled (experiments.cancel_requested_by)", (),
     tuple((experiments, c) for c in EXPERIMENT_COLUMNS_15)),
    (16, "prompt tokens prefilled, beside the tokens generated (launches.prompt_tokens_done, _total)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_16)),
    (17, "the engine settings a launch runs with: dtype, KV cache budget, CPU decode (launches.engine_json)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_17)),
    (18, "sizes captured or compiled before the run (launches.capture_done, capture_total)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_18)),
    (19, "what each launch's workers ran, to filter on: the plan fields they substituted, the dtype "
         "(launches.substituted, launches.dtype)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_19)),
    (20, "the launch each launch runs again, if any (launches.rerun_of)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_20)),
    (21, "the experiment each experiment runs again, if any (experiments.rerun_of)", (),
     tuple((experiments, c) for c in EXPERIMENT_COLUMNS_21)),
    (22, "idempotent CreateExperiment: the experiment a (principal, request id) made (experiment_requests)",
     (experiment_requests,), ()),
    (23, "the caller's labels of each launch (launches.labels)", (), tuple((launches, c) for c in LAUNCH_COLUMNS_23)),
    (24, "the experiment that made each launch, if any (launches.experiment)", (),
     tuple((launches, c) for c in LAUNCH_COLUMNS_24)),
    (25, "the caller's labels of each experiment (experiments.labels)", (),
     tuple((experiments, c) for c in EXPERIMENT_COLUMNS_25)),
    (26, "the plans each experiment measured, to filter on (experiments.plans)", (),
     tuple((experiments, c) for c in EXPERIMENT_COLUMNS_26)),
    (27, "what each launch measured, to filter on: TTFT and TPOT p50 and p99, throughput (launches.ttft_ms_p50, "
         "...)", (), tuple((launches, c) for c in LAUNCH_COLUMNS_27)),
)

# GPUs and catalog models are matched as a spec names them: in any case, a model by an alias too.
GPU_NAME = filters.Catalogued(lambda v: g.name if (g := catalog.find_gpu(v)) else None)
MODEL_NAME = filters.Catalogued(lambda v: m.name if (m := catalog.find_model(v)) else None)
AUDIT_FILTER_FIELDS: dict[str, filters.FieldKind] = {
    "model": MODEL_NAME, "gpu": GPU_NAME, "rule_id": "str", "principal": "str", "outcome": "str", "method": "str",
    "time": "time", "request_id": "str", "plan_id": filters.Named("plans"), "launch_id": filters.Named("launches"),
    "sequence": "int", "policy_version": "str", "policy": "str"}
# Plans are listed from the records that created them; create_time is the record's time.
PLAN_FILTER_COLUMNS = {"create_time": "time"}
PLAN_FILTER_FIELDS: dict[str, filters.FieldKind] = {
    "model": MODEL_NAME, "gpu": GPU_NAME, "prefill_backend": filters.Closed(PREFILL_GRAPH_BACKENDS),
    "decode_backend": filters.Closed(DECODE_GRAPH_BACKENDS), "attention_prefill": filters.Closed(ATTENTION_BACKENDS),
    "attention_decode": filters.Closed(ATTENTION_BACKENDS), "policy_version": "str", "plan_hash": "str",
    "principal": "str", "create_time": "time", "policy": "str", "rule_id": "str"}
MAX_PAGE_SIZE = 1000
DEFAULT_PAGE_SIZE = 50


class TreeSizeError(ValueError):
    """A tree size or record beyond the log."""


class PageTokenError(ValueError):
    """A page token this store did not issue for this filter, or a page size out of range;
    `field` names which (the message does not repeat it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field, self.message = field, message


def db_epoch(dialect: str) -> sa.ColumnElement[float]:
    """The database server's clock, in seconds since the epoch: one clock for every replica."""
    if dialect == "postgresql":
        return sa.cast(sa.func.extract("epoch", sa.func.clock_timestamp()), sa.Float)
    return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float)


@dataclass(frozen=True)
class PlanListing:
    """What the record that creates a plan adds to itself: the plan's listing fields the record
    does not already carry (its id, model, GPU, policy, hash, spec and plan JSON are the record's)."""

    prefill_backend: str
    decode_backend: str
    attention_prefill: str
    attention_decode: str


@dataclass(frozen=True)
class PlanRow:
    """A stored plan, as GetPlan and ListPlans read it off the record that created it."""

    plan_id: str
    model: str
    gpu: str
    prefill_backend: str
    decode_backend: str
    attention_prefill: str
    attention_decode: str
    policy_version: str
    plan_hash: str
    spec_json: str
    plan_json: str
    policy: str = "cgsvc"


@dataclass(frozen=True)
class StoredPlan:
    row: PlanRow
    sequence: int
    create_time: str
    principal: str


@dataclass(frozen=True)
class PendingAppend:
    """One append: the entry, the plan it creates (if any), and its idempotency key."""

    entry: AuditEntry
    plan: PlanListing | None = None
    request_id: str = ""


@dataclass(frozen=True)
class AppendResult:
    record: AuditRecord
    replay_of: AuditRecord | None = None  # the first record for this request_id, when replayed
    conflict: bool = False  # request_id reused with a different spec


class SpecGroup(NamedTuple):
    """The records of one spec (store.spec_groups): how many, the first, the latest that holds a
    plan (0 for none) and the latest."""

    spec_hash: str
    records: int
    first: int
    last_planned: int
    last: int


@dataclass(frozen=True)
class Verification:
    ok: bool
    records_checked: int
    first_bad_sequence: int
    reason: str
    head_hash: str


def _sqlite_engines(url: str) -> tuple[Engine, Engine]:
    def configure(engine: Engine, immediate: bool) -> Engine:
        @event.listens_for(engine, "connect")
        def on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=FULL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    args = {"check_same_thread": False, "timeout": 30}
    return (configure(sa.create_engine(url, connect_args=args), True),
            configure(sa.create_engine(url, connect_args=args), False))


@functools.lru_cache(maxsize=4096)
def _rule_set_id(rule_ids: tuple[str, ...]) -> str:
    ids = sorted(set(rule_ids))
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32] if ids else ""


def rule_set_id(rule_ids: Sequence[str]) -> str:
    """The id of a set of rule ids ("" for none)."""
    if isinstance(rule_ids, tuple):
        return _rule_set_id(rule_ids)
    ids = sorted(set(rule_ids))
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:32] if ids else ""


def _side_rows(bodies: Mapping[str, str], sets: Mapping[str, Sequence[str]]) -> dict[str, list[dict[str, str]]]:
    """The rows stored beside records, by table (each inserted unless already there): plan
    bodies by their reference, and rule sets by id with a row per member rule."""
    members = {set_id: sorted(set(ids)) for set_id, ids in sets.items()}
    return {"plan_bodies": [{"body_hash": ref[1:], "plan_json": body} for ref, body in bodies.items()],
            "rule_sets": [{"set_id": k, "rule_ids": json.dumps(m)} for k, m in members.items()],
            "rule_set_members": [{"rule_id": r, "set_id": k} for k, m in members.items() for r in m]}


def _insert_rule_set(conn: Connection, set_id: str, rule_ids: Sequence[str]) -> None:
    """Store a rule set and its members unless another writer already did."""
    if conn.execute(sa.select(rule_sets.c.set_id).where(rule_sets.c.set_id == set_id)).first() is not None:
        return
    rows = _side_rows({}, {set_id: rule_ids})
    conn.execute(rule_sets.insert(), rows["rule_sets"])
    conn.execute(rule_set_members.insert(), rows["rule_set_members"])


def _own_connection(engine: Engine) -> Any:
    """A DBAPI connection configured like the engine's (pragmas), outside its pool: for a
    thread that holds one for the store's life."""
    pooled = engine.raw_connection()
    pooled.detach()
    return pooled.dbapi_connection


def _leaf(record_hash: str) -> bytes:
    """A record's Merkle leaf: H(0x00 || its 32-byte record_hash)."""
    return merkle.leaf_hash(bytes.fromhex(record_hash))


def _frontier_json(frontier: dict[int, bytes]) -> str:
    return json.dumps({str(k): v.hex() for k, v in sorted(frontier.items())})


def _frontier_from_json(text: str) -> dict[int, bytes]:
    return {int(k): bytes.fromhex(v) for k, v in json.loads(text or "{}").items()}


_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(AuditRecord))
_PLAN_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(PlanRow))


@functools.lru_cache(maxsize=1024)
def _body_ref(plan_json: str) -> str:
    """The reference a record stores for a plan's JSON."""
    return BODY_REF + hashlib.sha256(plan_json.encode()).hexdigest()


_NOT_A_PLAN: dict[str, Any] = {"plan_created": 0, **{name: "" for name in PLAN_COLUMNS}}


@functools.lru_cache(maxsize=4096)
def _rule_ids_json(rule_ids: tuple[str, ...]) -> str:
    return json.dumps(list(rule_ids))


_HEAD_SQL = "SELECT sequence, record_hash, frontier FROM chain_head WHERE id = 1"
_KEYS_SQL = "SELECT request_id, principal, method, sequence FROM idempotency_keys WHERE request_id"


# A PostgreSQL batch on the head its store last committed, as one statement (run in autocommit:
# it is the whole transaction, one message and one answer). `head` locks the chain head and
# divides by zero unless it is still the head the batch extends; every insert joins it, so
# none runs without that check. Rows arrive as JSON arrays of objects named like the columns.
_PG_APPEND_SQL = """WITH head AS (SELECT 1 / (sequence = %s)::int AS ok FROM chain_head WHERE id = 1 FOR UPDATE),
records AS (INSERT INTO audit_records SELECT r.* FROM json_populate_recordset(NULL::audit_records, %s::json) r, head),
keys AS (INSERT INTO idempotency_keys SELECT k.* FROM json_populate_recordset(NULL::idempotency_keys, %s::json) k, head),
nodes AS (INSERT INTO merkle_nodes SELECT n.* FROM json_populate_recordset(NULL::merkle_nodes, %s::json) n, head),
bodies AS (INSERT INTO plan_bodies SELECT b.* FROM json_populate_recordset(NULL::plan_bodies, %s::json) b, head
           ON CONFLICT DO NOTHING),
sets AS (INSERT INTO rule_sets SELECT s.* FROM json_populate_recordset(NULL::rule_sets, %s::json) s, head
         ON CONFLICT DO NOTHING),
members AS (INSERT INTO rule_set_members SELECT m.* FROM json_populate_recordset(NULL::rule_set_members, %s::json) m,
            head ON CONFLICT DO NOTHING)
UPDATE chain_head SET sequence = %s, record_hash = %s, frontier = %s FROM head WHERE id = 1"""


class _StaleHead(Exception):
    """An optimistic PostgreSQL append found no head to extend."""


NUL_MARK = "\\u0000"  # what a NUL character in a caller's value is recorded as


def _without_nul(item: PendingAppend) -> PendingAppend:
    """The append with every NUL character (U+0000) in its text written as the six characters
    `\\u0000`: PostgreSQL text cannot hold NUL, and one caller's NUL must not fail its batch (the
    other callers' records with it) or go unrecorded. Both stores record the same text, so a
    record's hash is the same on either."""
    entry = item.entry
    text = [v for v in entry.__dict__.values() if isinstance(v, str)]
    if "\x00" not in "".join([*text, *entry.rule_ids, item.request_id]):
        return item  # the common case, in one scan
    dirty: dict[str, Any] = {k: v.replace("\x00", NUL_MARK) for k, v in entry.__dict__.items()
                             if isinstance(v, str) and "\x00" in v}
    if any("\x00" in r for r in entry.rule_ids):
        dirty["rule_ids"] = tuple(r.replace("\x00", NUL_MARK) for r in entry.rule_ids)
    return PendingAppend(dataclasses.replace(entry, **dirty), item.plan, item.request_id.replace("\x00", NUL_MARK))


def _record_values(rec: AuditRecord) -> dict[str, Any]:
    d = dict(rec.__dict__)  # shallow: asdict's deep copy dominated the append path
    d["rule_ids"] = _rule_ids_json(rec.rule_ids)
    return d


class _RawInsert:
    """INSERT of whole rows through the driver's executemany: the append path's rows skip
    SQLAlchemy's per-row parameter processing, which cost more than the database itself."""

    def __init__(self, table: sa.Table, mark: str, skip_existing: bool = False) -> None:
        self.columns = [c.name for c in table.columns]
        # a row's values in column order, as a tuple (every table here has two columns or more)
        self._values = operator.itemgetter(*self.columns)
        self.sql = f"INSERT INTO {table.name} ({', '.join(self.columns)}) VALUES ({', '.join([mark] * len(self.columns))})"
        if skip_existing:
            self.sql += " ON CONFLICT DO NOTHING"

    def __call__(self, cur: Any, rows: Sequence[dict[str, Any]]) -> None:
        if rows:
            cur.executemany(self.sql, list(map(self._values, rows)))


def _page_bound(filter_text: str, order: filters.Order) -> str:
    """What a page token is bound to: its filter and its order."""
    if order.field:
        return f"{filter_text}\norder_by {order.field} {'desc' if order.desc else 'asc'}"
    return filter_text + ("\norder_by desc" if order.desc else "")


def page_token_after(sequence: int, filter_text: str, order_by: str) -> str:
    """The page token that goes on after the item with this sequence, for a listing with this
    filter and (valid, already checked) order_by of when items were made: where a page is cut
    short (it would not fit in one message), the next one starts. (An order by another field
    takes cursor_token, with the item's value.)"""
    return cursor_token(Cursor(sequence), filter_text, filters.Order(desc=order_by.lower().split()[1:] == ["desc"]))


@dataclass(frozen=True)
class Cursor:
    """Where a page ended: its last item's sequence and, in an order by a field, its value there."""

    sequence: int = 0
    value: float | None = None


def cursor_token(after: Cursor, filter_text: str, order: filters.Order) -> str:
    """A page token going on after `after`, bound to the filter and the order."""
    data: dict[str, Any] = {"after": after.sequence,
                            "f": hashlib.sha256(_page_bound(filter_text, order).encode()).hexdigest()[:12]}
    if order.field:
        data["v"] = after.value
    raw = json.dumps(data)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _decode_token(token: str, filter_text: str, order: filters.Order) -> Cursor | None:
    """The cursor a page token holds (None: no token, the first page)."""
    if not token:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        after, value = data["after"], data.get("v")
        digest = str(data["f"])
        if type(after) is not int or not 0 <= after < 1 << 63:  # a token this server made holds a sequence
            raise ValueError(after)
        if value is not None and (type(value) not in (int, float) or not math.isfinite(value)):
            raise ValueError(value)
    except (ValueError, KeyError, TypeError, binascii.Error, UnicodeDecodeError, AttributeError):
        raise PageTokenError("page_token", "is not one this server issued") from None
    if digest != hashlib.sha256(_page_bound(filter_text, order).encode()).hexdigest()[:12]:
        raise PageTokenError("page_token", "was issued for a different filter or order")
    return Cursor(after, None if value is None else float(value))


def _past(table: sa.Table, last: Cursor | None, order: filters.Order) -> Any:
    """The rows after `last` in `order` (all of them on a first page): by sequence, or by the
    order's field then sequence, with the rows without a value after every other."""
    seq = table.c.sequence
    if last is None:
        return sa.true()
    if not order.field:
        return seq < last.sequence if order.desc else seq > last.sequence
    column = table.c[order.field]
    if last.value is None:
        return column.is_(None) & (seq > last.sequence)
    beyond = column < last.value if order.desc else column > last.value
    return beyond | ((column == last.value) & (seq > last.sequence)) | column.is_(None)


def _ordering(table: sa.Table, order: filters.Order) -> list[Any]:
    seq = table.c.sequence
    if not order.field:
        return [seq.desc() if order.desc else seq]
    column = table.c[order.field]
    return [(column.desc() if order.desc else column.asc()).nulls_last(), seq]


@functools.cache
def rpc_methods() -> dict[str, tuple[str, ...]]:
    """Every RPC of the cgsvc API by its short name in lower case ("createlaunch"), with the
    full names a record carries ("/cgsvc.v1.LaunchService/CreateLaunch")."""
    from cgsvc.v1 import audit_pb2, diagnostics_pb2, experiment_pb2, launch_pb2, plan_service_pb2

    out: dict[str, tuple[str, ...]] = {}
    for module in (plan_service_pb2, audit_pb2, launch_pb2, experiment_pb2, diagnostics_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for m in service.methods:
                out[m.name.lower()] = (*out.get(m.name.lower(), ()), f"/{service.full_name}/{m.name}")
    return out


def _method_term(column: Any, t: filters.Term) -> Any:
    """`method = "CreateLaunch"`: an RPC named as the listings show it (a bare word,
    case-insensitively) stands for its full name, and a prefix (`Create*`) for those of the RPCs
    whose names start so; a full name or an event the service records itself (`launch.state`,
    `experiment.state`) is compared as it is (None: not an RPC by name)."""
    value = str(t.value)
    if any(c in value for c in "./"):
        return None
    if t.prefix:
        full: tuple[str, ...] | None = tuple(name for short, names in rpc_methods().items()
                                             if short.startswith(value.lower()) for name in names)
    else:
        full = rpc_methods().get(value.lower())
    if full is None:
        near = difflib.get_close_matches(value.lower(), list(rpc_methods()), n=1) if len(value) <= 100 else []
        hint = f"did you mean {rpc_methods()[near[0]][0].rsplit('/', 1)[1]!r}? " if near else ""
        raise filters.FilterError(f"unknown method {clip(value, 32)!r}; {hint}give an RPC by name (ResolvePlan, "
                                  "CreateLaunch, ...) or in full, or an event: launch.state, experiment.state, "
                                  "launch.retention, server.credentials, server.signing_key")
    if t.op not in ("=", "!="):
        raise filters.FilterError(f"method {t.op} takes a full name; an RPC by name supports only = and !=")
    return column.in_(full) if t.op == "=" else column.not_in(full)


_OPS = {"=": "__eq__", "!=": "__ne__", "<": "__lt__", "<=": "__le__", ">": "__gt__", ">=": "__ge__"}


def starts_with(column: Any, prefix: str, fold: bool = False) -> Any:
    """`column` starts with `prefix` (`fold`: in any case): its first characters compared whole,
    not as a LIKE pattern, and in the same case on every database."""
    head = sa.func.substr(column, 1, len(prefix))
    return sa.func.lower(head) == prefix.lower() if fold else head == prefix


def term_where(table: sa.Table, t: filters.Term, columns: dict[str, str] | None = None) -> Any:
    """One term as SQL on `table`'s columns (fields named as `columns` maps them)."""
    if t.field == "method" and (clause := _method_term(table.c.method, t)) is not None:
        return clause
    if t.prefix:
        return _prefix_where(table, t, columns)
    if t.field == "rule_id":  # `!=`: the records of a resolution that did not use the rule
        if t.op not in ("=", "!="):
            raise filters.FilterError(f"rule_id takes = or !=, got {t.op}")
        return _used_rules(table, rule_sets_with(str(t.value)), t.op)
    if t.field == "outcome":
        code = CODE_NUMBERS.get(str(t.value).upper())
        if code is None:
            raise filters.FilterError(f"unknown outcome {t.value!r}; one of {', '.join(CODE_NUMBERS)}")
        return getattr(table.c.outcome_code, _OPS[t.op])(code)
    column = table.c[(columns or {}).get(t.field, t.field)]
    if t.also and t.op in ("=", "!="):
        spellings = [t.value, *t.also]
        return column.in_(spellings) if t.op == "=" else column.not_in(spellings)
    return getattr(column, _OPS[t.op])(t.value)


def _used_rules(table: sa.Table, sets: Any, op: str) -> Any:
    """`=`: the rows whose rule set is one of `sets` (a subquery); `!=`: a resolution's rows
    whose rule set is not (a row of no resolution, rule set "", matches neither)."""
    used = table.c.rule_set.in_(sets)
    return used if op == "=" else (table.c.rule_set != "") & ~used


def _prefix_where(table: sa.Table, t: filters.Term, columns: dict[str, str] | None) -> Any:
    """A prefix term (`principal = "ci-*"`, `rule_id = "breakable.*"`) as SQL."""
    if t.field == "outcome":
        raise filters.FilterError(f"outcome: a prefix (*) does not apply; give a code name, one of "
                                  f"{', '.join(CODE_NUMBERS)}")
    if t.field == "rule_id":  # any rule of the family; `!=`: a resolution that used none of them
        sets = sa.select(rule_set_members.c.set_id).where(starts_with(rule_set_members.c.rule_id, str(t.value)))
        return _used_rules(table, sets, t.op)
    match = starts_with(table.c[(columns or {}).get(t.field, t.field)], str(t.value), t.fold)
    return match if t.op == "=" else ~match


def matching(conditions: Sequence[filters.Condition], clause: Callable[[filters.Term], Any]) -> list[Any]:
    """A parsed filter as SQL, one clause a condition: a term's `clause`, or its alternatives'
    joined by OR."""
    return [sa.or_(*map(clause, filters.alternatives(c))) for c in conditions]


def _where(table: sa.Table, conditions: Sequence[filters.Condition], columns: dict[str, str] | None = None) -> list[Any]:
    return matching(conditions, lambda t: term_where(table, t, columns))


def rule_sets_with(rule_id: str) -> Any:
    """The ids of the rule sets that hold `rule_id` (a subquery)."""
    return sa.select(rule_set_members.c.set_id).where(rule_set_members.c.rule_id == rule_id)


def plans_where(terms: Sequence[filters.Condition]) -> Any:
    """The ids of the plans whose creating record matches every condition (a subquery): `rule_id`
    (their resolution used the rule), `model`, `gpu`, ... as the audit filter reads them."""
    return sa.select(audit_records.c.plan_id).where(audit_records.c.plan_created == 1, *_where(audit_records, terms))


class _Checkpointer:
    """Copies SQLite's write-ahead log into the database file from a thread of its own.

    SQLite's automatic checkpoint runs inside the commit that crosses its threshold (1,000 WAL
    pages: about every 200 records here), so one commit in some forty took 5-20 ms instead of
    2, and every caller of its batch waited with it. The append connection turns that off and
    this thread runs a PASSIVE checkpoint (it blocks neither the writer nor readers) once
    `every` records have been committed since the last, or a second after any commit.

    A log wholly copied starts over at the next commit; under appends that never pause, the
    thread's checkpoint never finds it wholly copied (commits land while it copies), and the
    log would only grow. So once it holds `restart_frames` pages, the writer itself copies what
    the thread has not yet (a few commits' pages) after a commit has been answered
    (AuditStore.after_commit), and its next commit starts the log over. Durability is
    unchanged: a commit is durable in the fsynced log; a checkpoint only moves pages."""

    def __init__(self, engine: Engine, every: int, restart_frames: int, idle: float = 1.0) -> None:
        self.engine = engine
        self.every = every
        self.idle = idle
        self.restart_frames = restart_frames
        self.pending = 0  # records committed since the thread's last checkpoint
        self.frames = 0  # the log's pages at the thread's last checkpoint
        self.checkpoints = 0  # the thread's
        self.restarts = 0  # the writer's own copies of the tail, each starting the log over
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def committed(self, records: int) -> None:
        """After the writer's commit (it holds the append lock)."""
        self.pending += records
        if self.frames < self.restart_frames and self.pending >= self.every:
            self._wake.set()

    def restart_due(self) -> bool:
        return self.frames >= self.restart_frames

    def copy_tail(self, conn: Any) -> None:
        """The writer's own copy of what the thread has not copied yet, so that the log
        starts over at the next commit (it holds the append lock; no commit is waiting on it)."""
        try:
            busy, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except Exception:  # noqa: BLE001 - the thread is copying: try after the next commit
            return
        if not busy and frames == copied:
            self.frames = 0
            self.restarts += 1

    def _run(self) -> None:
        conn = _own_connection(self.engine)
        try:
            while not self._stop:
                self._wake.wait(self.idle)
                self._wake.clear()
                if self._stop or not self.pending:
                    continue
                self.pending = 0
                try:
                    _busy, self.frames, _copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    self.checkpoints += 1
                except Exception as exc:  # noqa: BLE001 - the next round tries again; appends go on
                    log.warning("WAL checkpoint failed (will retry): %s", exc)
        finally:
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(30)


STORE_SCHEMA = max(version for version, *_ in MIGRATIONS)  # the schema this release migrates a store to


@dataclass(frozen=True)
class Probe:
    """What a database holds, read without changing it (`cgsvc serve --check`)."""

    schema_version: int  # 0: no cgsvc schema yet (a start makes it)
    records: int
    log_key: tuple[int, str] | None  # (generation, key_id) of the key that signs the log today


def _schema_version(conn: Connection) -> int:
    return int(conn.execute(sa.select(sa.func.max(schema_migrations.c.version))).scalar() or 0)


def _count_records(conn: Connection) -> int:
    return int(conn.execute(sa.select(sa.func.count()).select_from(audit_records)).scalar_one())


def _log_key(conn: Connection) -> tuple[int, str, int] | None:
    """(generation, key_id, rotating record's sequence) of the key that signs the log today."""
    row = conn.execute(sa.select(signing_keys.c.generation, signing_keys.c.key_id, signing_keys.c.sequence)
                       .order_by(signing_keys.c.generation.desc()).limit(1)).first()
    return None if row is None else (int(row.generation), str(row.key_id), int(row.sequence))


STORE_URLS = "sqlite:///PATH, postgresql+psycopg://USER@HOST:PORT/DB"
# PostgreSQL as libpq, hosted databases' DATABASE_URL and SQLAlchemy's default driver spell it
POSTGRESQL_ALIASES = ("postgres", "postgresql", "postgresql+psycopg")


def store_url(url: str) -> str:
    """The URL the store opens for a database URL as given (a setting, a command's argument):
    PostgreSQL by any of its usual spellings is `postgresql+psycopg://` (the driver cgsvc
    installs); SQLite stays as given. ValueError, naming what is valid and with no password in
    it, for a URL of another database, another driver, or a log that would not outlive the
    process (in-memory SQLite)."""
    shown = mask_secrets(url)
    valid = f"valid: {STORE_URLS} (postgres:// and postgresql:// mean postgresql+psycopg://)"
    try:
        parsed = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        raise ValueError(f"{shown!r} is not a database URL; {valid}") from None
    backend, driver = parsed.get_backend_name(), parsed.get_driver_name() if "+" in parsed.drivername else ""
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if parsed.database in (None, "", ":memory:"):
            raise ValueError(f"{shown!r} is an in-memory SQLite database: the log would be lost when the server "
                             f"stops; {valid}")
        return url
    if parsed.drivername in POSTGRESQL_ALIASES:
        if not parsed.database:
            raise ValueError(f"{shown!r} names no database (…/DB at its end); {valid}")
        return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)
    if backend in ("sqlite", "postgresql", "postgres"):
        raise ValueError(f"{shown!r} asks for the driver {driver}, which cgsvc does not install; {valid}")
    raise ValueError(f"{shown!r}: {backend} is not a database cgsvc keeps its log in; {valid}")


def probe(url: str) -> Probe | None:
    """Read what the database at `url` holds, writing nothing; None for a SQLite file that does
    not exist (a start makes it). Raises SQLAlchemyError when it cannot be reached."""
    if url.startswith("sqlite"):
        path = sa.engine.make_url(url).database or ""
        if path != ":memory:" and not Path(path).is_file():
            return None
    engine = sa.create_engine(url, connect_args={"connect_timeout": 5} if url.startswith("postgresql") else {})
    try:
        with engine.connect() as conn:
            tables = set(sa.inspect(conn).get_table_names())
            version = _schema_version(conn) if schema_migrations.name in tables else 0
            records = _count_records(conn) if audit_records.name in tables else 0
            key = _log_key(conn) if signing_keys.name in tables else None
    finally:
        engine.dispose()
    return Probe(version, records, None if key is None else key[:2])


class AuditStore:
    """The durable audit log and plan resources, on SQLite or PostgreSQL."""

    def __init__(self, url: str, wal_checkpoint_every: int = 2048, wal_restart_frames: int = 8192) -> None:
        """`wal_checkpoint_every` (SQLite): records between the checkpointer thread's checkpoints
        (0: none; SQLite checkpoints inside the commits, as it does by default);
        `wal_restart_frames`: the log's size, in pages, at which the writer copies the rest
        itself so that the log starts over."""
        self.url = url
        self.wal_checkpoint_every = wal_checkpoint_every
        self.wal_restart_frames = wal_restart_frames
        if url.startswith("sqlite"):
            self.write_engine, self.read_engine = _sqlite_engines(url)
        else:
            self.write_engine = sa.create_engine(url, pool_pre_ping=True)
            self.read_engine = self.write_engine
        self.dialect = self.write_engine.dialect.name
        # the log's file, for a SQLite log in a file ("" otherwise: PostgreSQL, or in memory)
        database = self.write_engine.url.database or ""
        self.sqlite_path = database if self.dialect == "sqlite" and database != ":memory:" else ""
        self._mark = "?" if self.write_engine.dialect.paramstyle == "qmark" else "%s"
        self._insert = {t.name: _RawInsert(t, self._mark) for t in (audit_records, idempotency, merkle_nodes)}
        self._insert.update({t.name: _RawInsert(t, self._mark, skip_existing=True)
                             for t in (plan_bodies, rule_sets, rule_set_members)})
        self._known_rule_sets: set[str] = set()  # sets this process has seen committed
        # plan bodies: the references this process has seen committed, and bodies read back
        self._known_bodies: dict[str, str] = {}
        # PostgreSQL: the head this store last committed (for the one-round-trip append), and
        # how often that optimism failed lately
        self._pg_head: tuple[int, str, str] | None = None
        self._pg_stale = 0
        self._pg_batches = 0
        # what an optimistic append fails with when its assumptions did not hold (imported only
        # here: psycopg costs a SQLite store, and every CLI start, about 50 ms)
        self._stale: tuple[type[BaseException], ...] = ()
        if self.dialect == "postgresql":
            from psycopg import errors as pg_errors
            self._stale = (pg_errors.DivisionByZero, pg_errors.UniqueViolation, _StaleHead)
        # The append path runs on one DBAPI connection of its own, held while the store lives:
        # SQLAlchemy's per-statement execution and the pool's checkout (a ping on PostgreSQL)
        # cost more than the statements. Dropped after a failed batch, reopened by the next.
        self._append_conn: Any = None
        self._append_lock = threading.Lock()
        self._checkpointer: _Checkpointer | None = None
        self.migrate()

    # ------------------------------------------------------------------ schema
    def migrate(self) -> list[int]:
        """Apply pending migrations (serialised across replicas); return the versions applied."""
        applied_now: list[int] = []
        with self.write_engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(727374)")
            schema_migrations.create(conn, checkfirst=True)
            done = set(conn.execute(sa.select(schema_migrations.c.version)).scalars())
            for version, description, tables, columns in MIGRATIONS:
                if version in done:
                    continue
                for table in tables:
                    table.create(conn, checkfirst=True)
                for table, column in columns:
                    have = {c["name"] for c in sa.inspect(conn).get_columns(table.name)}
                    if column.name not in have:  # a table created by an earlier version
                        # the column's own type (an integer column read back text '0' from a TEXT one);
                        # a nullable one is NULL on the rows there (a measure: none known)
                        arg = getattr(column.server_default, "arg", "")
                        default = arg.text if isinstance(arg, sa.TextClause) else f"'{arg}'"
                        fill = "" if column.nullable else f" NOT NULL DEFAULT {default}"
                        conn.exec_driver_sql(f"ALTER TABLE {table.name} ADD COLUMN {column.name} "
                                             f"{column.type.compile(dialect=conn.dialect)}{fill}")
                if version == 1:
                    conn.execute(chain_head.insert().values(id=1, sequence=0, record_hash=GENESIS, frontier="{}"))
                if version == 4:
                    self._build_tree(conn)
                if version == 5:
                    self._build_rule_sets(conn)
                if version == 7:
                    self._migrate_append_path(conn)
                if version in (19, 27):
                    self._fill_reported(conn, [c.name for t, c in columns])
                if version == 26:
                    self._fill_experiment_plans(conn)
                conn.execute(schema_migrations.insert().values(
                    version=version, description=description, applied_at=utc_now()))
                applied_now.append(version)
        return applied_now

    @staticmethod
    def _fill_experiment_plans(conn: Connection) -> None:
        """Migration 26: experiments.plans of the experiments there already, from their requests."""
        rows = conn.execute(sa.select(experiments.c.experiment_id, experiments.c.request_json))
        for experiment_id, request_json in list(rows):
            conn.execute(experiments.update().where(experiments.c.experiment_id == experiment_id)
                         .values(plans=plans_cell(json.loads(request_json).get("plans", []))))

    @staticmethod
    def _fill_reported(conn: Connection, cells: Sequence[str]) -> None:
        """Migrations 19 and 27: what the reports there already say (reported_cells), in the
        `cells` each adds, on their launches."""
        rows = conn.execute(sa.select(launches.c.launch_id, launches.c.report_json).where(launches.c.report_json != ""))
        for launch_id, report_json in list(rows):
            said = reported_cells(report_json)
            conn.execute(launches.update().where(launches.c.launch_id == launch_id)
                         .values({cell: said[cell] for cell in cells}))

    @staticmethod
    def _build_tree(conn: Connection) -> None:
        """Migration 4: the Merkle tree of the records already in the log."""
        size, after = 0, 0
        frontier: dict[int, bytes] = {}
        while True:
            rows = list(conn.execute(sa.select(audit_records.c.sequence, audit_records.c.record_hash)
                                     .where(audit_records.c.sequence > after).order_by(audit_records.c.sequence)
                                     .limit(5000)))
            if not rows:
                break
            frontier, made = merkle.append_leaves(size, frontier, [_leaf(r.record_hash) for r in rows])
            conn.execute(merkle_nodes.insert(), [{"pos": merkle.node_position(lv, i), "hash": h.hex()}
                                                 for lv, i, h in made])
            size, after = size + len(rows), int(rows[-1].sequence)
        conn.execute(chain_head.update().where(chain_head.c.id == 1).values(frontier=_frontier_json(frontier)))

    @staticmethod
    def _build_rule_sets(conn: Connection) -> None:
        """Migration 5: the rule set of every record already in the log; the old per-rule rows go."""
        conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_audit_records_rule_set ON audit_records (rule_set)")
        conn.exec_driver_sql("CREATE INDEX IF NOT EXISTS ix_idempotency_request_id ON idempotency (request_id)")
        for text in list(conn.execute(sa.select(audit_records.c.rule_ids).distinct()).scalars()):
            ids = tuple(json.loads(text))
            set_id = rule_set_id(ids)
            if set_id:
                _insert_rule_set(conn, set_id, ids)
            conn.execute(audit_records.update().where(audit_records.c.rule_ids == text).values(rule_set=set_id))
        conn.exec_driver_sql("DROP TABLE IF EXISTS audit_rule_ids")

    def _migrate_append_path(self, conn: Connection) -> None:
        """Migration 7: idempotency keys into their one-B-tree table; plans folded into the
        records that created them; no unique index on record_hash; Merkle nodes keyed by their
        in-order position. On SQLite the log is rebuilt once (its sequence becomes the rowid; a
        UNIQUE constraint's index cannot be dropped); a log made by this version is left as it is."""
        conn.exec_driver_sql("INSERT INTO idempotency_keys (request_id, principal, method, sequence) "
                             "SELECT request_id, principal, method, sequence FROM idempotency")
        conn.exec_driver_sql("DROP TABLE idempotency")
        inspector = sa.inspect(conn)
        have = {c["name"] for c in inspector.get_columns("audit_records")}
        if self.dialect == "postgresql":
            for column in AUDIT_COLUMNS_7:
                kind = "INTEGER" if column.name == "plan_created" else "TEXT"
                default = column.server_default.arg  # type: ignore[union-attr]
                conn.exec_driver_sql(f"ALTER TABLE audit_records ADD COLUMN IF NOT EXISTS {column.name} {kind} "
                                     f"NOT NULL DEFAULT '{default}'")
            conn.exec_driver_sql(f"UPDATE audit_records a SET plan_created = 1, "
                                 f"{', '.join(f'{c} = p.{c}' for c in PLAN_COLUMNS)} FROM plans p "
                                 "WHERE p.sequence = a.sequence")
            for uc in inspector.get_unique_constraints("audit_records"):
                if uc["column_names"] == ["record_hash"]:
                    conn.exec_driver_sql(f'ALTER TABLE audit_records DROP CONSTRAINT "{uc["name"]}"')
        else:
            unique_hash = any(ix["unique"] and ix["column_names"] == ["record_hash"]
                              for ix in inspector.get_indexes("audit_records"))
            if "plan_created" not in have or unique_hash or not self._sqlite_rowid_sequence(conn):
                self._rebuild_audit_records(conn, have)
        if "level" in {c["name"] for c in inspector.get_columns("merkle_nodes")}:  # keyed by (level, idx)
            self._rebuild(conn, merkle_nodes, "(idx << (level + 1)) + (CAST(1 AS BIGINT) << level) - 1, hash")
        conn.exec_driver_sql("DROP TABLE plans")

    @staticmethod
    def _sqlite_ddl(conn: Connection, table: str) -> str:
        return str(conn.exec_driver_sql("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?",
                                        (table,)).scalar_one())

    @staticmethod
    def _sqlite_rowid_sequence(conn: Connection) -> bool:
        """Whether audit_records.sequence is the table's rowid (declared INTEGER, the only key)."""
        cols = conn.exec_driver_sql("PRAGMA table_info(audit_records)").all()
        return [(c[1], c[2].upper()) for c in cols if c[5]] == [("sequence", "INTEGER")]

    @staticmethod
    def _rebuild(conn: Connection, table: sa.Table, select_sql: str, source: str = "") -> None:
        """Replace a table by one made from its current definition, filled by `select_sql` (a
        SELECT list over `source`, default the old table), with its indexes made again."""
        rebuilt = table.to_metadata(sa.MetaData(), name=f"{table.name}_rebuilt")
        conn.execute(sa.schema.CreateTable(rebuilt))
        cols = ", ".join(c.name for c in table.columns)
        conn.exec_driver_sql(f"INSERT INTO {table.name}_rebuilt ({cols}) SELECT {select_sql} "
                             f"FROM {source or table.name}")
        conn.exec_driver_sql(f"DROP TABLE {table.name}")
        conn.exec_driver_sql(f"ALTER TABLE {table.name}_rebuilt RENAME TO {table.name}")
        for index in table.indexes:
            index.create(conn)

    def _rebuild_audit_records(self, conn: Connection, have: set[str]) -> None:
        """SQLite: the log in its version-7 shape, each plan's listing fields read from its plans row."""
        count = conn.exec_driver_sql("SELECT count(*) FROM audit_records").scalar_one()
        log.warning("schema migration 7: rebuilding the audit log's table once (%d records; about a minute per "
                    "million); the server starts serving when it is done", count)
        exprs = []
        for c in audit_records.columns:
            if c.name in have:
                exprs.append(f"a.{c.name}")
            elif c.name == "plan_created":
                exprs.append("CASE WHEN p.sequence IS NULL THEN 0 ELSE 1 END")
            else:  # a plan column: from the plan the record created, if any
                exprs.append(f"COALESCE(p.{c.name}, '')")
        self._rebuild(conn, audit_records, ", ".join(exprs),
                      "audit_records a LEFT JOIN plans p ON p.sequence = a.sequence")

    def schema_version(self) -> int:
        with self.read_engine.begin() as conn:
            return _schema_version(conn)

    def close(self) -> None:
        if self._checkpointer is not None:
            self._checkpointer.close()
            self._checkpointer = None
        with self._append_lock:
            if self._append_conn is not None:
                self._append_conn.close()
                self._append_conn = None
        self.write_engine.dispose()
        self.read_engine.dispose()

    # ------------------------------------------------------------------ append
    def append_batch(self, items: Sequence[PendingAppend]) -> list[AppendResult]:
        """Append all items in one transaction, in order; durable when this returns (once more
        after a lost connection: append_again)."""
        batch = self.open_batch()
        try:
            batch.add(items)
            results = batch.commit()
        except Exception as exc:  # noqa: BLE001 - append_again raises what it cannot recover from
            batch.abort()
            results = self.append_again(items, batch, exc)
        except BaseException:  # an interrupt before add's or commit's own guard: give the store back
            batch.abort()
            raise
        self.after_commit()
        return results

    def append_again(self, items: Sequence[PendingAppend], batch: AppendBatch, exc: Exception) -> list[AppendResult]:
        """After `batch` (of `items`) failed with `exc`: where that is PostgreSQL's connection lost
        (a restart, a failover, an idle timeout) or its transaction given up (a serialization or
        deadlock abort), the log decides what happened. If the batch's last transaction is in it
        (only the COMMIT's answer was lost), its results answer; if not, nothing of it was
        written, and it is appended once more on a new connection. Anything else raises `exc`;
        so does a second failure, and a log that cannot be read to tell."""
        if self.dialect != "postgresql" or not isinstance(exc, _pg_operational_error()):
            raise exc
        self._pg_head = None  # the head is read again, from the log
        tried = batch.attempt
        try:
            with self.read_engine.connect() as conn:
                landed = bool(tried) and conn.execute(
                    sa.select(audit_records.c.record_hash).where(audit_records.c.sequence == tried[0].record.sequence)
                ).scalar() == tried[0].record.record_hash
        except sa.exc.SQLAlchemyError:
            raise exc from None
        log.warning("audit append: %s: %s", f"{type(exc).__name__}: {exc}".splitlines()[0],
                    "the batch was committed; answering it" if landed else "nothing was written; appending it again")
        if landed:
            return list(tried)
        batch = self.open_batch()
        try:
            batch.add(items)
            return batch.commit()
        except BaseException:
            batch.abort()
            raise

    def after_commit(self) -> None:
        """What a commit leaves that nobody need wait for: on SQLite, when the log has grown
        past `wal_restart_frames`, the copy that lets it start over. A writer calls this once
        it has answered the commit's callers (append_batch calls it itself)."""
        checkpointer = self._checkpointer
        if checkpointer is None or not checkpointer.restart_due():
            return
        with self._append_lock:
            if self._append_conn is not None:
                checkpointer.copy_tail(self._append_conn)

    def open_batch(self) -> AppendBatch:
        """Start a group commit that appends are added to as they arrive (AppendBatch). It
        holds the store's append lock until it commits or fails."""
        self._append_lock.acquire()
        try:
            if self._append_conn is None:
                self._append_conn = _own_connection(self.write_engine)
                if self.dialect == "sqlite" and self.wal_checkpoint_every > 0:
                    if self._checkpointer is None:
                        self._checkpointer = _Checkpointer(self.write_engine, self.wal_checkpoint_every,
                                                           self.wal_restart_frames)
                    self._append_conn.execute("PRAGMA wal_autocheckpoint=0")  # the checkpointer's job
            optimistic = self._pg_head is not None
            return AppendBatch(self, self._append_conn, optimistic,
                               deferred=self.dialect == "postgresql" and not optimistic)
        except BaseException:
            self._drop_append_conn()
            self._append_lock.release()
            raise

    def _drop_append_conn(self) -> None:
        """After a failure: a connection in an unknown state is not reused."""
        conn, self._append_conn = self._append_conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.rollback()
            with contextlib.suppress(Exception):
                conn.close()

    def _begin(self, conn: Any, ids: Sequence[str]) -> tuple[Any, Any, list[Any]]:
        """Open a locked append transaction and read the chain head and the idempotency keys
        stored for `ids` (on PostgreSQL BEGIN and both reads in one round trip): (cursor, head
        row, key rows)."""
        cur = conn.cursor()
        if self.dialect == "sqlite":
            cur.execute("BEGIN IMMEDIATE")
            cur.execute(_HEAD_SQL)
            head = cur.fetchone()
            return cur, head, self._stored_keys(cur, ids) if ids else []
        conn.autocommit = False
        keys_cur = conn.cursor()
        with conn.pipeline():
            cur.execute(_HEAD_SQL + " FOR UPDATE")
            if ids:
                keys_cur.execute(*self._keys_query(ids))
        return cur, cur.fetchone(), keys_cur.fetchall() if ids else []

    def _keys_query(self, ids: Sequence[str]) -> tuple[str, Sequence[Any]]:
        if self.dialect == "sqlite":
            return f"{_KEYS_SQL} IN ({', '.join(['?'] * len(ids))})", list(ids)
        return f"{_KEYS_SQL} = ANY(%s)", (list(ids),)

    def _stored_keys(self, cur: Any, ids: Sequence[str]) -> list[Any]:
        """The idempotency keys stored for these request ids (read in the open transaction)."""
        cur.execute(*self._keys_query(ids))
        return cur.fetchall()

    def _write_rows(self, cur: Any, records: list[dict[str, Any]], idem_rows: list[dict[str, Any]],
                    node_rows: list[dict[str, Any]], side: dict[str, list[dict[str, str]]]) -> None:
        """Rows into the open transaction. `side`: _side_rows, each inserted unless there."""
        for table, rows in ((audit_records, records), (idempotency, idem_rows), (merkle_nodes, node_rows)):
            self._insert[table.name](cur, rows)
        for name, rows in side.items():
            self._insert[name](cur, rows)

    def _first_requests(self, cur: Any, keys: set[tuple[str, str, str]],
                        key_rows: Sequence[Any]) -> dict[tuple[str, str, str], AuditRecord]:
        """The first records of the batch's request ids, keyed by (principal, method, request_id):
        the narrow key table was read by request id; the (rare) hits now fetch their records."""
        hits = [h for h in key_rows if (h[1], h[2], h[0]) in keys]
        if not hits:
            return {}
        cols = [c.name for c in audit_records.columns]
        cur.execute(f"SELECT {', '.join(cols)} FROM audit_records WHERE sequence IN "
                    f"({', '.join([self._mark] * len(hits))})", [h[3] for h in hits])
        recs = {}
        for row in cur.fetchall():
            values = dict(zip(cols, row, strict=True))
            recs[values["sequence"]] = self._record(values, cur)
        return {(h[1], h[2], h[0]): recs[h[3]] for h in hits}

    def append(self, entry: AuditEntry, plan: PlanListing | None = None, request_id: str = "") -> AppendResult:
        return self.append_batch([PendingAppend(entry, plan, request_id)])[0]

    # ------------------------------------------------------------------ read
    def _plan_json(self, stored: str, cur: Any = None) -> str:
        """A record's plan JSON: the column itself, or the body it refers to (read once per
        process; `cur` reads inside an open transaction). A body that is missing stays the
        reference, so verification names the record whose hash no longer matches."""
        if not stored.startswith(BODY_REF):
            return stored
        body = self._known_bodies.get(stored)
        if body is None:
            sql = f"SELECT plan_json FROM plan_bodies WHERE body_hash = {self._mark}"
            if cur is not None:
                cur.execute(sql, (stored[1:],))
                row = cur.fetchone()
            else:
                with self.read_engine.connect() as conn:
                    row = conn.exec_driver_sql(sql, (stored[1:],)).first()
            if row is None:
                return stored
            body = str(row[0])
            if len(self._known_bodies) >= 4096:
                self._known_bodies.clear()
            self._known_bodies[stored] = body
        return body

    def _record(self, m: Any, cur: Any = None, plan: bool = True) -> AuditRecord:
        """A record as stored; without its `plan` JSON (""), the plan body is not read."""
        values: dict[str, Any] = {name: m[name] for name in _RECORD_FIELDS}
        values["rule_ids"] = tuple(json.loads(values["rule_ids"]))
        values["plan_json"] = self._plan_json(values["plan_json"], cur) if plan else ""
        return AuditRecord(**values)

    def _stored_plan(self, row: Any) -> StoredPlan:
        """A plan, read off the record that created it."""
        m = row._mapping
        values = {name: m[name] for name in _PLAN_ROW_FIELDS}
        values["plan_json"] = self._plan_json(values["plan_json"])
        return StoredPlan(PlanRow(**values), int(m["sequence"]), m["time"], m["principal"])

    def get_record(self, sequence: int) -> AuditRecord | None:
        with self.read_engine.begin() as conn:
            row = conn.execute(sa.select(audit_records).where(audit_records.c.sequence == sequence)).first()
        return self._record(row._mapping) if row is not None else None

    def list_records(self, filter_text: str = "", page_size: int = 0, page_token: str = "",
                     order_by: str = "", plans: bool = True) -> tuple[list[AuditRecord], str]:
        """A page of records; without their `plans` (a basic view), their plan bodies are not read."""
        where = _where(audit_records, filters.parse_filter(filter_text, AUDIT_FILTER_FIELDS))
        rows, next_token = self.page(audit_records, where, filter_text, page_size, page_token,
                                     order=filters.parse_order(order_by, "sequence"))
        return [self._record(r._mapping, plan=plans) for r in rows], next_token

    def spec_groups(self, methods: Sequence[str], filter_text: str = "", batch: int = 1000,
                    latest: bool = False) -> Iterator[SpecGroup]:
        """Every distinct spec in the records of `methods` that match the filter, in order of
        first appearance; with `latest`, each one's latest record and latest record with a plan
        (0 otherwise: two more aggregates, a tenth more of the scan). The database groups and
        counts; rows stream in batches, so memory does not grow with the log."""
        terms = filters.parse_filter(filter_text, AUDIT_FILTER_FIELDS)
        seq = audit_records.c.sequence
        first = sa.func.min(seq).label("first")
        planned = sa.func.max(sa.case((audit_records.c.plan_json != "", seq), else_=0)) if latest else sa.literal(0)
        last = sa.func.max(seq) if latest else sa.literal(0)
        query = (sa.select(audit_records.c.spec_hash, sa.func.count().label("n"), first, planned.label("planned"),
                           last.label("last"))
                 .where(audit_records.c.method.in_(list(methods)), audit_records.c.spec_hash != "",
                        *_where(audit_records, terms))
                 .group_by(audit_records.c.spec_hash).order_by(first))
        with self.read_engine.connect() as conn:
            result = conn.execution_options(stream_results=True, yield_per=batch).execute(query)
            for row in result:
                yield SpecGroup(str(row.spec_hash), int(row.n), int(row.first), int(row.planned), int(row.last))

    def records_by_sequence(self, sequences: Sequence[int]) -> dict[int, AuditRecord]:
        """The records with these sequence numbers (absent ones are left out)."""
        if not sequences:
            return {}
        with self.read_engine.begin() as conn:
            rows = list(conn.execute(sa.select(audit_records).where(audit_records.c.sequence.in_(list(sequences)))))
        # converted after the connection is returned: a plan body not read yet takes another
        return {r.sequence: r for r in (self._record(row._mapping) for row in rows)}

    def policy_counts(self, methods: Sequence[str], filter_text: str = "") -> list[tuple[str, str, int]]:
        """(policy, policy_version, records) over the records of `methods` that carry a spec."""
        terms = filters.parse_filter(filter_text, AUDIT_FILTER_FIELDS)
        query = (sa.select(audit_records.c.policy, audit_records.c.policy_version, sa.func.count().label("n"))
                 .where(audit_records.c.method.in_(list(methods)), audit_records.c.spec_hash != "",
                        *_where(audit_records, terms))
                 .group_by(audit_records.c.policy, audit_records.c.policy_version)
                 .order_by(sa.func.min(audit_records.c.sequence)))
        with self.read_engine.begin() as conn:
            return [(str(r.policy), str(r.policy_version), int(r.n)) for r in conn.execute(query)]

    def get_plan(self, plan_id: str) -> StoredPlan | None:
        with self.read_engine.begin() as conn:
            row = conn.execute(sa.select(audit_records).where(audit_records.c.plan_id == plan_id,
                                                              audit_records.c.plan_created == 1)).first()
        return self._stored_plan(row) if row is not None else None

    def list_plans(self, filter_text: str = "", page_size: int = 0, page_token: str = "",
                   order_by: str = "") -> tuple[list[StoredPlan], str]:
        terms = filters.parse_filter(filter_text, PLAN_FILTER_FIELDS)
        where = [audit_records.c.plan_created == 1, *_where(audit_records, terms, PLAN_FILTER_COLUMNS)]
        rows, next_token = self.page(audit_records, where, filter_text, page_size, page_token,
                                     order=filters.parse_order(order_by, "create_time"))
        return [self._stored_plan(r) for r in rows], next_token

    def page(self, table: sa.Table, where: Sequence[Any], filter_text: str, page_size: int,
             page_token: str, order: filters.Order) -> tuple[list[Any], str]:
        """A page of `table` in `order` (by sequence, or by a field of its then by sequence): rows
        matching every clause of `where` (`filter_text` made into SQL). A page token holds where
        the page ended and is bound to the filter and the order."""
        if page_size < 0:
            raise PageTokenError("page_size", f"must not be negative (0 asks for the default, {DEFAULT_PAGE_SIZE}; at most "
                                              f"{MAX_PAGE_SIZE}), got {page_size}")
        size = min(page_size or DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE)
        last = _decode_token(page_token, filter_text, order)
        query = (sa.select(table).where(_past(table, last, order), *where)
                 .order_by(*_ordering(table, order)).limit(size + 1))
        with self.read_engine.begin() as conn:
            rows = list(conn.execute(query))
        if len(rows) > size:
            end = rows[size - 1]._mapping
            cursor = Cursor(int(end["sequence"]), end[order.field] if order.field else None)
            return rows[:size], cursor_token(cursor, filter_text, order)
        return rows, ""

    # ------------------------------------------------------------------ Merkle tree
    def tree_head(self) -> tuple[int, bytes]:
        """The tree's size (records) and root now, from the chain head alone."""
        with self.read_engine.begin() as conn:
            head = conn.execute(sa.select(chain_head.c.sequence, chain_head.c.frontier)
                                .where(chain_head.c.id == 1)).one()
        return int(head.sequence), merkle.root_from_frontier(_frontier_from_json(head.frontier))

    # ------------------------------------------------------------------ signing keys
    def log_key(self) -> tuple[int, str, int] | None:
        """The key that signs this log's checkpoints today: (generation, key_id, the sequence of
        the record that rotated to it, 0 for the first); None before any server named one."""
        with self.read_engine.begin() as conn:
            return _log_key(conn)

    def add_log_key(self, generation: int, key_id: str, public_key: str, sequence: int) -> bool:
        """Make `key_id` the log's key as `generation`; False when another server took that
        generation first (replicas starting together): read `log_key` again."""
        try:
            with self.write_engine.begin() as conn:
                conn.execute(signing_keys.insert().values(generation=generation, key_id=key_id,
                                                          public_key=public_key, sequence=sequence,
                                                          added_at=utc_now()))
        except sa.exc.IntegrityError:
            return False
        return True

    def _lookup(self, conn: Connection) -> merkle.SubtreeLookup:
        cache: dict[tuple[int, int], bytes] = {}

        def lookup(level: int, idx: int) -> bytes:
            if (level, idx) not in cache:
                h = conn.execute(sa.select(merkle_nodes.c.hash).where(
                    merkle_nodes.c.pos == merkle.node_position(level, idx))).scalar()
                if h is None:
                    raise LookupError(f"Merkle node ({level}, {idx}) is missing from the log")
                cache[(level, idx)] = bytes.fromhex(h)
            return cache[(level, idx)]
        return lookup

    def _size_for(self, tree_size: int) -> int:
        size, _ = self.tree_head()
        if tree_size > size:
            raise TreeSizeError(f"the log holds {size} records, not {tree_size}")
        return tree_size or size

    def root_at(self, tree_size: int) -> bytes:
        """The root of the tree of the first tree_size records (TreeSizeError when larger than the log)."""
        size = self._size_for(tree_size)
        with self.read_engine.begin() as conn:
            return merkle.root(size, self._lookup(conn))

    def inclusion_proof(self, sequence: int, tree_size: int = 0) -> tuple[int, list[bytes], AuditRecord]:
        """(tree size, audit path, the record) for record `sequence` in the tree of tree_size."""
        size = self._size_for(tree_size)
        rec = self.get_record(sequence)
        if rec is None or sequence > size:
            raise TreeSizeError(f"auditRecords/{sequence} is not in the tree of {size} records")
        with self.read_engine.begin() as conn:
            return size, merkle.inclusion_proof(sequence - 1, size, self._lookup(conn)), rec

    def consistency_proof(self, first: int, second: int = 0) -> tuple[int, list[bytes]]:
        size = self._size_for(second)
        if not 0 < first <= size:
            raise TreeSizeError(f"first_size must be within 1..{size}, got {first}")
        with self.read_engine.begin() as conn:
            return size, merkle.consistency_proof(first, size, self._lookup(conn))

    # ------------------------------------------------------------------ verify
    def iter_records(self, chunk: int = 2000) -> Iterator[AuditRecord]:
        after = 0
        while True:
            with self.read_engine.begin() as conn:
                rows = list(conn.execute(sa.select(audit_records).where(audit_records.c.sequence > after)
                                         .order_by(audit_records.c.sequence).limit(chunk)))
            if not rows:
                return
            for r in rows:
                yield self._record(r._mapping)
            after = int(rows[-1]._mapping["sequence"])

    def count_records(self) -> int:
        with self.read_engine.begin() as conn:
            return _count_records(conn)

    def verify(self, progress: Callable[[int, int], None] | None = None, every: int = 10_000) -> Verification:
        """Recompute the chain and the Merkle tree from the records; name the first record that
        fails and why. `progress(checked, total)` hears how far it has got, every `every` records
        and at the end."""
        expected_seq, prev, checked = 1, GENESIS, 0
        size, frontier = 0, dict[int, bytes]()
        total = self.count_records() if progress is not None else 0
        for rec in self.iter_records():
            if progress is not None and checked and checked % every == 0:
                progress(checked, total)
            problem = ""
            if rec.sequence != expected_seq:
                problem = f"sequence {expected_seq} is missing (next present is {rec.sequence})"
                bad = expected_seq
            elif rec.prev_hash != prev:
                problem = "prev_hash does not match the previous record's hash (a record was removed or reordered)"
                bad = rec.sequence
            elif rec.compute_hash() != rec.record_hash:
                problem = "record_hash does not match the record's contents (the record was modified)"
                bad = rec.sequence
            if problem:
                return Verification(False, checked, bad, problem, prev)
            checked += 1
            expected_seq, prev = rec.sequence + 1, rec.record_hash
            frontier, _ = merkle.append_leaves(size, frontier, [_leaf(rec.record_hash)])
            size += 1
        if progress is not None:
            progress(checked, total)
        with self.read_engine.begin() as conn:
            head = conn.execute(sa.select(chain_head).where(chain_head.c.id == 1)).one()
            if int(head.sequence) != expected_seq - 1 or head.record_hash != prev:
                return Verification(False, checked,
                                    expected_seq if int(head.sequence) >= expected_seq else int(head.sequence),
                                    f"chain head says sequence {head.sequence} but the log ends at {expected_seq - 1} "
                                    "(records at the end were removed or the head was altered)", prev)
            root = merkle.root_from_frontier(frontier)
            try:
                stored = merkle.root(size, self._lookup(conn))
            except LookupError as exc:
                return Verification(False, checked, 0, f"Merkle tree: {exc}", prev)
        if merkle.root_from_frontier(_frontier_from_json(head.frontier)) != root or stored != root:
            return Verification(False, checked, 0, "the stored Merkle tree does not match the records (its nodes or "
                                                   "the head's right edge were altered)", prev)
        return Verification(True, checked, 0, "", prev)


def _request_ids(items: Sequence[PendingAppend]) -> list[str]:
    return sorted({i.request_id for i in items if i.request_id})


def database_unavailable(exc: BaseException) -> bool:
    """Whether `exc` says the database could not do its part, for a while, rather than that the
    request or the code is wrong: DB-API's OperationalError ("an unexpected disconnect, data
    source name not found, transaction could not be processed"), raw or as SQLAlchemy wraps it,
    and the writer process's report of one."""
    import sqlite3

    from cgsvc.audit.writer import AuditDatabaseUnavailable

    return isinstance(exc, (sa.exc.OperationalError, sqlite3.OperationalError, _pg_operational_error(),
                            AuditDatabaseUnavailable))


def outage_text(exc: BaseException) -> str:
    """The first line of a database_unavailable error, as a log line or an answer names it."""
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:200]


def _pg_operational_error() -> type[Exception]:
    """psycopg's OperationalError: a connection lost or a transaction given up by the server
    (imported here: psycopg costs a SQLite store and every CLI start about 50 ms)."""
    import psycopg

    return psycopg.OperationalError


class AppendBatch:
    """One group commit, filled as appends arrive: `add` chains them onto the log at once,
    `commit` makes them durable together; nobody may be answered before it returns.

    `add` does each append's work when it arrives — its hash, Merkle nodes and rows, and on
    SQLite the inserts themselves — so a writer that holds a commit open for the rest of a
    cohort (audit/writer.py) does that work while it waits, and the commit has only the chain
    head and the COMMIT left. SQLite's transaction (its write lock) is therefore open from the
    first append to the commit. On PostgreSQL the rows go at commit: one statement in
    autocommit when the batch extends the head this store last committed (optimistic: nothing
    is read first, the records are chained as they arrive; the statement fails unless that head
    is still the head and every request id is new, and the batch is then appended again the
    locked way); without such a head the locked transaction runs whole at commit (`deferred`),
    so that no other replica waits on the chain head while this one waits for appends. Made
    by AuditStore.open_batch; any failure rolls the whole batch back and raises."""

    def __init__(self, store: AuditStore, conn: Any, optimistic: bool, deferred: bool = False,
                 first: Sequence[PendingAppend] = ()) -> None:
        """`first`: appends known when the batch opens (the locked PostgreSQL transaction, run
        whole), added at once; their stored idempotency keys are read with the head."""
        self.store, self.conn, self.optimistic, self.deferred = store, conn, optimistic, deferred
        self.items: list[PendingAppend] = []
        self.results: list[AppendResult] = []
        self.records: list[dict[str, Any]] = []  # rows not yet sent (PostgreSQL: all of them)
        self.idem_rows: list[dict[str, Any]] = []
        self.node_rows: list[dict[str, Any]] = []
        self.new_sets: dict[str, tuple[str, ...]] = {}
        self.new_bodies: dict[str, str] = {}
        self._unsent_sets: dict[str, tuple[str, ...]] = {}
        self._unsent_bodies: dict[str, str] = {}
        self.firsts: dict[tuple[str, str, str], AuditRecord] = {}
        # the results of the transaction last sent to be committed: where its answer is lost,
        # whether these are in the log says whether it committed (AuditStore.append_again)
        self.attempt: list[AppendResult] = []
        self._open = True
        if deferred:
            return
        if optimistic:
            assert store._pg_head is not None
            conn.autocommit = True
            self.cur, head = conn.cursor(), store._pg_head
        else:
            self.cur, head, key_rows = store._begin(conn, _request_ids(first))
        self.head_seq = int(head[0])
        self.seq, self.prev = self.head_seq, str(head[1])
        self.frontier = _frontier_from_json(head[2])
        self.now = utc_now()  # the batch's time: its records are committed together
        if first:
            self._add(list(first), key_rows)

    def __len__(self) -> int:
        return len(self.items)

    def add(self, items: Sequence[PendingAppend]) -> None:
        """Chain these appends onto the batch (in order)."""
        try:
            clean = [_without_nul(i) for i in items]
            if self.deferred:
                self.items += clean
            else:
                self._add(clean)
        except BaseException:
            self.abort()
            raise

    def _add(self, items: list[PendingAppend], stored: list[Any] | None = None) -> None:
        """`stored`: the key rows for these items' request ids, when already read."""
        store = self.store
        self.items += items
        keys = {(i.entry.principal, i.entry.method, i.request_id) for i in items if i.request_id}
        if keys and not self.optimistic:
            if stored is None:
                stored = store._stored_keys(self.cur, _request_ids(items))
            self.firsts.update(store._first_requests(self.cur, keys - self.firsts.keys(), stored))
        size = self.seq
        leaves = []
        for item in items:
            entry, listing, conflict = item.entry, item.plan, False
            key = (entry.principal, entry.method, item.request_id)
            replay_of = self.firsts.get(key) if item.request_id else None
            if replay_of is not None:
                listing = None
                if replay_of.spec_hash != entry.spec_hash or (
                        replay_of.schema_version >= 2 and replay_of.policy != entry.policy):
                    conflict = True
                    entry = dataclasses.replace(
                        entry, plan_json="", plan_hash="", rule_ids=(), plan_id="",
                        outcome_code=CODE_NUMBERS["INVALID_ARGUMENT"],
                        outcome_message=f"request_id {item.request_id!r} was first used with a "
                                        f"different spec or policy ({replay_of.name})")
                else:
                    entry = dataclasses.replace(
                        entry, plan_id=replay_of.plan_id, plan_json=replay_of.plan_json,
                        plan_hash=replay_of.plan_hash, rule_ids=replay_of.rule_ids,
                        outcome_message=f"replay of {replay_of.name}")
            self.seq += 1
            record = chain(entry, self.seq, self.now, self.prev)
            self.prev = record.record_hash
            leaves.append(_leaf(record.record_hash))
            values = _record_values(record)
            if record.plan_json:  # the plan's JSON once per distinct plan, the record a reference
                values["plan_json"] = ref = _body_ref(record.plan_json)
                if ref not in store._known_bodies and ref not in self.new_bodies:
                    self.new_bodies[ref] = self._unsent_bodies[ref] = record.plan_json
            values["rule_set"] = set_id = rule_set_id(record.rule_ids)
            if set_id and set_id not in store._known_rule_sets and set_id not in self.new_sets:
                self.new_sets[set_id] = self._unsent_sets[set_id] = record.rule_ids
            if listing is None:
                values.update(_NOT_A_PLAN)
            else:  # this record creates the plan: its listing fields ride on the record
                values["plan_created"] = 1
                values.update(listing.__dict__)
            self.records.append(values)
            if item.request_id and replay_of is None and record.outcome_code == 0:
                self.idem_rows.append({"principal": entry.principal, "method": entry.method,
                                       "request_id": item.request_id, "sequence": self.seq})
                self.firsts[key] = record  # a duplicate later in this batch is a replay
            self.results.append(AppendResult(record, replay_of, conflict))
        self.frontier, made = merkle.append_leaves(size, self.frontier, leaves)
        self.node_rows += [{"pos": merkle.node_position(lv, i), "hash": h.hex()} for lv, i, h in made]
        if store.dialect == "sqlite":  # in the open transaction now, while the writer waits for more
            self._send_rows()

    def _send_rows(self) -> None:
        side = _side_rows(self._unsent_bodies, self._unsent_sets)
        self.store._write_rows(self.cur, self.records, self.idem_rows, self.node_rows, side)
        self.records, self.idem_rows, self.node_rows = [], [], []
        self._unsent_bodies, self._unsent_sets = {}, {}

    def commit(self) -> list[AppendResult]:
        """Make the batch durable; returns one result per append, in order."""
        store = self.store
        try:
            locked = self.deferred
            if self.optimistic:  # PostgreSQL: the whole batch is one statement, its own transaction
                head = self._head()
                side = _side_rows(self._unsent_bodies, self._unsent_sets)
                self.attempt = self.results
                try:
                    self.cur.execute(_PG_APPEND_SQL, (
                        self.head_seq, json.dumps(self.records), json.dumps(self.idem_rows),
                        json.dumps(self.node_rows), *(json.dumps(rows) for rows in side.values()), *head))
                    if self.cur.rowcount != 1:  # no chain head row: nothing was written; the locked path says why
                        raise _StaleHead("the chain head row was not found")
                except store._stale as exc:  # the head moved (another replica) or a request id was seen before
                    self.conn.rollback()
                    store._pg_head = None
                    store._pg_stale += 1
                    log.debug("optimistic append fell back to the locked path: %s", type(exc).__name__)
                    locked = True
                else:
                    self._committed(head)
            elif not locked:  # SQLite: its transaction is open and holds every row but the head
                self.attempt = self.results
                self._commit_locked()
            if locked:  # PostgreSQL, the locked way: the whole transaction now
                self.attempt = []
                whole = AppendBatch(store, self.conn, optimistic=False, first=self.items)
                self.attempt = whole.results
                self.results = whole._commit_locked()
        except BaseException:
            self.abort()
            raise
        self._release()
        return self.results

    def _head(self) -> tuple[int, str, str]:
        """The chain head after this batch, as its row holds it."""
        return self.seq, self.prev, _frontier_json(self.frontier)

    def _commit_locked(self) -> list[AppendResult]:
        """The locked transaction's remaining rows, the chain head and the COMMIT (on
        PostgreSQL in one pipeline: one round trip)."""
        head = self._head()
        mark = self.store._mark
        with self.conn.pipeline() if self.store.dialect == "postgresql" else contextlib.nullcontext():
            self._send_rows()
            self.cur.execute(f"UPDATE chain_head SET sequence = {mark}, record_hash = {mark}, frontier = {mark} "
                             "WHERE id = 1", head)
            self.conn.commit()
        self._committed(head)
        return self.results

    def _committed(self, head: tuple[int, str, str]) -> None:
        store = self.store
        store._known_bodies.update(self.new_bodies)
        store._known_rule_sets.update(self.new_sets)
        if store.dialect == "postgresql":
            # the next batch may extend this head without reading it, unless optimism keeps
            # failing (replicas appending in turn): then it reads first for a while
            store._pg_head = head if store._pg_stale < 8 else None
            store._pg_batches += 1
            if store._pg_batches % 256 == 0:
                store._pg_stale = 0
        elif store._checkpointer is not None:
            store._checkpointer.committed(len(self.items))

    def abort(self) -> None:
        """Roll the batch back (nothing of it is written) and give the store back."""
        if self._open:
            self.store._drop_append_conn()
            self._release()

    def _release(self) -> None:
        if self._open:
            self._open = False
            self.store._append_lock.release()
