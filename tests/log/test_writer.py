"""The claim-scoped writer: fence, append with compare-and-set, latch, close (docs/design.md §4.1)."""
from __future__ import annotations

import json

import pytest

from baton.errors import AppendConflict, LogAlreadyClosed, RunClaimLost
from baton.fingerprint import fingerprint
from baton.log import DeliveryLog, StoredRecord
from tests.conftest import unique
from tests.log.conftest import chunk


async def test_fence_append_close_store_the_records_with_their_headers(dlog: DeliveryLog) -> None:
    run_id = unique("run/ü.*> ")
    w = dlog.writer(run_id, 1)
    fence = await w.fence()
    offsets = await w.append([chunk(0), chunk(1)], origin="journal")
    host = await w.append([{"type": "CUSTOM", "name": "run.accepted", "value": {}}], origin="host")
    assert await w.close("completed") is True

    recs = await dlog.stored_headers(run_id)
    assert [r.kind for r in recs] == ["fence", "chunk", "chunk", "chunk", "close"]
    assert recs[0].offset == fence
    assert [str(r.offset) for r in recs[1:4]] == offsets + host
    assert [r.origin for r in recs[1:4]] == ["journal", "journal", "host"]
    assert recs[1].fingerprint == fingerprint(chunk(0))
    assert [r.msg_id for r in recs] == [f"{run_id}/1/{n}" for n in range(1, 6)]
    assert all(r.epoch == 1 for r in recs)
    assert recs[-1].status == "completed"
    assert int(offsets[0]) < int(offsets[1])


async def test_stored_headers_before_stops_at_the_fence(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    await w1.append([chunk(i) for i in range(3)])
    w2 = dlog.writer(run_id, 2)
    fence2 = await w2.fence()
    await w2.append([chunk(9)])
    recs = await dlog.stored_headers(run_id, before=fence2)
    assert [(r.kind, r.epoch) for r in recs] == [("fence", 1)] + [("chunk", 1)] * 3
    assert await dlog.stored_headers(unique("empty")) == []


async def test_stored_before_fence_reads_what_the_fence_covers(dlog: DeliveryLog) -> None:
    """A successor's first read: the records before its fence exactly (none of another run,
    none after the fence), with the run input's body; read directly, or partly with a
    consumer when the log is longer than one direct read."""
    run_id, other = unique("run"), unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    (first,) = await w1.append([chunk(0)], origin="journal")
    accepted = {"type": "CUSTOM", "name": "run.accepted", "value": {"messages": [{"role": "user", "content": "hé"}]}}
    (host,) = await w1.append([accepted], origin="host")
    await dlog.writer(other, 1).fence()  # interleaved: another run's record in between
    rest = await w1.append([chunk(i) for i in range(1, 40)], origin="journal")
    w2 = dlog.writer(run_id, 2)
    assert w2.fenced_over is None
    fence2 = await w2.fence()
    await w2.append([chunk(99)])
    assert w2.fenced_over is not None and w2.fenced_over < fence2
    expected = await dlog.stored_headers(run_id, before=fence2)
    assert [r.kind for r in expected] == ["fence"] + ["chunk"] * 41 and expected[-1].offset == w2.fenced_over

    want = {int(first): chunk(0), int(host): accepted} | {int(o): chunk(i) for i, o in enumerate(rest, 1)}
    recs, bodies = await dlog.stored_before_fence(run_id, w2.fenced_over)
    assert recs == expected
    assert {k: json.loads(v) for k, v in bodies.items()} == want  # every chunk's body
    # One direct read of a few hundred bytes, the rest headers-only: the same records, and
    # the bodies of those read directly only.
    recs, bodies = await dlog.stored_before_fence(run_id, w2.fenced_over, max_bytes=300)
    assert recs == expected and 0 < len(bodies) < len(want)
    assert {k: json.loads(v) for k, v in bodies.items()} == {k: v for k, v in want.items() if k in bodies}
    assert sorted(bodies) == [r.offset for r in recs if r.kind == "chunk"][:len(bodies)]  # a prefix
    # A fence on an empty log covers nothing.
    w = dlog.writer(unique("run"), 1)
    await w.fence()
    assert w.fenced_over == 0
    assert await dlog.stored_before_fence(w.run_id, w.fenced_over) == ([], {})


async def test_paused_writer_is_refused_latched_and_lands_nothing(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    await w1.append([chunk(0)])
    # writer 1 "sleeps" holding its stale head; writer 2 takes over and appends
    w2 = dlog.writer(run_id, 2)
    await w2.fence()
    await w2.append([chunk(1)])
    with pytest.raises(RunClaimLost) as err:
        await w1.append([chunk(100), chunk(101)])
    assert err.value.held_epoch == 1 and err.value.observed == "chunk@2"
    assert w1.latched
    with pytest.raises(RunClaimLost):
        await w1.append([chunk(102)])
    assert await w1.close("failed", "late") is False
    recs = await dlog.stored_headers(run_id)
    assert [(r.kind, r.epoch) for r in recs] == [("fence", 1), ("chunk", 1), ("fence", 2), ("chunk", 2)]


async def test_lower_epoch_cannot_fence_over_a_higher_one(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    await dlog.writer(run_id, 3).fence()
    w = dlog.writer(run_id, 2)
    with pytest.raises(RunClaimLost) as err:
        await w.fence()
    assert err.value.observed == "fence@3"
    assert w.latched


async def test_close_refused_over_a_successors_fence_accepted_without_one(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    await w1.append([chunk(0)])
    w2 = dlog.writer(run_id, 2)
    await w2.fence()
    assert await w1.close("failed", {"message": "host lost", "code": "x"}) is False
    assert w1.latched

    # a writer that lost its lease but has no successor still closes
    other = unique("run")
    lone = dlog.writer(other, 1)
    await lone.fence()
    await lone.append([chunk(0)])
    assert await lone.close("failed", "agent crashed\r\nInjected: yes", error_code="agent_exit") is True
    assert await lone.close("failed") is True  # idempotent
    last = await dlog.last_record(other)
    assert last is not None and last.kind == "close" and last.status == "failed"
    assert last.error == "agent crashed Injected: yes" and last.error_code == "agent_exit"


async def test_successor_meets_a_closed_log(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    await w1.close("completed")
    with pytest.raises(LogAlreadyClosed) as err:
        await dlog.writer(run_id, 2).fence()
    assert (err.value.status, err.value.epoch) == ("completed", 1)


async def test_close_without_fence_closes_at_the_head(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w1 = dlog.writer(run_id, 1)
    await w1.fence()
    await w1.append([chunk(0)])
    finalizer = dlog.writer(run_id, 2)
    assert await finalizer.close("aborted", {"message": "cancelled", "code": "cancelled"}) is True
    recs = await dlog.stored_headers(run_id)
    assert recs[-1] == StoredRecord(
        offset=recs[-1].offset, kind="close", epoch=2, msg_id=f"{run_id}/2/1",
        status="aborted", error_code="cancelled", error="cancelled",
    )


async def test_same_epoch_interloper_is_a_conflict_not_a_latch(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    first = await w.append([chunk(0)])
    # a foreign record of the same epoch moves the head (a bug elsewhere, or a resumed writer)
    await dlog.js.publish(dlog.cfg.subject(run_id), b"{}", headers={"Baton-Kind": "chunk", "Baton-Epoch": "1"})
    with pytest.raises(AppendConflict) as err:
        await w.append([chunk(1), chunk(2)])
    assert err.value.landed == () and err.value.expected == int(first[0])
    assert not w.latched
    head = await w.resync()
    assert head == err.value.actual
    assert len(await w.append([chunk(1)])) == 1


async def test_retried_publish_is_not_stored_twice(dlog: DeliveryLog) -> None:
    """A timed-out publish retried with the same msg id: the compare refuses the copy and
    the writer recognises its own record at the head."""
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    fence = await w.fence()
    subject = dlog.cfg.subject(run_id)
    headers = {"Baton-Kind": "chunk", "Baton-Epoch": "1", "Nats-Msg-Id": f"{run_id}/1/2",
               "Nats-Expected-Last-Subject-Sequence": str(fence)}
    # the "lost" first attempt lands behind the writer's back
    ack = await dlog.js.publish(subject, b'{"type":"CUSTOM"}', headers=dict(headers))
    offsets = await w.append([{"type": "CUSTOM"}])
    assert offsets == [str(ack.seq)]
    recs = await dlog.stored_headers(run_id)
    assert [r.kind for r in recs] == ["fence", "chunk"]
