"""The one table of domain errors ↔ gRPC statuses round-trips every mapped exception."""
from __future__ import annotations

import grpc
import pytest
from grpc_status import rpc_status

from baton import errors as e
from baton import grpc_errors

SAMPLES: list[tuple[e.BatonError, grpc.StatusCode]] = [
    (e.InvalidArgument("run_id", "must be a non-empty string"), grpc.StatusCode.INVALID_ARGUMENT),
    (e.UnknownRun("r1"), grpc.StatusCode.NOT_FOUND),
    (e.ThreadBusy("t1", "r0"), grpc.StatusCode.ALREADY_EXISTS),
    (e.RunClaimNotAcquired("r1", "held"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.RunClaimLost("r1", 3, "fence@4"), grpc.StatusCode.ABORTED),
    (e.JournalAttachUnavailable("r1", "journal-timeout"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.JournalReplayDiverged(7, None, None), grpc.StatusCode.DATA_LOSS),
    (e.JournalReplayThreadIdMismatch(2, None, None), grpc.StatusCode.DATA_LOSS),
    (e.SandboxReclaimFailed("sb", "gone"), grpc.StatusCode.UNAVAILABLE),
    (e.OffsetExpired("r1", "3", "10"), grpc.StatusCode.OUT_OF_RANGE),
    (e.HostAtCapacity("host-a", 2), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.LogUnavailable("r1", "reading the log head failed"), grpc.StatusCode.UNAVAILABLE),
    (e.LogStorageFull("r1", "insufficient resources", 10023), grpc.StatusCode.UNAVAILABLE),
    (e.LogStorageFull("r1", "publish unanswered while reads answer"), grpc.StatusCode.UNAVAILABLE),
]


class _FakeCall(grpc.RpcError):
    """A minimal client-side error carrying trailing metadata, as grpc.aio delivers it."""

    def __init__(self, status: grpc.Status) -> None:
        self._status = status

    def code(self) -> grpc.StatusCode:
        return self._status.code

    def details(self) -> str:
        return self._status.details

    def trailing_metadata(self):  # type: ignore[no-untyped-def]
        return self._status.trailing_metadata


@pytest.mark.parametrize("exc,code", SAMPLES, ids=lambda x: type(x).__name__)
def test_round_trip(exc: e.BatonError, code: grpc.StatusCode) -> None:
    status = grpc_errors.to_status(exc)
    assert status.code == code
    back = grpc_errors.from_rpc_error(_FakeCall(status))
    assert type(back) is type(exc)
    assert {k: v for k, v in vars(back).items()} == {k: v for k, v in vars(exc).items() if k not in ("stored", "replayed")} | (
        {"stored": None, "replayed": None} if isinstance(exc, e.JournalReplayDiverged) else {}
    )
    assert rpc_status.from_call(_FakeCall(status)) is not None  # type: ignore[arg-type]
