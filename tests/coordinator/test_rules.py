"""The control-plane rules as tables (no servers): claim, update, cancel, reap, presence, detach,
the thread and reclaimable indexes.

Each rule is what :meth:`RunStore.mutate` runs on a snapshot; the real-etcd tests
(test_claims.py, test_records.py, test_watch_presence.py...) prove the store applies the plan
inside one transaction. Here every row states what a snapshot means.
"""
from __future__ import annotations

from typing import Any

import pytest
from aetcd import rpc

from baton.errors import RunClaimLost, RunClaimNotAcquired, ThreadBusy, UnknownRun
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus, Takeover
from coordinator import _etcd as E
from coordinator import rules
from coordinator._keys import Keys, prefix_end
from coordinator.rules import KEEP, REAPED, Plan, Snapshot, UpdateOutcome

pytestmark = pytest.mark.unit

K = Keys("/p/")
RUN, THREAD = "r1", "t1"
RUNNING, INTERRUPTED = RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_INTERRUPTED
COMPLETED, FAILED, ABORTED = (RunStatus.RUN_STATUS_COMPLETED, RunStatus.RUN_STATUS_FAILED,
                              RunStatus.RUN_STATUS_ABORTED)
SESSION, OTHER_SESSION = 11, 12
CLAIM_REV = 7


def record(status: "RunStatus.ValueType" = RUNNING, **fields: Any) -> RunRecord:
    base: dict[str, Any] = dict(run_id=RUN, thread_id=THREAD, tenant="acme", sandbox_key="sb",
                                started_at=100.0, driver_epoch=3, driver_host="host-a")
    base.update(fields)
    return RunRecord(status=status, **base)


def snap(rec: RunRecord | None, claim: Claim | None = None, *, cached: bool = False) -> Snapshot:
    """A snapshot as etcd would give it (a claim key exists only while its lease lives)."""
    kv = None if rec is None else E.KV(key=K.run(RUN), value=rec.SerializeToString(), mod_revision=5)
    claim_kv = None if claim is None else E.KV(key=K.claim(RUN), value=claim.SerializeToString(),
                                              mod_revision=CLAIM_REV, lease=claim.session_id)
    return Snapshot(RUN, kv, rec, claim_kv, 10, b"inc", cached)


def held(epoch: int = 3, session_id: int = SESSION, purpose: str = "drive") -> Claim:
    return Claim(run_id=RUN, epoch=epoch, host_id="host-a", session_id=session_id, purpose=purpose)


def absent(key: bytes, range_end: bytes = b"") -> E.Cmp:
    return E.cmp_absent(key, range_end)


# --- claim ----------------------------------------------------------------------------------

#: state → (record, claim). "held by a dead session" is what etcd holds once the lease went:
#: the record still names the old driver, the claim key is gone with the lease.
CLAIM_STATES: dict[str, tuple[RunRecord | None, Claim | None]] = {
    "unknown": (None, None),
    "free": (record(), None),
    "interrupted-free": (record(INTERRUPTED), None),
    "held-by-live-session": (record(), held()),
    "held-by-dead-session": (record(driver_host="dead-host"), None),
    "terminal-completed": (record(COMPLETED), None),
    "terminal-failed": (record(FAILED), None),
    "terminal-aborted-and-held": (record(ABORTED), held()),
    "cancel-requested": (record(cancel_requested=True, cancel_reason="user"), None),
    "cancel-requested-and-held": (record(cancel_requested=True, cancel_reason="user"), held()),
    "unknown-but-claim-key-left": (None, held()),
}

#: (state, purpose) → granted epoch, or the refusal reason (checked in the order
#: unknown, terminal, held, cancel_requested).
CLAIM_TABLE: dict[tuple[str, str], int | str] = {
    ("unknown", "drive"): "unknown",                         ("unknown", "finalize"): "unknown",
    ("free", "drive"): 4,                                    ("free", "finalize"): 4,
    ("interrupted-free", "drive"): 4,                        ("interrupted-free", "finalize"): 4,
    ("held-by-live-session", "drive"): "held",               ("held-by-live-session", "finalize"): "held",
    ("held-by-dead-session", "drive"): 4,                    ("held-by-dead-session", "finalize"): 4,
    ("terminal-completed", "drive"): "terminal",             ("terminal-completed", "finalize"): "terminal",
    ("terminal-failed", "drive"): "terminal",                ("terminal-failed", "finalize"): "terminal",
    ("terminal-aborted-and-held", "drive"): "terminal",      ("terminal-aborted-and-held", "finalize"): "terminal",
    ("cancel-requested", "drive"): "cancel_requested",       ("cancel-requested", "finalize"): 4,
    ("cancel-requested-and-held", "drive"): "held",          ("cancel-requested-and-held", "finalize"): "held",
    ("unknown-but-claim-key-left", "drive"): "unknown",      ("unknown-but-claim-key-left", "finalize"): "unknown",
}


def test_claim_table_covers_every_state_and_purpose() -> None:
    assert set(CLAIM_TABLE) == {(s, p) for s in CLAIM_STATES for p in rules.PURPOSES}


@pytest.mark.parametrize(("state", "purpose", "expected"), [(s, p, e) for (s, p), e in CLAIM_TABLE.items()],
                         ids=[f"{s}-{p}" for s, p in CLAIM_TABLE])
def test_claim_rule(state: str, purpose: str, expected: int | str) -> None:
    rec, claim = CLAIM_STATES[state]
    s = snap(rec, claim)
    if isinstance(expected, str):
        with pytest.raises(RunClaimNotAcquired) as ei:
            rules.claim(s, keys=K, session_id=SESSION, host_id="host-b", purpose=purpose)
        assert (ei.value.run_id, ei.value.reason) == (RUN, expected)
        return
    plan = rules.claim(s, keys=K, session_id=SESSION, host_id="host-b", purpose=purpose, now=1234.5)
    assert rec is not None
    want = RunRecord()
    want.CopyFrom(rec)
    want.driver_epoch, want.driver_host = expected, "host-b"
    # A claim after an earlier one is a takeover: the successor's side is stamped.
    want.last_takeover.CopyFrom(Takeover(from_epoch=rec.driver_epoch, from_host=rec.driver_host,
                                         to_host="host-b", claimed_at=1234.5))
    assert plan.result == (expected, want) and plan.new == want and plan.write
    stored = Claim(run_id=RUN, epoch=expected, host_id="host-b", session_id=SESSION, purpose=purpose)
    value = stored.SerializeToString()
    # The claim key must still be absent inside the write, and goes under the session's lease.
    assert list(plan.cmps) == [absent(K.claim(RUN))]
    assert list(plan.ops) == [E.put(K.claim(RUN), value, SESSION)]
    assert plan.claim == E.KV(key=K.claim(RUN), value=value, lease=SESSION)
    assert rec.driver_epoch == 3  # the snapshot is not modified


@pytest.mark.parametrize(("state", "expected"), [
    ("starting", "starting"), ("starting-and-held", "starting"), ("terminal-starting", "terminal"),
    ("unknown", "unknown"), ("started", 4)])
def test_an_attach_claim_refuses_a_run_still_starting(state: str, expected: int | str) -> None:
    """``require_started`` (AttachRun's claim): a run whose StartRun has not made its input
    durable is refused inside the write, after unknown and terminal; StartRun's own claim
    (without it) still takes it."""
    rec, claim = {
        "starting": (record(starting=True), None), "starting-and-held": (record(starting=True), held()),
        "terminal-starting": (record(COMPLETED, starting=True), None), "unknown": (None, None),
        "started": (record(), None),
    }[state]
    if isinstance(expected, str):
        with pytest.raises(RunClaimNotAcquired) as ei:
            rules.claim(snap(rec, claim), keys=K, session_id=SESSION, host_id="h", purpose="drive",
                        require_started=True)
        assert ei.value.reason == expected
    else:
        plan = rules.claim(snap(rec, claim), keys=K, session_id=SESSION, host_id="h", purpose="drive",
                           require_started=True)
        assert plan.result[0] == expected
    if state == "starting":
        assert rules.claim(snap(rec), keys=K, session_id=SESSION, host_id="h", purpose="drive").result[0] == 4


def test_claim_from_a_stale_cache_that_still_shows_a_dead_claim_is_refused_for_a_fresh_read() -> None:
    """The rule cannot know liveness; mutate re-reads a cached snapshot before refusing."""
    with pytest.raises(RunClaimNotAcquired) as ei:
        rules.claim(snap(record(), held(), cached=True), keys=K, session_id=SESSION, host_id="h",
                    purpose="drive")
    assert ei.value.reason == "held"


# --- update ---------------------------------------------------------------------------------

PATCHES: dict[str, tuple[RunRecord, list[str]]] = {
    "sandbox": (RunRecord(sandbox_key="sb2"), ["sandbox_key"]),
    "completed": (RunRecord(status=COMPLETED, finished_at=200.0), ["status", "finished_at"]),
}
#: writer → (session id it writes with, claim in etcd). The claim is at epoch 3 = driver_epoch.
WRITERS: dict[str, tuple[int, Claim | None]] = {
    "plain": (0, held()),               # not an owner write (no session): no claim check
    "owner": (SESSION, held()),
    "claim-gone": (SESSION, None),
    "other-session": (SESSION, held(session_id=OTHER_SESSION)),
}
EPOCH = {"lower": 2, "equal": 3, "higher": 4}

A, AC, S = "applied", "applied+claim-compare", "suppressed"
LOST_GONE, LOST_3 = "lost:claim-gone", "lost:epoch@3"

#: (patch, writer epoch vs driver_epoch, writer) → outcome. A terminal status below the
#: record's epoch is a stale driver's last word: suppressed before anything else is looked at.
UPDATE_TABLE: dict[tuple[str, str, str], str] = {
    ("sandbox", "lower", "plain"): A,    ("sandbox", "lower", "owner"): LOST_3,
    ("sandbox", "lower", "claim-gone"): LOST_GONE, ("sandbox", "lower", "other-session"): LOST_3,
    ("sandbox", "equal", "plain"): A,    ("sandbox", "equal", "owner"): AC,
    ("sandbox", "equal", "claim-gone"): LOST_GONE, ("sandbox", "equal", "other-session"): LOST_3,
    ("sandbox", "higher", "plain"): A,   ("sandbox", "higher", "owner"): LOST_3,
    ("sandbox", "higher", "claim-gone"): LOST_GONE, ("sandbox", "higher", "other-session"): LOST_3,
    ("completed", "lower", "plain"): S,  ("completed", "lower", "owner"): S,
    ("completed", "lower", "claim-gone"): S, ("completed", "lower", "other-session"): S,
    ("completed", "equal", "plain"): A,  ("completed", "equal", "owner"): AC,
    ("completed", "equal", "claim-gone"): LOST_GONE, ("completed", "equal", "other-session"): LOST_3,
    ("completed", "higher", "plain"): A, ("completed", "higher", "owner"): LOST_3,
    ("completed", "higher", "claim-gone"): LOST_GONE, ("completed", "higher", "other-session"): LOST_3,
}


def test_update_table_covers_every_combination() -> None:
    assert set(UPDATE_TABLE) == {(p, e, w) for p in PATCHES for e in EPOCH for w in WRITERS}


@pytest.mark.parametrize(("patch", "rel", "writer", "expected"),
                         [(*k, v) for k, v in UPDATE_TABLE.items()], ids=["-".join(k) for k in UPDATE_TABLE])
def test_update_rule(patch: str, rel: str, writer: str, expected: str) -> None:
    cur = record()
    body, paths = PATCHES[patch]
    session_id, claim = WRITERS[writer]
    s = snap(cur, claim)

    def run() -> Plan[tuple[UpdateOutcome, RunRecord | None]]:
        return rules.update(s, keys=K, patch=body, paths=paths, epoch=EPOCH[rel], session_id=session_id)

    if expected.startswith("lost:"):
        with pytest.raises(RunClaimLost) as ei:
            run()
        assert (ei.value.run_id, ei.value.held_epoch, ei.value.observed) == (RUN, EPOCH[rel], expected[5:])
        return
    plan = run()
    if expected == S:
        assert plan.result == (UpdateOutcome.SUPPRESSED, cur) and not plan.write
        return
    want = RunRecord()
    want.CopyFrom(cur)
    want.MergeFrom(body)
    assert plan.result == (UpdateOutcome.APPLIED, want) and plan.new == want and plan.write
    # An owner write compares the claim key's revision inside the transaction.
    assert list(plan.cmps) == ([E.cmp_mod(K.claim(RUN), CLAIM_REV)] if expected == AC else [])
    assert list(plan.ops) == []


@pytest.mark.parametrize(("cur", "patch", "paths", "epoch", "expected"), [
    pytest.param(None, RunRecord(status=COMPLETED), ["status"], 9, UpdateOutcome.UNKNOWN_RUN, id="unknown-run"),
    # Only a status path can be suppressed: a stale driver's other fields are plain writes.
    pytest.param(record(), RunRecord(status=COMPLETED, finished_at=1.0), ["finished_at"], 1,
                 UpdateOutcome.APPLIED, id="terminal-value-but-status-not-in-mask"),
    # interrupted (a HITL pause) is not terminal: never suppressed.
    pytest.param(record(), RunRecord(status=INTERRUPTED), ["status"], 1, UpdateOutcome.APPLIED,
                 id="stale-interrupted-is-applied"),
    pytest.param(record(), RunRecord(status=FAILED), ["status"], 1, UpdateOutcome.SUPPRESSED, id="stale-failed"),
    pytest.param(record(), RunRecord(status=ABORTED), ["status"], 2, UpdateOutcome.SUPPRESSED, id="stale-aborted"),
    # The record being terminal already does not refuse an update (the store keeps no such rule).
    pytest.param(record(COMPLETED), RunRecord(finished_at=5.0), ["finished_at"], 3, UpdateOutcome.APPLIED,
                 id="terminal-record-plain-update"),
    pytest.param(record(COMPLETED), RunRecord(status=FAILED), ["status"], 2, UpdateOutcome.SUPPRESSED,
                 id="terminal-record-stale-terminal"),
    # An epoch-0 writer (no claim ever) on an unclaimed run (driver_epoch 0) is not stale.
    pytest.param(record(driver_epoch=0), RunRecord(status=COMPLETED), ["status"], 0, UpdateOutcome.APPLIED,
                 id="unclaimed-run-epoch-0"),
])
def test_update_edges(cur: RunRecord | None, patch: RunRecord, paths: list[str], epoch: int,
                      expected: UpdateOutcome) -> None:
    plan = rules.update(snap(cur), keys=K, patch=patch, paths=paths, epoch=epoch, session_id=0)
    assert plan.result[0] is expected
    assert plan.write is (expected is UpdateOutcome.APPLIED)


def test_update_clears_a_path_unset_in_the_patch() -> None:
    plan = rules.update(snap(record(detached_since=5.0)), keys=K, patch=RunRecord(), paths=["detached_since"],
                        epoch=3, session_id=0)
    assert plan.new is not None and not plan.new.HasField("detached_since")


@pytest.mark.parametrize(("claim", "session_id", "epoch", "expected"), [
    (None, SESSION, 3, False),
    (held(), SESSION, 3, True),
    (held(), OTHER_SESSION, 3, False),
    (held(), SESSION, 2, False),
    (held(), SESSION, 4, False),
])
def test_holds(claim: Claim | None, session_id: int, epoch: int, expected: bool) -> None:
    assert rules.holds(claim, session_id, epoch) is expected


# --- thread index (THREAD_BUSY) and reclaimable index ------------------------------------------

ACTIVE = K.thread_active(THREAD)


def _active(run_id: str, rev: int = 8) -> E.KV:
    return E.KV(key=ACTIVE, value=run_id.encode(), mod_revision=rev)


@pytest.mark.parametrize(("old", "new", "active", "cmps", "ops"), [
    # Entering running with the index free claims it (compare: still absent).
    pytest.param(record(INTERRUPTED), record(), None, [absent(ACTIVE)], [E.put(ACTIVE, RUN.encode())],
                 id="enter-running-index-free"),
    pytest.param(record(INTERRUPTED), record(), _active(RUN), [], [], id="enter-running-index-already-here"),
    # Leaving running releases the index only when it names this run.
    pytest.param(record(), record(COMPLETED), _active(RUN), [E.cmp_mod(ACTIVE, 8)], [E.delete(ACTIVE)],
                 id="leave-running-index-here"),
    pytest.param(record(), record(COMPLETED), _active("newer"), [], [], id="leave-running-index-of-newer-run"),
    pytest.param(record(), record(INTERRUPTED), None, [], [], id="leave-running-index-absent"),
    # Staying running never touches (nor reads) the thread index.
    pytest.param(record(), record(sandbox_key="x"), _active("other"), [], [], id="stay-running"),
    pytest.param(record(COMPLETED), record(FAILED), None, [], [], id="stay-terminal"),
])
def test_thread_index(old: RunRecord, new: RunRecord, active: E.KV | None, cmps: list[E.Cmp],
                      ops: list[E.Op]) -> None:
    got_cmps, got_ops = rules.index_changes(K, old, new, active)
    assert (got_cmps, [op for op in got_ops if ACTIVE in (op.request_put.key, op.request_delete_range.key)]) \
        == (cmps, ops)


def test_entering_running_while_another_run_of_the_thread_runs_is_thread_busy() -> None:
    assert rules.enters_or_leaves_running(record(INTERRUPTED), record())
    with pytest.raises(ThreadBusy) as ei:
        rules.index_changes(K, record(INTERRUPTED), record(), _active("r-other"))
    assert (ei.value.thread_id, ei.value.active_run_id) == (THREAD, "r-other")


@pytest.mark.parametrize(("old", "new", "ops"), [
    pytest.param(record(), record(detached_since=50.0), [E.put(K.reclaimable(50.0, RUN), RUN.encode())],
                 id="detach"),
    pytest.param(record(detached_since=50.0), record(), [E.delete(K.reclaimable(50.0, RUN))], id="reattach"),
    pytest.param(record(detached_since=50.0), record(COMPLETED, detached_since=50.0),
                 [E.delete(K.reclaimable(50.0, RUN))], id="detached-run-ends"),
    pytest.param(record(detached_since=50.0), record(detached_since=60.0),
                 [E.delete(K.reclaimable(50.0, RUN)), E.put(K.reclaimable(60.0, RUN), RUN.encode())],
                 id="detached-again-later"),
    pytest.param(record(detached_since=50.0), record(detached_since=50.0, cancel_requested=True), [],
                 id="detached-unchanged"),
    pytest.param(record(INTERRUPTED), record(INTERRUPTED, detached_since=50.0), [], id="not-running-never-indexed"),
])
def test_reclaimable_index(old: RunRecord, new: RunRecord, ops: list[E.Op]) -> None:
    active = _active(RUN) if old.status == RUNNING else None
    cmps, got = rules.index_changes(K, old, new, active)
    assert [op for op in got if (op.request_put.key or op.request_delete_range.key).startswith(
        K.reclaimable_prefix)] == ops


# --- cancel ---------------------------------------------------------------------------------

@pytest.mark.parametrize(("cur", "written"), [
    pytest.param(record(), "user", id="running"),
    pytest.param(record(INTERRUPTED), "user", id="interrupted"),
    pytest.param(record(cancel_requested=True, cancel_reason="user"), None, id="already-for-this-reason"),
    pytest.param(record(cancel_requested=True, cancel_reason="disconnected"), "user", id="other-reason-replaced"),
    pytest.param(record(COMPLETED), None, id="completed"),
    pytest.param(record(ABORTED, cancel_requested=True, cancel_reason="x"), None, id="aborted"),
])
def test_request_cancel(cur: RunRecord, written: str | None) -> None:
    plan = rules.request_cancel(snap(cur), reason="user")
    if written is None:
        assert not plan.write and plan.result == cur
        return
    want = RunRecord()
    want.CopyFrom(cur)
    want.cancel_requested, want.cancel_reason = True, written
    assert plan.write and plan.new == want and plan.result == want
    assert want.status == cur.status  # a cancel writes no status; the driver ends the run


def test_request_cancel_of_unknown_run() -> None:
    with pytest.raises(UnknownRun):
        rules.request_cancel(snap(None), reason="user")


@pytest.mark.parametrize(("cur", "result", "writes"), [
    pytest.param(None, "unknown", False, id="gone"),
    pytest.param(record(COMPLETED, detached_since=50.0), "unknown", False, id="terminal"),
    pytest.param(record(INTERRUPTED, detached_since=50.0), "unknown", False, id="interrupted"),
    pytest.param(record(), "not-claimed", False, id="reader-came-back"),
    pytest.param(record(detached_since=60.0), "not-claimed", False, id="detached-again-later"),
    pytest.param(record(detached_since=50.0), None, True, id="still-detached-as-listed"),
    pytest.param(record(detached_since=50.0, cancel_requested=True, cancel_reason="user"), None, True,
                 id="cancelled-for-another-reason"),
    pytest.param(record(detached_since=50.0, cancel_requested=True, cancel_reason=REAPED), None, False,
                 id="already-reaped"),
])
def test_reap_cancel(cur: RunRecord | None, result: str | None, writes: bool) -> None:
    plan = rules.reap_cancel(snap(cur), listed_detached_since=50.0)
    assert plan.result == result and plan.write is writes
    if writes:
        assert plan.new is not None and (plan.new.cancel_requested, plan.new.cancel_reason) == (True, REAPED)
        assert plan.new.detached_since == 50.0


# --- presence -------------------------------------------------------------------------------

READERS = K.readers(RUN)


@pytest.mark.parametrize(("cur", "clears"), [
    pytest.param(None, False, id="no-record"),
    pytest.param(record(), False, id="attached"),
    pytest.param(record(detached_since=50.0), True, id="detached"),
    pytest.param(record(COMPLETED, detached_since=50.0), True, id="terminal-detached"),
])
def test_register_reader(cur: RunRecord | None, clears: bool) -> None:
    plan = rules.register_reader(snap(cur), keys=K, reader_id="g1", session_id=SESSION)
    assert plan.write and list(plan.ops) == [E.put(K.reader(RUN, "g1"), b"", SESSION)]
    if clears:
        assert cur is not None and plan.new is not None and not plan.new.HasField("detached_since")
        assert plan.new.status == cur.status
    else:
        assert plan.new is None  # only the reader key (the record's revision is still compared)


@pytest.mark.parametrize(("cur", "written"), [
    pytest.param(None, None, id="no-record"),
    pytest.param(record(INTERRUPTED), None, id="interrupted"),
    pytest.param(record(COMPLETED), None, id="terminal"),
    pytest.param(record(detached_since=50.0), None, id="already-detached"),
    pytest.param(record(), (False, ""), id="running"),
    pytest.param(record(cancel_on_disconnect=True), (True, "disconnected"), id="cancel-on-disconnect"),
    pytest.param(record(cancel_on_disconnect=True, cancel_requested=True, cancel_reason="user"), (True, "user"),
                 id="cancel-on-disconnect-already-cancelled"),
    pytest.param(record(cancel_requested=True, cancel_reason="user"), (True, "user"), id="cancelled-detaches"),
])
def test_detach(cur: RunRecord | None, written: tuple[bool, str] | None) -> None:
    plan = rules.detach(snap(cur), keys=K, now=77.0)
    if written is None:
        assert not plan.write and plan.result is None
        return
    assert plan.write and plan.new is not None and plan.result == plan.new
    assert plan.new.detached_since == 77.0
    assert (plan.new.cancel_requested, plan.new.cancel_reason) == written
    # "No reader" is compared inside the write; a failure with a reader present gives up.
    assert list(plan.cmps) == [absent(READERS, prefix_end(READERS))]
    assert list(plan.failure) == [E.get(READERS, prefix_end(READERS), count_only=True)]
    assert plan.give_up is not None
    reads = [rpc.ResponseOp(response_range=rpc.RangeResponse())] * rules.FAILURE_READS

    def failed(readers: int) -> E.TxnResult:
        return E.TxnResult(False, 11, [*reads, rpc.ResponseOp(response_range=rpc.RangeResponse(count=readers))])

    assert plan.give_up(failed(1)) and not plan.give_up(failed(0))


def test_plans_keep_the_claim_key_unless_they_say_so() -> None:
    assert rules.request_cancel(snap(record()), reason="x").claim is KEEP
    assert rules.detach(snap(record()), keys=K, now=1.0).claim is KEEP
