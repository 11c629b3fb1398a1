"""The live/ended index and retention rules, table-tested without servers (docs/design.md §3.5)."""
from __future__ import annotations

from typing import Any

import pytest

from baton.v1.coordinator_pb2 import SandboxInstance
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator import _etcd as E
from coordinator import rules
from coordinator._keys import Keys

K = Keys("/p/")
RUN, THREAD = "r1", "t1"
RUNNING, INTERRUPTED = RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_INTERRUPTED
COMPLETED, ABORTED = RunStatus.RUN_STATUS_COMPLETED, RunStatus.RUN_STATUS_ABORTED
LIVE = K.live(RUN)


def record(status: "RunStatus.ValueType" = RUNNING, **fields: Any) -> RunRecord:
    base: dict[str, Any] = dict(run_id=RUN, thread_id=THREAD, tenant="acme", sandbox_key="sb",
                                started_at=100.0, driver_epoch=3)
    base.update(fields)
    return RunRecord(status=status, **base)


def _volume_ops(ops: list[E.Op]) -> list[E.Op]:
    """The ops on the live and ended indexes."""
    return [op for op in ops if (op.request_put.key or op.request_delete_range.key).startswith(
        (K.live_prefix, K.ended_prefix))]


@pytest.mark.parametrize(("old", "new", "ops"), [
    pytest.param(record(INTERRUPTED), record(), [E.put(LIVE, b"r1")], id="resume-enters-live"),
    pytest.param(record(), record(INTERRUPTED), [E.delete(LIVE)], id="interrupt-leaves-live"),
    pytest.param(record(), record(COMPLETED, finished_at=200.0),
                 [E.delete(LIVE), E.put(K.ended(200.0, RUN), b"r1")], id="end-moves-live-to-ended"),
    pytest.param(record(), record(ABORTED), [E.delete(LIVE), E.put(K.ended(100.0, RUN), b"r1")],
                 id="end-without-finished_at-ages-from-start"),
    pytest.param(record(), record(detached_since=5.0), [], id="stay-running"),
    pytest.param(record(COMPLETED, finished_at=200.0), record(COMPLETED, finished_at=200.0, cancel_requested=True), [],
                 id="stay-ended"),
    pytest.param(record(COMPLETED, finished_at=200.0), record(COMPLETED, finished_at=300.0),
                 [E.delete(K.ended(200.0, RUN)), E.put(K.ended(300.0, RUN), b"r1")], id="ended-restamped"),
    pytest.param(record(INTERRUPTED), record(INTERRUPTED, cancel_requested=True), [], id="interrupted-in-neither"),
])
def test_live_and_ended_indexes_follow_the_status(old: RunRecord, new: RunRecord, ops: list[E.Op]) -> None:
    active = E.KV(key=K.thread_active(THREAD), value=b"r1", mod_revision=4) if old.status == RUNNING else None
    _cmps, got = rules.index_changes(K, old, new, active)
    assert _volume_ops(got) == ops


#: The run's four listing entries: every run's and its tenant's, oldest and newest first.
LISTED = [K.started(None, 100.0, RUN), K.started(None, 100.0, RUN, True),
          K.started("acme", 100.0, RUN), K.started("acme", 100.0, RUN, True)]
LIST_PUTS = [E.put(key, b"r1") for key in LISTED]


@pytest.mark.parametrize(("rec", "ops"), [
    pytest.param(record(), [E.put(LIVE, b"r1"), *LIST_PUTS], id="running"),
    pytest.param(record(starting=True), [E.put(K.starting(100.0, RUN), b"r1"), E.put(LIVE, b"r1"), *LIST_PUTS],
                 id="starting-is-live-too"),
    pytest.param(record(tenant=""), [E.put(LIVE, b"r1"), *LIST_PUTS[:2]], id="no-tenant-only-in-every-runs-listing"),
])
def test_a_created_record_is_live_and_listed_from_its_first_write(rec: RunRecord, ops: list[E.Op]) -> None:
    assert rules.creation_indexes(K, rec) == ops


def test_listing_entries_sort_by_start_time_both_ways() -> None:
    early, late = K.started("acme", 100.0, "zz"), K.started("acme", 100.5, "aa")
    assert early < late
    assert K.started("acme", 100.0, "zz", True) > K.started("acme", 100.5, "aa", True)
    assert K.run_id_of_started(K.started(None, 1.0, "a/b%c", True)) == "a/b%c"
    # Another tenant's entries are outside the tenant's range.
    scope = K.started_scope("acme")
    assert not K.started("acme2", 100.0, RUN).startswith(scope)


def test_a_rewritten_start_time_moves_the_listing_entries() -> None:
    _cmps, ops = rules.index_changes(K, record(), record(started_at=150.0), None)
    moved = [op for op in ops if (op.request_put.key or op.request_delete_range.key).startswith(K.prefix.encode() + b"started/")]
    assert moved == [op for old, new in zip(LISTED, [K.started(None, 150.0, RUN), K.started(None, 150.0, RUN, True),
                                                     K.started("acme", 150.0, RUN), K.started("acme", 150.0, RUN, True)])
                     for op in (E.delete(old), E.put(new, b"r1"))]


@pytest.mark.parametrize(("rec", "ops"), [
    pytest.param(record(), [*LIST_PUTS, E.put(LIVE, b"r1")], id="running"),
    pytest.param(record(COMPLETED, finished_at=7.0), [*LIST_PUTS, E.put(K.ended(7.0, RUN), b"r1")], id="terminal"),
    pytest.param(record(INTERRUPTED), LIST_PUTS, id="interrupted"),
])
def test_backfill_puts_what_the_status_calls_for(rec: RunRecord, ops: list[E.Op]) -> None:
    assert rules.backfill_indexes(K, rec) == ops


# --- retention ------------------------------------------------------------------------------

ENDED = K.ended(200.0, RUN)


def kv(rec: RunRecord, rev: int = 9) -> E.KV:
    return E.KV(key=K.run(RUN), value=rec.SerializeToString(), mod_revision=rev)


def sandbox(run_id: str, rev: int = 4) -> E.KV:
    return E.KV(key=K.sandbox("sb"), value=SandboxInstance(sandbox_key="sb", run_id=run_id).SerializeToString(),
                mod_revision=rev)


FULL = [E.delete(K.run(RUN)), E.delete(ENDED), E.delete(K.thread_run(THREAD, RUN)),
        *(E.delete(key) for key in LISTED), E.put(K.retired(RUN), THREAD.encode(), 77)]


@pytest.mark.parametrize(("rec_kv", "index_key", "sb", "cutoff", "expected"), [
    pytest.param(kv(record(COMPLETED, finished_at=200.0)), ENDED, None, 200.0,
                 ([E.cmp_mod(K.run(RUN), 9)], FULL), id="old-enough-inclusive"),
    pytest.param(kv(record(COMPLETED, finished_at=200.0)), ENDED, None, 199.9, None, id="too-young"),
    pytest.param(kv(record(COMPLETED, finished_at=200.0)), ENDED, sandbox(RUN), 300.0,
                 ([E.cmp_mod(K.run(RUN), 9), E.cmp_mod(K.sandbox("sb"), 4)], [*FULL, E.delete(K.sandbox("sb"))]),
                 id="own-sandbox-entry-goes-too"),
    pytest.param(kv(record(COMPLETED, finished_at=200.0)), ENDED, sandbox("r2"), 300.0,
                 ([E.cmp_mod(K.run(RUN), 9)], FULL), id="sandbox-taken-over-by-a-later-run-stays"),
    pytest.param(None, ENDED, None, 300.0, ([E.cmp_absent(K.run(RUN))], [E.delete(ENDED)]),
                 id="record-gone-stale-entry"),
    pytest.param(kv(record()), ENDED, None, 300.0, ([E.cmp_mod(K.run(RUN), 9)], [E.delete(ENDED)]),
                 id="running-again-stale-entry"),
    pytest.param(kv(record(COMPLETED, finished_at=250.0)), ENDED, None, 300.0,
                 ([E.cmp_mod(K.run(RUN), 9)], [E.delete(ENDED)]), id="restamped-stale-entry"),
])
def test_expire(rec_kv: E.KV | None, index_key: bytes, sb: E.KV | None, cutoff: float,
                expected: tuple[list[E.Cmp], list[E.Op]] | None) -> None:
    assert rules.expire(K, RUN, rec_kv, index_key, sb, cutoff=cutoff, retired_lease=77) == expected
