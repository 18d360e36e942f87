"""Every outcome of an audited method is one audit record, committed before any answer: here
the two no service can record itself — a fault inside the handler (INTERNAL) and a caller
that goes away (CANCELLED) — through the real request pipeline, gRPC and store, with a
ResolvePlan handler that fails on purpose."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore
from cgsvc.audit.writer import AuditWriter
from cgsvc.server.auth import Authenticator
from cgsvc.server.interceptors import Pipeline
from cgsvc.server.services import rejection_auditor
from cgsvc.v1 import plan_pb2, plan_service_pb2, plan_service_pb2_grpc


class FaultyPlans:
    """ResolvePlan fails inside for model "boom" and never answers for model "slow"."""

    async def ResolvePlan(self, request: Any, rc: Any) -> plan_pb2.Plan:  # noqa: N802
        if request.spec.model.name == "boom":
            raise RuntimeError("a bug")
        await asyncio.sleep(30)
        return plan_pb2.Plan()

    async def GetPlan(self, request: Any, rc: Any) -> plan_pb2.Plan:  # noqa: N802
        return plan_pb2.Plan()

    async def ListPlans(self, request: Any, rc: Any) -> Any:  # noqa: N802
        return plan_service_pb2.ListPlansResponse()

    async def ListPolicies(self, request: Any, rc: Any) -> Any:  # noqa: N802
        return plan_service_pb2.ListPoliciesResponse()

    async def ListModels(self, request: Any, rc: Any) -> Any:  # noqa: N802
        return plan_service_pb2.ListModelsResponse()

    async def ComputePolicyImpact(self, request: Any, rc: Any) -> Any:  # noqa: N802
        return plan_service_pb2.PolicyImpact()


@dataclass
class Served:
    """FaultyPlans behind the real request pipeline, gRPC server, audit writer and store."""

    store: AuditStore
    writer: AuditWriter
    pipeline: Pipeline
    server: grpc.aio.Server
    port: int


async def serve(tmp_path: Path) -> Served:
    store = AuditStore(f"sqlite:///{tmp_path / 'db.sqlite'}")
    writer = AuditWriter(store)
    pipeline = Pipeline(Authenticator(), on_rejected=rejection_auditor(Auditor(store, writer)))
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([pipeline.service_handler(
        plan_service_pb2.DESCRIPTOR.services_by_name["PlanService"], FaultyPlans())])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return Served(store, writer, pipeline, server, port)


async def scenario(tmp_path: Path) -> list[Any]:
    served = await serve(tmp_path)
    store, writer, server, port = served.store, served.writer, served.server, served.port
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = plan_service_pb2_grpc.PlanServiceStub(channel)
            codes = []
            for name, timeout in (("boom", 10.0), ("slow", 0.3)):
                req = plan_service_pb2.ResolvePlanRequest(request_id=f"req-{name}")
                req.spec.model.name = name
                try:
                    await stub.ResolvePlan(req, timeout=timeout)
                except grpc.aio.AioRpcError as err:
                    codes.append(err.code())
            assert codes == [grpc.StatusCode.INTERNAL, grpc.StatusCode.DEADLINE_EXCEEDED], codes
        for _ in range(100):  # the cancelled handler's record lands as the server notices the caller left
            records, _ = store.list_records()
            if len(records) == 2:
                return records
            await asyncio.sleep(0.05)
        return store.list_records()[0]
    finally:
        await server.stop(0)
        writer.close()
        store.close()


def test_internal_faults_and_cancelled_calls_are_audited_once(tmp_path: Path) -> None:
    records = asyncio.run(scenario(tmp_path))
    assert [(r.request_id, r.outcome_code) for r in records] == [("req-boom", 13), ("req-slow", 1)]
    assert records[0].outcome_message == "internal error: RuntimeError" and '"boom"' in records[0].spec_json
    assert "cancelled the call or its deadline passed" in records[1].outcome_message
    assert all(r.method == "/cgsvc.v1.PlanService/ResolvePlan" for r in records)


async def shutdown_scenario(tmp_path: Path) -> list[Any]:
    """A call in flight when the server stops (as `Running.stop` does it: the pipeline told first,
    then the gRPC server stopped with a grace shorter than the call)."""
    served = await serve(tmp_path)
    store, writer, pipeline, server, port = served.store, served.writer, served.pipeline, served.server, served.port
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            req = plan_service_pb2.ResolvePlanRequest(request_id="req-in-flight")
            req.spec.model.name = "slow"
            call = asyncio.ensure_future(plan_service_pb2_grpc.PlanServiceStub(channel).ResolvePlan(req, timeout=20))
            await asyncio.sleep(0.5)  # in the handler
            pipeline.shutting_down()
            await server.stop(0.2)
            assert await pipeline.drained(5.0)  # the cut call has appended its record
            writer.close()  # as Running.stop closes it next: the record is in already, no waiting
            with contextlib.suppress(grpc.aio.AioRpcError):  # CANCELLED, or UNAVAILABLE as the server goes
                await call
        return store.list_records()[0]
    finally:
        writer.close()
        store.close()


def test_a_call_cut_by_the_servers_shutdown_is_audited_as_that_not_as_the_callers_doing(tmp_path: Path) -> None:
    """The record of a call the server cut short at shutdown said "the caller cancelled the call or
    its deadline passed": a permanent record naming the wrong party."""
    (record,) = asyncio.run(shutdown_scenario(tmp_path))
    assert (record.request_id, record.outcome_code) == ("req-in-flight", 1)
    assert record.outcome_message == "the server shut down before answering", record.outcome_message
