"""ServiceError <-> google.rpc.Status with BadRequest and ErrorInfo details (AIP-193)."""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from cgsvc.errors import CODE_NUMBERS, FieldViolation, ServiceError, clip

DOMAIN = "cgsvc.v1"


# What an error may put on the wire. A status travels in HTTP/2 trailers, which gRPC clients
# cap (8 KiB soft, 16 KiB hard by default): an answer that echoed a caller's 5,000-character value
# reached the client as RESOURCE_EXHAUSTED instead of the refusal. Longer text is cut, saying so;
# the audit record keeps the whole message.
MAX_MESSAGE = 300
MAX_DESCRIPTION = 200
MAX_VIOLATION_BYTES = 3000


def to_status(err: ServiceError) -> grpc.Status:
    st = status_pb2.Status(code=CODE_NUMBERS[err.code], message=clip(err.message, MAX_MESSAGE))
    if err.violations:
        shown: list[error_details_pb2.BadRequest.FieldViolation] = []
        size = 0
        for v in err.violations:
            fv = error_details_pb2.BadRequest.FieldViolation(field=clip(v.field, MAX_DESCRIPTION),
                                                             description=clip(v.description, MAX_DESCRIPTION))
            size += fv.ByteSize()
            if size > MAX_VIOLATION_BYTES:
                fv = error_details_pb2.BadRequest.FieldViolation(
                    field="", description=f"{len(err.violations) - len(shown)} more violations not shown")
                shown.append(fv)
                break
            shown.append(fv)
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=shown))
        st.details.append(detail)
    info = error_details_pb2.ErrorInfo(domain=DOMAIN, reason=err.reason or ("RULE_REFUSED" if err.rule_id else err.code),
                                       metadata=err.info)
    if err.rule_id:
        info.metadata["rule_id"] = err.rule_id
    detail = any_pb2.Any()
    detail.Pack(info)
    st.details.append(detail)
    return rpc_status.to_status(st)


def from_status(st: status_pb2.Status | None, code: str, message: str) -> ServiceError:
    """Rebuild the ServiceError a server sent (the client side of to_status)."""
    violations: list[FieldViolation] = []
    rule_id, reason, facts = None, "", {}
    for detail in st.details if st is not None else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            br = error_details_pb2.BadRequest()
            detail.Unpack(br)
            violations += [FieldViolation(v.field, v.description) for v in br.field_violations]
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            rule_id = info.metadata.get("rule_id") or None
            if info.reason not in (code, "RULE_REFUSED"):  # a reason of its own, for a program to act on
                reason, facts = info.reason, dict(info.metadata)
    return ServiceError(code, st.message if st is not None else message, violations, rule_id, reason, facts)


def invalid(field: str, description: str) -> ServiceError:
    return ServiceError.invalid([FieldViolation(field, description)])
