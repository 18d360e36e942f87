"""A typed Python client for cgsvc.

    with Client("127.0.0.1:50051", token="...") as c:
        plan = c.resolve({"model": {"name": "nvidia/Kimi-K2.6-NVFP4"}, "hardware": {"gpu": "GB300"}})

Deadlines on every call; retries of UNAVAILABLE through gRPC's service config for calls that
are idempotent (ResolvePlan is made idempotent by the request_id the client always sends);
TLS, mutual TLS and bearer tokens. Server refusals surface as `ServiceError` with the same
code, message, field violations and rule id as an in-process resolution.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import field_mask_pb2
from grpc_status import rpc_status

from cgsvc import codec, tls
from cgsvc.errors import CODE_NUMBERS, FieldViolation, ServiceError
from cgsvc.plan import Plan
from cgsvc.server.addresses import target_is_local
from cgsvc.server.status import from_status
from cgsvc.v1 import (
    audit_pb2,
    audit_pb2_grpc,
    diagnostics_pb2,
    diagnostics_pb2_grpc,
    experiment_pb2,
    experiment_pb2_grpc,
    launch_pb2,
    launch_pb2_grpc,
    plan_pb2,
    plan_service_pb2,
    plan_service_pb2_grpc,
)

SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "cgsvc.v1.PlanService"}, {"service": "cgsvc.v1.AuditService"},
             {"service": "cgsvc.v1.DiagnosticsService"},
             {"service": "cgsvc.v1.LaunchService", "method": "GetLaunch"},
             {"service": "cgsvc.v1.LaunchService", "method": "ListLaunches"},
             {"service": "cgsvc.v1.LaunchService", "method": "ListReplicas"},
             {"service": "cgsvc.v1.LaunchService", "method": "CreateLaunch"},
             {"service": "cgsvc.v1.ExperimentService", "method": "CreateExperiment"},  # idempotent by request_id
             {"service": "cgsvc.v1.ExperimentService", "method": "GetExperiment"},
             {"service": "cgsvc.v1.ExperimentService", "method": "ListExperiments"}],
    "retryPolicy": {"maxAttempts": 4, "initialBackoff": "0.1s", "maxBackoff": "1s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
}]})

T = TypeVar("T")

# A watch (WatchLaunch, WatchExperiment) outlives a server restart: how long it waits for a server
# that answers nothing before it gives up, and what it tells its caller each time it opens again.
RESUME_SECONDS = 300.0
OnResume = Callable[[ServiceError | None, float], None]
LAUNCH_ENDED = ("SUCCEEDED", "FAILED", "CANCELLED", "LOST")


M = TypeVar("M")


def _message(cls: Callable[..., M], prefix: str = "", **fields: Any) -> M:
    """cls(**fields), a request or a part of one. A value protobuf cannot carry (a number past
    its field's range, a string for a number, a field the message does not have) raises its own
    ValueError or TypeError, naming no field; here it is INVALID_ARGUMENT on the field
    (`prefix` + its name, as the server names it), before anything is sent."""
    try:
        return cls(**fields)
    except (ValueError, TypeError) as exc:
        for name, value in fields.items():
            try:
                cls(**{name: value})
            except (ValueError, TypeError) as alone:
                raise ServiceError.invalid([FieldViolation(prefix + name, f"cannot be sent: {alone}")]) from None
        whole = prefix.rstrip(".") or "request"
        raise ServiceError.invalid([FieldViolation(whole, f"cannot be sent: {exc}")]) from None


def _tls_files(ca: str | None, cert: str | None, key: str | None) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(root CA, client key, client certificate) read and checked, or INVALID_ARGUMENT naming the flag."""
    try:
        ca_pem = tls.read_certificates(ca, "tls_ca") if ca else None
        if bool(cert) != bool(key):
            raise tls.TlsFileError("tls_key" if cert else "tls_cert", "a client certificate needs both --tls-cert "
                                                                      "and --tls-key")
        cert_pem, key_pem = tls.read_pair(cert, key) if cert and key else (None, None)
    except tls.TlsFileError as exc:
        raise ServiceError.invalid([FieldViolation(exc.name, exc.message)]) from None
    return ca_pem, key_pem, cert_pem


def error_from_rpc(err: grpc.RpcError) -> ServiceError:
    """The ServiceError a failed call carries (rich details decoded where present)."""
    code = err.code().name if hasattr(err, "code") else "UNKNOWN"  # type: ignore[attr-defined]
    details = err.details() if hasattr(err, "details") else str(err)  # type: ignore[attr-defined]
    try:
        st = rpc_status.from_call(err)  # type: ignore[arg-type]
    except ValueError:
        st = None
    return from_status(st, code if code in CODE_NUMBERS else "UNKNOWN", details or code)


def _every(list_call: Callable[..., Any], field: str, filter: str, page_size: int, **kw: Any) -> Iterator[Any]:
    """The items of every page a List call answers, following next_page_token to the last; a page
    is asked for only when the one before has been read."""
    token = ""
    while True:
        page = list_call(filter, page_size, token, **kw)
        yield from getattr(page, field)
        if not (token := page.next_page_token):
            return


def label_mask(set_labels: dict[str, str], remove: Sequence[str]) -> field_mask_pb2.FieldMask:
    """The update_mask that sets these labels and removes those: labels.KEY for each."""
    return field_mask_pb2.FieldMask(paths=[f"labels.{key}" for key in [*set_labels, *remove]])


class Client:
    def __init__(self, target: str, token: str | None = None, tls_ca: str | None = None,
                 tls_cert: str | None = None, tls_key: str | None = None, timeout: float = 10.0,
                 server_name: str | None = None) -> None:
        self.timeout = timeout
        self.token = token if token is not None else os.environ.get("CGSVC_TOKEN") or None
        if self.token and not (tls_ca or tls_cert) and not target_is_local(target):
            # the server refuses to take tokens in plaintext beyond loopback; so does its client, before the
            # token leaves (to a wrong address, a proxy, or someone else's server)
            raise ServiceError.invalid([FieldViolation("token", (
                f"a bearer token is sent to {target} only over TLS (its address is not loopback): pass --tls-ca "
                "(and --tls-cert/--tls-key for client certificates), or reach the server on a loopback address"))])
        options: list[tuple[str, Any]] = [("grpc.service_config", SERVICE_CONFIG), ("grpc.enable_retries", 1)]
        if server_name:
            options.append(("grpc.ssl_target_name_override", server_name))
        if tls_ca or tls_cert:
            creds = grpc.ssl_channel_credentials(*_tls_files(tls_ca, tls_cert, tls_key))
            self.channel = grpc.secure_channel(target, creds, options=options)
        else:
            self.channel = grpc.insecure_channel(target, options=options)
        self.plans = plan_service_pb2_grpc.PlanServiceStub(self.channel)
        self.audit = audit_pb2_grpc.AuditServiceStub(self.channel)
        self.diagnostics = diagnostics_pb2_grpc.DiagnosticsServiceStub(self.channel)
        self.launches = launch_pb2_grpc.LaunchServiceStub(self.channel)
        self.experiments = experiment_pb2_grpc.ExperimentServiceStub(self.channel)

    @classmethod
    def from_args(cls, ns: argparse.Namespace) -> Client:
        return cls(ns.server, token=ns.token, tls_ca=ns.tls_ca, tls_cert=ns.tls_cert, tls_key=ns.tls_key,
                   timeout=ns.timeout)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.channel.close()

    def metadata(self) -> list[tuple[str, str]]:
        return [("authorization", f"Bearer {self.token}")] if self.token else []

    def call(self, method: Any, request: Any, timeout: float | None = None) -> Any:
        try:
            return method(request, timeout=timeout or self.timeout, metadata=self.metadata())
        except grpc.RpcError as err:
            raise error_from_rpc(err) from None

    # ------------------------------------------------------------------ plans
    def resolve_proto(self, spec: dict[str, Any], validate_only: bool = False,
                      request_id: str | None = None, policy: str = "") -> plan_pb2.Plan:
        req = plan_service_pb2.ResolvePlanRequest(spec=codec.spec_proto_from_dict(spec), validate_only=validate_only,
                                                  request_id=request_id or uuid.uuid4().hex, policy=policy)
        return self.call(self.plans.ResolvePlan, req)  # type: ignore[no-any-return]

    def resolve(self, spec: dict[str, Any], validate_only: bool = False, request_id: str | None = None,
                policy: str = "") -> Plan:
        """The domain plan (its modes, sizes and decisions), without the resource fields: a program
        that launches the plan or finds it again needs its name, and calls resolve_proto."""
        return codec.plan_from_proto(self.resolve_proto(spec, validate_only, request_id, policy))

    def list_policies(self) -> plan_service_pb2.ListPoliciesResponse:
        return self.call(self.plans.ListPolicies, plan_service_pb2.ListPoliciesRequest())  # type: ignore[no-any-return]

    def list_models(self) -> plan_service_pb2.ListModelsResponse:
        return self.call(self.plans.ListModels, plan_service_pb2.ListModelsRequest())  # type: ignore[no-any-return]

    def policy_impact(self, candidate: str, baseline: str = "", filter: str = "") -> dict[str, Any]:
        req = plan_service_pb2.ComputePolicyImpactRequest(candidate=candidate, baseline=baseline, filter=filter)
        return codec.impact_dict(self.call(self.plans.ComputePolicyImpact, req, timeout=max(self.timeout, 600)))

    def get_plan(self, name: str) -> plan_pb2.Plan:
        return self.call(self.plans.GetPlan, plan_service_pb2.GetPlanRequest(name=name))  # type: ignore[no-any-return]

    def list_plans(self, filter: str = "", page_size: int = 0, page_token: str = "",
                   order_by: str = "") -> plan_service_pb2.ListPlansResponse:
        req = _message(plan_service_pb2.ListPlansRequest, filter=filter, page_size=page_size,
                       page_token=page_token, order_by=order_by)
        return self.call(self.plans.ListPlans, req)  # type: ignore[no-any-return]

    def iter_plans(self, filter: str = "", page_size: int = 100, order_by: str = "") -> Iterator[plan_pb2.Plan]:
        """Every plan that matches `filter`, in `order_by`'s order, read a page at a time."""
        return _every(self.list_plans, "plans", filter, page_size, order_by=order_by)

    # ------------------------------------------------------------------ audit
    def get_audit_record(self, name: str) -> audit_pb2.AuditRecord:
        return self.call(self.audit.GetAuditRecord, audit_pb2.GetAuditRecordRequest(name=name))  # type: ignore[no-any-return]

    def list_audit_records(self, filter: str = "", page_size: int = 0, page_token: str = "",
                           order_by: str = "", view: audit_pb2.AuditRecordView = audit_pb2.AUDIT_RECORD_VIEW_UNSPECIFIED,
                           ) -> audit_pb2.ListAuditRecordsResponse:
        """A page of records; `view` AUDIT_RECORD_VIEW_BASIC leaves out each one's plan JSON and hashed
        bytes (what a table or a count never shows)."""
        req = _message(audit_pb2.ListAuditRecordsRequest, filter=filter, page_size=page_size,
                       page_token=page_token, order_by=order_by, view=view)
        return self.call(self.audit.ListAuditRecords, req)  # type: ignore[no-any-return]

    def iter_audit_records(self, filter: str = "", page_size: int = 100, order_by: str = "",
                           view: audit_pb2.AuditRecordView = audit_pb2.AUDIT_RECORD_VIEW_UNSPECIFIED,
                           ) -> Iterator[audit_pb2.AuditRecord]:
        """Every record that matches `filter` (list_audit_records, `view` included), read a page at a time."""
        return _every(self.list_audit_records, "records", filter, page_size, order_by=order_by, view=view)

    def verify_audit_log(self) -> audit_pb2.VerifyAuditLogResponse:
        return self.call(self.audit.VerifyAuditLog, audit_pb2.VerifyAuditLogRequest(),  # type: ignore[no-any-return]
                         timeout=max(self.timeout, 120))

    def get_checkpoint(self) -> audit_pb2.Checkpoint:
        return self.call(self.audit.GetCheckpoint, audit_pb2.GetCheckpointRequest())  # type: ignore[no-any-return]

    def inclusion_proof(self, name: str, tree_size: int = 0) -> audit_pb2.InclusionProof:
        req = _message(audit_pb2.GetInclusionProofRequest, name=name, tree_size=tree_size)
        return self.call(self.audit.GetInclusionProof, req)  # type: ignore[no-any-return]

    def consistency_proof(self, first_size: int, second_size: int = 0) -> audit_pb2.ConsistencyProof:
        req = _message(audit_pb2.GetConsistencyProofRequest, first_size=first_size, second_size=second_size)
        return self.call(self.audit.GetConsistencyProof, req)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ launches
    def create_launch(self, model_path: str, workload: dict[str, int], spec: dict[str, Any] | None = None,
                      plan: str = "", wait_for_resources: bool = False, dispatcher: str = "",
                      request_id: str | None = None, policy: str = "",
                      validate_only: bool = False, engine: dict[str, Any] | None = None,
                      rerun_of: str = "", labels: dict[str, str] | None = None) -> launch_pb2.Operation:
        """`engine`: EngineSettings' fields (dtype, kv_cache_mb, cpu_decode); absent ones default.
        The source is `spec`, else `rerun_of` (launches/ID: that launch again, which the server
        reads; give no model_path, workload, dispatcher or engine with it), else `plan`."""
        req = _message(launch_pb2.CreateLaunchRequest, model_path=model_path,
                       workload=_message(launch_pb2.LaunchWorkload, "workload.", **workload),
                       wait_for_resources=wait_for_resources, dispatcher=dispatcher,
                       request_id=request_id or uuid.uuid4().hex, policy=policy, validate_only=validate_only,
                       engine=_message(launch_pb2.EngineSettings, "engine.", **(engine or {})), labels=labels or {})
        if spec is not None:
            req.spec.CopyFrom(codec.spec_proto_from_dict(spec))
        elif rerun_of:
            req.rerun_of = rerun_of
        else:
            req.plan = plan
        return self.call(self.launches.CreateLaunch, req, timeout=max(self.timeout, 60))  # type: ignore[no-any-return]

    def rerun_launch(self, name: str, request_id: str | None = None, wait_for_resources: bool = False,
                     validate_only: bool = False, labels: dict[str, str] | None = None) -> launch_pb2.Operation:
        """Launch `name` (launches/ID) again as it was asked for: the server reads its stored plan,
        checkpoint, workload, dispatcher and engine settings; the new launch's rerun_of names it.
        It keeps the launch's labels, unless `labels` are given."""
        return self.create_launch("", {}, rerun_of=name, request_id=request_id, wait_for_resources=wait_for_resources,
                                  validate_only=validate_only, labels=labels)

    def get_launch(self, name: str) -> launch_pb2.Launch:
        return self.call(self.launches.GetLaunch, launch_pb2.GetLaunchRequest(name=name))  # type: ignore[no-any-return]

    def list_launches(self, filter: str = "", page_size: int = 0, page_token: str = "",
                      order_by: str = "") -> launch_pb2.ListLaunchesResponse:
        req = _message(launch_pb2.ListLaunchesRequest, filter=filter, page_size=page_size, page_token=page_token,
                       order_by=order_by)
        return self.call(self.launches.ListLaunches, req)  # type: ignore[no-any-return]

    def iter_launches(self, filter: str = "", page_size: int = 100, order_by: str = "") -> Iterator[launch_pb2.Launch]:
        """Every launch that matches `filter`, in `order_by`'s order, read a page at a time."""
        return _every(self.list_launches, "launches", filter, page_size, order_by=order_by)

    def cancel_launch(self, name: str) -> launch_pb2.Launch:
        return self.call(self.launches.CancelLaunch, launch_pb2.CancelLaunchRequest(name=name),  # type: ignore[no-any-return]
                         timeout=max(self.timeout, 60))

    def label_launch(self, name: str, set_labels: dict[str, str], remove: Sequence[str] = ()) -> launch_pb2.Launch:
        """Set some of a launch's labels and remove others (UpdateLaunch with a mask of
        labels.KEY, one per label named), leaving the rest as they are."""
        req = launch_pb2.UpdateLaunchRequest(launch=launch_pb2.Launch(name=name, labels=set_labels),
                                             update_mask=label_mask(set_labels, remove))
        return self.call(self.launches.UpdateLaunch, req)  # type: ignore[no-any-return]

    def watch_launch(self, name: str, timeout: float = 3600, resume_for: float = RESUME_SECONDS,
                     on_resume: OnResume | None = None) -> Iterator[launch_pb2.LaunchEvent]:
        """The launch's state changes and progress until it ends, across a server restart (see
        `followed`): each opening answers its current state first."""
        yield from self.followed(
            lambda: self.launches.WatchLaunch(launch_pb2.WatchLaunchRequest(name=name), timeout=timeout,
                                              metadata=self.metadata()),
            lambda event: event.kind == "state" and event.launch.state in LAUNCH_ENDED, resume_for, on_resume)

    def followed(self, open_stream: Callable[[], Iterator[T]], ended: Callable[[T], bool],
                 resume_for: float = RESUME_SECONDS, on_resume: OnResume | None = None) -> Iterator[T]:
        """A server stream, followed until `ended` says what it watches has ended. A stream cut
        before then, by its own deadline or by the server going away (a restart, a rolling upgrade:
        UNAVAILABLE), is opened again; each opening sends the current state first, so nothing is
        missed. While nothing answers it waits 0.5 s, then longer, up to 5 s, between tries, and
        after `resume_for` seconds of no answer (or of streams closed with nothing in them) it raises
        the last error. `on_resume(error, pause)` is told each time (error None: the server closed
        the stream early)."""
        silent_since: float | None = None
        pause = 0.5
        while True:
            try:
                for message in open_stream():
                    silent_since, pause = None, 0.5
                    yield message
                    if ended(message):
                        return
                err: ServiceError | None = None
            except grpc.RpcError as exc:
                err = error_from_rpc(exc)
                if err.code not in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                    raise err from None
            if err is None or err.code == "UNAVAILABLE":  # no answer, or a stream closed with nothing in it
                silent_since = silent_since if silent_since is not None else time.monotonic()
                if time.monotonic() - silent_since >= resume_for:
                    raise err or ServiceError("UNAVAILABLE", f"the server closed the watch for {resume_for:g} s "
                                                             "without a word, before what it watches had ended")
            wait = 0.0 if err is not None and err.code == "DEADLINE_EXCEEDED" else pause
            if on_resume is not None:
                on_resume(err, wait)
            time.sleep(wait)
            pause = min(pause * 2, 5.0) if wait else pause

    def list_replicas(self) -> launch_pb2.ListReplicasResponse:
        return self.call(self.launches.ListReplicas, launch_pb2.ListReplicasRequest())  # type: ignore[no-any-return]

    def launch_logs(self, name: str, rank: int = -1, tail_lines: int = 0,
                    after_offsets: dict[str, int] | None = None) -> launch_pb2.LaunchLogs:
        req = _message(launch_pb2.GetLaunchLogsRequest, name=name, rank=rank, tail_lines=tail_lines,
                       after_offsets=after_offsets or {})
        return self.call(self.launches.GetLaunchLogs, req)  # type: ignore[no-any-return]

    # ------------------------------------------------------------------ experiments
    def create_experiment(self, plans: list[str], model_path: str, workload: dict[str, int], repeats: int,
                          dispatcher: str = "", engine: dict[str, Any] | None = None,
                          rerun_of: str = "", request_id: str | None = None,
                          labels: dict[str, str] | None = None) -> experiment_pb2.Experiment:
        """`rerun_of` (experiments/ID): that experiment again, which the server reads; give no
        plans, model_path, workload, repeats, dispatcher or engine with it (rerun_experiment).
        `request_id`: the idempotency key (a fresh one per call by default, so that a retried
        call starts one experiment). `labels`: the caller's names for it, which its launches
        carry too."""
        req = _message(experiment_pb2.CreateExperimentRequest, plans=plans, model_path=model_path, repeats=repeats,
                       workload=_message(launch_pb2.LaunchWorkload, "workload.", **workload), dispatcher=dispatcher,
                       engine=_message(launch_pb2.EngineSettings, "engine.", **(engine or {})),
                       rerun_of=rerun_of, request_id=request_id or uuid.uuid4().hex, labels=labels or {})
        return self.call(self.experiments.CreateExperiment, req, timeout=max(self.timeout, 60))  # type: ignore[no-any-return]

    def rerun_experiment(self, name: str, request_id: str | None = None,
                         labels: dict[str, str] | None = None) -> experiment_pb2.Experiment:
        """Run experiment `name` (experiments/ID) again as it was asked for, to see whether its
        result holds: the server reads its request; the new experiment's rerun_of names it. It
        keeps the experiment's labels unless `labels` are given."""
        return self.create_experiment([], "", {}, 0, rerun_of=name, request_id=request_id, labels=labels)

    def get_experiment(self, name: str) -> experiment_pb2.Experiment:
        return self.call(self.experiments.GetExperiment,  # type: ignore[no-any-return]
                         experiment_pb2.GetExperimentRequest(name=name))

    def list_experiments(self, filter: str = "", page_size: int = 0, page_token: str = "",
                         order_by: str = "") -> experiment_pb2.ListExperimentsResponse:
        req = _message(experiment_pb2.ListExperimentsRequest, filter=filter, page_size=page_size,
                       page_token=page_token, order_by=order_by)
        return self.call(self.experiments.ListExperiments, req)  # type: ignore[no-any-return]

    def iter_experiments(self, filter: str = "", page_size: int = 100,
                         order_by: str = "") -> Iterator[experiment_pb2.Experiment]:
        """Every experiment that matches `filter`, in `order_by`'s order, read a page at a time."""
        return _every(self.list_experiments, "experiments", filter, page_size, order_by=order_by)

    def cancel_experiment(self, name: str) -> experiment_pb2.Experiment:
        return self.call(self.experiments.CancelExperiment,  # type: ignore[no-any-return]
                         experiment_pb2.CancelExperimentRequest(name=name))

    def label_experiment(self, name: str, set_labels: dict[str, str],
                         remove: Sequence[str] = ()) -> experiment_pb2.Experiment:
        """label_launch for an experiment (UpdateExperiment); its launches keep their labels."""
        req = experiment_pb2.UpdateExperimentRequest(
            experiment=experiment_pb2.Experiment(name=name, labels=set_labels),
            update_mask=label_mask(set_labels, remove))
        return self.call(self.experiments.UpdateExperiment, req)  # type: ignore[no-any-return]

    def watch_experiment(self, name: str, timeout: float = 24 * 3600, resume_for: float = RESUME_SECONDS,
                         on_resume: OnResume | None = None) -> Iterator[experiment_pb2.Experiment]:
        """The experiment as it changes until it ends, across a server restart (see `followed`)."""
        yield from self.followed(
            lambda: self.experiments.WatchExperiment(experiment_pb2.WatchExperimentRequest(name=name),
                                                     timeout=timeout, metadata=self.metadata()),
            lambda experiment: experiment.state != "RUNNING", resume_for, on_resume)

    def server_info(self) -> diagnostics_pb2.ServerInfo:
        """What the server is, and who it takes this client's credentials for."""
        return self.call(self.diagnostics.GetServerInfo, diagnostics_pb2.GetServerInfoRequest())  # type: ignore[no-any-return]

    def echo(self, payload: bytes = b"") -> bytes:
        return self.call(self.diagnostics.Echo, diagnostics_pb2.EchoRequest(payload=payload)).payload  # type: ignore[no-any-return]
