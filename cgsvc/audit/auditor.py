"""The auditor: builds audit entries and appends them through the group-commit writer.

Every service and the launch lifecycle append through it; an append is queued before its caller
can cancel, so a caller that gives up (deadline, disconnect) is still audited.
"""

from __future__ import annotations

import contextvars
from typing import Any

from cgsvc import __version__
from cgsvc.audit.records import AuditEntry, mask_secrets
from cgsvc.audit.store import AppendResult, AuditStore, PendingAppend, PlanListing
from cgsvc.audit.writer import Writer
from cgsvc.errors import CODE_NUMBERS, clip
from cgsvc.plan import canonical_json
from cgsvc.resolve import DEFAULT_POLICY, policy_version
from cgsvc.resolve.policies import POLICIES

# Whether the request being served has already been appended (set by every append made while
# serving it), so that the pipeline audits an outcome the service did not — an internal fault
# or a cancelled call — exactly once.
REQUEST_AUDITED: contextvars.ContextVar[bool] = contextvars.ContextVar("cgsvc_request_audited", default=False)


# The longest model or GPU a record's indexed columns hold (characters; at most 2 KB of UTF-8,
# under PostgreSQL's B-tree limit of about 2.7 KB a key). A caller's longer value — a refused
# spec can carry anything — is cut, saying so; the record's spec_json keeps all of it.
MAX_INDEXED = 512


class Auditor:
    """Builds audit entries for requests and appends them through the group-commit writer."""

    def __init__(self, store: AuditStore, writer: Writer) -> None:
        self.store = store
        self.writer = writer

    async def append(self, entry: AuditEntry, plan: PlanListing | None = None, request_id: str = "") -> AppendResult:
        # A caller that cancels (deadline, disconnect) cancels only its wait: the record is
        # queued already, and both writers append it and skip a cancelled future.
        REQUEST_AUDITED.set(True)
        return await self.writer.submit_async(PendingAppend(entry, plan, request_id))

    @staticmethod
    def spec_fields(spec_dict: dict[str, Any] | None) -> dict[str, Any]:
        """Audit fields of a spec (JSON form): its masked canonical JSON, model and GPU."""
        if spec_dict is None:
            return {}
        spec = mask_secrets(spec_dict)
        model = spec.get("model", {})
        return {"spec_json": canonical_json(spec),
                "model": clip(str(model.get("name") or model.get("path") or ""), MAX_INDEXED),
                "gpu": clip(str(spec.get("hardware", {}).get("gpu", "")), MAX_INDEXED)}

    def entry(self, method: str, principal: str, peer: str, request_id: str, trace_id: str,
              spec_dict: dict[str, Any] | None, code: str, message: str, policy: str = DEFAULT_POLICY,
              **extra: Any) -> AuditEntry:
        """An entry under `policy` (a known policy's name; an unknown one is recorded as asked,
        with no version)."""
        version = policy_version(policy) if policy in POLICIES else ""
        return AuditEntry(principal=principal, peer=peer, method=method, request_id=request_id,
                          trace_id=trace_id, policy=policy, policy_version=version, service_version=__version__,
                          outcome_code=CODE_NUMBERS[code], outcome_message=message,
                          **self.spec_fields(spec_dict), **extra)
