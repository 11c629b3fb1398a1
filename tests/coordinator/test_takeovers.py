"""The takeover rules as tables (no servers): why a claim went, and how the leader's note and
the successor's claim meet on ``last_takeover`` in either order (coordinator/takeovers.py).

The real-server side (a SIGKILLed host's run noted ``crash``, a drained one ``drain``) is in
tests/cli/test_operator.py.
"""
from __future__ import annotations

import pytest

from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus, Takeover
from coordinator import takeovers as T

pytestmark = pytest.mark.unit

RUNNING = RunStatus.RUN_STATUS_RUNNING
LOST = Claim(run_id="r1", epoch=2, host_id="host-a", session_id=11, purpose="drive")


def host(session_id: int = 11, draining: bool = False) -> HostInfo:
    return HostInfo(host_id="host-a", address="127.0.0.1:1", session_id=session_id, draining=draining)


@pytest.mark.parametrize(("session_alive", "registered", "note", "cause"), [
    (False, None, b"crash", "crash"),          # fast failover noted it before revoking
    (False, None, b"closed", "closed"),        # CloseSession noted it
    (False, None, b"", "session-lost"),        # the TTL ran out: paused, partitioned, or dead unseen
    (True, host(draining=True), b"", "drain"),
    (True, host(), b"", "released"),
    (True, None, b"", "released"),
    # The host re-registered under a new session and drains that one: not this claim's drain.
    (True, host(session_id=99, draining=True), b"", "released"),
])
def test_classify(session_alive: bool, registered: HostInfo | None, note: bytes, cause: str) -> None:
    assert T.classify(LOST, session_alive=session_alive, host=registered, session_end=note) == cause


def rec(epoch: int = 2, driver: str = "host-a", status: "RunStatus.ValueType" = RUNNING,
        takeover: Takeover | None = None, starting: bool = False) -> RunRecord:
    r = RunRecord(run_id="r1", thread_id="t1", status=status, driver_epoch=epoch, driver_host=driver,
                  starting=starting)
    if takeover is not None:
        r.last_takeover.CopyFrom(takeover)
    return r


def claimed(cur: RunRecord, host_id: str, now: float) -> RunRecord:
    new = RunRecord()
    new.CopyFrom(cur)
    new.driver_epoch, new.driver_host = cur.driver_epoch + 1, host_id
    T.stamp_claim(cur, new, host_id, now)
    return new


FULL = Takeover(from_epoch=2, from_host="host-a", to_host="host-b", cause="crash", lost_at=10.0, claimed_at=10.4)


def test_note_then_claim() -> None:
    noted = T.after_loss(rec(), LOST, "crash", 10.0)
    assert noted is not None
    assert noted.last_takeover == Takeover(from_epoch=2, from_host="host-a", cause="crash", lost_at=10.0)
    assert claimed(noted, "host-b", 10.4).last_takeover == FULL


def test_claim_then_note() -> None:
    first = claimed(rec(), "host-b", 10.4)
    assert first.last_takeover == Takeover(from_epoch=2, from_host="host-a", to_host="host-b", claimed_at=10.4)
    noted = T.after_loss(first, LOST, "crash", 10.0)
    assert noted is not None and noted.last_takeover == FULL
    assert T.after_loss(noted, LOST, "crash", 10.0) is None  # the same deletion seen again


def test_first_claim_is_no_takeover() -> None:
    assert not claimed(rec(epoch=0, driver=""), "host-b", 1.0).HasField("last_takeover")


@pytest.mark.parametrize("cur", [
    None,
    rec(status=RunStatus.RUN_STATUS_COMPLETED),    # released at the end: no takeover
    rec(status=RunStatus.RUN_STATUS_INTERRUPTED),  # a HITL pause lets the claim go
    rec(starting=True),
    rec(epoch=4),                                  # moved on twice since
    # claimed again, but the claim stamped another loss (not this one)
    rec(epoch=3, takeover=Takeover(from_epoch=1, from_host="host-z", to_host="host-a")),
])
def test_loss_not_noted(cur: RunRecord | None) -> None:
    assert T.after_loss(cur, LOST, "crash", 10.0) is None
