"""Pure rules of start atomicity, without servers: HTTP mapping of a failed
start, who may drive a ``starting`` run, and that ``starting`` is only ever cleared."""
from __future__ import annotations

import pytest

from baton import errors as e
from baton.v1 import runs_pb2
from baton.v1.runs_pb2 import Claim, RunRecord
from coordinator._records import apply_mask, is_starting
from coordinator.failover import orphaned
from gateway._errors import StartFailed, error_body
from gateway._takeover import decide

RUNNING = runs_pb2.RUN_STATUS_RUNNING


def test_log_outage_at_start_is_503_log_unavailable_and_says_the_run_exists() -> None:
    status, body = error_body(StartFailed(e.LogUnavailable("r1", "reading the log head failed"), True))
    assert status == 503
    assert body["reason"] == "LOG_UNAVAILABLE" and body["runExists"] is True and body["run_id"] == "r1"
    status, body = error_body(StartFailed(e.StoreUnavailable("etcd down"), None))
    assert (status, body["reason"], body["runExists"]) == (503, "STORE_UNAVAILABLE", None)
    assert error_body(e.LogUnavailable("r1", "x"))[0] == 503


@pytest.mark.parametrize("record, claim, want", [
    (RunRecord(status=RUNNING, driver_epoch=1, starting=True), None, "starting"),
    (RunRecord(status=RUNNING, driver_epoch=1, starting=True, cancel_requested=True), None, "finalize"),
    (RunRecord(status=RUNNING, driver_epoch=1), None, "takeover"),
    (RunRecord(status=RUNNING, driver_epoch=1, starting=True), Claim(epoch=1), "claimed"),
])
def test_gateway_takeover_never_drives_a_starting_run(record: RunRecord, claim: Claim | None, want: str) -> None:
    assert decide(record, claim) == want


@pytest.mark.parametrize("record, claim, want", [
    (RunRecord(status=RUNNING, driver_epoch=1, starting=True), None, False),  # input not durable
    (RunRecord(status=RUNNING, driver_epoch=0), None, False),                 # never claimed
    (RunRecord(status=RUNNING, driver_epoch=1), Claim(epoch=1), False),       # driven
    (RunRecord(status=runs_pb2.RUN_STATUS_COMPLETED, driver_epoch=1), None, False),
    (RunRecord(status=RUNNING, driver_epoch=1), None, True),
])
def test_failover_hands_over_only_started_orphans(record: RunRecord, claim: Claim | None, want: bool) -> None:
    assert orphaned(record, claim) is want


def test_starting_is_only_ever_cleared() -> None:
    cur = RunRecord(run_id="r", status=RUNNING, starting=True)
    assert is_starting(cur)
    cleared = apply_mask(cur, RunRecord(starting=False), ["starting"])
    assert not cleared.starting and not is_starting(cleared)
    with pytest.raises(e.InvalidArgument):
        apply_mask(cleared, RunRecord(starting=True), ["starting"])
    assert not is_starting(RunRecord(status=runs_pb2.RUN_STATUS_ABORTED, starting=True))
