"""LaunchService: CreateLaunch (a long-running operation), Get/List/Cancel/Watch, and logs.

A shell over cgsvc.domain: it checks the request, has the plan resolved and recorded
(domain.plans) or fetched, and hands a LaunchOrder to the lifecycle (domain.launches).
CreateLaunch is idempotent: the same principal and request_id return the same launch, also
after a server restart or from another replica; a request_id reused for a different request
is refused.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from cgsvc import codec
from cgsvc.audit.filters import labels_cell, labels_of
from cgsvc.contract import DEFAULT_ENGINE, EngineSettings, RunDir
from cgsvc.domain.labels import label_problems, read_change
from cgsvc.domain.launches import (
    CREATE_METHOD,
    EXPERIMENT_RUNS,
    LOG_CHUNK_BYTES,
    TERMINAL,
    Launches,
    PlanSource,
    dispatcher_named,
    engine_settings,
    order_for,
    read_checkpoint,
    read_log,
    removed_logs,
    request_hash,
    workload_problems,
)
from cgsvc.domain.plans import Caller, Plans, resolve_spec
from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.ids import parse_name
from cgsvc.launch.dispatch import HOST, RunHandle
from cgsvc.launch.store import LaunchRow, Workload
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.services import MESSAGE_BYTES, caller, list_page, room
from cgsvc.text import counted
from cgsvc.v1 import launch_pb2


class LaunchService:
    def __init__(self, launches: Launches, plans: Plans, max_message_bytes: int = MESSAGE_BYTES) -> None:
        self.launches, self.plans = launches, plans
        self.max_message_bytes = max_message_bytes
        self.store = launches.store

    async def _records(self, launch_id: str) -> list[str]:
        recs, _ = await asyncio.to_thread(self.plans.store.list_records, f'launch_id = "{launch_id}"', 1000)
        return [r.name for r in recs]

    async def _proto(self, row: LaunchRow) -> launch_pb2.Launch:
        stored = await asyncio.to_thread(self.plans.store.get_plan, row.plan_id)
        return codec.launch_proto(row, await self._records(row.launch_id),
                                  f"auditRecords/{stored.sequence}" if stored is not None else "")

    async def CreateLaunch(self, request: launch_pb2.CreateLaunchRequest,  # noqa: N802 - gRPC name
                           rc: RequestContext) -> launch_pb2.Operation:
        who = caller(rc)
        try:
            rerun_of = ""
            if request.WhichOneof("source") == "rerun_of":
                request, rerun_of = await self._rerun(request)
            if request.validate_only:
                return await self._validate(request, who, rerun_of)
            row = await self._create(request, who, rerun_of)
        except ServiceError as err:
            fields = self.plans.auditor.spec_fields(
                codec.spec_dict_from_proto(request.spec) if request.HasField("spec") else None)
            await self.launches.audit(None, who.principal, CREATE_METHOD, err.code, err.message, caller=who,
                                      **fields)
            raise
        msg = await self._proto(row)
        return launch_pb2.Operation(name=f"operations/{row.launch_id}", done=row.state in TERMINAL, metadata=msg)

    async def _rerun(self, request: launch_pb2.CreateLaunchRequest) -> tuple[launch_pb2.CreateLaunchRequest, str]:
        """A rerun_of request as the request that made the launch it names, with that launch's
        stored plan as its source, and that launch's ID. The server reads them from the launch,
        so a rerun is a fact its record states, not a client's claim; INVALID_ARGUMENT names each
        field the request sets that the earlier launch's own would replace."""
        launch_id = parse_name(request.rerun_of, "launches", "rerun_of")
        was = await self.launches.get(launch_id)
        plan = f"plans/{was.plan_id}"
        given = {"model_path": bool(request.model_path), "workload": request.workload != launch_pb2.LaunchWorkload(),
                 "dispatcher": bool(request.dispatcher), "engine": request.engine != launch_pb2.EngineSettings(),
                 "policy": bool(request.policy)}
        if named := [field for field, value in given.items() if value]:
            raise ServiceError.invalid([FieldViolation(
                field, f"a rerun runs launches/{launch_id} with its own {field}: leave it empty, or launch its plan "
                       f"with another (`cgsvc-cli launch --plan {plan}`)") for field in named])
        again = launch_pb2.CreateLaunchRequest(
            plan=plan, workload=launch_pb2.LaunchWorkload(**dataclasses.asdict(was.workload)),
            model_path=was.model_path, dispatcher=was.dispatcher, engine=codec.engine_proto(was.engine),
            request_id=request.request_id, wait_for_resources=request.wait_for_resources,
            validate_only=request.validate_only,  # labels name a launch, not what ran: given ones replace A's
            labels=dict(request.labels) if request.labels else labels_of(was.labels))
        return again, launch_id

    def _checked(self, request: launch_pb2.CreateLaunchRequest
                 ) -> tuple[Workload, str, str, dict[str, Any], EngineSettings]:
        """The request's workload, checkpoint path, dispatcher (its one spelling), source (a
        spec as a dict, or {"plan": name}) and engine settings (their one spelling);
        INVALID_ARGUMENT naming every problem, the spec's with the rest, so that one answer lists
        all that a retry must mend."""
        wl = request.workload
        workload = Workload(wl.input_len, wl.output_len, wl.requests, wl.concurrency, wl.seed)
        problems = workload_problems(workload, request.model_path)
        dispatcher, wrong = dispatcher_named(request.dispatcher)
        problems += wrong
        engine, wrong = engine_settings(EngineSettings.read(request.engine))
        problems += wrong + label_problems(request.labels)
        if request.WhichOneof("source") is None:
            problems.append(FieldViolation("source", "give spec (resolved now), plan (plans/ID of a stored plan) or "
                                                     "rerun_of (launches/ID of a launch to run again)"))
        source = (codec.spec_dict_from_proto(request.spec) if request.WhichOneof("source") == "spec"
                  else {"plan": request.plan})
        if problems and "plan" not in source:  # the spec's own problems, without recording a resolution
            try:
                resolve_spec(source, request.policy, "", self.plans.model_roots)
            except ServiceError as err:
                problems += err.violations if err.code == "INVALID_ARGUMENT" else []
        if problems:
            raise ServiceError.invalid(problems)
        return workload, os.path.abspath(request.model_path), dispatcher, source, engine

    async def _plan(self, request: launch_pb2.CreateLaunchRequest, who: Caller, source: dict[str, Any],
                    validate_only: bool = False) -> PlanSource:
        """The plan a CreateLaunch runs: the stored plan it names, or its spec resolved and
        recorded now — stored as a plan, or with validate_only recorded as a check and not stored.
        (The launch carries the idempotency key; the plan it resolves is recorded plainly.)"""
        if request.WhichOneof("source") != "spec":
            return PlanSource.stored(await self.plans.get(parse_name(request.plan, "plans", "plan")))
        recorded = await self.plans.resolve_and_record(source, who, validate_only=validate_only, policy=request.policy)
        resolution = recorded.resolution
        return PlanSource(recorded.plan_id, resolution.plan_json, resolution.audit_fields["spec_json"],
                          recorded.audit_record)

    async def _validate(self, request: launch_pb2.CreateLaunchRequest, who: Caller,
                        rerun_of: str = "") -> launch_pb2.Operation:
        """CreateLaunch with validate_only: every check a launch gets, one record, nothing stored
        or started; the answer describes the launch that would be made (`rerun_of`: the ID of
        the launch it would run again)."""
        workload, model_path, dispatcher, source, engine = self._checked(request)
        ckpt = read_checkpoint(model_path, workload, self.plans.model_roots)
        plan = await self._plan(request, who, source, validate_only=True)
        order = order_for(plan, ckpt, model_path, workload, dispatcher, request.wait_for_resources, engine=engine)
        admitted = await self.launches.admit(order)
        placement = (f"validate_only: {admitted.free} of {admitted.slots} {dispatcher} devices free now; "
                     + (f"would be placed on {', '.join(admitted.devices)}" if admitted.devices
                        else f"would wait in PLACING for {order.tp}"))
        record = await self.launches.audit_order(
            None, order, who, f"validate_only: would launch {order.plan_audit} on {counted(order.tp, dispatcher + ' rank')}; "
                              f"nothing was started ({admitted.free} of {admitted.slots} devices free)"
                              + (f", rerun of launches/{rerun_of}" if rerun_of else ""))
        would = launch_pb2.Launch(
            plan=f"plans/{plan.plan_id}" if plan.plan_id else "", workload=request.workload, model_path=model_path,
            tp=order.tp, dispatcher=dispatcher, tokens_total=workload.requests * workload.output_len,
            prompt_tokens_total=workload.requests * workload.input_len,
            plan_audit_record=plan.audit_record, audit_records=[record], principal=who.principal,
            devices=admitted.devices, placement=placement, engine=codec.engine_proto(engine),
            rerun_of=f"launches/{rerun_of}" if rerun_of else "", labels=request.labels)
        return launch_pb2.Operation(done=True, metadata=would)

    async def _create(self, request: launch_pb2.CreateLaunchRequest, who: Caller, rerun_of: str = "") -> LaunchRow:
        workload, model_path, dispatcher, source, engine = self._checked(request)
        parts = {"source": source, "policy": request.policy, "workload": workload.__dict__, "model_path": model_path,
                 "dispatcher": dispatcher, "wait_for_resources": request.wait_for_resources}
        if engine != DEFAULT_ENGINE:  # the defaults hash as before there were settings: a retry still matches
            parts["engine"] = engine.__dict__
        if rerun_of:  # a rerun is another request than a launch of the same plan asked for in full
            parts["rerun_of"] = rerun_of
        if labels := labels_cell(request.labels):
            parts["labels"] = labels
        digest = request_hash(parts)
        if request.request_id.startswith(EXPERIMENT_RUNS):
            raise ServiceError.invalid([FieldViolation(
                "request_id", f"{request.request_id!r}: ids beginning {EXPERIMENT_RUNS!r} are the service's own (each "
                              "experiment asks for its runs' launches as experiments/ID/runs/N); any other id")])
        if request.request_id:  # a retry of a request that already made a launch: that launch
            earlier = await self._earlier(who, request.request_id, digest)
            if earlier is not None:
                return earlier
        ckpt = read_checkpoint(model_path, workload, self.plans.model_roots)
        order = dataclasses.replace(order_for(await self._plan(request, who, source), ckpt, model_path, workload,
                                              dispatcher, request.wait_for_resources, request.request_id, digest,
                                              engine), rerun_of=rerun_of, labels=labels)
        row, new = await self.launches.create(order, who)
        if not new:  # another call with this request_id got there first (a concurrent retry)
            return self._same_request(row, request.request_id, digest)
        return row

    async def _earlier(self, who: Caller, request_id: str, digest: str) -> LaunchRow | None:
        row = await asyncio.to_thread(self.store.by_request, who.principal, request_id)
        if row is None or (row.launch_id in self.launches.unfinished and row.request_hash == digest):
            return None  # none; or this server's, stored by a try whose record did not commit: create finishes it
        row = self._same_request(row, request_id, digest)
        await self.launches.audit(row, who.principal, CREATE_METHOD, "OK",
                                  f"replay of request_id {request_id!r}: launches/{row.launch_id}", caller=who)
        return row

    @staticmethod
    def _same_request(row: LaunchRow, request_id: str, digest: str) -> LaunchRow:
        if row.request_hash != digest:
            raise ServiceError.invalid([FieldViolation(
                "request_id", f"{request_id!r} already created launches/{row.launch_id} with a different request; "
                              "use a new request_id for a new launch")])
        return row

    async def GetLaunch(self, request: launch_pb2.GetLaunchRequest,  # noqa: N802
                        rc: RequestContext) -> launch_pb2.Launch:
        return await self._proto(await self.launches.get(parse_name(request.name, "launches")))

    async def ListLaunches(self, request: launch_pb2.ListLaunchesRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.ListLaunchesResponse:
        items, token = await list_page(self.store.list_rows, request, codec.launch_proto, self.max_message_bytes,
                                       self.store.token_after)
        return launch_pb2.ListLaunchesResponse(launches=items, next_page_token=token)

    async def CancelLaunch(self, request: launch_pb2.CancelLaunchRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.Launch:
        row = await self.launches.cancel(parse_name(request.name, "launches"), rc.principal.name)
        return await self._proto(row)

    async def UpdateLaunch(self, request: launch_pb2.UpdateLaunchRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.Launch:
        launch_id = parse_name(request.launch.name, "launches", "launch.name")
        change = read_change(request.launch.labels, list(request.update_mask.paths), "launch")
        return await self._proto(await self.launches.relabel(launch_id, change, caller(rc)))

    async def WatchLaunch(self, request: launch_pb2.WatchLaunchRequest,  # noqa: N802
                          rc: RequestContext) -> AsyncIterator[launch_pb2.LaunchEvent]:
        async for kind, row in self.launches.watch(parse_name(request.name, "launches")):
            yield launch_pb2.LaunchEvent(kind=kind, launch=await self._proto(row) if kind == "state"
                                         else codec.launch_proto(row))

    async def ListReplicas(self, request: launch_pb2.ListReplicasRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.ListReplicasResponse:
        seconds = self.launches.lease_seconds
        return launch_pb2.ListReplicasResponse(lease_seconds=seconds, replicas=[launch_pb2.Replica(
            name=f"replicas/{lease.owner}", host=lease.host, start_time=codec.timestamp(lease.started_at),
            seconds_since_renewal=round(lease.age, 3), lapsed=lease.age >= seconds, active_launches=active,
            answering=lease.owner == self.launches.instance, version=lease.version, address=lease.address)
            for lease, active in await self.launches.replicas()])

    async def _logs_elsewhere(self, row: LaunchRow, name: str, logs: Path) -> ServiceError | None:
        """Where a launch's logs are when this machine has none: with the replica that supervises
        it (another one, on a disk this one cannot see), or, for a launch this replica took over
        and settled because its group ran on another machine, on that machine, with the replica
        that holds a lease there now if any (LOGS_ELSEWHERE, naming the replica, host and address
        to ask). None: they are nowhere else (the group never wrote any)."""
        leases = self.launches.leases.leases  # the most recently renewed first
        if row.owner and row.owner != self.launches.instance:
            lease = next((x for x in await asyncio.to_thread(leases) if x.owner == row.owner), None)
            replica, host = f"replicas/{row.owner}", lease.host if lease else ""
            at = f" at {lease.address}" if lease and lease.address else ""
            message = (f"{name}'s logs are kept by {replica}{f' on {host}' if host else ''}, which supervises it, "
                       f"in {logs}: ask that replica{at} (cgsvc-cli replicas list)")
        else:
            host = RunHandle.from_json(row.handle_json).host if row.handle_json else ""
            if not host or host == HOST:
                return None
            lease = next((x for x in await asyncio.to_thread(leases)
                          if x.host == host and x.age < self.launches.lease_seconds), None)
            replica = f"replicas/{lease.owner}" if lease else ""
            ask = (f"ask {replica} there at {lease.address}" if lease and lease.address
                   else "no replica on that machine holds a lease now; they can be read there, on its disk")
            message = f"{name}'s logs are kept on {host}, where its group ran, in {logs}: {ask}"
        return ServiceError("FAILED_PRECONDITION", message, reason="LOGS_ELSEWHERE",
                            info={"replica": replica, "host": host, "address": lease.address if lease else ""})

    async def GetLaunchLogs(self, request: launch_pb2.GetLaunchLogsRequest,  # noqa: N802
                            rc: RequestContext) -> launch_pb2.LaunchLogs:
        row = await self.launches.get(parse_name(request.name, "launches"))
        if not -1 <= request.rank < row.tp:  # an empty answer would read as "this rank wrote nothing"
            raise ServiceError.invalid([FieldViolation("rank", f"{request.name} has ranks 0..{row.tp - 1} (-1: every "
                                                               f"rank and the supervisor), got {request.rank}")])
        if request.tail_lines < 0:
            raise ServiceError.invalid([FieldViolation(
                "tail_lines", f"must be 0 (the whole log) or more, got {request.tail_lines}")])
        for log, offset in request.after_offsets.items():
            if offset < 0:
                raise ServiceError.invalid([FieldViolation(
                    "after_offsets", f"{log}: a byte offset of 0 or more (an earlier answer's end_offset), got {offset}")])
        run = RunDir(Path(row.run_dir))
        logs = run.logs
        if (removed := removed_logs(run)) is not None:  # an empty answer would read as "the ranks wrote nothing"
            days = removed.get("retention_days")  # a marker edited by hand: "?", not a format error
            raise ServiceError("FAILED_PRECONDITION", (
                f"{request.name}'s logs were removed at {removed.get('removed_at', '?')} by the server's "
                f"--launch-retention-days ({f'{days:g}' if isinstance(days, int | float) else '?'} days after its "
                "last change, "
                f"{removed.get('last_change', '?')}; {removed.get('record', '')}): its report, plan and audit records "
                f"are kept (cgsvc-cli launches show {request.name})"), reason="LOGS_REMOVED",
                info={"removed_at": str(removed.get("removed_at", "")), "record": str(removed.get("record", ""))})
        if not logs.exists():  # an empty answer would read as "the ranks wrote nothing"
            elsewhere = await self._logs_elsewhere(row, request.name, logs)
            if elsewhere is not None:
                raise elsewhere
        names = sorted(p.name for p in logs.glob("*.log")) if logs.exists() else []
        if request.rank >= 0:
            names = [n for n in names if n == f"rank{request.rank}.log"]
        ended = row.state in TERMINAL  # read before the logs: an ended launch's logs are whole
        # each log's share of one message (the rest is asked for again from end_offset)
        share = min(LOG_CHUNK_BYTES, room(self.max_message_bytes) // max(1, len(names)))

        def read() -> list[launch_pb2.RankLog]:
            out = []
            for n in names:
                text, end, size = read_log(logs / n, request.tail_lines, request.after_offsets.get(n), ended, share)
                out.append(launch_pb2.RankLog(name=n, text=text, end_offset=end, size=size))
            return out
        return launch_pb2.LaunchLogs(logs=await asyncio.to_thread(read), state=row.state)
