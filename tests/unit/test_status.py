"""ServiceError on the wire: a google.rpc.Status that fits in the trailers every client accepts."""

from __future__ import annotations

from google.rpc import status_pb2

from cgsvc.errors import FieldViolation, ServiceError
from cgsvc.server.status import MAX_MESSAGE, from_status, to_status


def wire(err: ServiceError) -> tuple[ServiceError, int]:
    """What a client rebuilds from the status, and the status's size in bytes."""
    st = to_status(err)
    trailer = dict(st.trailing_metadata)["grpc-status-details-bin"]
    return from_status(status_pb2.Status.FromString(trailer), err.code, ""), len(trailer) + len(st.details)


def test_a_short_error_crosses_whole() -> None:
    err = ServiceError.invalid([FieldViolation("hardware.gpu", "unknown GPU 'X'"), FieldViolation("parallelism.tp", "must be at least 1")])
    back, _ = wire(err)
    assert back == err


def test_long_text_and_many_violations_are_cut_saying_so() -> None:
    """Regression: a refusal that echoed a 5,000-character value outgrew the 8 KiB of trailers a
    client accepts and arrived as RESOURCE_EXHAUSTED instead of the refusal."""
    long = "m" * 5_000
    err = ServiceError.invalid([FieldViolation(f"f{i}", f"unknown value {long!r}") for i in range(100)])
    back, size = wire(err)
    assert size < 8 * 1024 * 3 // 4  # base64 in the trailer adds a third
    assert back.message.endswith(f"(cut at {MAX_MESSAGE} of {len(err.message)} characters)")
    assert back.violations[0].field == "f0" and "(cut at 200 of 5016 characters)" in back.violations[0].description
    shown = len(back.violations) - 1
    assert 0 < shown < 100 and back.violations[-1].description == f"{100 - shown} more violations not shown"
