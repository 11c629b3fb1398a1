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


@pytest.mark.parametrize(("rec", "ops"), [
    pytest.param(record(), [E.put(LIVE, b"r1")], id="running"),
    pytest.param(record(starting=True), [E.put(K.starting(100.0, RUN), b"r1"), E.put(LIVE, b"r1")],
                 id="starting-is-live-too"),
])
def test_a_created_record_is_live_from_its_first_write(rec: RunRecord, ops: list[E.Op]) -> None:
    assert rules.creation_indexes(K, rec) == ops


@pytest.mark.parametrize(("rec", "ops"), [
    pytest.param(record(), [E.put(LIVE, b"r1")], id="running"),
    pytest.param(record(COMPLETED, finished_at=7.0), [E.put(K.ended(7.0, RUN), b"r1")], id="terminal"),
    pytest.param(record(INTERRUPTED), [], id="interrupted"),
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


FULL = [E.delete(K.run(RUN)), E.delete(ENDED), E.delete(K.thread_run(THREAD, RUN))]


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
    assert rules.expire(K, RUN, rec_kv, index_key, sb, cutoff=cutoff) == expected
