"""The retry helper (no servers): one deadline across attempts, capped pauses, stop, cancel.

A fake clock moves only when an attempt says so, so budgets are exact and the tests never
wait; real pauses are a millisecond (or interrupted).
"""
from __future__ import annotations

import asyncio
import math

import pytest

from baton.errors import StoreUnavailable
from baton.retry import Attempts, Deadline, retry

pytestmark = pytest.mark.unit

TINY = 0.001


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Flaky:
    """Fails with ``exc`` ``failures`` times, then returns ``"ok"``; each call costs ``cost`` seconds."""

    def __init__(self, failures: int, clock: FakeClock | None = None, cost: float = 0.0,
                 exc: type[BaseException] = StoreUnavailable) -> None:
        self.failures, self.clock, self.cost, self.exc = failures, clock, cost, exc
        self.calls = 0
        self.raised: list[BaseException] = []

    async def __call__(self) -> str:
        self.calls += 1
        if self.clock is not None:
            self.clock.now += self.cost
        if self.calls <= self.failures:
            err = self.exc(f"attempt {self.calls}")
            self.raised.append(err)
            raise err
        return "ok"


async def test_first_success_is_returned_without_a_pause() -> None:
    op = Flaky(0)
    assert await retry(op, deadline=Deadline.after(5), retry_on=(StoreUnavailable,), first_pause=60,
                       max_pause=60) == "ok"
    assert op.calls == 1


async def test_retries_the_named_failures_until_success() -> None:
    op = Flaky(3)
    seen: list[str] = []
    got = await retry(op, deadline=Deadline.after(60), retry_on=(StoreUnavailable,), first_pause=TINY,
                      max_pause=TINY, on_retry=lambda e: seen.append(str(e)))
    assert got == "ok" and op.calls == 4
    assert seen == ["attempt 1", "attempt 2", "attempt 3"]


async def test_other_failures_propagate_at_once() -> None:
    op = Flaky(5, exc=KeyError)
    with pytest.raises(KeyError):
        await retry(op, deadline=Deadline.after(60), retry_on=(StoreUnavailable,), first_pause=TINY)
    assert op.calls == 1


async def test_the_deadline_is_a_budget_across_attempts() -> None:
    """Each attempt costs 1 s of a 3.5 s budget: attempts at 0, 1, 2, 3 and none after."""
    clock = FakeClock()
    op = Flaky(100, clock, cost=1.0)
    d = Deadline.after(3.5, clock=clock)
    with pytest.raises(StoreUnavailable) as ei:
        await retry(op, deadline=d, retry_on=(StoreUnavailable,), first_pause=TINY, max_pause=TINY)
    assert op.calls == 4 and ei.value is op.raised[-1]  # the last failure, not a generic one
    assert d.expired and d.left() == 0.0


async def test_an_expired_deadline_still_gets_one_attempt() -> None:
    clock = FakeClock()
    op = Flaky(1, clock)
    with pytest.raises(StoreUnavailable):
        await retry(op, deadline=Deadline(-1.0, clock), retry_on=(StoreUnavailable,), first_pause=TINY)
    assert op.calls == 1


async def test_no_pause_runs_into_the_deadline() -> None:
    """With 0.3 s left a 0.5 s pause would end after the deadline: give up instead of waiting."""
    clock = FakeClock()
    op = Flaky(100, clock)
    with pytest.raises(StoreUnavailable):
        await retry(op, deadline=Deadline.after(0.3, clock=clock), retry_on=(StoreUnavailable,),
                    first_pause=0.5, max_pause=60)
    assert op.calls == 1


def test_pauses_double_up_to_the_cap_and_reset() -> None:
    a = Attempts(Deadline.never(), first_pause=0.1, max_pause=0.5)
    assert [a.next_pause() for _ in range(5)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    a.reset()
    assert a.next_pause() == 0.1


def test_bad_pauses_are_refused() -> None:
    with pytest.raises(ValueError):
        Attempts(Deadline.never(), first_pause=2.0, max_pause=1.0)


async def test_stop_set_before_a_retry_ends_it_with_the_last_failure() -> None:
    stop = asyncio.Event()
    op = Flaky(100)

    async def failing_then_stopping() -> str:
        if op.calls == 1:
            stop.set()
        return await op()

    with pytest.raises(StoreUnavailable) as ei:
        await retry(failing_then_stopping, deadline=Deadline.never(), retry_on=(StoreUnavailable,),
                    first_pause=TINY, stop=stop)
    assert op.calls == 2 and ei.value is op.raised[-1]


async def test_stop_cuts_a_pause_short() -> None:
    """A 1-hour pause ends as soon as ``stop`` is set (the test's timeout guards the claim)."""
    stop = asyncio.Event()
    op = Flaky(100)

    async def failing() -> str:
        asyncio.get_running_loop().call_soon(stop.set)  # set during the pause that follows
        return await op()

    with pytest.raises(StoreUnavailable):
        await retry(failing, deadline=Deadline.never(), retry_on=(StoreUnavailable,),
                    first_pause=3600, max_pause=3600, stop=stop)
    assert op.calls == 1


async def test_cancellation_during_a_pause_is_not_swallowed() -> None:
    op = Flaky(100)
    pausing = asyncio.Event()

    async def failing() -> str:
        pausing.set()
        return await op()

    task = asyncio.create_task(retry(failing, deadline=Deadline.never(), retry_on=(StoreUnavailable,),
                                     first_pause=3600, max_pause=3600))
    await pausing.wait()
    await asyncio.sleep(0)  # let the attempt fail and the pause begin
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert op.calls == 1


async def test_attempts_iterate_until_the_budget_is_spent() -> None:
    clock = FakeClock()
    d = Deadline.after(2.5, clock=clock)
    seen = []
    async for n in Attempts(d, first_pause=TINY, max_pause=TINY):
        seen.append(n)
        clock.now += 1.0
    assert seen == [1, 2, 3]


async def test_attempts_reset_after_progress_keeps_pauses_short() -> None:
    tries = Attempts(Deadline.never(), first_pause=TINY, max_pause=3600)
    async for n in tries:
        tries.reset()  # progress each time: the pause never grows toward the hour
        if n == 20:
            break
    assert tries.number == 20 and tries.next_pause() == TINY


async def test_attempts_end_when_stop_is_set() -> None:
    stop = asyncio.Event()
    seen = []
    async for n in Attempts(Deadline.never(), first_pause=TINY, stop=stop):
        seen.append(n)
        if n == 2:
            stop.set()
    assert seen == [1, 2]


def test_deadline_arithmetic() -> None:
    clock = FakeClock()
    d = Deadline.after(10, clock=clock)
    assert d.left() == 10 and d.cap(3) == 3 and not d.expired
    clock.now = 8
    assert d.cap(3) == 2
    clock.now = 11
    assert d.left() == 0.0 and d.cap(3) == 0.0 and d.expired
    assert Deadline.never().left() == math.inf and Deadline.never().cap(5) == 5
    assert Deadline.after(1, clock=clock) == Deadline(12, clock=lambda: 0.0)  # the clock is not compared
