"""Run-record rules of docs/design.md §3.1, one test each, against a real etcd."""
from __future__ import annotations

import time

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient, UpdateOutcome
from baton.v1.runs_pb2 import AgentSpec, RunError, RunRecord, RunStatus, Usage
from coordinator._store import RunStore
from tests.conftest import unique

RUNNING, COMPLETED, FAILED, ABORTED, INTERRUPTED = (
    RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_COMPLETED, RunStatus.RUN_STATUS_FAILED,
    RunStatus.RUN_STATUS_ABORTED, RunStatus.RUN_STATUS_INTERRUPTED)


def _store(coord) -> RunStore:  # type: ignore[no-untyped-def]
    return coord.server.store


async def _new(cc: CoordinatorClient, thread: str | None = None, **fields) -> RunRecord:  # type: ignore[no-untyped-def]
    rec, created = await cc.create_or_resume_run(
        RunRecord(run_id=unique("run-"), thread_id=thread or unique("th-"), **fields))
    assert created
    return rec


async def test_create_makes_a_running_record_with_started_at(cc: CoordinatorClient) -> None:
    rec, created = await cc.create_or_resume_run(RunRecord(
        run_id="r-" + unique(), thread_id="t-" + unique(), status=COMPLETED, driver_epoch=9,
        agent=AgentSpec(kind="replay", options_json='{"speed": 2}'), tenant="acme"))
    assert created
    assert rec.status == RUNNING          # a seed's status/epoch are not trusted
    assert rec.driver_epoch == 0
    assert rec.HasField("started_at") and rec.started_at > 0
    assert rec.agent.kind == "replay" and rec.tenant == "acme"
    view = await cc.get_run(rec.run_id)
    assert view.record == rec and view.claim is None and view.reap_at is None


async def test_create_or_resume_returns_existing_record_unchanged(cc: CoordinatorClient) -> None:
    first = await _new(cc, sandbox_key="sb-1")
    again, created = await cc.create_or_resume_run(RunRecord(
        run_id=first.run_id, thread_id="other-thread", sandbox_key="sb-2", agent=AgentSpec(kind="codex")))
    assert not created
    assert again == first
    assert (await cc.get_run(first.run_id)).record == first


async def test_update_of_unknown_run_is_a_noop_not_an_error(cc: CoordinatorClient) -> None:
    run_id = unique("ghost-")
    outcome, rec = await cc.update_run(run_id, RunRecord(status=COMPLETED), ["status"], epoch=3)
    assert outcome is UpdateOutcome.UNKNOWN_RUN and rec is None
    with pytest.raises(errors.UnknownRun):
        await cc.get_run(run_id)


async def test_update_round_trips_every_field_and_explicit_clear_removes_it(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    patch = RunRecord(
        status=INTERRUPTED, started_at=100.5, finished_at=200.25,
        error=RunError(message="boom", code="agent_exit"),
        usage=Usage(input_tokens=11, output_tokens=22, cost_usd=0.5), sandbox_key="sb-x",
        detached_since=150.0, cancel_requested=True, driver_host="host-a",
        agent=AgentSpec(kind="claude-code", options_json="{}"), parent_run_id="parent-1",
        cancel_on_disconnect=True, keep_sandbox=True, cancel_reason="user")
    paths = ["status", "started_at", "finished_at", "error", "usage", "sandbox_key", "detached_since",
             "cancel_requested", "driver_host", "agent", "parent_run_id",
             "cancel_on_disconnect", "keep_sandbox", "cancel_reason"]
    outcome, out = await cc.update_run(rec.run_id, patch, paths)
    assert outcome is UpdateOutcome.APPLIED
    stored = (await cc.get_run(rec.run_id)).record
    expect = RunRecord()
    expect.CopyFrom(patch)
    expect.run_id, expect.thread_id, expect.revision = rec.run_id, rec.thread_id, stored.revision
    expect.thread_seq = rec.thread_seq  # the run's number in its thread: given at creation, read-only
    assert rec.thread_seq == 1
    assert stored == expect and out == stored

    # An explicit clear: the path is in the mask, the value is unset.
    clear = ["finished_at", "error", "sandbox_key", "detached_since", "usage", "agent"]
    outcome, out = await cc.update_run(rec.run_id, RunRecord(), clear)
    stored = (await cc.get_run(rec.run_id)).record
    for f in ("finished_at", "error", "detached_since", "usage", "agent"):
        assert not stored.HasField(f), f
    assert stored.sandbox_key == "" and stored.started_at == 100.5 and stored.driver_host == "host-a"
    # Fields not in the mask are untouched even when the patch carries them.
    await cc.update_run(rec.run_id, RunRecord(sandbox_key="ignored", driver_host="h2"), ["driver_host"])
    stored = (await cc.get_run(rec.run_id)).record
    assert stored.sandbox_key == "" and stored.driver_host == "h2"


async def _raise_epoch(cc: CoordinatorClient, run_id: str, to: int) -> None:
    """Claim and release until ``driver_epoch`` is ``to`` (only ClaimRun raises it)."""
    s = await cc.open_session(5.0, owner="epoch-raiser")
    for _ in range(to):
        epoch, _rec = await cc.claim_run(run_id, s, "h")
        assert await cc.release_claim(run_id, s, epoch)
    await s.close()
    assert (await cc.get_run(run_id)).record.driver_epoch == to


async def test_driver_epoch_and_tenant_are_not_writable_by_update(cc: CoordinatorClient) -> None:
    rec = await _new(cc, tenant="t1")
    for path, patch in (("driver_epoch", RunRecord(driver_epoch=0)), ("tenant", RunRecord(tenant="t2"))):
        with pytest.raises(errors.InvalidArgument) as ei:
            await cc.update_run(rec.run_id, patch, [path])
        assert ei.value.field == "update_mask" and path in ei.value.problem
    stored = (await cc.get_run(rec.run_id)).record
    assert (stored.tenant, stored.driver_epoch, stored.revision) == ("t1", 0, rec.revision)


async def test_terminal_write_below_driver_epoch_is_suppressed(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    await _raise_epoch(cc, rec.run_id, 3)
    for status in (COMPLETED, FAILED, ABORTED):
        outcome, out = await cc.update_run(rec.run_id, RunRecord(status=status, finished_at=5.0),
                                           ["status", "finished_at"], epoch=2)
        assert outcome is UpdateOutcome.SUPPRESSED
        assert out is not None and out.status == RUNNING and not out.HasField("finished_at")
    assert (await cc.get_run(rec.run_id)).record.status == RUNNING


async def test_non_terminal_write_with_old_epoch_passes(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    await _raise_epoch(cc, rec.run_id, 5)
    outcome, out = await cc.update_run(rec.run_id, RunRecord(status=INTERRUPTED, sandbox_key="kept"),
                                       ["status", "sandbox_key"], epoch=1)
    assert outcome is UpdateOutcome.APPLIED
    assert out is not None and out.status == INTERRUPTED and out.sandbox_key == "kept"


async def test_terminal_write_at_current_epoch_applies(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    await _raise_epoch(cc, rec.run_id, 2)
    outcome, out = await cc.update_run(rec.run_id, RunRecord(status=COMPLETED, finished_at=9.0),
                                       ["status", "finished_at"], epoch=2)
    assert outcome is UpdateOutcome.APPLIED
    assert out is not None and out.status == COMPLETED and out.finished_at == 9.0


async def test_find_active_run_follows_status_changes(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    assert await cc.find_active_run(thread) is None
    rec = await _new(cc, thread)
    active = await cc.find_active_run(thread)
    assert active is not None and active.run_id == rec.run_id
    await cc.update_run(rec.run_id, RunRecord(status=INTERRUPTED), ["status"])
    assert await cc.find_active_run(thread) is None          # an interrupted run is not active
    await cc.update_run(rec.run_id, RunRecord(status=RUNNING), ["status"])
    assert (await cc.find_active_run(thread)).run_id == rec.run_id  # type: ignore[union-attr]
    await cc.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"])
    assert await cc.find_active_run(thread) is None
    # The next run on the thread is its active one.
    nxt = await _new(cc, thread)
    assert (await cc.find_active_run(thread)).run_id == nxt.run_id  # type: ignore[union-attr]


async def test_active_index_changes_in_the_same_transaction(cc: CoordinatorClient, coord) -> None:  # type: ignore[no-untyped-def]
    """The index and the record move at one etcd revision: never one without the other."""
    store = _store(coord)
    thread = unique("th-")
    rec = await _new(cc, thread)
    kvs, _ = await store.etcd.range(store.keys.thread_active(thread), timeout=5)
    assert kvs[0].value.decode() == rec.run_id and kvs[0].mod_revision == rec.revision
    _, out = await cc.update_run(rec.run_id, RunRecord(status=FAILED), ["status"])
    assert out is not None
    kvs, rev = await store.etcd.range(store.keys.thread_active(thread), timeout=5)
    assert kvs == []
    # The delete happened at the record's new revision (one transaction).
    hist, _ = await store.etcd.range(store.keys.thread_active(thread), timeout=5, revision=out.revision - 1)
    assert hist and hist[0].value.decode() == rec.run_id


async def test_new_run_on_busy_thread_is_refused_with_the_active_run_id(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    active = await _new(cc, thread)
    with pytest.raises(errors.ThreadBusy) as ei:
        await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread))
    assert ei.value.active_run_id == active.run_id and ei.value.thread_id == thread
    # Nothing was created, the active run is untouched.
    assert (await cc.find_active_run(thread)).run_id == active.run_id  # type: ignore[union-attr]
    assert [r.run_id for r in await cc.list_runs(thread)] == [active.run_id]


async def test_interrupt_active_cancels_the_active_run_then_starts(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    old = await _new(cc, thread)
    new, created = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread),
                                                 interrupt_active=True)
    assert created and new.status == RUNNING
    old_now = (await cc.get_run(old.run_id)).record
    assert old_now.cancel_requested and old_now.cancel_reason == "interrupted-by-new-run"
    assert old_now.status == RUNNING                    # a cancel request writes no status
    assert (await cc.find_active_run(thread)).run_id == new.run_id  # type: ignore[union-attr]
    # The old run finishing (aborted) does not take the index from the new one.
    await cc.update_run(old.run_id, RunRecord(status=ABORTED), ["status"])
    assert (await cc.find_active_run(thread)).run_id == new.run_id  # type: ignore[union-attr]


async def test_a_thread_belongs_to_its_first_runs_tenant(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    a1 = await _new(cc, thread, tenant="tenant-a")
    # Another tenant learns nothing of the thread's runs: not ThreadBusy with a1's id, and an
    # interrupt does not cancel a1.
    for interrupt in (False, True):
        with pytest.raises(errors.UnknownThread) as ei:
            await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="tenant-b"),
                                          interrupt_active=interrupt)
        assert ei.value.thread_id == thread and a1.run_id not in str(ei.value)
    assert not (await cc.get_run(a1.run_id)).record.cancel_requested
    # Still refused once the thread is idle; its own tenant goes on using it.
    await cc.update_run(a1.run_id, RunRecord(status=COMPLETED), ["status"])
    with pytest.raises(errors.UnknownThread):
        await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="tenant-b"))
    a2 = await _new(cc, thread, tenant="tenant-a")
    assert [r.run_id for r in await cc.list_runs(thread)] == [a1.run_id, a2.run_id]
    # The same run id asked for again by anyone is returned unchanged (the caller checks it).
    same, created = await cc.create_or_resume_run(RunRecord(run_id=a2.run_id, thread_id=thread, tenant="tenant-b"))
    assert not created and same.tenant == "tenant-a"


async def test_request_run_cancel_sets_the_flag_and_writes_no_status(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    out = await cc.request_run_cancel(rec.run_id, reason="user")
    assert out.cancel_requested and out.cancel_reason == "user" and out.status == RUNNING
    stored = (await cc.get_run(rec.run_id)).record
    assert stored.status == RUNNING and not stored.HasField("finished_at") and stored.cancel_requested
    with pytest.raises(errors.UnknownRun):
        await cc.request_run_cancel(unique("ghost-"))


async def test_list_reclaimable_is_inclusive_at_the_cutoff(cc: CoordinatorClient) -> None:
    a, b, c = await _new(cc), await _new(cc), await _new(cc)
    await _new(cc)  # attached: never reclaimable
    await cc.update_run(a.run_id, RunRecord(detached_since=1000.0), ["detached_since"])
    await cc.update_run(b.run_id, RunRecord(detached_since=1000.000001), ["detached_since"])
    await cc.update_run(c.run_id, RunRecord(detached_since=999.0), ["detached_since"])
    got = {r.run_id for r in await cc.list_reclaimable(now=1060.0, ttl=60.0)}
    assert {a.run_id, c.run_id} <= got and b.run_id not in got
    got = {r.run_id for r in await cc.list_reclaimable(now=1060.000001, ttl=60.0)}
    assert {a.run_id, b.run_id, c.run_id} <= got
    # Terminal runs leave the index; a re-attached run too.
    await cc.update_run(c.run_id, RunRecord(status=COMPLETED), ["status"])
    await cc.update_run(a.run_id, RunRecord(), ["detached_since"])
    got = {r.run_id for r in await cc.list_reclaimable(now=1060.000001, ttl=60.0)}
    assert b.run_id in got and a.run_id not in got and c.run_id not in got


async def test_list_reclaimable_reads_the_index_not_every_record(cc: CoordinatorClient, coord) -> None:  # type: ignore[no-untyped-def]
    """A detached run whose index key is gone is invisible: the answer comes from the index."""
    store = _store(coord)
    rec = await _new(cc)
    _, out = await cc.update_run(rec.run_id, RunRecord(detached_since=500.0), ["detached_since"])
    assert [r.run_id for r in await cc.list_reclaimable(now=600.0, ttl=50.0)] == [rec.run_id]
    from coordinator import _etcd as E
    await store.etcd.txn([], [E.delete(store.keys.reclaimable(500.0, rec.run_id))], timeout=5)
    assert await cc.list_reclaimable(now=600.0, ttl=50.0) == []


async def test_get_run_reports_reap_at_for_detached_running_runs(cc: CoordinatorClient, coord) -> None:  # type: ignore[no-untyped-def]
    rec = await _new(cc)
    await cc.update_run(rec.run_id, RunRecord(detached_since=1234.5), ["detached_since"])
    view = await cc.get_run(rec.run_id)
    assert view.reap_at == 1234.5 + coord.config.detached_run_ttl
    await cc.update_run(rec.run_id, RunRecord(status=INTERRUPTED), ["status"])
    assert (await cc.get_run(rec.run_id)).reap_at is None


async def test_list_runs_by_thread_and_tenant(cc: CoordinatorClient) -> None:
    thread, other = unique("th-"), unique("th-")
    x, y = unique("tenant-x-"), unique("tenant-y-")
    a = await _new(cc, thread, tenant=x, started_at=1.0)
    await cc.update_run(a.run_id, RunRecord(status=COMPLETED), ["status"])
    b = await _new(cc, thread, tenant=x, started_at=2.0)
    c = await _new(cc, other, tenant=y, started_at=3.0)
    assert [r.run_id for r in await cc.list_runs(thread)] == [a.run_id, b.run_id]
    assert [r.run_id for r in await cc.list_runs(thread, tenant=y)] == []
    assert [r.run_id for r in await cc.list_runs("", tenant=y)] == [c.run_id]
    assert [r.run_id for r in await cc.list_runs(thread, limit=1)] == [b.run_id]


async def test_sandbox_instances_round_trip(cc: CoordinatorClient) -> None:
    from baton.coordinator_client import SandboxInstance

    sb = SandboxInstance(sandbox_key=unique("sb-"), provider="docker", handle_json='{"container": "abc"}',
                         run_id="r1", journal_path="/tmp/j.ndjson", created_at=12.5)
    assert await cc.get_sandbox(sb.sandbox_key) is None
    await cc.put_sandbox(sb)
    assert await cc.get_sandbox(sb.sandbox_key) == sb
    await cc.delete_sandbox(sb.sandbox_key)
    assert await cc.get_sandbox(sb.sandbox_key) is None


async def test_a_run_interrupting_another_starts_after_it_whatever_the_clocks(cc: CoordinatorClient) -> None:
    # The active run was stamped by a coordinator whose clock ran ten minutes ahead (or
    # sent its own started_at); the run that interrupts it is still the later run of the
    # thread: its number in the thread, which orders a thread's runs (the transcript fence,
    # baton/thread_order.py), is the next one. started_at stays the clock's word.
    thread = unique("th-")
    a = await _new(cc, thread, started_at=time.time() + 600)
    b, created = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread),
                                               interrupt_active=True)
    assert created
    assert b.started_at < a.started_at
    assert b.thread_seq == a.thread_seq + 1
    assert [r.run_id for r in await cc.list_runs(thread_id=thread, limit=0)] == [a.run_id, b.run_id]
    assert (await cc.get_run(a.run_id)).record.cancel_requested
