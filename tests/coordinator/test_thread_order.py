"""The order of a thread's runs against a real etcd, with replicas whose clocks disagree
(docs/design.md §3.1, "Order of a thread's runs").

Two coordinator replicas share one etcd; the second's clock is an hour behind the first's
(an NTP step, a VM restored from a snapshot). A thread's second run, created through the
slow replica after its first run ended, is stamped with an earlier ``started_at`` than the
first. Ordered by that clock, the second run would come first: the thread's listing would
show it before the first, and the transcript fence would keep the first run's transcript
and refuse the second's. The thread's counter, taken in the creating transaction, orders
them as etcd ordered the creates.
"""
from __future__ import annotations

import time
from typing import AsyncIterator, Callable

import pytest

from baton.log import TranscriptWriter
from baton.log._transcript_fence import verdict
from baton.v1.coordinator_pb2 import QueuedRun
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator import _etcd as E
from coordinator._etcd import Etcd
from coordinator._store import RunStore
from baton_tools.testing.servers import EtcdServer
from tests.conftest import unique

pytestmark = pytest.mark.timeout(60)

T = 10.0
SKEW = 3600.0  # the slow replica's clock is this many seconds behind


def _clock(offset: float) -> Callable[[], float]:
    return lambda: time.time() + offset


@pytest.fixture
async def replicas(etcd: EtcdServer) -> AsyncIterator[tuple[RunStore, RunStore]]:
    """Two replicas on one prefix: ``(on time, an hour behind)``."""
    prefix = f"/{unique('ord')}/"
    fast = RunStore(Etcd([etcd.endpoint]), prefix, clock=_clock(0.0))
    slow = RunStore(Etcd([etcd.endpoint]), prefix, clock=_clock(-SKEW))
    try:
        yield fast, slow
    finally:
        await fast.etcd.close()
        await slow.etcd.close()


async def _run(store: RunStore, thread: str) -> RunRecord:
    rec, created = await store.create_or_resume(RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"),
                                                False, timeout=T)
    assert created
    return rec


async def _complete(store: RunStore, rec: RunRecord) -> None:
    await store.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED, finished_at=store.clock()),
                           ["status", "finished_at"], 0, 0, timeout=T)


def _writer(rec: RunRecord) -> TranscriptWriter:
    """The writer a host's driver saves a run's transcript as (sandbox_host/claim_log.py)."""
    return TranscriptWriter(rec.run_id, 1, rec.started_at, rec.thread_seq)


async def test_a_later_run_stamped_by_a_slow_clock_stays_the_later_run(replicas: tuple[RunStore, RunStore]) -> None:
    fast, slow = replicas
    thread = unique("th-")
    first = await _run(fast, thread)
    await _complete(fast, first)
    second = await _run(slow, thread)  # the next turn, through the replica an hour behind
    await _complete(slow, second)
    third = await _run(fast, thread)

    assert second.started_at < first.started_at  # the clocks did lie
    # The thread's listing is in the order the runs were created, from either replica.
    for store in (fast, slow):
        listed = await store.list_runs(thread, "", 0, timeout=T)
        assert [r.run_id for r in listed] == [first.run_id, second.run_id, third.run_id]
        newest = await store.list_runs(thread, "", 2, timeout=T)
        assert [r.run_id for r in newest] == [second.run_id, third.run_id]
    assert (first.thread_seq, second.thread_seq, third.thread_seq) == (1, 2, 3)
    # The transcript fence: the second run replaces the first's transcript, never the reverse.
    assert verdict(_writer(first), _writer(second)) == "replace"
    assert verdict(_writer(second), _writer(first)) == "later-run"
    assert verdict(_writer(third), _writer(second)) == "later-run"


async def test_an_interrupting_run_through_a_slow_replica_is_the_later_run(
        replicas: tuple[RunStore, RunStore]) -> None:
    fast, slow = replicas
    thread = unique("th-")
    first = await _run(fast, thread)
    second, created = await slow.create_or_resume(
        RunRecord(run_id=unique("run-"), thread_id=thread, tenant="acme"), True, timeout=T)
    assert created and second.thread_seq == first.thread_seq + 1
    assert verdict(_writer(second), _writer(first)) == "later-run"


async def test_records_from_before_the_counter_come_first(replicas: tuple[RunStore, RunStore]) -> None:
    """A thread whose runs were created before the counter: they keep their clock order
    among themselves, and every numbered run comes after them."""
    fast, slow = replicas
    thread = unique("th-")
    old = []
    for store in (fast, fast):
        rec = await _run(store, thread)
        await _complete(store, rec)
        old.append(rec)
    # As an older coordinator wrote them: no number, and no counter.
    ops = [E.delete(fast.keys.thread_seq(thread))]
    for rec in old:
        stored, _ = await fast.get_run(rec.run_id, timeout=T)
        assert stored is not None
        stored.ClearField("thread_seq")
        stored.ClearField("revision")
        ops.append(E.put(fast.keys.run(rec.run_id), stored.SerializeToString()))
        rec.ClearField("thread_seq")
    assert (await fast.etcd.txn([], ops, timeout=T)).succeeded
    fast.cache.forget(old[0].run_id)
    fast.cache.forget(old[1].run_id)
    new = await _run(slow, thread)
    assert new.thread_seq == 1
    listed = await fast.list_runs(thread, "", 0, timeout=T)
    assert [r.run_id for r in listed] == [old[0].run_id, old[1].run_id, new.run_id]
    assert verdict(_writer(old[1]), _writer(new)) == "replace"
    assert verdict(_writer(new), _writer(old[1])) == "later-run"


async def test_queued_runs_keep_their_arrival_order_whatever_the_gateways_clocks(
        replicas: tuple[RunStore, RunStore]) -> None:
    """Gateways stamp ``enqueued_at`` with their own clocks; the queue's order is the
    counter's."""
    fast, slow = replicas
    thread = unique("th-")
    await _run(fast, thread)

    def queued(at: float) -> QueuedRun:
        return QueuedRun(run_id=unique("q-"), thread_id=thread, tenant="acme", strategy="enqueue", enqueued_at=at,
                         start_request=b"\x0a\x01x", prompt="next")

    now = time.time()
    a, b, c = queued(now), queued(now - SKEW), queued(now - 10)  # b's gateway is an hour behind
    for store, q in ((fast, a), (slow, b), (fast, c)):
        await store.enqueue_run(q, timeout=T)
    listed = await slow.list_queued_runs(thread, timeout=T)
    assert [(q.run_id, q.position) for q in listed] == [(a.run_id, 1), (b.run_id, 2), (c.run_id, 3)]
