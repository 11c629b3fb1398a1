"""A run's shared tail outlives its last reader (``BATON_TAIL_LINGER``, gateway/_fanout.py
``Hubs``): whatever offset a reader comes back at, it gets every chunk after it once; a tail
it cannot use is replaced, not kept alive; nothing (timer, task, consumer) stays behind.
Real NATS and etcd (a helper's attempts to break it, kept)."""
from __future__ import annotations

import asyncio
from typing import Any

from gateway._fanout import Hubs
from gateway._reader import End, Gap, RunRead
from tests.conftest import assert_eventually
from tests.gateway.conftest import Gateway
from tests.gateway.test_shared_tail import _offsets_of_all, _open_run, _read_to_end, _values


async def _consumers(dlog: Any, run: str) -> list[str]:
    subject = dlog.cfg.subject(run)
    return sorted(c.name for c in await dlog.js.consumers_info(dlog.cfg.stream)
                  if c.config.filter_subject == subject)


async def _no_consumers(dlog: Any, run: str) -> bool:
    return await _consumers(dlog, run) == []


async def test_a_second_release_of_a_tail_does_not_keep_it_for_ever(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A release of a tail nobody holds any more changes nothing: the linger armed by the
    first ends it (a second timer over the first, with readers at -1, kept it and its
    consumer until the gateway stopped)."""
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=0.2)
    run, _chunks, _w = await _open_run(cc, dlog, ["a", "b"])
    hub = hubs.acquire(run)
    await assert_eventually(lambda: len(hub.seqs) == 2, timeout=10)
    await hubs.release(hub)
    await hubs.release(hub)
    try:
        await assert_eventually(lambda: not hubs.serving(run), timeout=3)
    finally:
        await hubs.aclose()


async def test_a_tail_acquired_after_the_close_does_not_linger(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A reader that acquires after ``Hubs.aclose`` (shutdown) and leaves: its tail goes with
    it, not on a timer nobody will cancel."""
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=30)
    run, _chunks, _w = await _open_run(cc, dlog, ["a", "b"])
    await hubs.aclose()
    async with RunRead(state, run, "-1") as r:
        got, _ = [], None
        while len(got) < 2:
            got += _values(await r.next(10))
    try:
        assert not hubs.serving(run), "a tail outlives the Hubs' close"
    finally:
        await hubs.aclose()


async def test_joins_of_a_lingering_tail_opened_at_an_offset(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A tail opened at a resume offset lingers; readers at every kind of offset get exactly
    the chunks after theirs, once, before and after the log closed."""
    state = gateway.state
    state.hubs = Hubs(state.log, linger=0)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    await w.append(chunks[2:4], origin="journal")
    offs = await _offsets_of_all(state, run, 4)
    hubs = state.hubs = Hubs(state.log, linger=30)
    try:
        async with RunRead(state, run, str(offs[1])) as r:  # the tail opens at offs[1]
            got = _values(await r.next(10))
            assert got == chunks[2:4]
        hub = hubs._hubs[run]
        assert hub.readers == 0 and hub.dropped_through == offs[1]
        # The readers below from before offs[1] replace that tail with one from their offset.
        want = {"-1": chunks[:4], str(offs[0]): chunks[1:4], str(offs[1]): chunks[2:4],
                str(offs[2]): chunks[3:4]}
        for after, exp in want.items():
            async with RunRead(state, run, after) as r:
                got = []
                while len(got) < len(exp):
                    got += _values(await r.next(10))
                assert got == exp, after
        # at its position: nothing now, then the rest, then End
        async with RunRead(state, run, str(offs[3])) as r:
            assert await r.next(0.3) is None
            await w.append(chunks[4:], origin="journal")
            await w.close("completed")
            got, end = await _read_to_end(r, idle=False)
            assert got == chunks[4:] and isinstance(end, End) and end.status == "completed"
        await assert_eventually(lambda: hubs._hubs[run].closed, timeout=10)
        hub = hubs._hubs[run]
        offs = await _offsets_of_all(state, run, len(chunks))
        for i, after in enumerate(["-1", *map(str, offs)]):
            async with RunRead(state, run, after) as r:
                got, end = await _read_to_end(r, idle=False)
                assert got == chunks[i:], after
                assert isinstance(end, End) and end.status == "completed", (after, end)
        # past the close and past the stream's end
        for after in (str(hub.close_position), str(hub.close_position + 1000)):
            async with RunRead(state, run, after) as r:
                got, end = await _read_to_end(r, idle=False)
                assert got == [] and isinstance(end, End), (after, end)
        assert await _consumers(dlog, run) == []  # the closed tail's read is over
    finally:
        await hubs.aclose()
    assert await _no_consumers(dlog, run)


async def test_a_lingering_tail_that_dropped_frames_while_nobody_read(gateway: Gateway, cc: Any, dlog: Any) -> None:
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, max_frames=3, linger=30)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    offs: list[int] = []
    async with RunRead(state, run, "-1") as r:
        while len(offs) < 2:
            step = await r.next(10)
            offs += [o for o, _ in step.items()]
    hub = hubs._hubs[run]
    await w.append(chunks[2:], origin="journal")
    await w.close("completed")
    await assert_eventually(lambda: hub.closed, timeout=10)
    assert hub.base > 0
    all_offs = await _offsets_all_own(state, run, len(chunks))
    dropped_through, first_kept = hub.dropped_through, hub.seqs[0]
    try:
        for after in ["-1", str(offs[0]), str(offs[1]), str(dropped_through), str(first_kept)]:
            async with RunRead(state, run, after) as r:
                got, end = await _read_to_end(r, idle=False)
                assert isinstance(end, End) and end.status == "completed"
                exp = [c for c, o in zip(chunks, all_offs) if o > int(after)]
                assert got == exp, (after, len(got), len(exp))
        assert hubs._hubs[run] is not hub  # a reader from before its frames replaced it
    finally:
        await hubs.aclose()
    assert await _no_consumers(dlog, run)


async def _offsets_all_own(state: Any, run: str, n: int) -> list[int]:
    """All offsets of the run, read through a fresh linger=0 Hubs (not the one under test)."""
    saved = state.hubs
    state.hubs = Hubs(state.log, linger=0)
    try:
        return await _offsets_of_all(state, run, n)
    finally:
        state.hubs = saved


async def test_no_timer_fires_and_no_consumer_stays_after_aclose(gateway: Gateway, cc: Any, dlog: Any) -> None:
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=0.3)
    run, _chunks, _w = await _open_run(cc, dlog, ["a", "b"])
    await _offsets_of_all(state, run, 2)
    timer = hubs._expiry[run]
    hub = hubs._hubs[run]
    await hubs.aclose()
    assert timer.cancelled() and not hubs._expiry and not hubs._hubs
    assert hub._task is not None and hub._task.done()
    assert await _no_consumers(dlog, run)


async def test_expire_and_acquire_churn(gateway: Gateway, cc: Any, dlog: Any) -> None:
    """Readers leave and come back around the linger's end: each gets every chunk once; a
    stale _expire for a replaced hub leaves the new one; nothing stays after aclose."""
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=0.01)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c"])
    await w.append(chunks[2:], origin="journal")
    n = len(chunks)
    for _ in range(25):
        async with RunRead(state, run, "-1") as r:
            got = []
            while len(got) < n:
                got += _values(await r.next(10))
            assert got == chunks
        await asyncio.sleep(0)  # (one turn)
    old = hubs._hubs.get(run)
    # a stale expiry of an old hub must not drop the current one
    await _offsets_of_all(state, run, n)
    cur = hubs.acquire(run)
    if old is not None and old is not cur:
        hubs._expire(old)
        assert hubs._hubs[run] is cur
    hubs._expire(cur)  # readers 1: must stay
    assert hubs._hubs[run] is cur
    await hubs.release(cur)
    await hubs.aclose()
    assert not hubs._closing and not hubs._expiry
    assert await _no_consumers(dlog, run)


async def test_many_short_readers_of_many_runs_leave_nothing(gateway: Gateway, cc: Any, dlog: Any) -> None:
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=0.2)
    runs = []
    for _ in range(12):
        run, _c, _w = await _open_run(cc, dlog, ["a", "b"])
        runs.append(run)
    for _ in range(2):
        for run in runs:
            await _offsets_of_all(state, run, 2)
    assert hubs.readers_per_run() == []
    await assert_eventually(lambda: not hubs._hubs and not hubs._expiry and not hubs._closing, timeout=10)
    for run in runs:
        assert await _no_consumers(dlog, run)
    assert not [t for t in asyncio.all_tasks() if t.get_name().startswith(("hub:", "hub-close:"))]
    await hubs.aclose()


async def test_a_purged_log_is_a_gap_for_a_resume_into_a_lingering_tail(gateway: Gateway, cc: Any, dlog: Any) -> None:
    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=30)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b"])
    await w.append(chunks[2:], origin="journal")
    await w.close("completed")
    offs = await _offsets_of_all(state, run, len(chunks))
    hub = hubs._hubs[run]
    await assert_eventually(lambda: hub.closed, timeout=10)
    # retention took the run's first records (keep the last one: its close)
    await dlog.js.purge_stream(dlog.cfg.stream, subject=dlog.cfg.subject(run), keep=1)
    try:
        async with RunRead(state, run, str(offs[1])) as r:
            step = await r.next(10)
            assert isinstance(step, Gap), step
    finally:
        await hubs.aclose()


async def test_readers_from_the_start_do_not_keep_an_offset_tail_they_cannot_use_alive(
        gateway: Gateway, cc: Any, dlog: Any) -> None:
    """A resume opened the run's tail at its offset and left. A reader from the start cannot
    use that tail (its frames begin after its offset): the tail is replaced by one from the
    start that every later reader shares, not joined, fallen behind and re-armed by each of
    them, each on a JetStream consumer of its own."""
    state = gateway.state
    state.hubs = Hubs(state.log, linger=0)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    await w.append(chunks[2:4], origin="journal")
    offs = await _offsets_of_all(state, run, 4)
    linger = 0.5
    hubs = state.hubs = Hubs(state.log, linger=linger)
    try:
        async with RunRead(state, run, str(offs[2])) as r:
            assert _values(await r.next(10)) == chunks[3:4]
        offset_tail = hubs._hubs[run]
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        own_reads = 0
        while loop.time() - t0 < 4 * linger:  # readers from the start, one after another
            async with RunRead(state, run, "-1") as r:
                got = []
                while len(got) < 4:
                    got += _values(await r.next(10))
                assert got == chunks[:4]
                own_reads += r._hub is None
        assert hubs._hubs.get(run) is not offset_tail, "the unusable offset tail outlived 4 lingers"
        assert own_reads <= 1, f"{own_reads} readers from the start each read on a consumer of their own"
    finally:
        await hubs.aclose()


async def test_a_tail_that_failed_while_lingering_is_replaced(gateway: Gateway, cc: Any, dlog: Any) -> None:
    from baton.errors import LogUnavailable

    state = gateway.state
    hubs = state.hubs = Hubs(state.log, linger=30)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b"])
    await _offsets_of_all(state, run, 2)
    old = hubs._hubs[run]
    old.failed = LogUnavailable(run, "injected")  # (the read failing while nobody reads)
    try:
        async with RunRead(state, run, "-1") as r:
            got = []
            while len(got) < 2:
                got += _values(await r.next(10))
            assert got == chunks[:2]
            new = hubs._hubs[run]
            assert new is not old and new.readers == 1 and not hubs._expiry
        await assert_eventually(lambda: old._task is not None and old._task.done(), timeout=10)
        assert len(await _consumers(dlog, run)) == 1  # the new tail's only
    finally:
        await hubs.aclose()
    assert await _no_consumers(dlog, run)


async def test_a_reader_back_within_the_linger_resumes_from_the_tail_that_stayed(
        gateway: Gateway, cc: Any, dlog: Any) -> None:
    """The last reader left (a reload, a dropped connection): the run's tail stays for the
    linger, and the reader that comes back with its ``Last-Event-ID`` is served from it,
    every chunk after its offset once, with no JetStream consumer made for it."""
    state = gateway.state
    run, chunks, w = await _open_run(cc, dlog, ["a", "b", "c", "d"])
    await w.append(chunks[2:4], origin="journal")
    offsets = await _offsets_of_all(state, run, 4)
    hub = state.hubs._hubs[run]  # stayed: nobody reads it now
    assert hub.readers == 0 and state.hubs.readers_per_run() == []
    consumers = await _consumers(dlog, run)
    assert len(consumers) == 1  # the tail's own
    async with RunRead(state, run, str(offsets[1])) as resumed:
        got = _values(await resumed.next(10))
        assert got == chunks[2:4]  # at once, from memory
        assert state.hubs._hubs[run] is hub and state.hubs.readers_per_run() == [1]
        assert await _consumers(dlog, run) == consumers  # no consumer made for it
        await w.append(chunks[4:], origin="journal")
        await w.close("completed")
        rest, step = await _read_to_end(resumed)
        got += rest
        assert got == chunks[2:] and isinstance(step, End) and step.status == "completed"


async def test_a_lingering_tail_goes_when_the_linger_ends_and_its_consumer_with_it(
        gateway: Gateway, cc: Any, dlog: Any) -> None:
    """Nobody came back: the tail is dropped after the linger, its read's consumer deleted;
    a reader after that opens a new tail and still gets every chunk."""
    state = gateway.state
    state.hubs = Hubs(state.log, linger=0.3)
    run, chunks, w = await _open_run(cc, dlog, ["a", "b"])
    async with RunRead(state, run, "-1") as first:
        got = _values(await first.next(10))
        while len(got) < 2:
            got += _values(await first.next(10))
    assert state.hubs.serving(run)
    await assert_eventually(lambda: not state.hubs.serving(run), timeout=10)
    await assert_eventually(lambda: _no_consumers(dlog, run), timeout=10)
    await w.append(chunks[2:], origin="journal")
    await w.close("completed")
    async with RunRead(state, run, "-1") as again:
        got, step = await _read_to_end(again)
    assert got == chunks and isinstance(step, End)
