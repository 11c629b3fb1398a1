"""The one table of domain errors: reason, gRPC status code (+ ``google.rpc.ErrorInfo``), HTTP status.

Every concrete error class of :mod:`baton.errors` has one row; the gateway answers the
same reason, metadata keys and status over gRPC and HTTP (``gateway/_errors.py`` adds the
errors that exist only at its edge). ``tests/test_errors_table.py`` walks every class over
both protocols and checks the error table of docs/api.md against this one.

Servers call :func:`to_status` (or :func:`abort`) at the edge; clients call
:func:`from_rpc_error` to rebuild the domain exception, so no caller parses messages.
ErrorInfo: ``reason`` is the exception's condition name, ``domain`` is ``baton.dev``, and
``metadata`` carries the exception's data as strings (never under the keys ``reason`` or
``error``: the HTTP body puts the metadata beside those two). Clients in any language
branch on ``reason`` and ``metadata``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import code_pb2, error_details_pb2, status_pb2
from grpc_status import rpc_status

from baton import errors as e
from baton.errors import drop_frames

DOMAIN = "baton.dev"


@dataclass(frozen=True)
class Mapping:
    exc: type[e.BatonError]
    code: grpc.StatusCode
    http: int  # the HTTP status the gateway answers with (gateway/_errors.py)
    reason: str
    to_meta: Callable[[e.BatonError], dict[str, str]]
    from_meta: Callable[[dict[str, str]], e.BatonError]


def _none(_: e.BatonError) -> dict[str, str]:
    return {}


# Ordered most specific first: lookup walks the MRO of the raised exception.
TABLE: tuple[Mapping, ...] = (
    Mapping(e.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT, 400, "INVALID_ARGUMENT",
            lambda x: {"field": x.field, "problem": x.problem},  # type: ignore[attr-defined]
            lambda m: e.InvalidArgument(m.get("field", ""), m.get("problem", ""))),
    Mapping(e.DurableRunIdRequired, grpc.StatusCode.INVALID_ARGUMENT, 400, "DURABLE_RUN_ID_REQUIRED",
            _none, lambda m: e.DurableRunIdRequired()),
    # A store that answered with an error (RESOURCE_EXHAUSTED, OUT_OF_RANGE...) is, to a
    # client, a store it cannot use now: the same code and status as unreachable, its own
    # reason so an operator can tell them apart.
    Mapping(e.StoreRefused, grpc.StatusCode.UNAVAILABLE, 503, "STORE_REFUSED",
            # Not "code"/"details": an HTTP error body has its own top-level "code".
            lambda x: {"store_code": x.code, "store_details": x.details},  # type: ignore[attr-defined]
            lambda m: e.StoreRefused(m.get("store_code", ""), m.get("store_details", ""))),
    Mapping(e.StoreUnavailable, grpc.StatusCode.UNAVAILABLE, 503, "STORE_UNAVAILABLE",
            _none, lambda m: e.StoreUnavailable(m.get("detail", "store unavailable"))),
    Mapping(e.UnknownRun, grpc.StatusCode.NOT_FOUND, 404, "UNKNOWN_RUN",
            lambda x: {"run_id": x.run_id},  # type: ignore[attr-defined]
            lambda m: e.UnknownRun(m.get("run_id", ""))),
    Mapping(e.UnknownThread, grpc.StatusCode.NOT_FOUND, 404, "UNKNOWN_THREAD",
            lambda x: {"thread_id": x.thread_id},  # type: ignore[attr-defined]
            lambda m: e.UnknownThread(m.get("thread_id", ""))),
    Mapping(e.ThreadExists, grpc.StatusCode.ALREADY_EXISTS, 409, "THREAD_EXISTS",
            lambda x: {"thread_id": x.thread_id},  # type: ignore[attr-defined]
            lambda m: e.ThreadExists(m.get("thread_id", ""))),
    Mapping(e.ThreadBusy, grpc.StatusCode.ALREADY_EXISTS, 409, "THREAD_BUSY",
            lambda x: {"thread_id": x.thread_id, "active_run_id": x.active_run_id},  # type: ignore[attr-defined]
            lambda m: e.ThreadBusy(m.get("thread_id", ""), m.get("active_run_id", ""))),
    Mapping(e.ApprovalNotFound, grpc.StatusCode.NOT_FOUND, 404, "APPROVAL_NOT_FOUND",
            lambda x: {"run_id": x.run_id, "approval_id": x.approval_id},  # type: ignore[attr-defined]
            lambda m: e.ApprovalNotFound(m.get("run_id", ""), m.get("approval_id", ""))),
    Mapping(e.ApprovalAlreadyAnswered, grpc.StatusCode.ABORTED, 409, "APPROVAL_ALREADY_ANSWERED",
            lambda x: {"run_id": x.run_id, "approval_id": x.approval_id, "approval_json": x.approval},  # type: ignore[attr-defined]
            lambda m: e.ApprovalAlreadyAnswered(m.get("run_id", ""), m.get("approval_id", ""), m.get("approval_json", "{}"))),
    Mapping(e.RunEnded, grpc.StatusCode.FAILED_PRECONDITION, 409, "RUN_ENDED",
            lambda x: {"run_id": x.run_id},  # type: ignore[attr-defined]
            lambda m: e.RunEnded(m.get("run_id", ""))),
    Mapping(e.SteerUnsupported, grpc.StatusCode.FAILED_PRECONDITION, 409, "STEER_UNSUPPORTED",
            lambda x: {"run_id": x.run_id, "agent": x.agent},  # type: ignore[attr-defined]
            lambda m: e.SteerUnsupported(m.get("run_id", ""), m.get("agent", ""))),
    Mapping(e.QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "QUEUE_FULL",
            lambda x: {"thread_id": x.thread_id, "limit": str(x.limit)},  # type: ignore[attr-defined]
            lambda m: e.QueueFull(m.get("thread_id", ""), int(m.get("limit", "0")))),
    Mapping(e.QueuedRunStarted, grpc.StatusCode.FAILED_PRECONDITION, 409, "QUEUED_RUN_STARTED",
            lambda x: {"run_id": x.run_id},  # type: ignore[attr-defined]
            lambda m: e.QueuedRunStarted(m.get("run_id", ""))),
    Mapping(e.InputIdTaken, grpc.StatusCode.ALREADY_EXISTS, 409, "INPUT_ID_TAKEN",
            lambda x: {"run_id": x.run_id, "input_id": x.input_id},  # type: ignore[attr-defined]
            lambda m: e.InputIdTaken(m.get("run_id", ""), m.get("input_id", ""))),
    Mapping(e.TooManyInputs, grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "TOO_MANY_INPUTS",
            lambda x: {"run_id": x.run_id, "limit": str(x.limit)},  # type: ignore[attr-defined]
            lambda m: e.TooManyInputs(m.get("run_id", ""), int(m.get("limit", "0")))),
    Mapping(e.RunIdRetired, grpc.StatusCode.FAILED_PRECONDITION, 409, "RUN_ID_RETIRED",
            lambda x: {"run_id": x.run_id},  # type: ignore[attr-defined]
            lambda m: e.RunIdRetired(m.get("run_id", ""))),
    Mapping(e.RunClaimNotAcquired, grpc.StatusCode.FAILED_PRECONDITION, 409, "RUN_CLAIM_NOT_ACQUIRED",
            lambda x: {"run_id": x.run_id, "refusal": x.reason},  # type: ignore[attr-defined]
            lambda m: e.RunClaimNotAcquired(m.get("run_id", ""), m.get("refusal", "held"))),  # type: ignore[arg-type]
    Mapping(e.RunClaimLost, grpc.StatusCode.ABORTED, 409, "RUN_CLAIM_LOST",
            lambda x: {"run_id": x.run_id, "held_epoch": str(x.held_epoch), "observed": x.observed},  # type: ignore[attr-defined]
            lambda m: e.RunClaimLost(m.get("run_id", ""), int(m.get("held_epoch", "0")), m.get("observed", ""))),
    Mapping(e.SessionLost, grpc.StatusCode.FAILED_PRECONDITION, 503, "SESSION_LOST",
            lambda x: {"session_id": str(x.session_id)},  # type: ignore[attr-defined]
            lambda m: e.SessionLost(int(m.get("session_id", "0")))),
    Mapping(e.JournalAttachUnavailable, grpc.StatusCode.FAILED_PRECONDITION, 409, "JOURNAL_ATTACH_UNAVAILABLE",
            lambda x: {"run_id": x.run_id, "refusal": x.reason},  # type: ignore[attr-defined]
            lambda m: e.JournalAttachUnavailable(m.get("run_id", ""), m.get("refusal", "unknown-run"))),  # type: ignore[arg-type]
    Mapping(e.JournalReplayThreadIdMismatch, grpc.StatusCode.DATA_LOSS, 500, "JOURNAL_REPLAY_THREAD_ID_MISMATCH",
            lambda x: {"index": str(x.index)},  # type: ignore[attr-defined]
            lambda m: e.JournalReplayThreadIdMismatch(int(m.get("index", "0")), None, None)),
    Mapping(e.JournalReplayDiverged, grpc.StatusCode.DATA_LOSS, 500, "JOURNAL_REPLAY_DIVERGED",
            lambda x: {"index": str(x.index)},  # type: ignore[attr-defined]
            lambda m: e.JournalReplayDiverged(int(m.get("index", "0")), None, None)),
    Mapping(e.SandboxBuildFailed, grpc.StatusCode.FAILED_PRECONDITION, 502, "SANDBOX_BUILD_FAILED",
            lambda x: {"step": x.step, "detail": x.detail},  # type: ignore[attr-defined]
            lambda m: e.SandboxBuildFailed(m.get("step", ""), m.get("detail", ""))),
    Mapping(e.SandboxReclaimFailed, grpc.StatusCode.UNAVAILABLE, 503, "SANDBOX_RECLAIM_FAILED",
            lambda x: {"sandbox_key": x.sandbox_key, "detail": x.detail},  # type: ignore[attr-defined]
            lambda m: e.SandboxReclaimFailed(m.get("sandbox_key", ""), m.get("detail", ""))),
    Mapping(e.ProviderUnreachable, grpc.StatusCode.UNAVAILABLE, 503, "PROVIDER_UNREACHABLE",
            lambda x: {"run_id": x.run_id, "provider": x.provider, "detail": x.detail},  # type: ignore[attr-defined]
            lambda m: e.ProviderUnreachable(m.get("run_id", ""), m.get("provider", ""), m.get("detail", ""))),
    Mapping(e.HostDraining, grpc.StatusCode.UNAVAILABLE, 503, "HOST_DRAINING",
            _none, lambda m: e.HostDraining("host is draining")),
    Mapping(e.HostAtCapacity, grpc.StatusCode.RESOURCE_EXHAUSTED, 503, "HOST_AT_CAPACITY",
            lambda x: {"host_id": x.host_id, "capacity": str(x.capacity)},  # type: ignore[attr-defined]
            lambda m: e.HostAtCapacity(m.get("host_id", ""), int(m.get("capacity", "0")))),
    Mapping(e.OffsetExpired, grpc.StatusCode.OUT_OF_RANGE, 410, "OFFSET_EXPIRED",
            lambda x: {"run_id": x.run_id, "offset": x.offset, "earliest_offset": x.earliest_offset},  # type: ignore[attr-defined]
            lambda m: e.OffsetExpired(m.get("run_id", ""), m.get("offset", ""), m.get("earliest_offset", ""))),
    Mapping(e.InvalidOffset, grpc.StatusCode.INVALID_ARGUMENT, 400, "INVALID_OFFSET",
            lambda x: {"offset": x.offset},  # type: ignore[attr-defined]
            lambda m: e.InvalidOffset(m.get("offset", ""))),
    Mapping(e.LogAlreadyClosed, grpc.StatusCode.FAILED_PRECONDITION, 409, "LOG_ALREADY_CLOSED",
            lambda x: {"run_id": x.run_id, "status": x.status, "epoch": str(x.epoch), "offset": str(x.offset)},  # type: ignore[attr-defined]
            lambda m: e.LogAlreadyClosed(m.get("run_id", ""), m.get("status", ""), int(m.get("epoch", "0")), int(m.get("offset", "0")))),
    Mapping(e.LogStorageFull, grpc.StatusCode.UNAVAILABLE, 503, "LOG_STORAGE_FULL",
            lambda x: {"run_id": x.run_id, "detail": x.detail, "err_code": "" if x.err_code is None else str(x.err_code)},  # type: ignore[attr-defined]
            lambda m: e.LogStorageFull(m.get("run_id", ""), m.get("detail", ""),
                                       int(m["err_code"]) if m.get("err_code", "").isdigit() else None)),
    Mapping(e.LogUnavailable, grpc.StatusCode.UNAVAILABLE, 503, "LOG_UNAVAILABLE",
            lambda x: {"run_id": x.run_id, "detail": x.detail},  # type: ignore[attr-defined]
            lambda m: e.LogUnavailable(m.get("run_id", ""), m.get("detail", ""))),
    Mapping(e.AppendConflict, grpc.StatusCode.ABORTED, 409, "APPEND_CONFLICT",
            lambda x: {"run_id": x.run_id, "expected": str(x.expected), "actual": str(x.actual), "landed": ",".join(x.landed)},  # type: ignore[attr-defined]
            lambda m: e.AppendConflict(m.get("run_id", ""), int(m.get("expected", "0")), int(m.get("actual", "0")),
                                       tuple(o for o in m.get("landed", "").split(",") if o))),
    Mapping(e.WorkspaceFenced, grpc.StatusCode.ABORTED, 409, "WORKSPACE_FENCED",
            lambda x: {"thread_id": x.thread_id, "run_id": x.run_id, "epoch": str(x.epoch),  # type: ignore[attr-defined]
                       "stored_run_id": x.stored_run_id, "stored_epoch": str(x.stored_epoch)},  # type: ignore[attr-defined]
            lambda m: e.WorkspaceFenced(m.get("thread_id", ""), m.get("run_id", ""), int(m.get("epoch", "0")),
                                        m.get("stored_run_id", ""), int(m.get("stored_epoch", "0")))),
    Mapping(e.WorkspaceConflict, grpc.StatusCode.ABORTED, 409, "WORKSPACE_CONFLICT",
            lambda x: {"thread_id": x.thread_id, "expected_revision": "" if x.expected_revision is None else str(x.expected_revision)},  # type: ignore[attr-defined]
            lambda m: e.WorkspaceConflict(m.get("thread_id", ""), int(m["expected_revision"]) if m.get("expected_revision") else None)),
    Mapping(e.TranscriptFenced, grpc.StatusCode.ABORTED, 409, "TRANSCRIPT_FENCED",
            lambda x: {"thread_id": x.thread_id, "run_id": x.run_id, "epoch": str(x.epoch),  # type: ignore[attr-defined]
                       "stored_run_id": x.stored_run_id, "stored_epoch": str(x.stored_epoch)},  # type: ignore[attr-defined]
            lambda m: e.TranscriptFenced(m.get("thread_id", ""), m.get("run_id", ""), int(m.get("epoch", "0")),
                                         m.get("stored_run_id", ""), int(m.get("stored_epoch", "0")))),
    Mapping(e.TranscriptConflict, grpc.StatusCode.ABORTED, 409, "TRANSCRIPT_CONFLICT",
            lambda x: {"thread_id": x.thread_id, "expected_revision": "" if x.expected_revision is None else str(x.expected_revision)},  # type: ignore[attr-defined]
            lambda m: e.TranscriptConflict(m.get("thread_id", ""), int(m["expected_revision"]) if m.get("expected_revision") else None)),
    # A workspace over the limit is the request's precondition failing, not the server's:
    # 413 like a body over its limit.
    Mapping(e.WorkspaceTooLarge, grpc.StatusCode.FAILED_PRECONDITION, 413, "WORKSPACE_TOO_LARGE",
            lambda x: {"limit": str(x.limit), "size": str(x.size)},  # type: ignore[attr-defined]
            lambda m: e.WorkspaceTooLarge(int(m.get("limit", "0")), int(m.get("size", "0")))),
    Mapping(e.WorkspaceUnsafe, grpc.StatusCode.FAILED_PRECONDITION, 422, "WORKSPACE_UNSAFE",
            lambda x: {"path": x.path, "problem": x.problem},  # type: ignore[attr-defined]
            lambda m: e.WorkspaceUnsafe(m.get("path", ""), m.get("problem", ""))),
    Mapping(e.SnapshotMissing, grpc.StatusCode.NOT_FOUND, 404, "SNAPSHOT_MISSING",
            lambda x: {"digest": x.digest, "detail": x.detail},  # type: ignore[attr-defined]
            lambda m: e.SnapshotMissing(m.get("digest", ""), m.get("detail", ""))),
)

_BY_REASON = {m.reason: m for m in TABLE}


def mapping_for(exc: BaseException) -> Mapping | None:
    """The table row for ``exc`` (most specific class first), or ``None``."""
    for cls in type(exc).__mro__:
        for m in TABLE:
            if m.exc is cls:
                return m
    return None


def to_status(exc: e.BatonError) -> grpc.Status:
    """Build a rich ``grpc.Status`` (code, message, ErrorInfo detail) for a domain error.

    Raises:
        KeyError: when ``exc`` has no row in :data:`TABLE` (a programming error).
    """
    m = mapping_for(exc)
    if m is None:
        raise KeyError(f"no gRPC mapping for {type(exc).__name__}")
    meta = m.to_meta(exc)
    if m.exc is e.StoreUnavailable:
        meta = {"detail": str(exc)}
    info = error_details_pb2.ErrorInfo(reason=m.reason, domain=DOMAIN, metadata=meta)
    detail = any_pb2.Any()
    detail.Pack(info)
    st = status_pb2.Status(code=getattr(code_pb2, m.code.name), message=str(exc), details=[detail])
    return rpc_status.to_status(st)


async def abort(context: grpc.aio.ServicerContext[Any, Any], exc: e.BatonError) -> NoReturn:
    """Abort the current RPC with the mapped status of ``exc``."""
    await context.abort_with_status(to_status(exc))  # type: ignore[attr-defined]  # grpc-stubs' aio context lacks it
    raise AssertionError("unreachable")  # abort_with_status always raises


def from_rpc_error(err: grpc.aio.AioRpcError | grpc.RpcError) -> BaseException:
    """Rebuild the domain exception from a gRPC error, or return ``err`` unchanged.

    ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` without baton details become
    :class:`~baton.errors.StoreUnavailable` so callers handle "cannot reach" in one place.
    """
    # grpcio's failed call sits in a reference cycle (its task, its frames) until a
    # collection: its frames must not keep the request they sent meanwhile.
    drop_frames(err)
    status = rpc_status.from_call(err)  # type: ignore[arg-type]
    if status is not None:
        for d in status.details:
            if d.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                d.Unpack(info)
                m = _BY_REASON.get(info.reason)
                if m is not None and info.domain == DOMAIN:
                    return m.from_meta(dict(info.metadata))
    code = err.code() if hasattr(err, "code") else None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return e.StoreUnavailable(f"{code.name}: {err.details() if hasattr(err, 'details') else err}")
    return err
