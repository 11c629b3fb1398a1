"""The delivery-log errors round-trip through the one gRPC table with their data."""
from __future__ import annotations

import grpc
import pytest

from baton import errors as e
from baton import grpc_errors
from tests.test_errors_table import _FakeCall


@pytest.mark.parametrize("exc,code", [
    (e.LogAlreadyClosed("r1", "completed", 2, 41), grpc.StatusCode.FAILED_PRECONDITION),
    (e.LogUnavailable("r1", "publish not acknowledged"), grpc.StatusCode.UNAVAILABLE),
    (e.AppendConflict("r1", 5, 7, ("4", "5")), grpc.StatusCode.ABORTED),
    (e.AppendConflict("r1", 5, 7), grpc.StatusCode.ABORTED),
    (e.TranscriptConflict("t1", 12), grpc.StatusCode.ABORTED),
    (e.TranscriptConflict("t1", None), grpc.StatusCode.ABORTED),
    (e.TranscriptFenced("t1", "r1", 1, "r1", 2), grpc.StatusCode.ABORTED),
], ids=lambda x: type(x).__name__)
def test_log_errors_round_trip(exc: e.BatonError, code: grpc.StatusCode) -> None:
    status = grpc_errors.to_status(exc)
    assert status.code == code
    back = grpc_errors.from_rpc_error(_FakeCall(status))
    assert type(back) is type(exc)
    assert vars(back) == vars(exc)
