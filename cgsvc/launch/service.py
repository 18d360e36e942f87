"""LaunchService: CreateLaunch (a long-running operation), Get/List/Cancel/Watch, and logs."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from cgsvc import catalog, codec
from cgsvc.errors import FieldViolation, ResolveError
from cgsvc.launch.dispatch import Workload
from cgsvc.launch.manager import TERMINAL, LaunchManager, tail
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.services import PlanService, list_page, parse_name, timestamp
from cgsvc.server.status import invalid
from cgsvc.v1 import launch_pb2, plan_service_pb2

CREATE_METHOD = "/cgsvc.v1.LaunchService/CreateLaunch"


def report_summary(report: dict[str, Any]) -> launch_pb2.LaunchReport:
    if not report or report.get("status") != "ok":
        return launch_pb2.LaunchReport()
    agg, modes, att = report["aggregate"], report["modes"], report["attention"]
    fidelity = report.get("plan_fidelity", [])
    subs = [f"{f['field']}: {json.dumps(f['requested'])} -> {json.dumps(f['effective'])} ({f['reason']})"
            for f in fidelity if f["status"] == "substituted"]
    return launch_pb2.LaunchReport(
        ttft_ms_p50=agg["ttft_ms"].get("p50", 0), ttft_ms_p99=agg["ttft_ms"].get("p99", 0),
        tpot_ms_p50=agg["tpot_ms"].get("p50", 0), tpot_ms_p99=agg["tpot_ms"].get("p99", 0),
        throughput_tok_s=agg["throughput_tok_s"], output_tokens=agg["output_tokens"],
        prefill_requested=modes["prefill"]["requested"], prefill_effective=modes["prefill"]["effective"],
        decode_requested=modes["decode"]["requested"], decode_effective=modes["decode"]["effective"],
        attention_prefill_effective=att["prefill"]["effective"], attention_decode_effective=att["decode"]["effective"],
        capture_seconds=modes["prefill"]["capture_seconds"] + modes["decode"]["capture_seconds"],
        capture_bytes=modes["prefill"]["capture_bytes"] + modes["decode"]["capture_bytes"],
        kv_bytes_per_token=report["kv_cache"]["bytes_per_token"], substitutions=subs,
        plan_fidelity=[launch_pb2.PlanFidelity(field=f["field"], requested=json.dumps(f["requested"]),
                                               effective=json.dumps(f["effective"]), status=f["status"],
                                               reason=f["reason"]) for f in fidelity])


def launch_proto(row: dict[str, Any], records: list[str] | None = None) -> launch_pb2.Launch:
    wl = json.loads(row["workload_json"])
    report = json.loads(row["report_json"]) if row["report_json"] else {}
    return launch_pb2.Launch(
        name=f"launches/{row['launch_id']}", plan=f"plans/{row['plan_id']}", state=row["state"],
        workload=launch_pb2.LaunchWorkload(**wl), model_path=row["model_path"], tp=row["tp"],
        dispatcher=row["dispatcher"], create_time=timestamp(row["create_time"]),
        update_time=timestamp(row["update_time"]), tokens_done=row["tokens_done"], tokens_total=row["tokens_total"],
        error=row["error"], report=report_summary(report), report_json=row["report_json"],
        audit_records=records or [], principal=row["principal"])


class LaunchService:
    def __init__(self, manager: LaunchManager, plans: PlanService) -> None:
        self.manager, self.plans = manager, plans
        self.store = manager.store

    async def _records(self, launch_id: str) -> list[str]:
        recs, _ = await asyncio.to_thread(self.store.list_records, f'launch_id = "{launch_id}"', 1000)
        return [r.name for r in recs]

    async def _proto(self, row: dict[str, Any]) -> launch_pb2.Launch:
        msg = launch_proto(row, await self._records(row["launch_id"]))
        stored = await asyncio.to_thread(self.store.get_plan, row["plan_id"])
        if stored is not None:
            msg.plan_audit_record = f"auditRecords/{stored.sequence}"
        return msg

    async def CreateLaunch(self, request: launch_pb2.CreateLaunchRequest,  # noqa: N802 - gRPC name
                           rc: RequestContext) -> launch_pb2.Operation:
        try:
            row = await self._create(request, rc)
        except ResolveError as err:
            fields = self.plans.auditor.spec_fields(
                codec.spec_dict_from_proto(request.spec) if request.HasField("spec") else None)
            await self.manager.audit("", "", rc.principal.name, CREATE_METHOD, err.code, err.message, peer=rc.peer,
                                     request_id=rc.request_id, **fields)
            raise
        msg = await self._proto(row)
        return launch_pb2.Operation(name=f"operations/{row['launch_id']}", done=row["state"] in TERMINAL, metadata=msg)

    async def _create(self, request: launch_pb2.CreateLaunchRequest, rc: RequestContext) -> dict[str, Any]:
        wl = request.workload
        problems = [FieldViolation(f"workload.{k}", f"must be at least 1, got {v}") for k, v in
                    (("input_len", wl.input_len), ("output_len", wl.output_len), ("requests", wl.requests)) if v < 1]
        if wl.concurrency < 0:
            problems.append(FieldViolation("workload.concurrency", "must be 0 (all at once) or positive"))
        if not request.model_path:
            problems.append(FieldViolation("model_path", "required: the checkpoint directory the workers load"))
        if request.WhichOneof("source") is None:
            problems.append(FieldViolation("source", "give spec (resolved now) or plan (plans/ID of a stored plan)"))
        if problems:
            raise ResolveError.invalid(problems)
        model_path = os.path.abspath(request.model_path)
        try:
            ckpt = catalog.read_model_dir(model_path)
        except ResolveError as err:
            raise ResolveError.invalid([FieldViolation("model_path", v.description) for v in err.violations]) from None
        max_pos = ckpt.max_position_embeddings or 0
        if max_pos and wl.input_len + wl.output_len > max_pos:
            raise invalid("workload.input_len", f"input_len + output_len = {wl.input_len + wl.output_len} exceeds the "
                                                f"checkpoint's context of {max_pos} tokens")
        if request.WhichOneof("source") == "spec":
            plan_msg = await self.plans.ResolvePlan(plan_service_pb2.ResolvePlanRequest(spec=request.spec), rc)
        else:
            plan_msg = await self.plans.GetPlan(plan_service_pb2.GetPlanRequest(name=request.plan), rc)
        plan_id = plan_msg.name.split("/", 1)[1]
        stored = await asyncio.to_thread(self.store.get_plan, plan_id)
        assert stored is not None
        spec = json.loads(stored.row.spec_json)
        wanted = catalog.facts_for_spec(spec)
        if wanted is not None and wanted.text_architecture != ckpt.text_architecture:
            raise ResolveError("FAILED_PRECONDITION",
                               f"the checkpoint at {model_path} is a {ckpt.text_architecture} model; the plan was "
                               f"resolved for {wanted.name} ({wanted.text_architecture})",
                               [FieldViolation("model_path", "a checkpoint of the plan's model family")])
        tp = int(spec.get("parallelism", {}).get("tp", 1))
        return await self.manager.create(
            plan_id=plan_id, plan_json=stored.row.plan_json, spec_json=stored.row.spec_json,
            plan_audit=f"auditRecords/{stored.sequence}", tp=tp, model_path=model_path,
            workload=Workload(wl.input_len, wl.output_len, wl.requests, wl.concurrency, wl.seed),
            dispatcher=request.dispatcher or "local", wait=request.wait_for_resources,
            principal=rc.principal.name, peer=rc.peer, request_id=request.request_id)

    async def GetLaunch(self, request: launch_pb2.GetLaunchRequest,  # noqa: N802
                        rc: RequestContext) -> launch_pb2.Launch:
        row = await asyncio.to_thread(self.store.get_launch, parse_name(request.name, "launches"))
        if row is None:
            raise ResolveError("NOT_FOUND", f"{request.name} does not exist")
        return await self._proto(row)

    async def ListLaunches(self, request: launch_pb2.ListLaunchesRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.ListLaunchesResponse:
        rows, token = await list_page(self.store.list_launches, request)
        return launch_pb2.ListLaunchesResponse(launches=[launch_proto(r) for r in rows], next_page_token=token)

    async def CancelLaunch(self, request: launch_pb2.CancelLaunchRequest,  # noqa: N802
                           rc: RequestContext) -> launch_pb2.Launch:
        row = await self.manager.cancel(parse_name(request.name, "launches"), rc.principal.name)
        return await self._proto(row)

    async def WatchLaunch(self, request: launch_pb2.WatchLaunchRequest,  # noqa: N802
                          rc: RequestContext) -> AsyncIterator[launch_pb2.LaunchEvent]:
        async for kind, row in self.manager.watch(parse_name(request.name, "launches")):
            yield launch_pb2.LaunchEvent(kind=kind, launch=await self._proto(row) if kind == "state"
                                         else launch_proto(row))

    async def GetLaunchLogs(self, request: launch_pb2.GetLaunchLogsRequest,  # noqa: N802
                            rc: RequestContext) -> launch_pb2.LaunchLogs:
        row = await asyncio.to_thread(self.store.get_launch, parse_name(request.name, "launches"))
        if row is None:
            raise ResolveError("NOT_FOUND", f"{request.name} does not exist")
        logs = Path(row["run_dir"]) / "logs"
        names = sorted(p.name for p in logs.glob("*.log")) if logs.exists() else []
        if request.rank >= 0:
            names = [n for n in names if n == f"rank{request.rank}.log"]
        return launch_pb2.LaunchLogs(logs=[launch_pb2.RankLog(name=n, text=tail(logs / n, request.tail_lines))
                                           for n in names])

