"""PlanService, AuditService and DiagnosticsService: thin shells over the domain and the store.

They translate between protobuf and the domain (through cgsvc.codec) and nothing more: every
ResolvePlan — accepted, refused, malformed or denied — is resolved and recorded by
cgsvc.domain.plans, committed before the answer leaves.
"""

from __future__ import annotations

import asyncio
import functools
import json
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from google.protobuf import timestamp_pb2
from google.protobuf.message import Message

from cgsvc import __version__, codec
from cgsvc.audit import checkpoint, filters
from cgsvc.audit.auditor import Auditor
from cgsvc.audit.store import AuditStore, PageTokenError, TreeSizeError, page_token_after, utc_now
from cgsvc.domain.impact import policy_impact
from cgsvc.domain.plans import RESOLVE_METHOD, Caller, Plans, Resolution
from cgsvc.errors import ServiceError, clip
from cgsvc.ids import parse_name
from cgsvc.resolve import DEFAULT_POLICY
from cgsvc.resolve.policies import POLICIES
from cgsvc.server import metrics, signing
from cgsvc.server.interceptors import RequestContext
from cgsvc.server.status import invalid
from cgsvc.v1 import audit_pb2, diagnostics_pb2, launch_pb2, plan_pb2, plan_service_pb2

# Methods whose every call is audited, malformed ones included.
AUDITED_METHODS = {RESOLVE_METHOD, "/cgsvc.v1.LaunchService/CreateLaunch", "/cgsvc.v1.LaunchService/CancelLaunch",
                   "/cgsvc.v1.LaunchService/UpdateLaunch", "/cgsvc.v1.ExperimentService/CreateExperiment",
                   "/cgsvc.v1.ExperimentService/CancelExperiment", "/cgsvc.v1.ExperimentService/UpdateExperiment"}


def caller(rc: RequestContext) -> Caller:
    return Caller(rc.principal.name, rc.peer, rc.request_id, rc.trace_id)


def record_sequence(name: str) -> int:
    """N of "auditRecords/N": a sequence number from 1 to 2**63 - 1 (the store's integer)."""
    raw = parse_name(name, "auditRecords")
    # ASCII digits only: str.isdigit() also takes "²", which int() refuses (an INTERNAL error)
    if not (raw.isascii() and raw.isdigit()) or len(raw) > 19 or not 1 <= int(raw) < 1 << 63:
        raise invalid("name", f"the ID of auditRecords/ID is a sequence number from 1 to 2^63-1, got {clip(raw, 40)!r}")
    return int(raw)


MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's own default for the largest message; the server passes its setting


def room(max_message_bytes: int) -> int:
    """What of one message an answer's items may fill: the rest is for its other fields."""
    return max_message_bytes * 3 // 4


def how_many_fit(items: Sequence[Message], space: int) -> int:
    """How many of `items`, from the first, fit in `space` bytes as a repeated field (at least one,
    so that an answer always makes progress)."""
    for i, item in enumerate(items):
        space -= item.ByteSize() + 8  # the field's tag and the item's length
        if space < 0:
            return max(i, 1)
    return len(items)


def _token_after(row: Any, filter_text: str, order_by: str) -> str:
    return page_token_after(int(row.sequence), filter_text, order_by)


async def list_page(lister: Callable[[str, int, str, str], tuple[list[Any], str]], request: Any,
                    to_proto: Callable[[Any], Message], max_bytes: int,
                    token_after: Callable[[Any, str, str], str] = _token_after) -> tuple[list[Any], str]:
    """Run a store listing for a List request, as messages: bad filters, orders and page tokens
    name their field, and a page that would not fit in one message of `max_bytes` (the server's
    max_message_bytes) is cut short, its token going on after the last item kept (AIP-158 lets a
    page hold fewer than page_size). Items carry their plans and reports, so 1,000 of them could
    not be sent, and `--all` asks for pages of 1,000. `token_after(row, filter, order_by)`: the
    token going on after a row kept (the listing's own, where its order is not when made)."""
    try:
        rows, token = await asyncio.to_thread(lister, request.filter, request.page_size, request.page_token,
                                              request.order_by)
    except filters.FilterError as exc:
        raise invalid("filter", str(exc)) from None
    except filters.OrderError as exc:
        raise invalid("order_by", str(exc)) from None
    except PageTokenError as exc:
        raise invalid(exc.field, exc.message) from None
    items = [to_proto(row) for row in rows]
    if (kept := how_many_fit(items, room(max_bytes))) < len(items):
        return items[:kept], token_after(rows[kept - 1], request.filter, request.order_by)
    return items, token


def rejection_auditor(auditor: Auditor) -> Callable[..., Any]:
    """The pipeline's hook for outcomes no service recorded: every denial (of any method), and
    for the audited methods a malformed call, an internal failure or a cancelled call — with the
    spec when the request carries one."""

    async def rejected(method: str, principal: str, peer: str, request: Any, code: str, message: str) -> None:
        if code not in ("UNAUTHENTICATED", "PERMISSION_DENIED") and method not in AUDITED_METHODS:
            return
        spec = codec.spec_dict_from_proto(request.spec) \
            if isinstance(request, plan_service_pb2.ResolvePlanRequest | launch_pb2.CreateLaunchRequest) \
            and request.HasField("spec") else None
        request_id = getattr(request, "request_id", "") if request is not None else ""
        policy = (getattr(request, "policy", "") if request is not None else "") or DEFAULT_POLICY
        await auditor.append(auditor.entry(method, principal, peer, request_id, "", spec, code, message,
                                           policy=policy.strip().lower()))
    return rejected


class PlanService:
    def __init__(self, plans: Plans, max_message_bytes: int = MESSAGE_BYTES) -> None:
        self.plans = plans
        self.max_message_bytes = max_message_bytes
        # A resolution's answer but for its per-request fields: the plan and the spec as recorded
        # (closed sets in their one spelling), encoded once. Keyed by the resolution itself,
        # which the resolution memo keeps alive; a resolution that is not memoised (a model.path
        # spec) leaves with its request.
        self._answers: weakref.WeakKeyDictionary[Resolution, bytes] = weakref.WeakKeyDictionary()
        self._counters: dict[tuple[str, str], Any] = {}  # (prefill, decode backend) -> PLANS_TOTAL's child
        self._last_time: tuple[str, timestamp_pb2.Timestamp] = ("", timestamp_pb2.Timestamp())

    def _answer(self, resolution: Resolution) -> bytes:
        raw = self._answers.get(resolution)
        if raw is None:
            msg = codec.plan_to_proto(resolution.plan)
            msg.spec.CopyFrom(codec.spec_proto_from_canonical(resolution.spec))
            raw = self._answers[resolution] = msg.SerializeToString()
        return raw

    def _timestamp(self, text: str) -> timestamp_pb2.Timestamp:
        """codec.timestamp, remembering the last: the records of one commit share their time."""
        if self._last_time[0] != text:
            self._last_time = (text, codec.timestamp(text))
        return self._last_time[1]

    async def ResolvePlan(self, request: plan_service_pb2.ResolvePlanRequest,  # noqa: N802 - gRPC name
                          rc: RequestContext) -> plan_pb2.Plan | bytes:
        """The plan, as a message or (the common case) already encoded: the resolution's cached
        encoding followed by this request's fields, which a protobuf parser merges into one
        message (the pipeline sends bytes as they are)."""
        spec_key = codec.spec_json_from_proto(request.spec)
        rec = await self.plans.resolve_and_record(json.loads(spec_key), caller(rc), request.validate_only,
                                                  request.request_id, policy=request.policy, spec_key=spec_key)
        plan = rec.resolution.plan
        key = (plan.prefill_backend, plan.decode_backend)
        if (counter := self._counters.get(key)) is None:
            counter = self._counters[key] = metrics.PLANS_TOTAL.labels(*key)
        counter.inc()
        if rec.replay is not None:
            return codec.stored_plan_proto(rec.replay)
        tail = plan_pb2.Plan(audit_record=rec.audit_record)
        if rec.plan_id:
            tail.name = f"plans/{rec.plan_id}"
            tail.create_time.CopyFrom(self._timestamp(rec.time))
        return self._answer(rec.resolution) + tail.SerializeToString()

    async def GetPlan(self, request: plan_service_pb2.GetPlanRequest,  # noqa: N802
                      rc: RequestContext) -> plan_pb2.Plan:
        return codec.stored_plan_proto(await self.plans.get(parse_name(request.name, "plans")))

    async def ListPlans(self, request: plan_service_pb2.ListPlansRequest,  # noqa: N802
                        rc: RequestContext) -> plan_service_pb2.ListPlansResponse:
        items, token = await list_page(self.plans.store.list_plans, request, codec.stored_plan_proto,
                                       self.max_message_bytes)
        return plan_service_pb2.ListPlansResponse(plans=items, next_page_token=token)


    async def ListPolicies(self, request: plan_service_pb2.ListPoliciesRequest,  # noqa: N802
                           rc: RequestContext) -> plan_service_pb2.ListPoliciesResponse:
        return plan_service_pb2.ListPoliciesResponse(policies=[codec.policy_info(p) for p in POLICIES.values()])

    async def ListModels(self, request: plan_service_pb2.ListModelsRequest,  # noqa: N802
                         rc: RequestContext) -> plan_service_pb2.ListModelsResponse:
        return plan_service_pb2.ListModelsResponse(models=codec.model_infos())

    async def ComputePolicyImpact(self, request: plan_service_pb2.ComputePolicyImpactRequest,  # noqa: N802
                                  rc: RequestContext) -> plan_service_pb2.PolicyImpact:
        try:
            impact = await asyncio.to_thread(policy_impact, self.plans.store, request.candidate,
                                             request.baseline or DEFAULT_POLICY, request.filter, None,
                                             self.plans.model_roots)
        except filters.FilterError as exc:
            raise invalid("filter", str(exc)) from None
        return fit_impact(codec.impact_proto(impact), room(self.max_message_bytes))


def fit_impact(msg: plan_service_pb2.PolicyImpact, budget: int) -> plan_service_pb2.PolicyImpact:
    """The impact with its lists of specs cut to what fits in `budget` bytes (the totals and the
    changes by field stay whole): the refusals first, since each is one spec's story, then the
    changed specs, each list in the order the history first held its specs."""
    if msg.ByteSize() <= budget:
        return msg
    names = ("newly_refused", "newly_accepted", "changed")
    kept: dict[str, list[Any]] = {name: list(getattr(msg, name)) for name in names}
    for name in names:
        msg.ClearField(name)
    for name in names:
        space = budget - msg.ByteSize()
        fit = how_many_fit(kept[name], space) if space > 0 else 0
        getattr(msg, name).extend(kept[name][:fit])
        if fit < len(kept[name]):
            break
    return msg


class AuditService:
    def __init__(self, store: AuditStore, signing_key: Ed25519PrivateKey, key_id: str,
                 max_message_bytes: int = MESSAGE_BYTES) -> None:
        self.store = store
        self.max_message_bytes = max_message_bytes
        self.key = signing_key
        self.key_id = key_id

    async def GetAuditRecord(self, request: audit_pb2.GetAuditRecordRequest,  # noqa: N802
                             rc: RequestContext) -> audit_pb2.AuditRecord:
        rec = await asyncio.to_thread(self.store.get_record, record_sequence(request.name))
        if rec is None:
            size, _ = await asyncio.to_thread(self.store.tree_head)
            ends = f"the log ends at auditRecords/{size}" if size else "the log is empty"
            raise ServiceError("NOT_FOUND", f"{request.name} does not exist: {ends}")
        return codec.record_proto(rec)

    async def ListAuditRecords(self, request: audit_pb2.ListAuditRecordsRequest,  # noqa: N802
                               rc: RequestContext) -> audit_pb2.ListAuditRecordsResponse:
        if request.view not in audit_pb2.AuditRecordView.values():
            raise invalid("view", f"{request.view} is not a view; valid: {', '.join(audit_pb2.AuditRecordView.keys())}")
        basic = request.view == audit_pb2.AUDIT_RECORD_VIEW_BASIC  # AIP-157: UNSPECIFIED is FULL
        items, token = await list_page(functools.partial(self.store.list_records, plans=not basic), request,
                                       functools.partial(codec.record_proto, basic=basic), self.max_message_bytes)
        return audit_pb2.ListAuditRecordsResponse(records=items, next_page_token=token)

    async def VerifyAuditLog(self, request: audit_pb2.VerifyAuditLogRequest,  # noqa: N802
                             rc: RequestContext) -> audit_pb2.VerifyAuditLogResponse:
        v = await asyncio.to_thread(self.store.verify)
        return audit_pb2.VerifyAuditLogResponse(ok=v.ok, records_checked=v.records_checked,
                                                first_bad_sequence=v.first_bad_sequence, reason=v.reason,
                                                head_hash=v.head_hash)


    async def GetCheckpoint(self, request: audit_pb2.GetCheckpointRequest,  # noqa: N802
                            rc: RequestContext) -> audit_pb2.Checkpoint:
        if why := await asyncio.to_thread(signing.still_ours, self.store, self.key_id):
            raise ServiceError("FAILED_PRECONDITION", why)  # another replica rotated the log's key
        size, root = await asyncio.to_thread(self.store.tree_head)
        return audit_pb2.Checkpoint(**checkpoint.sign(self.key, size, root, utc_now()).to_dict())

    async def GetInclusionProof(self, request: audit_pb2.GetInclusionProofRequest,  # noqa: N802
                                rc: RequestContext) -> audit_pb2.InclusionProof:
        sequence = record_sequence(request.name)
        if request.tree_size < 0:
            raise invalid("tree_size", "must be 0 (the current tree) or a checkpoint's tree_size")
        try:
            size, path, rec = await asyncio.to_thread(self.store.inclusion_proof, sequence, request.tree_size)
        except TreeSizeError as exc:
            raise ServiceError("NOT_FOUND", str(exc)) from None
        return audit_pb2.InclusionProof(leaf_index=sequence - 1, tree_size=size, hashes=[h.hex() for h in path],
                                        record=codec.record_proto(rec))

    async def GetConsistencyProof(self, request: audit_pb2.GetConsistencyProofRequest,  # noqa: N802
                                  rc: RequestContext) -> audit_pb2.ConsistencyProof:
        if request.first_size < 1 or request.second_size < 0:
            raise invalid("first_size", "must be at least 1 (second_size: 0 for the current tree)")
        try:
            size, path = await asyncio.to_thread(self.store.consistency_proof, request.first_size,
                                                 request.second_size)
        except TreeSizeError as exc:
            raise ServiceError("OUT_OF_RANGE", str(exc)) from None
        return audit_pb2.ConsistencyProof(first_size=request.first_size, second_size=size,
                                          hashes=[h.hex() for h in path])


@dataclass(frozen=True)
class ServerFacts:
    """What GetServerInfo says of this server, fixed at start (a new signing key needs a restart).
    `methods` are the cgsvc.v1 RPCs as "/package.Service/Method"."""

    replica: str
    host: str
    store: str
    dispatchers: tuple[str, ...]
    log_key_id: str
    methods: tuple[str, ...]
    start_time: str = field(default_factory=utc_now)


class DiagnosticsService:
    def __init__(self, facts: ServerFacts) -> None:
        self.facts = facts

    async def Echo(self, request: diagnostics_pb2.EchoRequest,  # noqa: N802
                   rc: RequestContext) -> diagnostics_pb2.EchoResponse:
        return diagnostics_pb2.EchoResponse(payload=request.payload)

    async def GetServerInfo(self, request: diagnostics_pb2.GetServerInfoRequest,  # noqa: N802
                            rc: RequestContext) -> diagnostics_pb2.ServerInfo:
        facts, who = self.facts, rc.principal
        loop = type(asyncio.get_running_loop()).__module__.split(".")[0]
        return diagnostics_pb2.ServerInfo(
            version=__version__, replica=facts.replica, host=facts.host, store=facts.store, event_loop=loop,
            dispatchers=facts.dispatchers, log_key_id=facts.log_key_id,
            start_time=facts.start_time,
            caller=diagnostics_pb2.Caller(
                principal=who.name, roles=who.roles, credential=who.credential,
                token_expires=who.expiry() if who.credential == "bearer token" else "",
                may_call=[m.lstrip("/").removeprefix("cgsvc.v1.") for m in facts.methods if who.may_call(m)]))
