"""The launch lifecycle: admission, devices, dispatch, monitoring, cancellation and recovery.

    PLACING -> LOADING -> CAPTURING -> RUNNING (tokens done) -> SUCCEEDED | FAILED | CANCELLED
    (LOST: a group this server started is gone and left no report)

Launch state lives in the service's database (LaunchStore); every state change is appended
to the audit log, linked to the plan by plan_id and to the launch by launch_id. One asyncio
task per active launch follows the worker group's events and its supervisor process. What
the workers write is read through cgsvc.contract only: a malformed event or report fails the
launch with the reason, it never stops the server.

Replicas on one PostgreSQL database each supervise the launches they started (`owner`). A
replica renews a lease while it runs (LeaseStore); when one's lease lapses, another takes
over its launches (take_over): a queued launch is placed by the new owner, a running group on
the same machine is followed from there, one on another machine is settled LOST, saying why.
Every write of a supervising replica is fenced by its ownership, so a replica that was only
stalled finds its launches taken over when it resumes, lets them go, and stops a group the
new owner settled.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime as dt
import functools
import hashlib
import json
import math
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import structlog

from cgsvc import __version__, catalog, codec
from cgsvc.audit.auditor import Auditor
from cgsvc.audit.records import AuditEntry, utc_text
from cgsvc.audit.store import StoredPlan, database_unavailable, outage_text, utc_now
from cgsvc.contract import (
    CPU_DECODE_MODES,
    DEFAULT_ENGINE,
    DTYPE_ALIASES,
    DTYPES,
    KV_PAGE_TOKENS,
    MAX_KV_CACHE_MB,
    TP_SHARDED,
    ContractError,
    EngineSettings,
    PlacedEvent,
    ProgressEvent,
    RunDir,
    StateEvent,
    WorkerReport,
    kv_budget_bytes,
    kv_budget_floor,
    parse_event,
    read_report,
    substituted,
    tp_fits,
    tp_misfits,
)
from cgsvc.domain.labels import LabelChange, change_labels, created_with
from cgsvc.domain.plans import Caller
from cgsvc.errors import CODE_NUMBERS, FieldViolation, ServiceError, did_you_mean, one_spelling
from cgsvc.ids import new_id
from cgsvc.launch.dispatch import HOST, DispatchError, LocalDispatcher, RunHandle
from cgsvc.launch.store import (
    DISPATCHERS,
    LAUNCH_STATES,
    LaunchRow,
    LaunchStore,
    Lease,
    LeaseStore,
    Workload,
)
from cgsvc.plan import canonical_json, rule_ids
from cgsvc.resolve import DEFAULT_POLICY, policy_version
from cgsvc.text import counted

log = structlog.get_logger("cgsvc.launch")
T = TypeVar("T")

CREATE_METHOD = "/cgsvc.v1.LaunchService/CreateLaunch"
ACTIVE = LAUNCH_STATES[:4]  # in the order a launch moves through them
TERMINAL = LAUNCH_STATES[4:]
WORKER_STATES = {"loading": "LOADING", "capturing": "CAPTURING", "running": "RUNNING"}
STATE_METHOD = "launch.state"
RETENTION_METHOD = "launch.retention"  # an ended launch's logs removed (--launch-retention-days)
REMOVED = "removed.json"  # what retention leaves in a run directory: when and why its logs went
UPDATE_METHOD = "/cgsvc.v1.LaunchService/UpdateLaunch"


class TakenOver(Exception):
    """Another replica owns the launch (or experiment) now: this one must let it go."""


@dataclass(frozen=True)
class LaunchOrder:
    """Everything a new launch needs, checked by the service."""

    plan_id: str
    plan_json: str
    spec_json: str
    plan_audit: str  # "auditRecords/N" of the plan
    tp: int
    model_path: str
    workload: Workload
    dispatcher: str
    wait: bool
    request_id: str = ""
    request_hash: str = ""
    rule_ids: tuple[str, ...] = ()  # the plan's: its CreateLaunch record carries them (`rule_id = X` finds it)
    engine: EngineSettings = EngineSettings()
    rerun_of: str = ""  # the ID of the launch this one runs again
    labels: str = ""  # the caller's labels, as the store keeps them (labels_cell)
    experiment: str = ""  # the ID of the experiment this launch is a run of
    experiment_run: str = ""  # which of its runs ("arm A, repeat 2"), for the record


# The most requests one launch runs (a bigger benchmark is several launches, or an experiment).
MAX_REQUESTS = 100_000
# The longest request (input_len + output_len) when the checkpoint states no context length.
MAX_SEQUENCE_TOKENS = 1_048_576


def workload_problems(workload: Workload, model_path: str) -> list[FieldViolation]:
    """What is wrong with a launch's workload and checkpoint path, field by field."""
    problems = [FieldViolation(f"workload.{k}", f"must be at least 1, got {v}") for k, v in
                (("input_len", workload.input_len), ("output_len", workload.output_len),
                 ("requests", workload.requests)) if v < 1]
    if workload.requests > MAX_REQUESTS:
        problems.append(FieldViolation("workload.requests", f"at most {MAX_REQUESTS} per launch, got "
                                                            f"{workload.requests}; split it into several launches"))
    if workload.concurrency < 0:
        problems.append(FieldViolation("workload.concurrency", "must be 0 (all at once) or positive"))
    if not model_path:
        problems.append(FieldViolation("model_path", "required: the checkpoint directory the workers load"))
    return problems


def engine_settings(given: EngineSettings) -> tuple[EngineSettings, list[FieldViolation]]:
    """A request's engine settings as it gave them (EngineSettings.read of its message) in their
    one spelling, and the violation of each field outside what the workers take."""
    problems = []
    closed = {}
    dtype = DTYPE_ALIASES.get(given.dtype.lower(), given.dtype)
    aliases = f" (or {', '.join(DTYPE_ALIASES)})"
    for name, value, choices, also in (("dtype", dtype, DTYPES, aliases),
                                       ("cpu_decode", given.cpu_decode, CPU_DECODE_MODES, "")):
        closed[name] = one_spelling(value, choices) or ""
        if not closed[name]:
            problems.append(FieldViolation(f"engine.{name}", f"unknown value {value[:40]!r}; "
                                                             f"{did_you_mean(value, choices)}valid: {', '.join(choices)}"
                                                             f"{also}"))
    if not 0 <= given.kv_cache_mb <= MAX_KV_CACHE_MB:  # NaN too
        problems.append(FieldViolation("engine.kv_cache_mb", f"MiB of KV cache a rank: 0 (auto) or more than 0, at most "
                                                             f"{MAX_KV_CACHE_MB}, got {given.kv_cache_mb:.12g}"))
    if problems:
        return EngineSettings(), problems
    return EngineSettings(closed["dtype"], float(given.kv_cache_mb), closed["cpu_decode"]), []


def dispatcher_named(value: str) -> tuple[str, list[FieldViolation]]:
    """The dispatcher `value` names ("" is local) in its one spelling, read in any case as every
    closed set is; outside the set, the violation saying what would do. (Whether this server has
    it configured is admission's question: FAILED_PRECONDITION there.)"""
    value = value or "local"
    known = one_spelling(value, DISPATCHERS)
    if known is not None:
        return known, []
    return value, [FieldViolation("dispatcher", f"unknown value {value[:40]!r}; {did_you_mean(value, DISPATCHERS)}"
                                                f"valid: {', '.join(DISPATCHERS)}")]


def read_checkpoint(model_path: str, workload: Workload, roots: catalog.ModelRoots) -> catalog.ModelFacts:
    """The checkpoint the workers would load, checked against the workload and the server's
    model roots (INVALID_ARGUMENT naming model_path or workload.input_len otherwise)."""
    try:
        ckpt = catalog.read_model_dir(model_path, roots=roots)
    except ServiceError as err:
        raise ServiceError.invalid([FieldViolation("model_path", v.description) for v in err.violations]) from None
    max_pos = ckpt.max_position_embeddings or 0
    if workload.input_len + workload.output_len > (max_pos or MAX_SEQUENCE_TOKENS):
        limit = (f"the checkpoint's context of {max_pos} tokens" if max_pos else
                 f"{MAX_SEQUENCE_TOKENS} tokens (the checkpoint states no max_position_embeddings)")
        raise ServiceError.invalid([FieldViolation(
            "workload.input_len", f"input_len + output_len = {workload.input_len + workload.output_len} exceeds "
                                  f"{limit}")])
    return ckpt


@dataclass(frozen=True)
class PlanSource:
    """The plan a launch runs: a stored plan, or (validate_only) a resolution that is not stored
    (no plan_id; `audit_record` is its validate_only ResolvePlan record)."""

    plan_id: str
    plan_json: str
    spec_json: str
    audit_record: str

    @classmethod
    def stored(cls, stored: StoredPlan) -> PlanSource:
        return cls(stored.row.plan_id, stored.row.plan_json, stored.row.spec_json, f"auditRecords/{stored.sequence}")


@dataclass(frozen=True)
class Admission:
    """What admitting an order found: the devices it would be placed on now (empty when it would
    wait for them), and how many of the dispatcher's devices are free."""

    devices: list[str]
    free: int
    slots: int


def order_for(plan: PlanSource, ckpt: catalog.ModelFacts, model_path: str, workload: Workload, dispatcher: str,
              wait: bool, request_id: str = "", request_hash: str = "",
              engine: EngineSettings = DEFAULT_ENGINE) -> LaunchOrder:
    """The order that runs a plan on a checkpoint: FAILED_PRECONDITION when the checkpoint is of
    another model family than the plan's or of sizes its tp cannot split, INVALID_ARGUMENT when
    it has no weights."""
    spec = json.loads(plan.spec_json)
    wanted = catalog.facts_for_spec(spec)
    if wanted is not None and wanted.text_architecture != ckpt.text_architecture:
        raise ServiceError("FAILED_PRECONDITION",
                           f"the checkpoint at {model_path} is a {ckpt.text_architecture} model; the plan was "
                           f"resolved for {wanted.name} ({wanted.text_architecture})",
                           [FieldViolation("model_path", "a checkpoint of the plan's model family")])
    tp = int(spec.get("parallelism", {}).get("tp", 1))
    sizes = {fact: getattr(ckpt, fact) for fact, _ in TP_SHARDED}
    if misfits := tp_misfits(tp, sizes):
        why = f"tp={tp} (the plan's) does not divide the checkpoint's {' or '.join(misfits)}"
        fits = ", ".join(map(str, tp_fits(sizes)))
        raise ServiceError("FAILED_PRECONDITION", f"{why}: its ranks could not split it evenly ({model_path})",
                           [FieldViolation("model_path", f"{why}; a checkpoint whose sizes tp={tp} divides, or a "
                                                         f"plan of a tp that divides this one's: {fits}")])
    if not any(Path(model_path).glob("*.safetensors")):  # a config alone resolves a plan, but runs nothing
        raise ServiceError.invalid([FieldViolation("model_path", f"no *.safetensors weights in {model_path}: a "
                                                                 "launch needs a checkpoint in hub layout (config.json "
                                                                 "and its model*.safetensors)")])
    resolved = codec.plan_from_dict(json.loads(plan.plan_json))
    if too_small := kv_budget_problem(engine, resolved.kv_cache_dtype, ckpt):
        raise ServiceError.invalid([too_small])
    return LaunchOrder(plan_id=plan.plan_id, plan_json=plan.plan_json, spec_json=plan.spec_json,
                       plan_audit=plan.audit_record, tp=tp,
                       model_path=model_path, workload=workload, dispatcher=dispatcher, wait=wait,
                       request_id=request_id, request_hash=request_hash, engine=engine,
                       rule_ids=tuple(rule_ids(resolved)))


def kv_budget_problem(engine: EngineSettings, kv_cache_dtype: str, ckpt: catalog.ModelFacts) -> FieldViolation | None:
    """A KV budget (engine.kv_cache_mb) too small for the cache's two pages on this checkpoint
    and plan, which every rank would fail on after loading; None when it may fit (the floor
    takes the smallest dtype auto could settle on, so nothing that runs is refused)."""
    if not engine.kv_cache_mb or not ckpt.kv_lora_rank:
        return None
    latent = ckpt.kv_lora_rank + (ckpt.qk_rope_head_dim or 0)
    floor = kv_budget_floor(kv_cache_dtype, engine.dtype, ckpt.num_layers, latent)
    given = kv_budget_bytes(engine.kv_cache_mb)
    if given >= floor:
        return None
    row = floor // (2 * KV_PAGE_TOKENS * ckpt.num_layers)
    stored = f"kv_cache_dtype {kv_cache_dtype or 'auto'}"
    if kv_cache_dtype in ("", "auto"):  # stored as the model's dtype
        stored += f", dtype {engine.dtype}{' (16-bit at least)' if engine.dtype == 'auto' else ''}"
    return FieldViolation("engine.kv_cache_mb", (
        f"{engine.kv_cache_mb:.12g} MiB is under the 2 KV cache pages a rank needs: at least {mib_up(floor)} MiB "
        f"({floor} bytes: 2 x {KV_PAGE_TOKENS} tokens x {ckpt.num_layers} layers x {row} bytes, {stored}), "
        "or 0 (auto)"))


def mib_up(n: int) -> str:
    """`n` bytes in MiB to three significant figures, rounded up (a floor said in MiB must hold)."""
    mib = n / (1 << 20)
    step = 10.0 ** (math.floor(math.log10(mib)) - 2)
    return f"{math.ceil(round(mib / step, 9)) * step:.3g}"


def request_hash(parts: dict[str, Any]) -> str:
    """What makes two CreateLaunch requests the same request (request_id aside)."""
    return hashlib.sha256(canonical_json(parts).encode()).hexdigest()


@dataclass
class Watched:
    """In-memory companion of an active launch: who waits on it, and cancellation."""

    version: int = 0
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    cancel: bool = False
    cancel_principal: str = ""
    cancel_reason: str = ""
    events_offset: int = 0
    task: asyncio.Task[None] | None = None


LOG_CHUNK_BYTES = 1 << 20  # at most this much of one log in one answer to a follow


# The most a launch keeps of its worker report (what GetLaunch and WatchLaunch carry, within one
# message of the default 4 MiB beside the rest of the launch). The run directory's report.json
# keeps every byte.
REPORT_BYTES = 1 << 20


def fidelity_said(report: dict[str, Any]) -> str:
    """What a succeeded launch's SUCCEEDED record says of its plan fidelity, so that the audit
    trail says whether the plan ran as planned without the report beside it."""
    fields = report.get("plan_fidelity") or []
    if not fields:
        return ""
    if not (changed := substituted(report)):  # the count first: a listing cuts the rest
        return f"all {len(fields)} plan fields ran as planned (or had nothing to act on)"
    return (f"{len(changed)} of {len(fields)} plan fields substituted by the workers: {', '.join(changed)} "
            "(launches show has each one's reason)")


def stored_report(report: dict[str, Any]) -> dict[str, Any]:
    """The worker report as a launch keeps it: whole while it is within REPORT_BYTES; past that,
    the requests without their generated token ids, and then only the first requests that fit,
    each step said in its notes. The aggregate, which the workers computed over every request,
    stays whole."""
    if len(json.dumps(report)) <= REPORT_BYTES:
        return report
    requests = [{k: v for k, v in r.items() if k != "output_tokens"} for r in report.get("requests") or []]
    notes = [*report.get("notes", []), "each request's output_tokens (the token ids) are left out of the launch's "
             "copy of this report to keep it within one message; the run directory's report.json has them"]
    out = {**report, "requests": requests, "notes": notes}
    room = REPORT_BYTES - 1024 - len(json.dumps({**out, "requests": []}))  # 1 KiB for the note and count below
    kept = 0
    for r in requests:
        room -= len(json.dumps(r)) + 2
        if room < 0:
            break
        kept += 1
    if kept < len(requests):
        omitted = len(requests) - kept
        out |= {"requests": requests[:kept], "requests_omitted": omitted,
                "notes": [*notes, f"{omitted} requests past the first {kept} are left out of the launch's copy of "
                                  "this report as well (the aggregate covers every request; the run directory's "
                                  "report.json has each)"]}
    return out


def read_log(path: Path, tail_lines: int, after: int | None = None, ended: bool = True,
             limit: int = LOG_CHUNK_BYTES) -> tuple[str, int, int]:
    """One log's text for GetLaunchLogs, the byte offset just past it, and the log's size, in at
    most `limit` bytes (an answer's share of one message). Without `after`: its last `tail_lines`
    lines (those that fit), or with 0 the log from its start as far as `limit` goes. With
    `after`: what follows that offset. Where more follows, or while the launch has not `ended`
    (a line still being written waits for its end), the text stops after its last newline (a
    line longer than `limit` goes in pieces); an offset past the end (the file was replaced)
    reads from the start."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if after is None and tail_lines > 0:
                fh.seek(max(0, size - limit))
                data = fh.read(limit)
                lines = data.decode(errors="replace").splitlines()
                whole = lines[1:] if size > limit else lines  # the first may be cut: it is not one of the last
                whole = whole[-tail_lines:]
                # bad bytes read as U+FFFD, 3 bytes: drop the first lines until the text fits
                text_bytes, first = len("\n".join(whole).encode()), 0
                while first < len(whole) and text_bytes > limit:
                    text_bytes -= len(whole[first].encode()) + (1 if first < len(whole) - 1 else 0)
                    first += 1
                return "\n".join(whole[first:]), size, size
            start = after if after is not None and after <= size else 0
            fh.seek(start)
            data = fh.read(limit)
    except OSError:
        return "", after or 0, after or 0
    if not ended or start + len(data) < size:
        cut = data.rfind(b"\n") + 1
        if cut or len(data) < limit:
            data = data[:cut]
    data = _within(data, limit)
    return data.decode(errors="replace"), start + len(data), size


def _within(data: bytes, limit: int) -> bytes:
    """The longest start of `data` whose text is at most `limit` bytes: a log's bad bytes read as
    U+FFFD, three bytes each, so a share of raw bytes can decode to more than the share."""
    def text_size(n: int) -> int:
        return len(data[:n].decode(errors="replace").encode())

    if text_size(len(data)) <= limit:
        return data
    lo, hi = 0, len(data)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if text_size(mid) <= limit else (lo, mid - 1)
    return data[:lo]


class Launches:
    def __init__(self, store: LaunchStore, auditor: Auditor, run_root: Path, dispatchers: list[LocalDispatcher],
                 instance: str = "", shared: bool = False, lease_seconds: float = 30.0) -> None:
        """`instance`: this server's name as an owner (app.server_instance); `shared`: other
        replicas may use the database (PostgreSQL), so their launches are theirs to recover,
        until their lease has gone `lease_seconds` unrenewed."""
        self.store, self.auditor = store, auditor
        self.leases = LeaseStore(store.audit)
        self.lease_seconds = lease_seconds
        self.started_at = utc_now()
        self.run_root = run_root
        self.dispatchers: dict[str, LocalDispatcher] = {d.name: d for d in dispatchers}
        self.instance = instance or uuid.uuid4().hex[:12]
        self.address = ""  # HOST:PORT its clients reach it at, once it serves (Replica.address)
        self.shared = shared
        self.watched: dict[str, Watched] = {}
        # launches stored whose accepted record did not commit: not placed; each waits for its
        # caller's retry (its request_id) for unfinished_grace seconds, then is ended (_unless_retried)
        self.unfinished: dict[str, asyncio.Task[None]] = {}
        self.unfinished_grace = UNFINISHED_GRACE
        # ... by what became of them (a metric): UNRECORDED_OUTCOMES
        self.unrecorded: collections.Counter[str] = collections.Counter()
        self.poll_seconds = 0.1
        self.taken_over = 0  # launches claimed from replicas whose lease lapsed (a metric)
        self.ended: collections.Counter[tuple[str, str]] = collections.Counter()  # (dispatcher, state) ended here
        self.on_ended: list[Callable[[LaunchRow], None]] = []  # told of each launch that ends here, as stored
        # One placement at a time: a launch stays PLACING in the store until its group has
        # started, so two schedule() calls at once (two creates, or a create and a launch that
        # ended) each started every PLACING launch, a second group on the same devices.
        self._placing = asyncio.Lock()
        self._relabelling = asyncio.Lock()

    def owns(self, owner: str) -> bool:
        """Whether a launch or experiment with this owner is this server's to recover: on a
        shared database only its own (or one written before owners); on SQLite every one."""
        return not self.shared or owner in (self.instance, "")

    async def _cancel_unstarted(self, row: LaunchRow, principal: str, reason: str = "") -> LaunchRow | None:
        """PLACING -> CANCELLED, unless it has moved on meanwhile (None)."""
        # any replica may: the owner's start of it is conditional on PLACING too
        return await self.transition_if_still(row, "CANCELLED", _cancelled_by(f"{principal} before it started", reason),
                                              principal=principal, fenced=False, error=_cancelled_by(principal, reason))

    # ------------------------------------------------------------------ audit and state
    async def audit(self, row: LaunchRow | None, principal: str, method: str, code: str, message: str,
                    caller: Caller | None = None, spec_json: str = "", model: str = "", gpu: str = "",
                    rule_ids: tuple[str, ...] = ()) -> str:
        policy, version, filed = _plan_filing(row)
        model, gpu = model or filed.get("model", ""), gpu or filed.get("gpu", "")
        entry = AuditEntry(principal=principal, peer=caller.peer if caller else "", method=method,
                           request_id=caller.request_id if caller else "", trace_id=caller.trace_id if caller else "",
                           launch_id=row.launch_id if row else "", plan_id=row.plan_id if row else "",
                           policy=policy, policy_version=version, service_version=__version__,
                           outcome_code=CODE_NUMBERS[code], outcome_message=message, spec_json=spec_json,
                           model=model, gpu=gpu, rule_ids=rule_ids)
        return str((await self.auditor.append(entry)).record.name)

    async def audit_order(self, row: LaunchRow | None, order: LaunchOrder, caller: Caller, message: str) -> str:
        """The accepted CreateLaunch record of `order` (`row` None: checked, not made): its
        spec's fields and its plan's rules, so that `rule_id = X` finds it."""
        described = Auditor.spec_fields(json.loads(order.spec_json)) if order.spec_json else {}
        return await self.audit(row, caller.principal, CREATE_METHOD, "OK", message, caller=caller,
                                spec_json=order.spec_json, model=described.get("model", ""),
                                gpu=described.get("gpu", ""), rule_ids=order.rule_ids)

    async def transition(self, row: LaunchRow, state: str, reason: str = "", principal: str = "cgsvc",
                         **values: Any) -> LaunchRow:
        """Persist, audit and announce a state change of a launch this server supervises;
        TakenOver, with nothing written, when another replica has taken it over."""
        new = await self._transition(row, state, reason, principal, "", **values)
        if new is None:
            raise TakenOver(row.launch_id)
        return new

    async def transition_if_still(self, row: LaunchRow, state: str, reason: str = "", principal: str = "cgsvc",
                                  fenced: bool = True, **values: Any) -> LaunchRow | None:
        """The same, only if the stored launch is still in `row.state` (another replica may
        have moved it) and, when `fenced`, still this server's; None, with nothing written,
        when it is not."""
        return await self._transition(row, state, reason, principal, row.state, fenced, **values)

    async def _transition(self, row: LaunchRow, state: str, reason: str, principal: str, only_from: str,
                          fenced: bool = True, **values: Any) -> LaunchRow | None:
        if row.state == state and not values:
            return row
        owner = self.instance if fenced and self.shared else ""
        moved = row.state != state
        message = f"{row.state} -> {state}" + (f": {reason}" if reason else "")

        def write() -> bool:
            return self.store.update(row.launch_id, only_from, owner, state=state, **values)

        if only_from:  # a race to leave this state (placement, a cancel before it started): the winner records it
            if not await asyncio.to_thread(write):
                return None
            if moved:
                await self.audit(row, principal, STATE_METHOD, "OK", message)
        else:
            # The record first (write-ahead): whoever reads the new state finds its record
            # committed, and a crash in between leaves a record to repeat, not a state without one.
            if moved:
                await self.audit(row, principal, STATE_METHOD, "OK", message)
            if not await asyncio.to_thread(write):  # fenced: another replica took the launch over meanwhile
                if moved:
                    await self.audit(row, "cgsvc", STATE_METHOD, "OK", f"not applied: {message} (replica "
                                     f"{self.instance} no longer supervises the launch: another has taken it over)")
                return None
        if moved:
            log.info("launch state", launch_id=row.launch_id, state=state, reason=reason)
        new = await asyncio.to_thread(self.store.get, row.launch_id)
        assert new is not None
        if moved and state in TERMINAL:
            self.ended[(row.dispatcher, state)] += 1
            for hear in self.on_ended:
                hear(new)
        await self.announce(row.launch_id)
        return new

    async def announce(self, launch_id: str) -> None:
        w = self.watched.setdefault(launch_id, Watched())
        async with w.changed:
            w.version += 1
            w.changed.notify_all()

    # ------------------------------------------------------------------ create
    def occupancy(self) -> tuple[list[LaunchRow], dict[str, tuple[int, int]]]:
        """Now, from the store: the active launches this replica supervises, and each
        dispatcher's devices as (busy, all) — what the metrics say when scraped."""
        rows = self.store.in_states(ACTIVE)
        return ([r for r in rows if r.owner == self.instance],
                {name: (len(self._busy(d, rows)), d.slots) for name, d in self.dispatchers.items()})

    def _busy(self, disp: LocalDispatcher, rows: list[LaunchRow]) -> list[str]:
        """Devices held by active launches: this machine's (owned here) for local devices, the
        whole cluster's slots for Ray."""
        held = [r for r in rows if r.dispatcher == disp.name and r.state != "PLACING"
                and (not disp.assigns_devices or r.owner == self.instance)]
        if disp.assigns_devices:
            return [d for r in held for d in r.devices]
        return [f"ray{i}" for i in range(sum(r.tp for r in held))]

    async def admit(self, order: LaunchOrder) -> Admission:
        """Whether this server can run `order` now: its dispatcher is configured and reachable,
        the plan fits the dispatcher's devices, and enough are free (or the order waits for
        them); the refusal a launch gets otherwise."""
        disp = self.dispatchers.get(order.dispatcher)
        if disp is None:
            raise ServiceError("FAILED_PRECONDITION", f"dispatcher {order.dispatcher!r} is not configured on this "
                               f"server; available: {', '.join(self.dispatchers)}",
                               [FieldViolation("dispatcher", f"one of {', '.join(self.dispatchers)}")])
        problem = await asyncio.to_thread(disp.check)
        if problem:
            raise ServiceError("FAILED_PRECONDITION", problem, [FieldViolation("dispatcher", problem)])
        if order.tp > disp.slots:
            raise ServiceError("FAILED_PRECONDITION", f"the plan needs {order.tp} devices, the {order.dispatcher} "
                               f"dispatcher has {disp.slots} in all ({', '.join(disp.inventory.devices)})",
                               [FieldViolation("plan", f"tp={order.tp} > {disp.slots} devices")])
        busy = self._busy(disp, await asyncio.to_thread(self.store.in_states, ACTIVE))
        free = disp.slots - len(busy)
        if free < order.tp and not order.wait:
            raise ServiceError("RESOURCE_EXHAUSTED", f"the plan needs {order.tp} devices and {free} of {disp.slots} "
                               "are free; retry later or set wait_for_resources to queue")
        return Admission(disp.inventory.take(order.tp, busy) or [], free, disp.slots)

    async def create(self, order: LaunchOrder, caller: Caller) -> tuple[LaunchRow, bool]:
        """Start a launch (or find the one this request_id already started); returns the row
        and whether it is new. A retry of a try that stored the row and then lost the database
        before its record committed finishes that launch (new): nothing places it until then."""
        await self.admit(order)
        launch_id = new_id()
        run = RunDir(self.run_root / launch_id)
        row = LaunchRow(launch_id=launch_id, plan_id=order.plan_id, state="PLACING", principal=caller.principal,
                        dispatcher=order.dispatcher, tp=order.tp, model_path=order.model_path,
                        workload=order.workload, run_dir=str(run.path),
                        tokens_total=order.workload.requests * order.workload.output_len,
                        prompt_tokens_total=order.workload.requests * order.workload.input_len, owner=self.instance,
                        request_id=order.request_id, request_hash=order.request_hash, engine=order.engine,
                        rerun_of=order.rerun_of, labels=order.labels, experiment=order.experiment)
        created = await asyncio.to_thread(self.store.create, row)
        if not created.new and (created.conflicts or created.row.launch_id not in self.unfinished):
            return created.row, False
        # new, or this server's own launch whose first try lost the database after the row was
        # stored and before its record committed: the retry (its request_id) finishes that try
        launch_id, run = created.row.launch_id, RunDir(Path(created.row.run_dir))
        if (waiting := self.unfinished.pop(launch_id, None)) is not None:  # a call now answers it as made
            waiting.cancel()
        finishing = not created.new
        engine = f" ({order.engine.text()})" if order.engine != DEFAULT_ENGINE else ""  # the record says what was asked
        again = f", rerun of launches/{order.rerun_of}" if order.rerun_of else ""
        if order.experiment:
            again += f", {order.experiment_run} of experiments/{order.experiment}"
        again += created_with(order.labels)
        try:
            write_plan(run, order.plan_json, order.spec_json)
            await self.audit_order(created.row, order, caller, f"launch of {order.plan_audit} on "
                                   f"{counted(order.tp, order.dispatcher + ' rank')}{engine}{again}")
        except Exception:  # not placed until a retry records it; ended if none comes (or at a restart)
            if order.request_id:
                self.unfinished[launch_id] = asyncio.create_task(self._unless_retried(created.row))
            raise
        if finishing:
            self.unrecorded["finished"] += 1
        self.watched[launch_id] = Watched()
        await self.schedule()
        got = await asyncio.to_thread(self.store.get, launch_id)
        assert got is not None
        return got, True

    async def schedule(self) -> None:
        """Start placing launches, oldest first, while devices are free; one call at a time,
        so that each launch is started once."""
        async with self._placing:
            await self._place()

    async def _place(self) -> None:
        for row in await asyncio.to_thread(self.store.in_states, ("PLACING",)):
            if row.owner != self.instance or row.launch_id in self.unfinished:
                continue
            disp = self.dispatchers[row.dispatcher]
            busy = self._busy(disp, await asyncio.to_thread(self.store.in_states, ACTIVE))
            devices = disp.inventory.take(row.tp, busy)
            if devices is None:
                return  # FIFO: later launches wait behind this one
            w = self.watched.setdefault(row.launch_id, Watched())
            if w.cancel:
                continue
            if row.cancel_requested_by:  # asked of another replica before it started
                await self._cancel_unstarted(row, row.cancel_requested_by, row.cancel_reason)
                continue
            run = RunDir(Path(row.run_dir))
            gpu_plan = _gpu_plan(run)
            row = row.replace(devices=tuple(devices) if disp.assigns_devices else ())
            placement = disp.placement(row, gpu_plan)
            try:
                handle = await asyncio.to_thread(disp.start, row, run, gpu_plan)
            except DispatchError as exc:
                await self.transition_if_still(row, "FAILED", str(exc), error=str(exc))
                continue
            loading = await self.transition_if_still(row, "LOADING", f"supervisor pid {handle.pid}; {placement}",
                                                     handle_json=handle.to_json(), devices=row.devices,
                                                     placement=placement)
            if loading is None:  # cancelled, or taken over, by another replica while the group started
                await asyncio.to_thread(disp.stop, handle)
                stored = await asyncio.to_thread(self.store.get, row.launch_id)
                why = "taken over by replica " + stored.owner if stored and stored.owner != self.instance \
                    else "cancelled"
                await self.audit(row, "cgsvc", STATE_METHOD, "OK", f"stopped the group started as it was {why} "
                                 f"(supervisor pid {handle.pid})")
                continue
            w.task = asyncio.create_task(self.monitor(loading.launch_id))

    # ------------------------------------------------------------------ monitor
    async def monitor(self, launch_id: str) -> None:
        """Follow a launch's group until it ends. Through a database that does not answer for a
        while it keeps following: once it answers again, the group's events are read again from
        the start (states only move forward) and what happened is written then, its end once."""
        w = self.watched.setdefault(launch_id, Watched())

        def read_again() -> None:
            w.events_offset = 0  # an event read but not written is read again

        if await patiently(lambda: self._monitor(launch_id, w), "following a launch", read_again, launch_id=launch_id):
            await self.schedule()

    async def _monitor(self, launch_id: str, w: Watched) -> bool:
        """monitor()'s one try: False when another replica took the launch over."""
        row = await asyncio.to_thread(self.store.get, launch_id)
        assert row is not None
        if row.state in TERMINAL:  # settled before the database went away
            return True
        disp = self.dispatchers[row.dispatcher]
        handle = RunHandle.from_json(row.handle_json)
        try:
            await self._follow(row, disp, handle, RunDir(Path(row.run_dir)), w)
        except TakenOver:
            await self._let_go(launch_id, disp, handle)
            return False
        return True

    async def _follow(self, row: LaunchRow, disp: LocalDispatcher, handle: RunHandle, run: RunDir,
                      w: Watched) -> None:
        """Follow the group until the launch ends; TakenOver when another replica owns it."""
        launch_id = row.launch_id
        polls = 0
        while True:
            if polls % 10 == 0:  # about once a second: a cancel asked of another replica, a takeover
                with contextlib.suppress(OSError):  # followed: its supervisor stops a group nobody follows
                    run.followed.touch()
                stored = await asyncio.to_thread(self.store.get, launch_id)
                if stored is not None and self.shared and stored.owner != self.instance:
                    raise TakenOver(launch_id)
                if stored is not None and stored.cancel_requested_by and not w.cancel:
                    w.cancel, w.cancel_principal, w.cancel_reason = True, stored.cancel_requested_by, \
                        stored.cancel_reason
            polls += 1
            row, bad = await self.follow_events(row, run, w)
            if bad:  # the group broke the contract: stop it, say why
                await asyncio.to_thread(disp.stop, handle)
                await self.transition(row, "FAILED", bad, error=bad)
                break
            if w.cancel:
                await asyncio.to_thread(disp.stop, handle)
                why = _cancelled_by(w.cancel_principal, w.cancel_reason)
                await self.transition(row, "CANCELLED", why, principal=w.cancel_principal, error=why)
                break
            code = disp.exit_code(handle)
            if code is not None:
                row, _ = await self.follow_events(row, run, w)
                await self.finish(row, run, code)
                break
            await asyncio.sleep(self.poll_seconds)

    async def _let_go(self, launch_id: str, disp: LocalDispatcher, handle: RunHandle) -> None:
        """This replica's lease lapsed and another took the launch over. A group it followed on
        from this machine is its now; one it settled (LOST: it could not follow it from there)
        is stopped here, where it runs."""
        stored = await asyncio.to_thread(self.store.get, launch_id)
        owner = stored.owner if stored is not None else "?"
        if stored is None or stored.state not in TERMINAL:
            log.warning("launch taken over", launch_id=launch_id, owner=owner)
            return
        await asyncio.to_thread(disp.stop, handle)
        await self.audit(stored, "cgsvc", STATE_METHOD, "OK",
                         f"stopped the group (supervisor pid {handle.pid}) on {HOST}, from replica {self.instance}: "
                         f"replica {owner} took the launch over while its lease had lapsed, and settled it "
                         f"{stored.state}")
        log.warning("stopped a launch's group taken over and settled elsewhere", launch_id=launch_id, owner=owner,
                    state=stored.state)

    async def follow_events(self, row: LaunchRow, run: RunDir, w: Watched) -> tuple[LaunchRow, str]:
        """Apply the events written since the last call; returns the row and, when an event
        breaks the contract, why."""
        try:
            with open(run.events, encoding="utf-8") as fh:
                fh.seek(w.events_offset)
                chunk = fh.read()
        except FileNotFoundError:
            return row, ""
        complete = chunk[: chunk.rfind("\n") + 1]
        w.events_offset += len(complete.encode())
        for line in complete.splitlines():
            try:
                event = parse_event(line)
            except ContractError as exc:
                return row, f"the worker group wrote a malformed event ({exc}): {line[:200]!r}"
            if isinstance(event, StateEvent) and event.state in WORKER_STATES:
                # forward only: a monitor that re-attaches after a restart reads the group's
                # events again from the start and must not move the launch back through them
                state = WORKER_STATES[event.state]
                if row.state in ACTIVE and ACTIVE.index(state) > ACTIVE.index(row.state):
                    row = await self.transition(row, state)
            elif isinstance(event, ProgressEvent):
                counts: dict[str, Any] = {"tokens_done": event.tokens_done, "tokens_total": event.tokens_total,
                          "prompt_tokens_done": event.prompt_done, "prompt_tokens_total": event.prompt_total,
                          "capture_done": event.capture_done, "capture_total": event.capture_total}
                await asyncio.to_thread(self.store.update, row.launch_id, **counts)
                row = row.replace(**counts)
                await self.announce(row.launch_id)
            elif isinstance(event, PlacedEvent) and not row.devices:  # Ray: the devices it assigned
                await asyncio.to_thread(self.store.update, row.launch_id, devices=event.devices)
                row = row.replace(devices=event.devices)
                await self.announce(row.launch_id)
        return row, ""

    async def finish(self, row: LaunchRow, run: RunDir, code: int) -> None:
        try:
            report = read_report(run.report)
        except ContractError as exc:
            if code == -1 and not run.report.exists():
                await self.transition(row, "LOST", "the worker group is gone and left no report",
                                      error="the worker group is gone and left no report (killed, or the machine "
                                            "restarted)")
                return
            report = WorkerReport.failed(f"the worker group left no readable report ({exc}); its supervisor "
                                         f"exited with code {code}")
        if report.ok and code in (0, -1):
            done = report.output_tokens or row.tokens_done
            stored = stored_report(report.to_dict())
            await self.transition(row, "SUCCEEDED", fidelity_said(stored), report_json=json.dumps(stored),
                                  tokens_done=done)
            return
        error = report.error or f"the worker supervisor exited with code {code}"
        for r in report.rank_errors:
            last = read_log(run.rank_log(r.rank), 5)[0]
            error += f"\nrank {r.rank} exited with code {r.exit_code}" + (f"; last log lines:\n{last}" if last else "")
        if not report.rank_errors:
            last = read_log(run.rank_log(0), 5)[0] or read_log(run.supervisor_log, 5)[0]
            if last:
                error += f"\nlast log lines:\n{last}"
        await self.transition(row, "FAILED", error.splitlines()[0], error=error,
                              report_json=json.dumps(stored_report(report.to_dict())))

    # ------------------------------------------------------------------ read, cancel, watch, recover
    async def get(self, launch_id: str) -> LaunchRow:
        row = await asyncio.to_thread(self.store.get, launch_id)
        if row is None:
            raise ServiceError("NOT_FOUND", f"launches/{launch_id} does not exist")
        return row

    async def relabel(self, launch_id: str, change: LabelChange, caller: Caller) -> LaunchRow:
        """Change a launch's labels (in any state), recorded before they are stored."""
        async with self._relabelling:  # this replica's relabels one at a time; other replicas' lose with ABORTED
            row = await self.get(launch_id)

            async def record(code: str, message: str) -> None:
                await self.audit(row, caller.principal, UPDATE_METHOD, code, message, caller)

            await change_labels(f"launches/{launch_id}", row.labels, change, "launch.labels", record,
                                functools.partial(self.store.relabel, launch_id))
        return await self.get(launch_id)

    async def cancel(self, launch_id: str, principal: str) -> LaunchRow:
        row = await self.request_cancel(launch_id, principal)
        for _ in range(400):  # the monitor stops the group; wait for it (bounded)
            row = await self.get(launch_id)
            if row.state in TERMINAL:
                break
            await asyncio.sleep(0.05)
        return row

    async def request_cancel(self, launch_id: str, principal: str, reason: str = "") -> LaunchRow:
        """Ask for the launch to be cancelled, without waiting for its group to stop: a launch
        not started yet is cancelled at once; a started one is stopped by the monitor of the
        replica that supervises it (the request is stored, for any replica to read). A
        `reason` (a cancel the service makes itself) is stored with it and ends up in the
        launch's error and its CANCELLED record."""
        row = await self.get(launch_id)
        if row.state in TERMINAL:
            raise ServiceError("FAILED_PRECONDITION", f"launches/{launch_id} has already ended ({row.state})")
        await asyncio.to_thread(self.store.update, launch_id, cancel_requested_by=principal, cancel_reason=reason)
        w = self.watched.setdefault(launch_id, Watched())
        w.cancel, w.cancel_principal, w.cancel_reason = True, principal, reason
        if row.state == "PLACING":
            async with self._placing:  # not while schedule() may be starting it
                row = await self.get(launch_id)
                if row.state == "PLACING" and (done := await self._cancel_unstarted(row, principal,
                                                                                     reason)) is not None:
                    return done
            # it started meanwhile (here or on another replica): its monitor stops the group
        return row

    async def watch(self, launch_id: str) -> AsyncIterator[tuple[str, LaunchRow]]:
        row = await self.get(launch_id)
        w = self.watched.setdefault(launch_id, Watched())
        yield "state", row
        seen_version, last_state = w.version, row.state
        while row.state not in TERMINAL:
            async with w.changed:
                # Also re-read every second: another replica may own this launch.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(w.changed.wait_for(functools.partial(self._moved, w, seen_version)),
                                           timeout=1.0)
            seen_version = w.version
            new = await self.get(launch_id)
            if new.state != last_state or (new.tokens_done, new.prompt_tokens_done, new.capture_done) != (
                    row.tokens_done, row.prompt_tokens_done, row.capture_done):
                yield ("state" if new.state != last_state else "progress"), new
            row, last_state = new, new.state

    @staticmethod
    def _moved(w: Watched, version: int) -> bool:
        return w.version != version

    async def recover(self) -> list[str]:
        """At start-up: re-attach to groups that still run, settle those that ended, never forget one."""
        notes = []
        for row in await asyncio.to_thread(self.store.in_states, ACTIVE):
            if not self.owns(row.owner):
                continue  # another replica's: it supervises it, and recovers it when it restarts
            if (claimed := await self._claim(row, row.owner)) is None:
                continue  # taken over meanwhile by a replica that saw this one's lease lapse
            notes += await self._adopt(claimed, "", row.owner)
        await self.schedule()
        return notes

    async def replicas(self) -> list[tuple[Lease, int]]:
        """Every replica's lease, the most recently renewed first, with the number of active
        launches it supervises; on SQLite (one server, no leases) this server alone."""
        rows = await asyncio.to_thread(self.store.in_states, ACTIVE)
        active = collections.Counter(r.owner for r in rows)
        if not self.shared:
            return [(Lease(self.instance, HOST, self.started_at, 0.0, __version__, self.address), len(rows))]
        return [(lease, active[lease.owner]) for lease in await asyncio.to_thread(self.leases.leases)]

    async def take_over(self, lease: Lease) -> list[str]:
        """The active launches of a replica whose lease lapsed become this server's: each is
        claimed (one replica wins it), audited, and then adopted as at a restart."""
        notes = []
        why = (f"replica {lease.owner} on {lease.host} stopped renewing its lease ({lease.age:.0f} s ago); taken over "
               f"by replica {self.instance} on {HOST}")
        for row in await asyncio.to_thread(self.store.in_states, ACTIVE):
            if row.owner != lease.owner or (claimed := await self._claim(row, lease.owner)) is None:
                continue
            self.taken_over += 1
            notes.append(f"took over launches/{row.launch_id} ({row.state}) from replica {lease.owner}")
            notes += await self._adopt(claimed, why, lease.owner, lease.host)
        await self.schedule()
        return notes

    async def _claim(self, row: LaunchRow, owner: str) -> LaunchRow | None:
        """The launch, now this server's, if it is still in its state and `owner`'s (one of the
        replicas claiming it at once wins); None when it has moved on or another claimed it."""
        if not await asyncio.to_thread(self.store.claim, row.launch_id, row.state, owner, self.instance):
            return None
        return row.replace(owner=self.instance)

    async def _unless_retried(self, row: LaunchRow) -> None:
        """A launch stored without its accepted record, unplaced, `unfinished_grace` seconds on: a
        retry of its request_id has not finished it, so it is placed if its record did commit
        after all (only the answer was lost), and ended FAILED, unstarted, otherwise."""
        await asyncio.sleep(self.unfinished_grace)
        accepted = await patiently(lambda: asyncio.to_thread(self._accepted, row.launch_id),
                                   "settling a launch stored without its record", launch_id=row.launch_id)
        if self.unfinished.pop(row.launch_id, None) is None:  # a retry finished it meanwhile
            return
        if accepted:
            self.unrecorded["placed"] += 1
            self.watched.setdefault(row.launch_id, Watched())
            await self.schedule()
            return
        said = f"no retry of request_id {row.request_id!r} came within {self.unfinished_grace:g} s; "
        await patiently(lambda: self._unaccepted(row, said), "settling a launch stored without its record",
                        launch_id=row.launch_id)

    def _accepted(self, launch_id: str) -> bool:
        """Whether the log holds the accepted CreateLaunch record of this launch."""
        where = f'launch_id = "{launch_id}" AND method = "{CREATE_METHOD}" AND outcome = "OK"'
        return bool(self.auditor.store.list_records(where, page_size=1, plans=False)[0])

    async def _unaccepted(self, row: LaunchRow, said: str) -> list[str]:
        """End, unstarted, a launch stored by a server that lost its database (or stopped) before
        its accepted record committed: no group runs that the log does not account for."""
        why = (f"{said}no record of it was accepted (the server that stored it stopped, or lost its database, before "
               "recording it): not started; ask again, with a new request_id")
        if await self.transition_if_still(row, "FAILED", why, error=why) is None:
            return []  # moved on meanwhile (cancelled, or another replica's now)
        self.unrecorded["failed"] += 1
        return [f"failed launches/{row.launch_id}: stored, never recorded as accepted"]

    async def _adopt(self, row: LaunchRow, why: str, owner: str, host: str = HOST) -> list[str]:
        """A launch this server has just claimed, from its own earlier run (`why` empty) or from
        a replica whose lease lapsed: placed here (PLACING), followed from here (its group runs
        on this machine), or settled (it ended: finished from its run directory; it runs on
        another machine, or on a dispatcher this server lacks: LOST, saying why). Another
        replica may take it over even now (this one's own lease had lapsed): then it is let go."""
        try:
            return await self._settle_or_follow(row, why, owner, host)
        except TakenOver:
            return [f"let go of launches/{row.launch_id}: another replica took it over meanwhile"]

    async def _settle_or_follow(self, row: LaunchRow, why: str, owner: str, host: str) -> list[str]:
        disp = self.dispatchers.get(row.dispatcher)
        w = self.watched.setdefault(row.launch_id, Watched())
        run = RunDir(Path(row.run_dir))
        said = f"{why}; " if why else ""
        if disp is None:
            await self._lost(row, f"{said}dispatcher {row.dispatcher!r} is not configured here",
                             f"{said}dispatcher {row.dispatcher!r} is not configured on this server")
            return []
        if row.state == "PLACING":
            if not await asyncio.to_thread(self._accepted, row.launch_id):
                return await self._unaccepted(row, said)
            if not run.plan.exists():  # its run directory was on another machine: make one here
                stored = await asyncio.to_thread(self.auditor.store.get_plan, row.plan_id)
                if stored is None:
                    await self._lost(row, f"{said}plans/{row.plan_id} is not in the log")
                    return []
                run = RunDir(self.run_root / row.launch_id)
                write_plan(run, stored.row.plan_json, stored.row.spec_json)
                await asyncio.to_thread(self.store.update, row.launch_id, run_dir=str(run.path))
            if why:
                await self.audit(row, "cgsvc", STATE_METHOD, "OK", f"{why}; it waits for devices here")
            return []
        handle = RunHandle.from_json(row.handle_json)
        where = handle.host or host
        if where != HOST:
            until = f" until replica {owner} returns and stops it" if why else ""
            await self._lost(row, f"{said}its worker group ran on {where}, which cannot be followed from here",
                             f"{said}its worker group ran on {where} and cannot be followed from {HOST}: it may "
                             f"still run there{until}")
            return []
        if disp.alive(handle):
            await self.audit(row, "cgsvc", STATE_METHOD, "OK",
                             f"re-attached: {why}; its group (supervisor pid {handle.pid}) runs on this machine" if why
                             else f"re-attached after a server restart (pid {handle.pid})")
            w.task = asyncio.create_task(self.monitor(row.launch_id))
            return [f"re-attached launches/{row.launch_id} (pid {handle.pid})"]
        if why:
            await self.audit(row, "cgsvc", STATE_METHOD, "OK", f"{why}; its group has ended")
        await self.finish(row, run, -1)
        return [f"settled launches/{row.launch_id}, whose group had ended"]

    async def _lost(self, row: LaunchRow, message: str, error: str = "") -> None:
        await self.transition(row, "LOST", message, error=error or message)

    # ------------------------------------------------------------------ retention
    async def remove_old_logs(self, days: float) -> list[str]:
        """The run directories on this machine (under run_root) of launches that ended and have
        not changed for `days` lose their logs, events and report file. Each removal's audit
        record is committed first; what stays is the plan file (the launch's later records are
        filed by it) and REMOVED, naming the record, which GetLaunchLogs answers with. The
        report, the plan and the records are in the database. Returns the launches' names."""
        cutoff = utc_text(dt.datetime.now(dt.UTC) - dt.timedelta(days=days))

        def candidates() -> list[Path]:
            if not self.run_root.is_dir():
                return []
            return sorted(p for p in self.run_root.iterdir() if p.is_dir() and not (p / REMOVED).exists())

        removed = []
        for path in await asyncio.to_thread(candidates):
            row = await asyncio.to_thread(self.store.get, path.name)
            if row is None or row.state not in TERMINAL or not row.update_time or row.update_time >= cutoff \
                    or Path(row.run_dir).resolve() != path.resolve():
                continue
            record = await self.audit(row, "cgsvc", RETENTION_METHOD, "OK", (
                f"launches/{row.launch_id}: logs and events removed from {path} on {HOST}: it ended "
                f"{row.state} and last changed {row.update_time}, over {days:g} days ago (launch_retention_days); "
                "its report, plan and records are kept"))
            await asyncio.to_thread(_remove_run_files, RunDir(path), {
                "removed_at": utc_now(), "record": record, "last_change": row.update_time, "retention_days": days})
            removed.append(f"launches/{row.launch_id}")
        return removed

    async def close(self) -> None:
        """Stop following launches (they keep running; a restarted server re-attaches)."""
        for w in self.watched.values():
            if w.task is not None:
                w.task.cancel()
        for waiting in self.unfinished.values():  # a restart ends them (_unaccepted)
            waiting.cancel()


UNFINISHED_GRACE = 600.0  # seconds a launch stored without its record waits for its caller's retry
# what became of a launch stored without its accepted record: a retry recorded it; its record had
# committed after all (only the answer was lost); ended FAILED, unstarted
UNRECORDED_OUTCOMES = ("finished", "placed", "failed")
EXPERIMENT_RUNS = "experiments/"  # request_ids of experiments' runs' launches; CreateLaunch refuses them


async def patiently(step: Callable[[], Awaitable[T]], doing: str, on_wait: Callable[[], None] | None = None,
                    **context: str) -> T:
    """step(), and again while the database does not answer (store.database_unavailable), waiting
    0.5 s, then longer, up to 5 s between tries: what the service does on its own (following a
    launch, running an experiment) waits an outage out. `on_wait` is called before each wait."""
    pause = 0.5
    while True:
        try:
            return await step()
        except Exception as exc:
            if not database_unavailable(exc):
                raise
            log.warning(f"{doing}: the database does not answer; waiting", error=outage_text(exc),
                        retry_seconds=pause, **context)
            if on_wait is not None:
                on_wait()
            await asyncio.sleep(pause)
            pause = min(pause * 2, 5.0)


def _remove_run_files(run: RunDir, why: dict[str, Any]) -> None:
    """What retention removes of an ended launch's run directory, the marker saying so written last."""
    shutil.rmtree(run.logs, ignore_errors=True)
    for path in (run.events, run.report, run.followed):
        path.unlink(missing_ok=True)
    (run.path / REMOVED).write_text(json.dumps(why))


def removed_logs(run: RunDir) -> dict[str, Any] | None:
    """What retention left in a run directory whose logs it removed (REMOVED); None where it did not."""
    try:
        return dict(json.loads((run.path / REMOVED).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _cancelled_by(principal: str, reason: str) -> str:
    return f"cancelled by {principal}" + (f": {reason}" if reason else "")


def write_plan(run: RunDir, plan_json: str, spec_json: str) -> None:
    """A new run directory, with the plan and spec the workers run (written again by a retry
    that finishes an earlier try's launch: the same plan)."""
    run.path.mkdir(parents=True, exist_ok=True)
    run.plan.write_text(json.dumps({"plan": json.loads(plan_json), "spec": json.loads(spec_json)}))


def _plan_filing(row: LaunchRow | None) -> tuple[str, str, dict[str, Any]]:
    """(policy, policy_version, the spec's model and gpu) of the plan a launch runs, as written to
    its run directory, that its records are filed under; the default policy's, and no model or
    gpu, when there is no launch or no plan file yet."""
    if row is not None:
        try:
            written = json.loads(RunDir(Path(row.run_dir)).plan.read_text())
            plan, spec = written.get("plan") or {}, written.get("spec")
            filed = Auditor.spec_fields(spec) if isinstance(spec, dict) else {}
            return str(plan.get("policy", DEFAULT_POLICY)), str(plan.get("policy_version", "")), filed
        except (OSError, ValueError, AttributeError):
            pass
    return DEFAULT_POLICY, policy_version(), {}


def _gpu_plan(run: RunDir) -> bool:
    """Whether the launch's plan (as written to its run directory) is for CUDA GPUs."""
    try:
        spec = json.loads(run.plan.read_text()).get("spec") or {}
    except (OSError, ValueError):
        return False
    gpu = catalog.find_gpu(str(spec.get("hardware", {}).get("gpu", "")))
    return bool(gpu and gpu.cuda)
