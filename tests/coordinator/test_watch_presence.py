"""WatchRun (docs/design.md §3.2) and presence/detach (§3.3) against a real etcd."""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator

from baton.coordinator_client import CoordinatorClient, WatchEvent
from baton.v1.runs_pb2 import RunRecord, RunStatus
from tests.conftest import assert_eventually, unique
from tests.coordinator.conftest import open_bare_session

RUNNING, COMPLETED = RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_COMPLETED


async def _new(cc: CoordinatorClient, **fields) -> RunRecord:  # type: ignore[no-untyped-def]
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-"), **fields))
    return rec


async def _next(it: AsyncIterator[WatchEvent]) -> WatchEvent:
    async with asyncio.timeout(5):
        return await it.__anext__()


async def test_watch_run_streams_cancel_epoch_and_status(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    it = cc.watch_run(rec.run_id).__aiter__()
    try:
        ev = await _next(it)
        assert ev.record == rec and ev.claim is None
        s = await cc.open_session(2.0)
        epoch, _ = await cc.claim_run(rec.run_id, s, "h")
        seen = []
        while not (seen and seen[-1].claim is not None and seen[-1].record.driver_epoch == 1):  # type: ignore[union-attr]
            seen.append(await _next(it))
        assert seen[-1].claim.epoch == epoch  # type: ignore[union-attr]
        await cc.request_run_cancel(rec.run_id, "user")
        ev = await _next(it)
        assert ev.record is not None and ev.record.cancel_requested and ev.record.cancel_reason == "user"
        await cc.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"], epoch=epoch)
        ev = await _next(it)
        assert ev.record is not None and ev.record.status == COMPLETED
        await cc.release_claim(rec.run_id, s, epoch)
        ev = await _next(it)
        assert ev.claim is None and ev.record is not None and ev.record.status == COMPLETED
    finally:
        await it.aclose()  # type: ignore[attr-defined]


async def test_watch_of_unknown_run_starts_empty_then_sees_creation(cc: CoordinatorClient) -> None:
    run_id = unique("later-")
    it = cc.watch_run(run_id).__aiter__()
    try:
        ev = await _next(it)
        assert ev.record is None and ev.claim is None
        await cc.create_or_resume_run(RunRecord(run_id=run_id, thread_id=unique("th-")))
        ev = await _next(it)
        assert ev.record is not None and ev.record.run_id == run_id and ev.record.status == RUNNING
    finally:
        await it.aclose()  # type: ignore[attr-defined]


async def _detached(cc: CoordinatorClient, run_id: str) -> bool:
    return (await cc.get_run(run_id)).record.HasField("detached_since")


async def test_last_reader_leaving_detaches_and_a_new_reader_reattaches(cc: CoordinatorClient) -> None:
    rec = await _new(cc, sandbox_key="sb-1")
    gw = await cc.open_session(2.0, owner="gateway")
    await cc.register_reader(rec.run_id, gw, "r1")
    await cc.register_reader(rec.run_id, gw, "r2")
    await cc.unregister_reader(rec.run_id, "r1")
    assert not await _detached(cc, rec.run_id)              # r2 still reads
    before = time.time()
    await cc.unregister_reader(rec.run_id, "r2")
    view = await cc.get_run(rec.run_id)
    assert view.record.HasField("detached_since") and before <= view.record.detached_since <= time.time()
    assert view.record.sandbox_key == "sb-1" and view.record.status == RUNNING and not view.record.cancel_requested
    assert view.reap_at is not None
    assert rec.run_id in {r.run_id for r in await cc.list_reclaimable(now=0, ttl=0)}
    await cc.register_reader(rec.run_id, gw, "r3")
    view = await cc.get_run(rec.run_id)
    assert not view.record.HasField("detached_since") and view.reap_at is None
    assert rec.run_id not in {r.run_id for r in await cc.list_reclaimable(now=0, ttl=0)}


async def test_dead_gateway_session_detaches_within_ttl_plus_one_second(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    live = await cc.open_session(2.0, owner="gateway-live")
    dead = await open_bare_session(cc.addresses[0], 2.0)
    await cc.register_reader(rec.run_id, dead, "r-dead-1")
    await cc.register_reader(rec.run_id, dead, "r-dead-2")
    t0 = time.monotonic()
    await assert_eventually(lambda: _detached(cc, rec.run_id), timeout=10)
    assert time.monotonic() - t0 <= 2.0 + 1.0
    # A reader on a live gateway brings it back; that reader's gateway then dies too.
    await cc.register_reader(rec.run_id, live, "r-live")
    assert not await _detached(cc, rec.run_id)
    await live.close()
    await assert_eventually(lambda: _detached(cc, rec.run_id), timeout=5)


async def test_dead_gateway_does_not_detach_a_run_another_gateway_reads(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    control = await _new(cc)   # read by the dead gateway only
    live = await cc.open_session(2.0, owner="gateway-live")
    dead = await open_bare_session(cc.addresses[0], 2.0)
    await cc.register_reader(rec.run_id, live, "r-live")
    await cc.register_reader(rec.run_id, dead, "r-dead")
    await cc.register_reader(control.run_id, dead, "r-dead")
    # Both dead readers go at one revision; once the control run is detached, the sweeper
    # has handled that revision, so the other run's state is final.
    await assert_eventually(lambda: _detached(cc, control.run_id), timeout=10)
    assert not await _detached(cc, rec.run_id)


async def test_run_with_cancel_on_disconnect_is_cancelled_when_last_reader_leaves(cc: CoordinatorClient) -> None:
    rec = await _new(cc, cancel_on_disconnect=True)
    gw = await cc.open_session(2.0)
    await cc.register_reader(rec.run_id, gw, "r1")
    await cc.unregister_reader(rec.run_id, "r1")
    stored = (await cc.get_run(rec.run_id)).record
    assert stored.cancel_requested and stored.cancel_reason == "disconnected" and stored.status == RUNNING


async def test_a_client_that_names_no_disconnect_policy_gets_detach_not_cancel(cc: CoordinatorClient) -> None:
    # A client in another language that omits the field sends proto3's default; the
    # deprecated detach_on_disconnect is then false too, and must not mean "cancel".
    rec = await _new(cc)
    assert not rec.cancel_on_disconnect and not rec.detach_on_disconnect
    gw = await cc.open_session(2.0)
    await cc.register_reader(rec.run_id, gw, "r1")
    await cc.unregister_reader(rec.run_id, "r1")
    stored = (await cc.get_run(rec.run_id)).record
    assert stored.HasField("detached_since") and stored.status == RUNNING
    assert not stored.cancel_requested and stored.cancel_reason == ""


async def test_terminal_run_is_not_detached(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    gw = await cc.open_session(2.0)
    await cc.register_reader(rec.run_id, gw, "r1")
    await cc.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"])
    await cc.unregister_reader(rec.run_id, "r1")
    assert not await _detached(cc, rec.run_id)
