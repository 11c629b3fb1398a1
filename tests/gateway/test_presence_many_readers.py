"""Many readers of one run on one gateway: their presence goes to the coordinator in a few
batched calls, each reader is still a key of its own (the run stays attached while any one
reads), and the last one out detaches the run (docs/design.md §3.3)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from baton import errors
from baton.v1 import runs_pb2
from gateway._reader import Chunks, Presence, RunRead
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, run_chunks, write_run

READERS = 200


async def _detached(cc: Any, run_id: str) -> bool:
    return (await cc.get_run(run_id)).record.HasField("detached_since")


async def test_many_readers_register_in_a_few_calls_and_the_last_one_out_detaches(
        gateway: Gateway, cc: Any, dlog: Any) -> None:
    state = gateway.state
    thread, run = unique("th"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, started_at=1.0))
    chunks = run_chunks(run, thread, ["a"])
    await write_run(dlog, run, chunks, close=False)
    reads = [RunRead(state, run, "-1") for _ in range(READERS)]
    try:
        steps = await asyncio.gather(*(r.next(10) for r in reads))
        assert all(isinstance(s, Chunks) for s in steps)
        await assert_eventually(lambda: all(r._presence.session is not None for r in reads), timeout=30)
        calls = state.presence.registers.calls
        assert state.presence.registers.items == READERS
        assert calls <= READERS // 10, f"{calls} registration calls for {READERS} readers"
        assert not await _detached(cc, run)
        await asyncio.gather(*(r.aclose() for r in reads[1:]))
        assert not await _detached(cc, run), "detached while one reader still reads"
        assert state.presence.unregisters.items == READERS - 1
        assert state.presence.unregisters.calls <= READERS // 10
    finally:
        await asyncio.gather(*(r.aclose() for r in reads))
    assert await _detached(cc, run)


async def _running_run(cc: Any, dlog: Any) -> str:
    thread, run = unique("th"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, started_at=1.0))
    await write_run(dlog, run, run_chunks(run, thread, ["a"]), close=False)
    return run


async def test_a_reader_cancelled_while_it_registers_removes_its_key_after_the_registration_lands(
        gateway: Gateway, cc: Any, dlog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader re-registering in its own task (its gateway's session was reopened) is
    cancelled while the call carrying it is still under way. Its removal must come after
    that call: sent before, it deletes nothing, the call then puts the key, and the run
    stays attached with no reader."""
    state = gateway.state
    run = await _running_run(cc, dlog)
    real_register, real_unregister = state.coordinator.register_readers, state.coordinator.unregister_readers
    release, order = asyncio.Event(), []

    async def register_readers(run_id: str, session: Any, reader_ids: list[str], **kw: Any) -> None:
        order.append("register sent")
        await release.wait()
        await real_register(run_id, session, reader_ids, **kw)
        order.append("register landed")

    async def unregister_readers(run_id: str, reader_ids: list[str], **kw: Any) -> None:
        order.append("unregister sent")
        await real_unregister(run_id, reader_ids, **kw)

    monkeypatch.setattr(state.coordinator, "register_readers", register_readers)
    monkeypatch.setattr(state.coordinator, "unregister_readers", unregister_readers)
    presence = Presence(state, run)
    registering = asyncio.create_task(presence.ensure())
    await assert_eventually(lambda: order == ["register sent"], timeout=10)
    registering.cancel()
    removing = asyncio.create_task(presence.remove())
    for _ in range(10):  # (turns of the loop: the removal is under way, not a wait for time)
        await asyncio.sleep(0)
    assert order == ["register sent"] and not removing.done()
    release.set()
    await asyncio.wait_for(removing, 10)
    assert order == ["register sent", "register landed", "unregister sent"]
    assert await _detached(cc, run)


async def test_a_removal_the_coordinator_did_not_answer_is_tried_again(
        gateway: Gateway, cc: Any, dlog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coordinator is away for less than the gateway session's TTL while a reader leaves:
    the key would outlive the reader (the session lives on), so the removal is tried again."""
    state = gateway.state
    run = await _running_run(cc, dlog)
    real_unregister, tries = state.coordinator.unregister_readers, []

    async def unregister_readers(run_id: str, reader_ids: list[str], **kw: Any) -> None:
        tries.append(reader_ids)
        if len(tries) <= 2:
            raise errors.StoreUnavailable("UNAVAILABLE: coordinator restarting")
        await real_unregister(run_id, reader_ids, **kw)

    monkeypatch.setattr(state.coordinator, "unregister_readers", unregister_readers)
    async with RunRead(state, run, "-1") as read:
        assert isinstance(await read.next(10), Chunks)
        await assert_eventually(lambda: read._presence.session is not None, timeout=10)
        assert not await _detached(cc, run)
    assert len(tries) == 3
    assert await _detached(cc, run)


async def test_a_registration_the_coordinator_did_not_answer_in_time_is_logged_with_its_bound(
        gateway: Gateway, cc: Any, dlog: Any, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A timeout's own text is empty: the warning says what ran out instead of ending in
    ``not registered: ``."""
    state = gateway.state
    run = await _running_run(cc, dlog)
    release = asyncio.Event()
    real_register = state.coordinator.register_readers

    async def register_readers(run_id: str, session: Any, reader_ids: list[str], **kw: Any) -> None:
        await release.wait()  # past the presence call's bound
        await real_register(run_id, session, reader_ids, **kw)

    monkeypatch.setattr(state.coordinator, "register_readers", register_readers)
    presence = Presence(state, run)
    with caplog.at_level("WARNING", logger="gateway.reader"):
        await asyncio.wait_for(presence.ensure(), 30)
    release.set()
    await asyncio.wait_for(presence.remove(), 30)
    lines = [r.getMessage() for r in caplog.records if "not registered" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith("not registered: no answer within 3 s"), lines
