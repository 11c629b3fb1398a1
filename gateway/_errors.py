"""The one table mapping domain errors to HTTP statuses (mirrors :mod:`baton.grpc_errors`).

Routes raise domain exceptions; the app's exception handler turns them into a JSON body
``{"error": <message>, "reason": <REASON>, ...metadata}`` with the status below. ``reason``
and the metadata keys are the same as the gRPC ``ErrorInfo`` of the exception, so a client
rebuilds the domain exception the same way in HTTP and gRPC (see :mod:`baton.client`).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from baton import errors as e
from baton import grpc_errors
from baton.errors import drop_frames
from gateway import _admission

if TYPE_CHECKING:
    import grpc

log = logging.getLogger("gateway.errors")


# --- errors that only exist at the HTTP edge ----------------------------------------------


class Unauthorized(e.BatonError):
    """No or an unknown bearer API key (the key itself never appears in the message)."""

    def __init__(self, problem: str = "a valid API key is required: send Authorization: Bearer <key>") -> None:
        super().__init__(problem)


class SeveralCredentials(Unauthorized):
    """More than one ``Authorization`` header (gRPC: ``authorization`` metadata entry): refused
    whatever they say, so which one counts never depends on the layer reading them."""

    def __init__(self) -> None:
        super().__init__("send one Authorization header, not several")


class MetricsForbidden(e.BatonError):
    """The public port's ``/metrics`` with API keys on, without the internal token: a
    tenant's key must not read cluster-wide counts (scrape the metrics listener instead)."""

    def __init__(self) -> None:
        super().__init__("/metrics needs the internal token here (Authorization: Bearer <BATON_INTERNAL_TOKEN>); "
                         "scrape the metrics listener (BATON_GATEWAY_METRICS_LISTEN) instead")


class BodyTooLarge(e.BatonError):
    """The request body is larger than the configured limit (bytes)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        super().__init__(f"request body larger than {limit} bytes")


class NoHostAvailable(e.BatonError):
    """No live, non-draining sandbox host could take the run."""

    def __init__(self, detail: str = "no sandbox host is available") -> None:
        self.detail = detail
        super().__init__(detail)


class CancelWaitTimeout(e.BatonError):
    """``POST /api/chat/cancel?wait=true`` ran out of time before the run was terminal."""

    def __init__(self, run_id: str, timeout: float) -> None:
        self.run_id = run_id
        self.timeout = timeout
        super().__init__(f"run {run_id!r} was not terminal within {timeout:g}s of the cancel")


class StartFailed(e.BatonError):
    """A ``POST /api/chat`` whose start did not complete: the cause, and whether the run exists.

    The response is the cause's (status, reason, metadata) plus ``runExists``: ``true``
    (the run exists but was not started: a retry of the same POST, same run id, starts it),
    ``false`` (nothing was created: a retry creates it), or ``null`` (the store could not
    be asked; a retry with the same run id is safe either way).

    Attributes:
        cause: the domain error the start failed with.
        run_exists: see above.
    """

    def __init__(self, cause: e.BatonError, run_exists: bool | None) -> None:
        self.cause = cause
        self.run_exists = run_exists
        super().__init__(str(cause))


UnknownThread = e.UnknownThread  # shared with the coordinator (baton/errors.py)
TooManyStarts = _admission.TooManyStarts  # gateway/_admission.py


@dataclass(frozen=True)
class HttpMapping:
    exc: type[e.BatonError]
    status: int
    reason: str


#: The errors that exist only at the gateway's edge, with their gRPC codes.
EDGE: tuple[tuple[type[e.BatonError], int, str, str], ...] = (
    (Unauthorized, 401, "UNAUTHENTICATED", "UNAUTHENTICATED"),
    (MetricsForbidden, 403, "METRICS_FORBIDDEN", "PERMISSION_DENIED"),
    (BodyTooLarge, 413, "BODY_TOO_LARGE", "INVALID_ARGUMENT"),
    (NoHostAvailable, 503, "NO_HOST_AVAILABLE", "UNAVAILABLE"),
    (CancelWaitTimeout, 504, "CANCEL_WAIT_TIMEOUT", "DEADLINE_EXCEEDED"),
    (TooManyStarts, 429, "TOO_MANY_STARTS", "RESOURCE_EXHAUSTED"),
)
#: ``Retry-After`` (seconds) of a start refused because every host is full.
FULL_RETRY_AFTER = 5

# Lookup walks the MRO of the raised exception, so a row per class suffices: the edge's
# own errors, then every domain error with the status of the one table
# (baton/grpc_errors.py), then anything else as 500 INTERNAL.
TABLE: tuple[HttpMapping, ...] = (
    *(HttpMapping(cls, status, reason) for cls, status, reason, _code in EDGE),
    *(HttpMapping(m.exc, m.http, m.reason) for m in grpc_errors.TABLE),
    HttpMapping(e.BatonError, 500, "INTERNAL"),
)


def mapping_for(exc: BaseException) -> HttpMapping | None:
    """The table row for ``exc`` (most specific class first), or ``None``."""
    for cls in type(exc).__mro__:
        for m in TABLE:
            if m.exc is cls:
                return m
    return None


def error_body(exc: e.BatonError) -> tuple[int, dict[str, object]]:
    """Status and JSON body for a domain error.

    The body carries the gRPC table's metadata for the exception (when it has a row there)
    so clients rebuild the same exception; ``ThreadBusy`` also carries ``activeRunId``
    (the issue's wire contract for a busy thread).
    """
    if isinstance(exc, StartFailed):
        status, body = error_body(exc.cause)
        body["runExists"] = exc.run_exists
        return status, body
    m = mapping_for(exc)
    assert m is not None  # BatonError is the last row
    body = {"error": str(exc), "reason": m.reason}
    g = grpc_errors.mapping_for(exc)
    if g is not None and g.exc is not e.StoreUnavailable:
        body.update(g.to_meta(exc))
    body.update(_edge_meta(exc))
    if isinstance(exc, e.ThreadBusy):
        body["activeRunId"] = exc.active_run_id
    if isinstance(exc, e.OffsetExpired):
        body["earliestOffset"] = exc.earliest_offset
    if isinstance(exc, e.ApprovalAlreadyAnswered):
        body["approval"] = json.loads(exc.approval)  # the first answer, as GET /api/runs/{id} shows it
    return m.status, body


def retry_after(exc: e.BatonError) -> int | None:
    """Seconds a client should wait before it retries (the ``Retry-After`` header), or
    ``None``: too many starts at once, or every host full."""
    cause = exc.cause if isinstance(exc, StartFailed) else exc
    if isinstance(cause, TooManyStarts):
        return cause.retry_after
    if isinstance(cause, e.HostAtCapacity):
        return FULL_RETRY_AFTER
    return None


def error_response(exc: e.BatonError) -> Response:
    status, body = error_body(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
    after = retry_after(exc)
    if after is not None:
        headers["Retry-After"] = str(after)
    return JSONResponse(body, status_code=status, headers=headers or None)


async def handle_baton_error(request: Request, exc: Exception) -> Response:
    """Starlette exception handler: domain errors become their mapped status."""
    assert isinstance(exc, e.BatonError)
    drop_frames(exc)  # its frames hold the request's body; the error itself may wait for a collection
    m = mapping_for(exc.cause if isinstance(exc, StartFailed) else exc)
    st = getattr(request.app.state, "gateway", None)
    if st is not None:
        st.metrics.rejected.labels("http", m.reason if m is not None else "INTERNAL").inc()
    if m is not None and m.status >= 500:
        log.warning("%s %s -> %s: %s", request.method, request.url.path, m.status, exc)
    return error_response(exc)



# --- the same errors over gRPC (the Runs service) -----------------------------------------

def _edge_meta(exc: e.BatonError) -> dict[str, str]:
    if isinstance(exc, BodyTooLarge):
        return {"limit": str(exc.limit)}
    if isinstance(exc, CancelWaitTimeout):
        return {"run_id": exc.run_id, "timeout": f"{exc.timeout:g}"}
    if isinstance(exc, TooManyStarts):
        return {"retry_after": str(exc.retry_after)}
    return {}


def grpc_status(exc: e.BatonError) -> "grpc.Status":
    """The rich gRPC status (code, message, ``ErrorInfo``) of a domain error at the gRPC edge.

    Errors with a row in :data:`baton.grpc_errors.TABLE` use it; the edge's own errors get
    the code below and the reason of this module's HTTP table; anything else is INTERNAL.
    """
    import grpc
    from google.protobuf import any_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2
    from grpc_status import rpc_status

    if isinstance(exc, StartFailed):
        return grpc_status(exc.cause)  # the cause's code and reason, as HTTP answers it
    if grpc_errors.mapping_for(exc) is not None:
        return grpc_errors.to_status(exc)
    m = mapping_for(exc)
    edge = next((row for row in EDGE if isinstance(exc, row[0])), None)
    code = getattr(grpc.StatusCode, edge[3]) if edge is not None else grpc.StatusCode.INTERNAL
    reason = m.reason if m is not None else "INTERNAL"
    info = error_details_pb2.ErrorInfo(reason=reason, domain=grpc_errors.DOMAIN, metadata=_edge_meta(exc))
    detail = any_pb2.Any()
    detail.Pack(info)
    st = status_pb2.Status(code=getattr(code_pb2, code.name), message=str(exc), details=[detail])
    return rpc_status.to_status(st)
