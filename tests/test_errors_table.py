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
    (e.ThreadExists("t1"), grpc.StatusCode.ALREADY_EXISTS),
    (e.RunClaimNotAcquired("r1", "held"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.RunIdRetired("r1"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.RunClaimLost("r1", 3, "fence@4"), grpc.StatusCode.ABORTED),
    (e.JournalAttachUnavailable("r1", "journal-timeout"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.JournalReplayDiverged(7, None, None), grpc.StatusCode.DATA_LOSS),
    (e.JournalReplayThreadIdMismatch(2, None, None), grpc.StatusCode.DATA_LOSS),
    (e.SandboxReclaimFailed("sb", "gone"), grpc.StatusCode.UNAVAILABLE),
    (e.OffsetExpired("r1", "3", "10"), grpc.StatusCode.OUT_OF_RANGE),
    (e.HostAtCapacity("host-a", 2), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.ProviderUnreachable("r1", "kubernetes", "no kubeconfig"), grpc.StatusCode.UNAVAILABLE),
    (e.LogUnavailable("r1", "reading the log head failed"), grpc.StatusCode.UNAVAILABLE),
    (e.LogStorageFull("r1", "insufficient resources", 10023), grpc.StatusCode.UNAVAILABLE),
    (e.LogStorageFull("r1", "publish unanswered while reads answer"), grpc.StatusCode.UNAVAILABLE),
    (e.WorkspaceFenced("t1", "r1", 1, "r2", 2), grpc.StatusCode.ABORTED),
    (e.WorkspaceTooLarge(1024, 2048), grpc.StatusCode.FAILED_PRECONDITION),
    (e.SnapshotMissing("ab12", "pack gone"), grpc.StatusCode.NOT_FOUND),
    (e.ApprovalNotFound("r1", "req-1"), grpc.StatusCode.NOT_FOUND),
    (e.ApprovalAlreadyAnswered("r1", "req-1", '{"id":"req-1","decision":"deny"}'), grpc.StatusCode.ABORTED),
    (e.RunEnded("r1"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.SteerUnsupported("r1", "codex"), grpc.StatusCode.FAILED_PRECONDITION),
    (e.TooManyInputs("r1", 256), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.InputIdTaken("r1", "req-1"), grpc.StatusCode.ALREADY_EXISTS),
    (e.QueueFull("t1", 64), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (e.QueuedRunStarted("r1"), grpc.StatusCode.FAILED_PRECONDITION),
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


# --- every error class, over HTTP and gRPC, as the gateway answers it -----------

import inspect  # noqa: E402
import json  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402

import httpx  # noqa: E402

from baton.client import GatewayHTTPError, _error_from  # noqa: E402
from gateway import _errors as edge  # noqa: E402

#: One instance of every concrete domain error (the abstract roots have no row on purpose).
EVERY: dict[type[e.BatonError], e.BatonError] = {
    e.InvalidArgument: e.InvalidArgument("runId", "is required"),
    e.StoreUnavailable: e.StoreUnavailable("etcd did not answer"),
    e.StoreRefused: e.StoreRefused("RESOURCE_EXHAUSTED", "response too large"),
    e.DurableRunIdRequired: e.DurableRunIdRequired(),
    e.UnknownRun: e.UnknownRun("r1"),
    e.ThreadBusy: e.ThreadBusy("t1", "r0"),
    e.ThreadExists: e.ThreadExists("t1"),
    e.UnknownThread: e.UnknownThread("t1"),
    e.RunClaimNotAcquired: e.RunClaimNotAcquired("r1", "held"),
    e.RunIdRetired: e.RunIdRetired("r1"),
    e.RunClaimLost: e.RunClaimLost("r1", 3, "fence@4"),
    e.SessionLost: e.SessionLost(42),
    e.AppendConflict: e.AppendConflict("r1", 5, 6, ("6",)),
    e.OffsetExpired: e.OffsetExpired("r1", "3", "10"),
    e.InvalidOffset: e.InvalidOffset("abc"),
    e.JournalAttachUnavailable: e.JournalAttachUnavailable("r1", "journal-timeout"),
    e.JournalReplayDiverged: e.JournalReplayDiverged(7, None, None),
    e.JournalReplayThreadIdMismatch: e.JournalReplayThreadIdMismatch(2, None, None),
    e.SandboxBuildFailed: e.SandboxBuildFailed("pull", "no such image"),
    e.SandboxReclaimFailed: e.SandboxReclaimFailed("sb", "gone"),
    e.HostDraining: e.HostDraining("host is draining"),
    e.HostAtCapacity: e.HostAtCapacity("host-a", 2),
    e.ProviderUnreachable: e.ProviderUnreachable("r1", "kubernetes", "no kubeconfig"),
    e.LogAlreadyClosed: e.LogAlreadyClosed("r1", "completed", 1, 9),
    e.LogUnavailable: e.LogUnavailable("r1", "no answer"),
    e.LogStorageFull: e.LogStorageFull("r1", "insufficient resources", 10023),
    e.TranscriptFenced: e.TranscriptFenced("t1", "r1", 1, "r2", 2),
    e.TranscriptConflict: e.TranscriptConflict("t1", 4),
    e.WorkspaceFenced: e.WorkspaceFenced("t1", "r1", 1, "r2", 2),
    e.WorkspaceConflict: e.WorkspaceConflict("t1", None),
    e.WorkspaceTooLarge: e.WorkspaceTooLarge(1024, 2048),
    e.WorkspaceUnsafe: e.WorkspaceUnsafe("work/../x", "a '..' component"),
    e.SnapshotMissing: e.SnapshotMissing("ab12", "pack gone"),
    e.ApprovalNotFound: e.ApprovalNotFound("r1", "req-1"),
    e.ApprovalAlreadyAnswered: e.ApprovalAlreadyAnswered("r1", "req-1", '{"id":"req-1","decision":"deny"}'),
    e.RunEnded: e.RunEnded("r1"),
    e.SteerUnsupported: e.SteerUnsupported("r1", "codex"),
    e.TooManyInputs: e.TooManyInputs("r1", 256),
    e.InputIdTaken: e.InputIdTaken("r1", "req-1"),
    e.QueueFull: e.QueueFull("t1", 64),
    e.QueuedRunStarted: e.QueuedRunStarted("r1"),
}
ABSTRACT = {e.BatonError, e.ClaimError, e.DeliveryLogError, e.JournalError, e.SandboxError, e.WorkspaceError}
EDGE_SAMPLES: list[e.BatonError] = [edge.Unauthorized(), edge.MetricsForbidden(), edge.BodyTooLarge(1024),
                                    edge.NoHostAvailable(),
                                    edge.CancelWaitTimeout("r1", 5.0), edge.TooManyStarts(3, "a test")]
API_DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "api.md"


def test_every_domain_error_class_has_one_row() -> None:
    concrete = {cls for _, cls in inspect.getmembers(e, inspect.isclass)
                if issubclass(cls, e.BatonError) and cls.__module__ == e.__name__} - ABSTRACT
    assert concrete == set(EVERY)
    rows = [m.exc for m in grpc_errors.TABLE]
    assert sorted(rows, key=lambda c: c.__name__) == sorted(concrete, key=lambda c: c.__name__)  # one row each
    assert {type(x) for x in EDGE_SAMPLES} == {row[0] for row in edge.EDGE}


@pytest.mark.parametrize("exc", [*EVERY.values(), *EDGE_SAMPLES], ids=lambda x: type(x).__name__)
def test_the_same_reason_and_metadata_over_http_and_grpc(exc: e.BatonError) -> None:
    """The gateway's HTTP answer and gRPC status carry one reason; each client rebuilds the class."""
    status, body = edge.error_body(exc)
    g = edge.grpc_status(exc)
    info = next(iter(rpc_status.from_call(_FakeCall(g)).details))  # type: ignore[arg-type]
    from google.rpc import error_details_pb2
    ei = error_details_pb2.ErrorInfo()
    info.Unpack(ei)
    assert body["reason"] == ei.reason
    row = grpc_errors.mapping_for(exc)
    if row is not None:
        assert (status, g.code, ei.reason) == (row.http, row.code, row.reason)
    else:
        cls, http_status, reason, code = next(r for r in edge.EDGE if isinstance(exc, r[0]))
        assert (status, g.code.name, ei.reason) == (http_status, code, reason)
    for key, value in ei.metadata.items():
        if isinstance(exc, e.StoreUnavailable) and key == "detail":
            continue  # the message itself: HTTP's "error"
        assert str(body[key]) == value, key
    # Clients: the HTTP client and the gRPC client rebuild the same exception.
    resp = httpx.Response(status, content=json.dumps(body).encode())
    over_http = _error_from(resp, resp.content)
    over_grpc = grpc_errors.from_rpc_error(_FakeCall(g))
    if row is not None:
        assert type(over_http) is type(over_grpc) is type(exc)
    else:
        assert isinstance(over_http, GatewayHTTPError) and over_http.status == status


def test_the_documented_error_table_is_the_table() -> None:
    """docs/api.md's "Errors" table: one line per reason with its HTTP status and gRPC code."""
    text = API_DOC.read_text()
    section = text[text.index("| reason | HTTP | gRPC |"):]
    section = section[:section.index("\n\n")]
    got = {m.group(1): (int(m.group(2)), m.group(3))
           for m in re.finditer(r"^\| `(\w+)` \| (\d+) \| `(\w+)` \|", section, re.M)}
    want = {m.reason: (m.http, m.code.name) for m in grpc_errors.TABLE}
    want |= {reason: (status, code) for _cls, status, reason, code in edge.EDGE}
    assert got == want
