"""The request pipeline every cgsvc RPC passes through, in order:

    decode (malformed bytes -> INVALID_ARGUMENT, never INTERNAL)
    -> authenticate and authorise (UNAUTHENTICATED / PERMISSION_DENIED, audited)
    -> bind the log context (request id, trace id, principal, method)
    -> the service method (raises ServiceError for refusals)
    -> rich status on error, one log line and metrics per call.

Handlers are registered from the service descriptors, so the pipeline wraps every method
of every service the same way, unary and server-streaming alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import secrets
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from google.protobuf import message_factory
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message

from cgsvc.audit.auditor import REQUEST_AUDITED
from cgsvc.audit.store import database_unavailable, outage_text
from cgsvc.errors import ServiceError
from cgsvc.server import metrics
from cgsvc.server.auth import Authenticator, AuthError, Principal
from cgsvc.server.status import invalid, to_status

log = structlog.get_logger("cgsvc.rpc")


@dataclass(frozen=True)
class RequestContext:
    method: str
    principal: Principal
    peer: str
    request_id: str
    trace_id: str
    grpc_context: Any


REQUEST: contextvars.ContextVar[RequestContext] = contextvars.ContextVar("cgsvc_request")

# Called with (method, principal name, peer, request message or None, code, message) for an
# outcome the service itself did not audit: denied, malformed, failed inside (INTERNAL) or
# cancelled. The hook decides which methods it records.
RejectedHook = Callable[[str, str, str, Any, str, str], Awaitable[None]]


MAX_REQUEST_ID = 128  # an idempotency key is stored and indexed with the caller and method


def _check_text(request: Any) -> None:
    """Refuse what a request's own text fields (ids, names, filters, paths) may not hold, naming
    the field: a NUL character (U+0000) — PostgreSQL text cannot hold one, a request id is an
    idempotency key compared exactly, and a name or path with one names nothing — and a request
    id over MAX_REQUEST_ID characters (it is a key in an index). A spec's text is checked by the
    resolver against its closed sets; the audit log records a NUL as `\\u0000`."""
    for field, value in request.ListFields():
        if field.type == field.TYPE_STRING and any("\x00" in v for v in (value if isinstance(value, str) else list(value))):
            raise invalid(field.name, "must not contain NUL characters (U+0000)")
    if len(getattr(request, "request_id", "")) > MAX_REQUEST_ID:
        raise invalid("request_id", f"at most {MAX_REQUEST_ID} characters (a UUID is 36), got {len(request.request_id)}")


class _Malformed:
    def __init__(self, error: str) -> None:
        self.error = error


def _safe_deserializer(cls: type[Message]) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        try:
            return cls.FromString(data)
        except (DecodeError, UnicodeDecodeError, ValueError, RuntimeError) as exc:
            return _Malformed(f"cannot decode {cls.DESCRIPTOR.full_name}: {exc}")
    return decode


def _trace_id(metadata: dict[str, str]) -> str:
    tp = metadata.get("traceparent", "")
    parts = tp.split("-")
    if len(parts) == 4 and len(parts[1]) == 32:
        return parts[1]
    return secrets.token_hex(16)  # 128 random bits, as W3C trace ids are; a quarter of uuid4().hex's cost


def _cert_common_name(context: Any) -> str | None:
    names = (context.auth_context() or {}).get("x509_common_name") or []
    return names[0].decode() if names else None


class Pipeline:
    """Builds grpc handlers that run the pipeline around servicer methods."""

    def __init__(self, authenticator: Authenticator, on_rejected: RejectedHook | None = None) -> None:
        self.auth = authenticator
        self.on_rejected = on_rejected
        self.stopping = False  # the server is shutting down: a call cancelled now was cut by it
        self.inflight = 0  # calls past authentication whose handler has not returned
        self._drained: asyncio.Event | None = None

    def shutting_down(self) -> None:
        """Before the gRPC server stops: the calls it then cancels are logged and audited as cut
        by the shutdown, not as their callers' doing."""
        self.stopping = True

    async def drained(self, timeout: float) -> bool:
        """After the gRPC server has stopped: wait, at most `timeout` seconds, until every call it
        cut short has unwound (its CANCELLED record appended), so that the audit writer is closed
        after them. False if some had not."""
        if self.inflight:
            self._drained = asyncio.Event()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), timeout)
        return self.inflight == 0

    def _left(self) -> None:
        self.inflight -= 1
        if not self.inflight and self._drained is not None:
            self._drained.set()

    async def _enter(self, method: str, request: Any, context: Any) -> RequestContext | None:
        metadata = {k.lower(): v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}
        peer = context.peer() or ""
        try:
            principal = self.auth.authenticate(
                metadata, _cert_common_name(context) if self.auth.certificates else None)
            if not principal.may_call(method):
                raise AuthError("PERMISSION_DENIED",
                                f"principal {principal.name!r} (roles: {', '.join(principal.roles) or 'none'}) "
                                f"may not call {method}")
        except AuthError as exc:
            name = "" if exc.code == "UNAUTHENTICATED" else principal.name
            if self.on_rejected is not None:
                await self.on_rejected(method, name, peer, None if isinstance(request, _Malformed) else request,
                                     exc.code, exc.message)
            metrics.RPC_TOTAL.labels(method, exc.code).inc()
            log.warning("rpc denied", method=method, peer=peer, principal=name, code=exc.code)
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            return None
        request_id = getattr(request, "request_id", "") or metadata.get("x-request-id", "") or secrets.token_hex(16)
        return RequestContext(method, principal, peer, request_id, _trace_id(metadata), context)

    async def _malformed(self, rc: RequestContext, request: _Malformed) -> None:
        if self.on_rejected is not None:
            await self.on_rejected(rc.method, rc.principal.name, rc.peer, None, "INVALID_ARGUMENT", request.error)
        raise invalid("request", request.error)

    def _finish(self, rc: RequestContext, t0: float, code: str, error: str = "") -> None:
        seconds = time.perf_counter() - t0
        metrics.RPC_TOTAL.labels(rc.method, code).inc()
        metrics.RPC_SECONDS.labels(rc.method).observe(seconds)
        fields = dict(peer=rc.peer, duration_ms=round(seconds * 1000, 3), outcome=code)  # the rest is bound
        if code == "OK":
            log.info("rpc", **fields)
        else:
            log.warning("rpc", **fields, error=error)

    async def _fail(self, rc: RequestContext, t0: float, exc: Exception, context: Any, request: Any) -> None:
        """Answer a failed call: a refusal with its rich status, anything else as INTERNAL,
        audited (once) before the answer leaves."""
        if isinstance(exc, ServiceError):
            self._finish(rc, t0, exc.code, exc.message)
            await self._audit_unrecorded(rc, request, exc.code, exc.message)  # e.g. a refused CancelLaunch
            await context.abort_with_status(to_status(exc))
        if database_unavailable(exc):  # not a bug, and not for long: a client retries UNAVAILABLE
            why = outage_text(exc)
            message = (f"the database does not answer ({why}); try again: a retry with the same request_id "
                       "makes nothing twice")
            self._finish(rc, t0, "UNAVAILABLE", message)
            log.error("rpc failed: the database does not answer", method=rc.method, error=why)
            try:  # the record of it, where the database answers that much
                await self._audit_unrecorded(rc, request, "UNAVAILABLE", message)
            except Exception:  # noqa: BLE001 - it does not: the caller is answered all the same
                log.warning("the failed call could not be audited either", method=rc.method)
            await context.abort_with_status(to_status(ServiceError("UNAVAILABLE", message, reason="DATABASE_UNAVAILABLE")))
        self._finish(rc, t0, "INTERNAL", repr(exc))
        log.error("rpc failed", method=rc.method, error=traceback.format_exc())
        message = f"internal error: {type(exc).__name__}"
        await self._audit_unrecorded(rc, request, "INTERNAL", message)
        await context.abort(grpc.StatusCode.INTERNAL, message)

    async def _audit_unrecorded(self, rc: RequestContext, request: Any, code: str, message: str) -> None:
        if self.on_rejected is not None and not REQUEST_AUDITED.get():
            await self.on_rejected(rc.method, rc.principal.name, rc.peer,
                                   None if isinstance(request, _Malformed) else request, code, message)

    async def _cancelled(self, rc: RequestContext, t0: float, request: Any) -> None:
        """The caller went away (cancelled, or its deadline passed), or the server's shutdown cut
        the call: audited, nobody answered."""
        why = ("the server shut down before answering" if self.stopping
               else "the caller cancelled the call or its deadline passed")
        self._finish(rc, t0, "CANCELLED", why)
        await self._audit_unrecorded(rc, request, "CANCELLED", why)

    def unary(self, method: str, fn: Callable[[Any, RequestContext], Awaitable[Any]]) -> Callable[..., Any]:
        async def handler(request: Any, context: Any) -> Any:
            t0 = time.perf_counter()
            rc = await self._enter(method, request, context)
            if rc is None:
                return None
            token, bound, audited = REQUEST.set(rc), _bind(rc), REQUEST_AUDITED.set(False)
            self.inflight += 1
            try:
                if isinstance(request, _Malformed):
                    await self._malformed(rc, request)
                _check_text(request)
                response = await fn(request, rc)
            except asyncio.CancelledError:
                await self._cancelled(rc, t0, request)
                raise
            except Exception as exc:
                if _is_abort(exc):
                    raise
                await self._fail(rc, t0, exc, context, request)
            else:
                self._finish(rc, t0, "OK")
                return response
            finally:
                self._left()
                structlog.contextvars.reset_contextvars(**bound)
                REQUEST_AUDITED.reset(audited)
                REQUEST.reset(token)
        return handler

    def stream(self, method: str, fn: Callable[[Any, RequestContext], AsyncIterator[Any]]) -> Callable[..., Any]:
        async def handler(request: Any, context: Any) -> AsyncIterator[Any]:
            t0 = time.perf_counter()
            rc = await self._enter(method, request, context)
            if rc is None:
                return
            token, bound, audited = REQUEST.set(rc), _bind(rc), REQUEST_AUDITED.set(False)
            self.inflight += 1
            try:
                if isinstance(request, _Malformed):
                    await self._malformed(rc, request)
                _check_text(request)
                async for item in fn(request, rc):
                    yield item
            except asyncio.CancelledError:
                await self._cancelled(rc, t0, request)
                raise
            except Exception as exc:
                if _is_abort(exc):
                    raise
                await self._fail(rc, t0, exc, context, request)
            else:
                self._finish(rc, t0, "OK")
            finally:
                self._left()
                structlog.contextvars.reset_contextvars(**bound)
                REQUEST_AUDITED.reset(audited)
                REQUEST.reset(token)
        return handler

    def service_handler(self, descriptor: ServiceDescriptor, servicer: Any) -> grpc.GenericRpcHandler:
        """A generic handler for every method of the service, each wrapped by the pipeline."""
        handlers: dict[str, grpc.RpcMethodHandler] = {}
        for m in descriptor.methods:
            req_cls = message_factory.GetMessageClass(m.input_type)
            full = f"/{descriptor.full_name}/{m.name}"
            fn = getattr(servicer, m.name)
            if m.server_streaming:
                handlers[m.name] = grpc.unary_stream_rpc_method_handler(
                    self.stream(full, fn), request_deserializer=_safe_deserializer(req_cls),
                    response_serializer=_serialize)
            else:
                handlers[m.name] = grpc.unary_unary_rpc_method_handler(
                    self.unary(full, fn), request_deserializer=_safe_deserializer(req_cls),
                    response_serializer=_serialize)
        return grpc.method_handlers_generic_handler(descriptor.full_name, handlers)


def _serialize(response: Message | bytes) -> bytes:
    """A response message's encoding; a handler may answer with the encoding itself (a hot
    path that caches most of its answer's bytes)."""
    return response if isinstance(response, bytes) else response.SerializeToString()


def _bind(rc: RequestContext) -> Mapping[str, Any]:
    """Bind the request's fields to every log line written while serving it (and by tasks it
    starts, which copy the context); returns the tokens that unbind them."""
    return structlog.contextvars.bind_contextvars(request_id=rc.request_id, trace_id=rc.trace_id,
                                                 principal=rc.principal.name, method=rc.method)


def _is_abort(exc: BaseException) -> bool:
    # context.abort() raises AbortError, which the server must see to send the status.
    return isinstance(exc, grpc.aio.AbortError)

