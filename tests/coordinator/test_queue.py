"""A thread's queue of runs against a real etcd (docs/hitl.md): runs wait behind the active
run, interrupting ones first, then in arrival order; an idle thread queues nothing."""
from __future__ import annotations

import asyncio

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient
from baton.v1.coordinator_pb2 import EnqueueRunResponse as Out
from baton.v1.coordinator_pb2 import QueuedRun
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator import _store
from tests.conftest import unique


def queued(thread: str, strategy: str = "enqueue", at: float = 0.0, tenant: str = "acme") -> QueuedRun:
    return QueuedRun(run_id=unique("q-"), thread_id=thread, tenant=tenant, strategy=strategy, enqueued_at=at,
                     start_request=b"\x0a\x01x", prompt="next")


async def test_runs_wait_in_order_behind_the_active_run(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    idle = queued(thread)
    assert (await cc.enqueue_run(idle))[0] == Out.IDLE  # nothing to wait for: start it instead
    active, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"))
    first, second, urgent = queued(thread, at=10.0), queued(thread, at=11.0), queued(thread, "interrupt", at=12.0)
    assert await cc.enqueue_run(first) == (Out.QUEUED, 1, active.run_id)
    assert await cc.enqueue_run(second) == (Out.QUEUED, 2, active.run_id)
    assert (await cc.enqueue_run(urgent))[:2] == (Out.QUEUED, 1)  # an interrupt goes first
    assert (await cc.enqueue_run(first))[0] == Out.EXISTS  # a retry queues nothing twice
    listed = await cc.list_queued_runs(thread)
    assert [(q.run_id, q.position) for q in listed] == [(urgent.run_id, 1), (first.run_id, 2), (second.run_id, 3)]
    assert listed[1].start_request == first.start_request and listed[1].prompt == "next"
    assert [q.run_id for q in await cc.list_queued_runs(thread, tenant="globex")] == []
    assert [q.position for q in await cc.list_queued_runs(run_id=second.run_id)] == [3]
    assert any(q.run_id == first.run_id for q in await cc.list_queued_runs())  # every thread's

    assert not await cc.remove_queued_run(thread, first.run_id, tenant="globex")
    assert await cc.remove_queued_run(thread, first.run_id, tenant="acme")
    assert not await cc.remove_queued_run(thread, first.run_id)
    assert [(q.run_id, q.position) for q in await cc.list_queued_runs(thread)] == [(urgent.run_id, 1),
                                                                                  (second.run_id, 2)]
    # A run id that names a record cannot be queued.
    assert (await cc.enqueue_run(QueuedRun(run_id=active.run_id, thread_id=thread, strategy="enqueue")))[0] == Out.EXISTS


async def test_a_thread_idle_between_its_queued_runs_queues_a_newcomer_behind_them(cc: CoordinatorClient) -> None:
    thread = unique("th-")
    active, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"))
    waiting = queued(thread, at=10.0)
    assert (await cc.enqueue_run(waiting))[:2] == (Out.QUEUED, 1)
    await cc.update_run(active.run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED), ["status"])
    assert await cc.find_active_run(thread) is None  # idle: the dispatcher has not started the next yet
    late = queued(thread, at=20.0)
    assert await cc.enqueue_run(late) == (Out.QUEUED, 2, "")  # behind the one waiting, not ahead of it
    assert [q.run_id for q in await cc.list_queued_runs(thread)] == [waiting.run_id, late.run_id]


async def test_a_full_queue_refuses_in_the_write_however_many_enqueue_at_once(
        cc: CoordinatorClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # The bound is checked inside EnqueueRun's transaction (no entry created since the queue
    # was counted), so gateways racing each other cannot pass it, not even by one.
    monkeypatch.setattr(_store, "MAX_QUEUED_RUNS", 3)  # the coordinator runs in this process
    thread = unique("th-")
    active, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"))
    runs = [queued(thread, at=10.0 + i) for i in range(10)]
    answers = await asyncio.gather(*(cc.enqueue_run(r) for r in runs), return_exceptions=True)
    ok = [r.run_id for r, a in zip(runs, answers) if not isinstance(a, BaseException)]
    refused = [a for a in answers if isinstance(a, BaseException)]
    assert len(ok) == 3 and all(isinstance(a, errors.QueueFull) and a.limit == 3 for a in refused), answers
    assert sorted(q.run_id for q in await cc.list_queued_runs(thread)) == sorted(ok)
    # A retry of a queued run is still EXISTS on a full queue; a removal makes room.
    assert (await cc.enqueue_run(next(r for r in runs if r.run_id == ok[0])))[0] == Out.EXISTS
    assert await cc.remove_queued_run(thread, ok[0])
    assert (await cc.enqueue_run(queued(thread, at=30.0)))[0] == Out.QUEUED
    with pytest.raises(errors.QueueFull):
        await cc.enqueue_run(queued(thread, at=31.0))


async def test_a_users_cancel_and_the_dispatchers_start_agree_on_who_won(cc: CoordinatorClient) -> None:
    # The dispatcher's start is a create of the run's record (here under an idle thread of its
    # own: the record's thread plays no part in the race).
    thread = unique("th-")
    await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"))
    first, second = queued(thread, at=10.0), queued(thread, at=11.0)
    for q in (first, second):
        assert (await cc.enqueue_run(q))[0] == Out.QUEUED

    # The cancel lands first: removed, and the start already on its way is born cancelled
    # (no agent is launched for it), never a run going on after "removed".
    assert await cc.remove_queued_run(thread, first.run_id, tenant="acme", user_cancel=True)
    born, created = await cc.create_or_resume_run(RunRecord(run_id=first.run_id, thread_id=unique("th-"),
                                                            tenant="acme"))
    assert created and born.cancel_requested and born.cancel_reason == "dequeued"

    # The start lands first: the cancel is refused and removes nothing (the dispatcher takes
    # the entry out once its start returned).
    started, _ = await cc.create_or_resume_run(RunRecord(run_id=second.run_id, thread_id=unique("th-"),
                                                         tenant="acme"))
    assert not started.cancel_requested
    with pytest.raises(errors.QueuedRunStarted):
        await cc.remove_queued_run(thread, second.run_id, tenant="acme", user_cancel=True)
    assert [q.run_id for q in await cc.list_queued_runs(thread)] == [second.run_id]
    assert await cc.remove_queued_run(thread, second.run_id)  # the dispatcher's own removal
    assert not await cc.remove_queued_run(thread, second.run_id, tenant="acme", user_cancel=True)
