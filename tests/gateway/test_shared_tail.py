"""A live reader served from a run's shared tail (``gateway._fanout.RunHub`` through
``gateway._reader.RunRead``) misses no chunk and waits for none that is already there."""
from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from baton.v1 import runs_pb2
from gateway._fanout import Hubs
from gateway._reader import CaughtUp, Chunks, End, RunRead
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, run_chunks, write_run


async def _open_run(cc: Any, dlog: Any, texts: list[str]) -> tuple[str, list[dict[str, Any]], Any]:
    """A run with a record and its first two chunks stored (the log stays open)."""
    thread, run = unique("th"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run, thread_id=thread, started_at=1.0,
                                                     status=runs_pb2.RUN_STATUS_INTERRUPTED), interrupt_active=False)
    chunks = run_chunks(run, thread, texts)
    w, _ = await write_run(dlog, run, chunks[:2], close=False)
    return run, chunks, w


def _values(step: Any) -> list[dict[str, Any]]:
    assert isinstance(step, Chunks), step
    return [json.loads(payload) for _, payload in step.items()]


async def _read_to_end(read: Any, *, idle: bool = True) -> tuple[list[dict[str, Any]], Any]:
    """The chunks ``read`` yields up to its first step that is not chunks (``End`` at a close):
    ``(chunk values, that step)``. ``idle=False``: an idle step (no chunk within 10 s) fails."""
    got: list[dict[str, Any]] = []
    while True:
        step = await read.next(10)
        if step is None:
            assert idle, "idle"
            continue
        if not isinstance(step, Chunks):
            return got, step
        got += _values(step)


async def _offsets_of_all(state: Any, run: str, n: int) -> list[int]:
    """The offsets of the run's first ``n`` chunks, read by a reader from the start that then leaves."""
    offsets: list[int] = []
    async with RunRead(state, run, "-1") as r:
        while len(offsets) < n:
            step = await r.next(10)
            assert isinstance(step, Chunks)
            offsets += [o for o, _ in step.items()]
    return offsets


async def test_chunks_stored_while_a_reader_renews_its_presence_wake_it_at_once(
        gateway: Gateway, cc: Any, dlog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader looked at the tail (nothing new), then renewed its presence key (an RPC:
    the gateway session was reopened, or the first registration did not answer). The rest
    of the run is stored and read by the tail during that RPC: the reader's wait must end at
    once with those chunks, not after its whole timeout (a /ds reader: 20 s) as if nothing
    came (a long-poll then answered "up to date" with the chunks there)."""
    state = gateway.state
    run, chunks, w = await _open_run(cc, dlog, ["a", "b"])
    real = state.coordinator.register_readers
    armed, entered, release = False, asyncio.Event(), asyncio.Event()

    async def register_readers(run_id: str, session: Any, reader_ids: list[str], **kw: Any) -> Any:
        if not armed:
            raise TimeoutError  # unanswered: the reader registers again when it next waits
        entered.set()
        await release.wait()
        return await real(run_id, session, reader_ids, **kw)

    monkeypatch.setattr(state.coordinator, "register_readers", register_readers)
    async with RunRead(state, run, "-1") as read:
        got = _values(await read.next(10))
        while len(got) < 2:
            got += _values(await read.next(10))
        assert got == chunks[:2]
        armed = True
        waiting = asyncio.create_task(read.next(5))
        try:
            await asyncio.wait_for(entered.wait(), 10)  # the reader is in its presence RPC
            await w.append(chunks[2:], origin="journal")
            await w.close("completed")
            hub = state.hubs._hubs[run]
            await assert_eventually(lambda: hub.closed, timeout=10)  # the tail read it all
            release.set()
            step = await asyncio.wait_for(waiting, 10)
        finally:
            waiting.cancel()
        assert step is not None, "the reader waited out its timeout with the chunks already read"
        rest = _values(step)
        assert rest == chunks[2:]
        end = await read.next(5)
        assert isinstance(end, End) and end.status == "completed"


async def test_a_reader_behind_the_kept_window_reads_the_dropped_chunks_on_its_own(
        gateway: Gateway, cc: Any, dlog: Any) -> None:
    """The tail keeps its newest frames only; a reader whose last chunk is older than a
    dropped one reads on from its own offset, so nothing between is skipped."""
    state = gateway.state
    state.hubs = Hubs(state.log, max_frames=3)  # this gateway's tail keeps 3 frames
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    async with RunRead(state, run, "-1") as read:
        got = _values(await read.next(10))
        while len(got) < 2:
            got += _values(await read.next(10))
        # While this reader's client is slow, the run writes 6 more chunks: the tail drops 3.
        await w.append(chunks[2:], origin="journal")
        await w.close("completed")
        hub = state.hubs._hubs[run]
        await assert_eventually(lambda: hub.closed, timeout=10)
        assert hub.base > 0  # frames were dropped
        rest, step = await _read_to_end(read)
        got += rest
        assert got == chunks and isinstance(step, End) and step.status == "completed"


async def test_a_resumed_reader_with_no_tail_opens_one_at_its_offset(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A reconnect (``Last-Event-ID``) to a run nobody reads here opens the run's tail at its
    offset, not at the run's start (it must not wait for the whole log to be read again);
    a reader from the start that comes while that tail lives still gets every chunk, once."""
    state = gateway.state
    state.hubs = Hubs(state.log, linger=0)  # a tail goes with its last reader
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    await w.append(chunks[2:4], origin="journal")
    offsets = await _offsets_of_all(state, run, 4)
    assert run not in state.hubs._hubs  # the first reader left: no tail for the run
    cut = offsets[1]
    async with RunRead(state, run, str(cut)) as resumed, RunRead(state, run, "-1") as fresh:
        assert await resumed.open() is None
        hub = state.hubs._hubs[run]
        await assert_eventually(lambda: len(hub.seqs) >= 2, timeout=10)
        assert hub.seqs[0] > cut  # the tail began after the resumed reader's offset
        await w.append(chunks[4:], origin="journal")
        await w.close("completed")
        for read, want in ((resumed, chunks[2:]), (fresh, chunks)):
            got, step = await _read_to_end(read)
            assert got == want and isinstance(step, End) and step.status == "completed"


async def test_a_catch_up_read_at_the_tail_with_no_tail_open_ends_at_once(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A bounded read (``until``) from the log's last offset, the first reader of the run
    here: its tail opens at that offset and knows the log up to it, so the read is caught up
    at once instead of waiting for a record that may never come."""
    state = gateway.state
    state.hubs = Hubs(state.log, linger=0)  # a tail goes with its last reader
    run, _chunks, _w = await _open_run(cc, dlog, ["a"])
    offsets = await _offsets_of_all(state, run, 2)
    assert run not in state.hubs._hubs
    async with RunRead(state, run, str(offsets[-1]), until=offsets[-1]) as read:
        step = await read.next(10)
        assert isinstance(step, CaughtUp) and step.position == offsets[-1]


async def test_a_reader_gets_chunks_while_its_presence_registers_and_leaves_no_key_behind(
        gateway: Gateway, cc: Any, dlog: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The presence RPC is not on the way to a reader's first chunk (a resume waits for the
    log, not for an etcd write); a reader closed while its registration is still under way
    waits for it, then removes the key it made."""
    state = gateway.state
    run, chunks, _w = await _open_run(cc, dlog, ["a", "b"])
    real_register, real_unregister = state.coordinator.register_readers, state.coordinator.unregister_readers
    release, calls = asyncio.Event(), []

    async def register_readers(run_id: str, session: Any, reader_ids: list[str], **kw: Any) -> Any:
        await release.wait()
        calls.append("register")
        return await real_register(run_id, session, reader_ids, **kw)

    async def unregister_readers(run_id: str, reader_ids: list[str], **kw: Any) -> Any:
        calls.append("unregister")
        return await real_unregister(run_id, reader_ids, **kw)

    monkeypatch.setattr(state.coordinator, "register_readers", register_readers)
    monkeypatch.setattr(state.coordinator, "unregister_readers", unregister_readers)
    read = RunRead(state, run, "-1")
    try:
        got = _values(await read.next(10))
        while len(got) < 2:
            got += _values(await read.next(10))
        assert got == chunks[:2] and calls == []  # served while the registration waits
    finally:
        closing = asyncio.create_task(read.aclose())
        await asyncio.sleep(0)  # (one turn: the close is under way, not a wait for time)
        assert not closing.done()  # it waits for the registration under way
        release.set()
        await asyncio.wait_for(closing, 10)
    assert calls == ["register", "unregister"]

