"""A/B experiments: two stored plans measured on real worker groups, interleaved.

    create(request):  check both plans against the checkpoint, record, audit, start run()
    run():            for repeat 1..K: launch A, wait; launch B, wait      # A B A B ...
                      after each launch: its requests' TTFT / TPOT join that arm's samples,
                      the statistics are recomputed and stored (domain/stats.py)
                      a launch that does not succeed stops the experiment, names the launch,
                      and keeps what was measured

Launches go through the launch lifecycle like any other (audited, visible in `launches
list`); the experiment stores their names in run order. Interleaving spreads drift of the
machine (thermal, other load) over both arms instead of onto one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import structlog

from cgsvc import __version__
from cgsvc.audit.filters import labels_cell, labels_of
from cgsvc.audit.records import AuditEntry
from cgsvc.contract import DEFAULT_ENGINE, EngineSettings, ran_alike, ran_as
from cgsvc.domain import stats
from cgsvc.domain.labels import LabelChange, change_labels, created_with, label_problems
from cgsvc.domain.launches import (
    EXPERIMENT_RUNS,
    TERMINAL,
    Launches,
    LaunchOrder,
    PlanSource,
    TakenOver,
    dispatcher_named,
    engine_settings,
    order_for,
    patiently,
    read_checkpoint,
    request_hash,
    workload_problems,
)
from cgsvc.domain.plans import Caller, Plans
from cgsvc.errors import CODE_NUMBERS, FieldViolation, ServiceError
from cgsvc.ids import new_id, parse_name
from cgsvc.launch.store import ExperimentRow, ExperimentStore, LaunchRow, Lease, Workload

log = structlog.get_logger("cgsvc.experiments")
T = TypeVar("T")

CREATE_EXPERIMENT_METHOD = "/cgsvc.v1.ExperimentService/CreateExperiment"
CANCEL_EXPERIMENT_METHOD = "/cgsvc.v1.ExperimentService/CancelExperiment"
UPDATE_EXPERIMENT_METHOD = "/cgsvc.v1.ExperimentService/UpdateExperiment"
EXPERIMENT_STATE_METHOD = "experiment.state"
ARMS = ("A", "B")
MAX_REPEATS = 100


def _empty_samples() -> dict[str, dict[str, list[float]]]:
    return {arm: {"ttft_ms": [], "tpot_ms": []} for arm in ARMS}


def samples_of(report: dict[str, Any]) -> dict[str, list[float]]:
    """Per-request TTFT and TPOT of a worker report (TPOT only for requests with a second token)."""
    reqs = report.get("requests") or []
    return {"ttft_ms": [float(r["ttft_ms"]) for r in reqs if r.get("ttft_ms") is not None],
            "tpot_ms": [float(r["tpot_ms"]) for r in reqs if r.get("tpot_ms") is not None]}


def substitutions_of(report: dict[str, Any]) -> list[str]:
    """What the workers ran differently from the plan, as "field: requested -> effective (reason)"."""
    return [f"{f['field']}: {f['requested']} -> {f['effective']} ({f['reason']})"
            for f in report.get("plan_fidelity") or [] if f.get("status") == "substituted"]


# The samples an experiment's stored result keeps, per arm and metric: each is about 10 bytes on
# the wire, and GetExperiment must fit in one message (4 MiB by default) with the rest.
SAMPLES_KEPT = 20_000


def stored(row: ExperimentRow, key: str) -> dict[str, dict[str, list[float]]]:
    """Per arm and metric, what the stored result holds under `key` ("samples" or "launch_means")."""
    return {arm: {m: list(row.result.get("arms", {}).get(arm, {}).get(key, {}).get(m, []))
                  for m in ("ttft_ms", "tpot_ms")} for arm in ARMS}


def result_of(row: ExperimentRow, samples: dict[str, dict[str, list[float]]],
              substituted: dict[str, list[str]] | None = None,
              launch_means: dict[str, dict[str, list[float]]] | None = None,
              ran: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    out = stats.analyse(samples, launch_means if launch_means is not None else stored(row, "launch_means"))
    for arm, plan in zip(ARMS, row.request["plans"], strict=True):
        kept = row.result.get("arms", {}).get(arm, {})
        out["arms"][arm]["plan"] = plan
        out["arms"][arm]["launches"] = [r["launch"] for r in row.runs if r["arm"] == arm and r["state"] == "SUCCEEDED"]
        # every sample counts in the statistics; the stored result keeps the first SAMPLES_KEPT of each
        out["arms"][arm]["samples"] = {m: v[:SAMPLES_KEPT] for m, v in samples[arm].items()}
        if omitted := {m: len(v) - SAMPLES_KEPT for m, v in samples[arm].items() if len(v) > SAMPLES_KEPT}:
            out["arms"][arm]["samples_omitted"] = omitted
        # What was planned is what ran, or this says why not (the same for every launch of the arm).
        out["arms"][arm]["substituted"] = (substituted or {}).get(arm) or kept.get("substituted", [])
        out["arms"][arm]["ran"] = (ran or {}).get(arm) or kept.get("ran", {})
    out["ran_alike"] = ran_alike(out["arms"]["A"]["ran"], out["arms"]["B"]["ran"])
    if out["ran_alike"]:
        out["verdict"] = (f"A and B ran alike here: their plans differ only in {', '.join(out['ran_alike'])}, which "
                          "these workers substituted away or did not apply, so a difference below is the machine's, "
                          "not the plans'; " + out["verdict"])
        out["verdict_brief"] = "ran alike; " + out["verdict_brief"]
    return out


class Experiments:
    def __init__(self, store: ExperimentStore, launches: Launches, plans: Plans, instance: str = "") -> None:
        self.store, self.launches, self.plans = store, launches, plans
        self.auditor = plans.auditor
        self.instance = instance or launches.instance
        self.changed: dict[str, asyncio.Condition] = {}
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self._relabelling = asyncio.Lock()
        self.current: dict[str, str] = {}  # experiment id -> the launch id this replica started last for it
        self.taken_over = 0  # experiments claimed from replicas whose lease lapsed (a metric)
        self.ended: collections.Counter[str] = collections.Counter()  # by state, ended here (a metric)

    async def audit(self, method: str, principal: str, code: str, message: str, caller: Caller | None = None,
                    experiment_id: str = "") -> str:
        entry = AuditEntry(principal=principal, peer=caller.peer if caller else "", method=method,
                           request_id=caller.request_id if caller else "", trace_id=caller.trace_id if caller else "",
                           service_version=__version__, outcome_code=CODE_NUMBERS[code],
                           outcome_message=(f"experiments/{experiment_id}: " if experiment_id else "") + message)
        return str((await self.auditor.append(entry)).record.name)

    # ------------------------------------------------------------------ create
    async def create(self, plans: list[str], workload: Workload, model_path: str, repeats: int, dispatcher: str,
                     caller: Caller, engine: EngineSettings = DEFAULT_ENGINE, rerun_of: str = "",
                     request_id: str = "", labels: Mapping[str, str] | None = None) -> ExperimentRow:
        """Check, record and start an experiment; a refusal is audited, then raised. `engine`:
        the settings as the request gave them (EngineSettings.read; engine_settings checks and
        spells them); the defaults if none. `rerun_of` ("experiments/ID"): that experiment's
        request again, every other argument left empty (but `labels`: given, they replace its
        own). `request_id`: a retry of the request that made an experiment is answered with
        that experiment (nothing new starts). `labels`: the caller's, which its launches carry."""
        try:
            if rerun_of:
                rerun_of, (plans, workload, model_path, repeats, dispatcher, engine), was_labels = await self._rerun(
                    rerun_of, plans, workload, model_path, repeats, dispatcher, engine)
                labels = labels or labels_of(was_labels)
            row, new = await self._create(plans, workload, model_path, repeats, dispatcher, caller, engine, rerun_of,
                                          request_id, labels or {})
        except ServiceError as err:
            await self.audit(CREATE_EXPERIMENT_METHOD, caller.principal, err.code, err.message, caller)
            raise
        if new:
            self.tasks[row.experiment_id] = asyncio.create_task(self.run(row.experiment_id, caller))
        return row

    async def _earlier(self, found: tuple[ExperimentRow, str] | None, request_id: str, digest: str,
                       caller: Caller) -> ExperimentRow | None:
        """The experiment an earlier request with this request_id made (audited as a replay),
        None if there is none; INVALID_ARGUMENT when that request was another."""
        if found is None:
            return None
        row, made_by = found
        if made_by != digest:
            raise ServiceError.invalid([FieldViolation(
                "request_id", f"{request_id!r} already created experiments/{row.experiment_id} with a different "
                              "request; use a new request_id for a new experiment")])
        await self.audit(CREATE_EXPERIMENT_METHOD, caller.principal, "OK", f"replay of request_id {request_id!r}",
                         caller, row.experiment_id)
        return row

    async def _rerun(self, name: str, plans: list[str], workload: Workload, model_path: str, repeats: int,
                     dispatcher: str, engine: EngineSettings
                     ) -> tuple[str, tuple[list[str], Workload, str, int, str, EngineSettings], str]:
        """The ID of the experiment `name` runs again, its request and its labels (as stored):
        INVALID_ARGUMENT naming each argument also given, which its own would replace; NOT_FOUND
        when there is none."""
        experiment_id = parse_name(name, "experiments", "rerun_of")
        was = await self.get(experiment_id)
        given = {"plans": bool(plans), "workload": any(dataclasses.astuple(workload)), "model_path": bool(model_path),
                 "repeats": bool(repeats), "dispatcher": bool(dispatcher), "engine": engine != DEFAULT_ENGINE}
        if named := [field for field, value in given.items() if value]:
            raise ServiceError.invalid([FieldViolation(
                field, f"a rerun runs {name} with its own {field}: leave it empty, or run its plans with another "
                       f"(`cgsvc-cli experiment run {' '.join(was.request['plans'])}`)") for field in named])
        req = was.request
        return experiment_id, (list(req["plans"]), Workload(**req["workload"]), req["model_path"], int(req["repeats"]),
                               req["dispatcher"], EngineSettings.read(req.get("engine", {}))), was.labels

    async def _create(self, plans: list[str], workload: Workload, model_path: str, repeats: int, dispatcher: str,
                      caller: Caller, asked: EngineSettings, rerun_of: str = "", request_id: str = "",
                      labels: Mapping[str, str] | None = None) -> tuple[ExperimentRow, bool]:
        problems = workload_problems(workload, model_path) + label_problems(labels or {})
        dispatcher, wrong = dispatcher_named(dispatcher)
        problems += wrong
        engine, wrong = engine_settings(asked)
        problems += wrong
        if len(plans) != 2:
            problems.append(FieldViolation("plans", f"exactly two (A and B), got {len(plans)}"))
        if not 1 <= repeats <= MAX_REPEATS:
            problems.append(FieldViolation("repeats", f"launches per arm, 1 to {MAX_REPEATS}; got {repeats}"))
        if problems:
            raise ServiceError.invalid(problems)
        request = {"plans": plans, "workload": dataclasses.asdict(workload), "model_path": model_path,
                   "repeats": repeats, "dispatcher": dispatcher, "engine": dataclasses.asdict(engine)}
        cell = labels_cell(labels or {})
        digest = request_hash({**request, "rerun_of": rerun_of, **({"labels": cell} if cell else {})}) if request_id else ""
        if request_id and (earlier := await self._earlier(
                await asyncio.to_thread(self.store.by_request, caller.principal, request_id), request_id, digest,
                caller)):
            return earlier, False
        ids = []
        for i, name in enumerate(plans):
            prefix = "plans/"
            if not name.startswith(prefix) or len(name) == len(prefix):
                raise ServiceError.invalid([FieldViolation(f"plans[{i}]", f"must look like plans/ID, got {name!r}")])
            ids.append(name[len(prefix):])
        ckpt = read_checkpoint(model_path, workload, self.plans.model_roots)
        for plan_id in ids:  # both arms must be launchable before anything runs
            order_for(PlanSource.stored(await self.plans.get(plan_id)), ckpt, model_path, workload, dispatcher, True,
                      engine=engine)
        if dispatcher not in self.launches.dispatchers:
            raise ServiceError("FAILED_PRECONDITION", f"dispatcher {dispatcher!r} is not configured on this server",
                               [FieldViolation("dispatcher", f"one of {', '.join(self.launches.dispatchers)}")])
        experiment_id = new_id()
        again = (f", rerun of experiments/{rerun_of}" if rerun_of else "") + created_with(cell)
        record = await self.audit(CREATE_EXPERIMENT_METHOD, caller.principal, "OK",
                                  f"{plans[0]} (A) vs {plans[1]} (B), {repeats} launches per arm, interleaved{again}",
                                  caller, experiment_id)
        row = ExperimentRow(experiment_id=experiment_id, state="RUNNING", principal=caller.principal,
                            request=request, result=result_of(
                                ExperimentRow(experiment_id, "RUNNING", caller.principal, request), _empty_samples()),
                            audit_records=(record,), owner=self.instance, rerun_of=rerun_of, labels=cell)
        made, new, conflicts = await asyncio.to_thread(self.store.create_once, row, request_id, digest)
        if not new:  # a concurrent retry got there first: this one's record names an experiment never made
            await self.audit(CREATE_EXPERIMENT_METHOD, caller.principal, "OK",
                             f"not made: request_id {request_id!r} made experiments/{made.experiment_id} first",
                             caller, experiment_id)
            earlier = await self._earlier((made, "" if conflicts else digest), request_id, digest, caller)
            assert earlier is not None
            return earlier, False
        return made, True

    # ------------------------------------------------------------------ run
    @staticmethod
    async def _patiently(experiment_id: str, step: Callable[[], Awaitable[T]]) -> T:
        """step(), and again while the database does not answer: an experiment waits an outage
        out, as its launches do (each step is a read, or a write of the same row again)."""
        return await patiently(step, "running an experiment", experiment_id=experiment_id)

    async def _save(self, row: ExperimentRow) -> ExperimentRow:
        """Store the row (TakenOver when another replica owns the experiment now)."""
        saved = await self._patiently(row.experiment_id, lambda: asyncio.to_thread(self.store.update, row))
        if saved is None:
            raise TakenOver(row.experiment_id)
        row = saved
        cond = self.changed.setdefault(row.experiment_id, asyncio.Condition())
        async with cond:
            cond.notify_all()
        return row

    async def _launch(self, order: LaunchOrder, caller: Caller) -> LaunchRow:
        """The launch of one run, made once however often the database goes away meanwhile (its
        request_id, under EXPERIMENT_RUNS, is one no client's CreateLaunch may take)."""
        launch, _ = await self._patiently(order.experiment, lambda: self.launches.create(order, caller))
        return launch

    async def _follow(self, row: ExperimentRow, launch_id: str) -> tuple[ExperimentRow, LaunchRow]:
        """Wait for a launch to end, keeping its state in the experiment's last run up to date
        (through a database outage: the watch opens again, answering the state first)."""
        async def follow() -> tuple[ExperimentRow, LaunchRow]:
            nonlocal row
            async for kind, launch in self.launches.watch(launch_id):
                if kind == "state" and launch.state != row.runs[-1]["state"]:
                    row = dataclasses.replace(row, runs=(*row.runs[:-1], {**row.runs[-1], "state": launch.state}))
                    if launch.state not in TERMINAL:
                        row = await self._save(row)
                if launch.state in TERMINAL:
                    return row, launch
            return row, await self.launches.get(launch_id)
        return await self._patiently(row.experiment_id, follow)

    async def run(self, experiment_id: str, caller: Caller) -> None:
        why = f"experiments/{experiment_id}, which started it, has ended"
        try:
            await self._run(experiment_id, caller)
        except TakenOver:  # this replica's lease lapsed and another ended the experiment
            log.warning("experiment taken over; cancelling the launch this replica started for it",
                        experiment_id=experiment_id, launch_id=self.current.get(experiment_id, ""))
            why = f"experiments/{experiment_id}, which started it, was taken over by another replica and has ended"
        except asyncio.CancelledError:  # the server stops: its restart ends the experiment and the launch
            self.current.pop(experiment_id, None)
            raise
        # However the schedule ended (a failure inside included), the launch it started last serves
        # nothing now; one that has ended (the usual case) is left as it is. The new owner of a
        # taken-over experiment may never have seen this launch.
        await self._cancel_launches([self.current.pop(experiment_id, "")], why)

    async def _cancel_launches(self, launch_ids: list[str], why: str, principal: str = "cgsvc") -> None:
        """Ask for an ended (or cancelled) experiment's unfinished launches to be cancelled (not
        waiting for them), by `principal`: the service itself, or whoever cancelled it."""
        for launch_id in filter(None, launch_ids):
            with contextlib.suppress(ServiceError):  # it has ended meanwhile
                await self.launches.request_cancel(launch_id, principal, why)

    async def _run(self, experiment_id: str, caller: Caller) -> None:
        row = await self._patiently(experiment_id, lambda: asyncio.to_thread(self.store.get, experiment_id))
        assert row is not None
        req = row.request
        workload = Workload(**req["workload"])
        engine = EngineSettings.read(req.get("engine", {}))  # an experiment from before engine settings: the defaults
        samples = _empty_samples()
        substituted: dict[str, list[str]] = {arm: [] for arm in ARMS}
        ran: dict[str, dict[str, Any]] = {}
        try:
            ckpt = read_checkpoint(req["model_path"], workload, self.plans.model_roots)
            plans = [PlanSource.stored(await self._patiently(experiment_id, functools.partial(
                self.plans.get, name.removeprefix("plans/")))) for name in req["plans"]]
            for repeat in range(1, req["repeats"] + 1):
                for arm, plan in zip(ARMS, plans, strict=True):
                    if who := await self._cancel_asked(experiment_id):
                        await self._end(row, samples, "CANCELLED", _cancelled(who, samples))
                        return
                    # one request_id a run: a retry after the database went away finds the launch
                    # the first try made, rather than making a second
                    asked = f"{EXPERIMENT_RUNS}{experiment_id}/runs/{len(row.runs) + 1}"
                    order = dataclasses.replace(
                        order_for(plan, ckpt, req["model_path"], workload, req["dispatcher"], True, engine=engine),
                        experiment=experiment_id, experiment_run=f"arm {arm}, repeat {repeat}", labels=row.labels,
                        request_id=asked, request_hash=request_hash({"experiment": experiment_id, "run": asked}))
                    launch = await self._launch(order, dataclasses.replace(caller, request_id=asked))
                    self.current[experiment_id] = launch.launch_id
                    run = {"arm": arm, "repeat": repeat, "launch": f"launches/{launch.launch_id}", "state": launch.state}
                    row = await self._save(dataclasses.replace(row, runs=(*row.runs, run)))
                    if who := await self._cancel_asked(experiment_id):  # asked while this launch was being made
                        await self._cancel_launches([launch.launch_id], _cancel_reason(experiment_id, who), who)
                    row, done = await self._follow(row, launch.launch_id)
                    if done.state != "SUCCEEDED" and (who := await self._cancel_asked(experiment_id)):
                        await self._end(row, samples, "CANCELLED", _cancelled(who, samples))
                        return
                    if done.state != "SUCCEEDED":
                        why = (done.error.splitlines() or [done.state])[0]
                        await self._end(row, samples, "FAILED",
                                        f"launches/{done.launch_id} (arm {arm}, repeat {repeat}) ended {done.state}: "
                                        f"{why}; {_kept(samples, 'before it')}")
                        return
                    report = json.loads(done.report_json or "{}")
                    means = stored(row, "launch_means")
                    for metric, values in samples_of(report).items():
                        samples[arm][metric].extend(values)
                        if values:
                            means[arm][metric].append(round(sum(values) / len(values), 4))
                    substituted[arm] = list(dict.fromkeys(substituted[arm] + substitutions_of(report)))
                    ran[arm] = ran_as(report)
                    # the bootstrap takes seconds on large samples: off the event loop, which serves every call
                    result = await asyncio.to_thread(result_of, row, samples, substituted, means, ran)
                    row = await self._save(dataclasses.replace(row, result=result))
        except TakenOver:
            raise
        except ServiceError as err:  # a plan or checkpoint that went away, devices gone, ...
            await self._end(row, samples, "FAILED", f"{err.code}: {err.message}")
            return
        except Exception as exc:  # noqa: BLE001 - say so on the resource rather than lose it
            log.exception("experiment failed", experiment_id=experiment_id)
            await self._end(row, samples, "FAILED", f"internal error: {exc}")
            return
        if who := await self._cancel_asked(experiment_id):  # accepted, though its last launch beat it
            await self._end(row, samples, "CANCELLED", f"cancelled by {who} as its last launch finished: every "
                            f"launch it planned ran, and {_kept(samples, 'in them')}")
            return
        await self._end(row, samples, "SUCCEEDED", "")

    async def _end(self, row: ExperimentRow, samples: dict[str, dict[str, list[float]]], state: str,
                   error: str) -> None:
        now = await self._patiently(row.experiment_id, lambda: asyncio.to_thread(self.store.get, row.experiment_id))
        if now is not None and now.owner != row.owner:  # not this replica's to end any more
            raise TakenOver(row.experiment_id)
        # the result saved after the last launch was made from these same samples: not made again
        result = row.result if row.result.get("arms") else await asyncio.to_thread(result_of, row, samples)
        message = f"{state}: {result['verdict']}" + (f"; {error}" if error else "")
        record = await self._patiently(row.experiment_id, lambda: self.audit(
            EXPERIMENT_STATE_METHOD, "cgsvc", "OK", message, experiment_id=row.experiment_id))
        await self._save(dataclasses.replace(row, state=state, error=error, result=result,
                                             audit_records=(*row.audit_records, record)))
        self.ended[state] += 1
        log.info("experiment ended", experiment_id=row.experiment_id, state=state, verdict=result["verdict"])

    # ------------------------------------------------------------------ cancel
    async def cancel(self, experiment_id: str, caller: Caller) -> ExperimentRow:
        """Ask, of any replica, for a running experiment to stop: the request is stored for the
        replica running it, which starts no further launch and ends it CANCELLED, keeping what
        was measured; the launch running now is cancelled here. Audited; a refusal (ended
        already) is audited by the request pipeline."""
        row = await self.get(experiment_id)
        if row.state != "RUNNING" or not await asyncio.to_thread(self.store.request_cancel, experiment_id,
                                                                  caller.principal):
            now = await self.get(experiment_id)
            raise ServiceError("FAILED_PRECONDITION", f"experiments/{experiment_id} has already ended ({now.state})")
        await self.audit(CANCEL_EXPERIMENT_METHOD, caller.principal, "OK",
                         f"cancel asked by {caller.principal}; it ends after its current launch stops", caller,
                         experiment_id)
        if row.runs and row.runs[-1]["state"] not in TERMINAL:
            await self._cancel_launches([row.runs[-1]["launch"].removeprefix("launches/")],
                                        _cancel_reason(experiment_id, caller.principal), caller.principal)
        return await self.get(experiment_id)

    async def relabel(self, experiment_id: str, change: LabelChange, caller: Caller) -> ExperimentRow:
        """Change an experiment's labels (in any state; its launches keep the ones they were
        made with), recorded before they are stored."""
        async with self._relabelling:
            row = await self.get(experiment_id)

            async def record(code: str, message: str) -> None:
                await self.audit(UPDATE_EXPERIMENT_METHOD, caller.principal, code, message, caller, experiment_id)

            await change_labels(f"experiments/{experiment_id}", row.labels, change, "experiment.labels", record,
                                functools.partial(self.store.relabel, experiment_id))
        return await self.get(experiment_id)

    async def _cancel_asked(self, experiment_id: str) -> str:
        """Who asked for the experiment to stop ("" when nobody has)."""
        row = await self._patiently(experiment_id, lambda: asyncio.to_thread(self.store.get, experiment_id))
        return row.cancel_requested_by if row is not None else ""

    # ------------------------------------------------------------------ read, watch, recover
    async def get(self, experiment_id: str) -> ExperimentRow:
        row = await asyncio.to_thread(self.store.get, experiment_id)
        if row is None:
            raise ServiceError("NOT_FOUND", f"experiments/{experiment_id} does not exist")
        return row

    async def watch(self, experiment_id: str) -> AsyncIterator[ExperimentRow]:
        row = await self.get(experiment_id)
        yield row
        cond = self.changed.setdefault(experiment_id, asyncio.Condition())
        while row.state == "RUNNING":
            async with cond:  # also re-read every few seconds: another replica may run it
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(cond.wait(), timeout=2.0)
            new = await self.get(experiment_id)
            if new.update_time != row.update_time:
                yield new
            row = new

    async def recover(self) -> list[str]:
        """At start-up: an experiment left RUNNING by a server that stopped cannot resume its
        schedule; it ends FAILED, keeping what it measured."""
        notes = []
        for row in await asyncio.to_thread(self.store.in_state, "RUNNING"):
            if self.launches.owns(row.owner):  # else another replica runs it
                notes += await self._claim_and_fail(row, row.owner, "the server stopped while the experiment ran",
                                                    "the server stopped while it ran")
        return notes

    async def take_over(self, lease: Lease) -> list[str]:
        """The running experiments of a replica whose lease lapsed: their schedule ran there and
        cannot resume, so each, once claimed (one replica wins it), ends FAILED as at a restart."""
        notes = []
        for row in await asyncio.to_thread(self.store.in_state, "RUNNING"):
            if row.owner == lease.owner and (said := await self._claim_and_fail(
                    row, lease.owner, f"replica {lease.owner} on {lease.host}, which ran it, stopped renewing its "
                                      f"lease ({lease.age:.0f} s ago)", f"taken over from replica {lease.owner}")):
                self.taken_over += 1
                notes += said
        return notes

    async def _claim_and_fail(self, row: ExperimentRow, owner: str, why: str, note: str) -> list[str]:
        """End an experiment whose schedule cannot resume FAILED, once this replica has claimed
        it from `owner` (of replicas claiming it at once, one wins; another may still take it
        over from this one, whose own lease had lapsed: then it is let go)."""
        if not await asyncio.to_thread(self.store.claim, row.experiment_id, owner, self.instance):
            return []
        unfinished = [r["launch"] for r in row.runs if r["state"] not in TERMINAL]
        cancelled = f"; {', '.join(unfinished)}, which it ran, is cancelled" if unfinished else ""
        try:
            await self._end(dataclasses.replace(row, owner=self.instance), stored(row, "samples"), "FAILED",
                            f"{why}; the launches it had finished are kept{cancelled}, start a new experiment to "
                            "continue")
        except TakenOver:
            return [f"let go of experiments/{row.experiment_id}: another replica took it over"]
        await self._cancel_launches([name.removeprefix("launches/") for name in unfinished],
                                    f"experiments/{row.experiment_id}, which ran it, ended FAILED: {why}")
        return [f"ended experiments/{row.experiment_id} ({note})"]

    def running(self) -> int:
        """The experiments this replica runs now."""
        return sum(1 for task in list(self.tasks.values()) if not task.done())  # asked from the metrics thread

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()


def _kept(samples: dict[str, dict[str, list[float]]], when: str) -> str:
    """What an experiment that ends early keeps: "the 3 samples measured before it are kept"."""
    n = sum(len(s["ttft_ms"]) for s in samples.values())
    if not n:
        return f"nothing was measured {when}"
    return f"the 1 sample measured {when} is kept" if n == 1 else f"the {n} samples measured {when} are kept"


def _cancel_reason(experiment_id: str, principal: str) -> str:
    """Why a cancelled experiment's launch is cancelled, as that launch records it."""
    return f"experiments/{experiment_id} was cancelled by {principal}"


def _cancelled(principal: str, samples: dict[str, dict[str, list[float]]]) -> str:
    return f"cancelled by {principal}; {_kept(samples, 'before')}"
