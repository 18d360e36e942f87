"""The launch store: launches as typed rows, beside the audit log in the same database.

Creation is serialised (PostgreSQL: a transaction-scoped advisory lock; SQLite: `BEGIN
IMMEDIATE`), so replicas sharing one database give launches distinct, ordered sequence
numbers, and a (principal, request_id) pair maps to one launch however often, and from
however many replicas, it is retried.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from cgsvc import __version__
from cgsvc.audit import filters
from cgsvc.audit.store import (
    GPU_NAME,
    MODEL_NAME,
    AuditStore,
    Cursor,
    cursor_token,
    db_epoch,
    experiment_requests,
    experiments,
    launch_requests,
    launches,
    matching,
    plans_cell,
    plans_where,
    replica_leases,
    reported_cells,
    term_where,
    utc_now,
)
from cgsvc.contract import (
    DTYPE_ALIASES,
    MODEL_DTYPE_BYTES,
    PLAN_FIELDS,
    REPORT_MEASURES,
    EngineSettings,
)

# model, gpu and rule_id are the plan's: a launch matches when the plan it ran does
LAUNCH_STATES = ("PLACING", "LOADING", "CAPTURING", "RUNNING",  # active, in the order a launch moves through them
                 "SUCCEEDED", "FAILED", "CANCELLED", "LOST")  # terminal
DISPATCHERS = ("local", "ray")
LAUNCH_PLAN_FIELDS: dict[str, filters.FieldKind] = {"rule_id": "str", "model": MODEL_NAME, "gpu": GPU_NAME}
# What its report says the workers ran (a launch with no report yet matches neither = nor !=):
# substituted, a plan field they ran as something else (its plan fidelity), or "none": every
# field ran as planned; dtype, the dtype the model ran in.
LAUNCH_REPORTED_FIELDS: dict[str, filters.FieldKind] = {
    "substituted": filters.Closed(("none", *PLAN_FIELDS)),
    "dtype": filters.Closed(tuple(MODEL_DTYPE_BYTES), DTYPE_ALIASES)}
# What its report says the run measured (a launch that measured nothing matches no comparison).
LAUNCH_MEASURED_FIELDS: dict[str, filters.FieldKind] = dict.fromkeys(REPORT_MEASURES, "number")
LAUNCH_FILTER_FIELDS: dict[str, filters.FieldKind] = {
    "state": filters.Closed(LAUNCH_STATES), "plan": filters.Named("plans"), "principal": "str",
    "dispatcher": filters.Closed(DISPATCHERS), "create_time": "time", "model_path": "str", "tp": "int",
    "rerun_of": filters.Named("launches"), "experiment": filters.Named("experiments"), "labels": "labels",
    **LAUNCH_REPORTED_FIELDS, **LAUNCH_MEASURED_FIELDS, **LAUNCH_PLAN_FIELDS}
_LAUNCH_LOCK = 727375  # PostgreSQL advisory lock key for launch creation


@dataclass(frozen=True)
class Workload:
    input_len: int
    output_len: int
    requests: int
    concurrency: int
    seed: int = 0


@dataclass(frozen=True)
class LaunchRow:
    """One launch as stored; `devices` has one entry per rank, in rank order, once placed."""

    launch_id: str
    plan_id: str
    state: str
    principal: str
    dispatcher: str
    tp: int
    model_path: str
    workload: Workload
    run_dir: str
    create_time: str = ""
    update_time: str = ""
    sequence: int = 0
    tokens_done: int = 0
    tokens_total: int = 0
    prompt_tokens_done: int = 0
    prompt_tokens_total: int = 0
    capture_done: int = 0  # sizes captured or compiled before the run
    capture_total: int = 0
    error: str = ""
    report_json: str = ""
    handle_json: str = ""
    owner: str = ""
    devices: tuple[str, ...] = ()
    placement: str = ""
    request_id: str = ""
    request_hash: str = ""
    cancel_requested_by: str = ""  # who asked, of any replica, for the launch to be cancelled
    cancel_reason: str = ""  # why, where the service itself asked
    engine: EngineSettings = EngineSettings()  # what the workers were asked to run with
    rerun_of: str = ""  # the launch this one runs again (its ID), if any
    labels: str = ""  # the caller's labels as stored (labels_cell): ",team=infra,ticket=inc-42,"; "" for none
    experiment: str = ""  # the experiment that made this launch (its ID), if any

    def replace(self, **changes: Any) -> LaunchRow:
        return dataclasses.replace(self, **changes)


def _equality(term: filters.Term) -> None:
    """A term on a delimited cell takes = or != only."""
    if term.op not in ("=", "!="):
        raise filters.FilterError(f"{term.field} takes = or !=, got {term.op}")


def _listed(column: sa.ColumnElement[str], item: str, starts: bool = False) -> sa.ColumnElement[bool]:
    """`item` is one of the comma-delimited items of `column` (",a,b,"), or with `starts` the
    start of one: after a comma, its underscores matched as written, not as a pattern."""
    escaped = item.replace("_", "\\_")
    return column.like(f"%,{escaped}{'%' if starts else ',%'}", escape="\\")


def _listed_where(term: filters.Term, column: sa.ColumnElement[str], item: str) -> sa.ColumnElement[bool]:
    """A term taking = or != on whether `item` is listed in `column`."""
    _equality(term)
    match = _listed(column, item)
    return match if term.op == "=" else ~match


def label_where(term: filters.Term, table: sa.Table = launches) -> sa.ColumnElement[bool]:
    """`labels.KEY = VALUE` (or !=) as SQL on the table's labels (launches', experiments'): the
    pair key=value, listed; `labels.KEY = "V*"`: an item that starts key=V; `labels.KEY:*` (or
    NOT), whose value is "": one that starts key= (keys hold no = or ,)."""
    key = term.field.removeprefix("labels.")
    if term.prefix or term.op in (filters.HAS, filters.NOT_HAS):  # a value that starts so; has: with "" any does
        starts = _listed(table.c.labels, f"{key}={term.value}", starts=True)
        return starts if term.op in ("=", filters.HAS) else ~starts
    return _listed_where(term, table.c.labels, f"{key}={term.value}")


def _to_columns(row: LaunchRow) -> dict[str, Any]:
    values = {f.name: getattr(row, f.name) for f in dataclasses.fields(LaunchRow)
              if f.name not in ("workload", "devices", "engine")}
    values["workload_json"] = json.dumps(dataclasses.asdict(row.workload))
    values["devices_json"] = json.dumps(list(row.devices))
    values["engine_json"] = json.dumps(dataclasses.asdict(row.engine))
    values.update(reported_cells(row.report_json))
    return values


def _from_columns(m: Any) -> LaunchRow:
    names = {f.name for f in dataclasses.fields(LaunchRow)} - {"workload", "devices", "engine"}
    return LaunchRow(**{k: m[k] for k in names}, workload=Workload(**json.loads(m["workload_json"])),
                     devices=tuple(json.loads(m["devices_json"] or "[]")),
                     engine=EngineSettings.read(json.loads(m["engine_json"] or "{}")))


def _update_values(values: dict[str, Any]) -> dict[str, Any]:
    out = dict(values)
    if "devices" in out:
        out["devices_json"] = json.dumps(list(out.pop("devices")))
    if "workload" in out:
        out["workload_json"] = json.dumps(dataclasses.asdict(out.pop("workload")))
    if "engine" in out:
        out["engine_json"] = json.dumps(dataclasses.asdict(out.pop("engine")))
    if "report_json" in out:
        out.update(reported_cells(out["report_json"]))
    return out


def reported_where(term: filters.Term) -> sa.ColumnElement[bool]:
    """A term on what the report says ran, as SQL on its column (reported_cells' form): `!=`
    matches only launches with a report."""
    _equality(term)
    column = launches.c[term.field]
    if term.field != "substituted":
        match = column == term.value
    elif term.value == "none":
        match = column == ","
    else:  # a plan field, listed
        match = _listed(column, str(term.value))
    return match if term.op == "=" else (column != "") & ~match


def _launch_where(term: filters.Term) -> sa.ColumnElement[bool]:
    """A term of a launches filter as SQL: a field of its plan, a label, what its report says
    ran, or one of its own columns."""
    if term.field in LAUNCH_PLAN_FIELDS:  # of its plan (older launches too: their records carry no rules)
        return launches.c.plan_id.in_(plans_where([term]))
    if term.field.startswith("labels."):
        return label_where(term)
    if term.field in LAUNCH_REPORTED_FIELDS:
        return reported_where(term)
    return term_where(launches, term, {"plan": "plan_id"})


def _experiment_where(term: filters.Term) -> sa.ColumnElement[bool]:
    """A term of an experiments filter as SQL: a label, a plan of either arm, or a column."""
    if term.field.startswith("labels."):
        return label_where(term, experiments)
    if term.field == "plan":  # either arm
        return _listed_where(term, experiments.c.plans, str(term.value))
    return term_where(experiments, term)


def _relabel(engine: Any, table: sa.Table, which: sa.ColumnElement[bool], before: str, after: str) -> bool:
    with engine.begin() as conn:
        done = conn.execute(table.update().where(which, table.c.labels == before)
                            .values(labels=after, update_time=utc_now()))
    return bool(done.rowcount)


@dataclass(frozen=True)
class Created:
    row: LaunchRow
    new: bool  # False: an earlier launch of the same (principal, request_id) was found
    conflicts: bool = False  # that earlier launch was asked for with a different request


class LaunchStore:
    def __init__(self, audit: AuditStore) -> None:
        self.audit = audit
        self.write_engine, self.read_engine = audit.write_engine, audit.read_engine

    def create(self, row: LaunchRow) -> Created:
        """Insert a new launch with the next sequence number; when (principal, request_id)
        already named a launch, return that one instead (and whether the request differs)."""
        with self.write_engine.begin() as conn:
            if self.audit.dialect == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_LAUNCH_LOCK})")
            if row.request_id:
                found = conn.execute(sa.select(launch_requests.c.launch_id).where(
                    launch_requests.c.principal == row.principal,
                    launch_requests.c.request_id == row.request_id)).scalar()
                if found is not None:
                    earlier = conn.execute(sa.select(launches).where(launches.c.launch_id == found)).first()
                    if earlier is not None:
                        old = _from_columns(earlier._mapping)
                        return Created(old, False, conflicts=old.request_hash != row.request_hash)
            seq = conn.execute(sa.select(sa.func.coalesce(sa.func.max(launches.c.sequence), 0))).scalar_one()
            now = utc_now()
            row = row.replace(sequence=int(seq) + 1, create_time=now, update_time=now)
            conn.execute(launches.insert().values(**_to_columns(row)))
            if row.request_id:
                conn.execute(launch_requests.insert().values(principal=row.principal, request_id=row.request_id,
                                                             launch_id=row.launch_id))
        return Created(row, True)

    def by_request(self, principal: str, request_id: str) -> LaunchRow | None:
        """The launch an earlier CreateLaunch of (principal, request_id) made, if any."""
        with self.read_engine.begin() as conn:
            row = conn.execute(sa.select(launches).join(launch_requests,
                                                        launch_requests.c.launch_id == launches.c.launch_id)
                               .where(launch_requests.c.principal == principal,
                                      launch_requests.c.request_id == request_id)).first()
        return _from_columns(row._mapping) if row is not None else None

    def update(self, launch_id: str, only_from: str = "", only_owner: str = "", **values: Any) -> bool:
        """Set these values; with `only_from`, only while the launch is in that state, and with
        `only_owner`, only while that server owns it (whether it was is the answer: another
        replica may have moved it, or taken it over)."""
        where = launches.c.launch_id == launch_id
        if only_from:
            where = where & (launches.c.state == only_from)
        if only_owner:
            where = where & (launches.c.owner == only_owner)
        with self.write_engine.begin() as conn:
            done = conn.execute(launches.update().where(where).values(**_update_values(values), update_time=utc_now()))
        return bool(done.rowcount)

    def relabel(self, launch_id: str, before: str, after: str) -> bool:
        """Store a launch's labels (labels_cell form) as `after`, if they are still `before`:
        whether they were (a relabel on another replica may have come between)."""
        return _relabel(self.write_engine, launches, launches.c.launch_id == launch_id, before, after)

    def claim(self, launch_id: str, state: str, from_owner: str, to_owner: str) -> bool:
        """Make `to_owner` the launch's owner, if it is still in `state` and `from_owner` (even
        "", a launch written before owners) still owns it: of replicas claiming one launch at
        once, one wins."""
        with self.write_engine.begin() as conn:
            done = conn.execute(launches.update().where(launches.c.launch_id == launch_id, launches.c.state == state,
                                                        launches.c.owner == from_owner)
                                .values(owner=to_owner, update_time=utc_now()))
        return bool(done.rowcount)

    def get(self, launch_id: str) -> LaunchRow | None:
        with self.read_engine.begin() as conn:
            row = conn.execute(sa.select(launches).where(launches.c.launch_id == launch_id)).first()
        return _from_columns(row._mapping) if row is not None else None

    def list_rows(self, filter_text: str = "", page_size: int = 0, page_token: str = "",
                  order_by: str = "") -> tuple[list[LaunchRow], str]:
        where = matching(filters.parse_filter(filter_text, LAUNCH_FILTER_FIELDS), _launch_where)
        rows, token = self.audit.page(launches, where, filter_text, page_size, page_token,
                                      order=filters.parse_order(order_by, "create_time", REPORT_MEASURES))
        return [_from_columns(r._mapping) for r in rows], token

    @staticmethod
    def token_after(row: LaunchRow, filter_text: str, order_by: str) -> str:
        """The page token going on after `row` in a listing of `filter_text` and (checked)
        `order_by`: where a page that would not fit in one message is cut short."""
        order = filters.parse_order(order_by, "create_time", REPORT_MEASURES)
        value = reported_cells(row.report_json)[order.field] if order.field else None
        return cursor_token(Cursor(row.sequence, value), filter_text, order)

    def in_states(self, states: Sequence[str]) -> list[LaunchRow]:
        with self.read_engine.begin() as conn:
            rows = conn.execute(sa.select(launches).where(launches.c.state.in_(list(states)))
                                .order_by(launches.c.sequence))
            return [_from_columns(r._mapping) for r in rows]


# ---------------------------------------------------------------------------- leases

@dataclass(frozen=True)
class Lease:
    """A replica's lease as stored: who, on which machine, since when, and how long ago (seconds,
    on the database's clock) it was last renewed."""

    owner: str
    host: str
    started_at: str
    age: float
    version: str = ""  # the cgsvc release it runs, as of its last renewal ("": from before migration 13)
    address: str = ""  # HOST:PORT its clients reach it at ("": from before migration 14)


class LeaseStore:
    """One lease per server instance. A server renews its own while it runs; on a shared
    database, a lease older than the configured time says that replica is gone."""

    def __init__(self, audit: AuditStore) -> None:
        self.audit = audit
        self.now = db_epoch(audit.dialect)

    def renew(self, owner: str, host: str, address: str = "", version: str = __version__) -> float | None:
        """Renew `owner`'s lease (on `host`, reached at `address`, running release `version`); how
        long it had gone unrenewed (None: the first one)."""
        with self.audit.write_engine.begin() as conn:
            now = float(conn.execute(sa.select(self.now)).scalar_one())
            before = conn.execute(sa.select(replica_leases.c.renewed_at)
                                  .where(replica_leases.c.owner == owner)).scalar()
            if before is None:
                conn.execute(replica_leases.insert().values(owner=owner, host=host, started_at=utc_now(),
                                                            renewed_at=now, version=version, address=address))
                return None
            conn.execute(replica_leases.update().where(replica_leases.c.owner == owner)
                         .values(host=host, renewed_at=now, version=version, address=address))
        return now - float(before)

    def leases(self) -> list[Lease]:
        """Every replica's lease, the most recently renewed first."""
        return self._leases()

    def lapsed(self, seconds: float, but: str, active: Sequence[str]) -> list[Lease]:
        """Leases other than `but`'s not renewed for `seconds` or more whose replica still owns
        a launch in one of the `active` states or a RUNNING experiment: those left to take over
        (a replica that went with nothing to hand on costs the others nothing)."""
        return self._leases(replica_leases.c.owner != but, self._unrenewed_for(seconds), _holds_work(active))

    def forget(self, seconds: float, active: Sequence[str]) -> list[str]:
        """Delete the leases not renewed for `seconds` or more whose replica owns nothing
        active (as in lapsed): a replica rescheduled under a new name leaves its old lease
        behind, and the list of replicas should not grow with every reschedule. Returns the
        owners forgotten."""
        with self.audit.write_engine.begin() as conn:
            return list(conn.execute(replica_leases.delete()
                                     .where(self._unrenewed_for(seconds), ~_holds_work(active))
                                     .returning(replica_leases.c.owner)).scalars())

    def _unrenewed_for(self, seconds: float) -> sa.ColumnElement[bool]:
        return self.now - replica_leases.c.renewed_at >= seconds

    def _leases(self, *where: sa.ColumnElement[bool]) -> list[Lease]:
        with self.audit.read_engine.begin() as conn:
            rows = conn.execute(sa.select(replica_leases, (self.now - replica_leases.c.renewed_at).label("age"))
                                .where(*where).order_by(replica_leases.c.renewed_at.desc()))
            return [Lease(r.owner, r.host, r.started_at, float(r.age), r.version, r.address) for r in rows]


def _holds_work(active: Sequence[str]) -> sa.ColumnElement[bool]:
    """Whether a lease's replica still owns a launch in one of the `active` states or a RUNNING
    experiment."""
    return sa.or_(
        sa.exists().where(launches.c.owner == replica_leases.c.owner, launches.c.state.in_(list(active))),
        sa.exists().where(experiments.c.owner == replica_leases.c.owner, experiments.c.state == "RUNNING"))


# ---------------------------------------------------------------------------- experiments

EXPERIMENT_STATES = ("RUNNING", "SUCCEEDED", "FAILED", "CANCELLED")
EXPERIMENT_FILTER_FIELDS: dict[str, filters.FieldKind] = {
    "state": filters.Closed(EXPERIMENT_STATES), "principal": "str", "create_time": "time",
    "rerun_of": filters.Named("experiments"), "labels": "labels", "plan": filters.Named("plans")}


@dataclass(frozen=True)
class ExperimentRow:
    """One A/B experiment as stored: the request, the launches so far, what they measured."""

    experiment_id: str
    state: str
    principal: str
    request: dict[str, Any]  # {"plans": [A, B], "workload", "model_path", "repeats", "dispatcher"}
    runs: tuple[dict[str, Any], ...] = ()  # {"arm", "repeat", "launch", "state"}, in run order
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    error: str = ""
    audit_records: tuple[str, ...] = ()
    owner: str = ""
    create_time: str = ""
    update_time: str = ""
    sequence: int = 0
    cancel_requested_by: str = ""  # who asked, of any replica, for it to stop ("": nobody)
    rerun_of: str = ""  # the experiment this one runs again (its ID), if any
    labels: str = ""  # the caller's labels as stored (labels_cell); its launches carry them too


def _experiment_from(m: Any) -> ExperimentRow:
    return ExperimentRow(experiment_id=m["experiment_id"], state=m["state"], principal=m["principal"],
                         request=json.loads(m["request_json"]), runs=tuple(json.loads(m["launches_json"] or "[]")),
                         result=json.loads(m["result_json"] or "{}"), error=m["error"],
                         audit_records=tuple(json.loads(m["audit_records_json"] or "[]")), owner=m["owner"],
                         create_time=m["create_time"], update_time=m["update_time"], sequence=int(m["sequence"]),
                         cancel_requested_by=m["cancel_requested_by"], rerun_of=m["rerun_of"], labels=m["labels"])


class ExperimentStore:
    def __init__(self, audit: AuditStore) -> None:
        self.audit = audit
        self.write_engine, self.read_engine = audit.write_engine, audit.read_engine

    def create(self, row: ExperimentRow) -> ExperimentRow:
        return self.create_once(row)[0]

    def create_once(self, row: ExperimentRow, request_id: str = "",
                    request_hash: str = "") -> tuple[ExperimentRow, bool, bool]:
        """Insert a new experiment with the next sequence number; when (principal, request_id)
        already named one, that one instead. Returns the row, whether it is new, and whether the
        earlier one was asked for with a different request."""
        with self.write_engine.begin() as conn:
            if self.audit.dialect == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_LAUNCH_LOCK + 1})")
            if request_id:
                found = self._by_request(conn, row.principal, request_id)
                if found is not None:
                    return found[0], False, found[1] != request_hash
            seq = conn.execute(sa.select(sa.func.coalesce(sa.func.max(experiments.c.sequence), 0))).scalar_one()
            now = utc_now()
            row = dataclasses.replace(row, sequence=int(seq) + 1, create_time=now, update_time=now)
            conn.execute(experiments.insert().values(
                experiment_id=row.experiment_id, sequence=row.sequence, state=row.state, principal=row.principal,
                create_time=now, update_time=now, request_json=json.dumps(row.request),
                launches_json=json.dumps(list(row.runs)), result_json=json.dumps(row.result), error=row.error,
                audit_records_json=json.dumps(list(row.audit_records)), owner=row.owner, rerun_of=row.rerun_of,
                labels=row.labels, plans=plans_cell(row.request.get("plans", []))))
            if request_id:
                conn.execute(experiment_requests.insert().values(
                    principal=row.principal, request_id=request_id, experiment_id=row.experiment_id,
                    request_hash=request_hash))
        return row, True, False

    def by_request(self, principal: str, request_id: str) -> tuple[ExperimentRow, str] | None:
        """The experiment an earlier CreateExperiment of (principal, request_id) made, and the
        hash of that request; None if none did."""
        with self.read_engine.begin() as conn:
            return self._by_request(conn, principal, request_id)

    @staticmethod
    def _by_request(conn: Any, principal: str, request_id: str) -> tuple[ExperimentRow, str] | None:
        row = conn.execute(sa.select(experiments, experiment_requests.c.request_hash).join(
            experiment_requests, experiment_requests.c.experiment_id == experiments.c.experiment_id).where(
            experiment_requests.c.principal == principal, experiment_requests.c.request_id == request_id)).first()
        return (_experiment_from(row._mapping), row.request_hash) if row is not None else None

    def update(self, row: ExperimentRow) -> ExperimentRow | None:
        """Store the row's state, runs, result, error and records, while `row.owner` owns the
        experiment; returns it with its update time, or None when another replica has taken it
        over (nothing written)."""
        now = utc_now()
        with self.write_engine.begin() as conn:
            done = conn.execute(experiments.update().where(experiments.c.experiment_id == row.experiment_id,
                                                           experiments.c.owner == row.owner).values(
                state=row.state, update_time=now, launches_json=json.dumps(list(row.runs)),
                result_json=json.dumps(row.result), error=row.error,
                audit_records_json=json.dumps(list(row.audit_records))))
        return dataclasses.replace(row, update_time=now) if done.rowcount else None

    def request_cancel(self, experiment_id: str, principal: str) -> bool:
        """Ask for a running experiment to stop (the replica running it acts on it); False when
        it is not running (any more)."""
        with self.write_engine.begin() as conn:
            done = conn.execute(experiments.update().where(experiments.c.experiment_id == experiment_id,
                                                           experiments.c.state == "RUNNING")
                                .values(cancel_requested_by=principal))
        return bool(done.rowcount)

    def relabel(self, experiment_id: str, before: str, after: str) -> bool:
        """An experiment's labels, as LaunchStore.relabel stores a launch's."""
        return _relabel(self.write_engine, experiments, experiments.c.experiment_id == experiment_id, before, after)

    def claim(self, experiment_id: str, from_owner: str, to_owner: str) -> bool:
        """Make `to_owner` the owner, if `from_owner` still is (one replica wins)."""
        with self.write_engine.begin() as conn:
            done = conn.execute(experiments.update().where(experiments.c.experiment_id == experiment_id,
                                                           experiments.c.owner == from_owner)
                                .values(owner=to_owner, update_time=utc_now()))
        return bool(done.rowcount)

    def get(self, experiment_id: str) -> ExperimentRow | None:
        with self.read_engine.begin() as conn:
            row = conn.execute(sa.select(experiments).where(experiments.c.experiment_id == experiment_id)).first()
        return _experiment_from(row._mapping) if row is not None else None

    def list_rows(self, filter_text: str = "", page_size: int = 0,
                  page_token: str = "", order_by: str = "") -> tuple[list[ExperimentRow], str]:
        where = matching(filters.parse_filter(filter_text, EXPERIMENT_FILTER_FIELDS), _experiment_where)
        rows, token = self.audit.page(experiments, where, filter_text, page_size, page_token,
                                      order=filters.parse_order(order_by, "create_time"))
        return [_experiment_from(r._mapping) for r in rows], token

    def in_state(self, state: str) -> list[ExperimentRow]:
        with self.read_engine.begin() as conn:
            rows = conn.execute(sa.select(experiments).where(experiments.c.state == state)
                                .order_by(experiments.c.sequence))
            return [_experiment_from(r._mapping) for r in rows]
