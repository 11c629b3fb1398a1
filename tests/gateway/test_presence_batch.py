"""The presence batcher (gateway/_presence_batch.py), without servers: a lone reader's call is
made at once, readers that come while a call is under way go together in the next one, and
each gets the outcome of the call that carried it."""
from __future__ import annotations

import asyncio
from typing import Any, Coroutine

import pytest

from gateway._presence_batch import Batcher, BatcherClosed


class Calls:
    """A ``send`` that records each call and waits for ``gate`` (set: answers at once)."""

    def __init__(self) -> None:
        self.made: list[tuple[Any, list[str]]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.fail: dict[int, Exception] = {}  # call index -> what it raises

    async def __call__(self, key: Any, items: list[str]) -> None:
        self.made.append((key, items))
        self.entered.set()
        await self.gate.wait()
        err = self.fail.get(len(self.made) - 1)
        if err is not None:
            raise err


class Owner:
    """``GatewayState.spawn``: owned tasks; ``closed`` starts none."""

    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []
        self.closed = False

    def spawn(self, coro: Coroutine[object, object, None], name: str) -> asyncio.Task[None] | None:
        if self.closed:
            coro.close()
            return None
        t = asyncio.get_running_loop().create_task(coro, name=name)
        self.tasks.append(t)
        return t


async def test_a_lone_reader_makes_its_call_at_once() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    await asyncio.wait_for(b.submit("run-1", "r1"), 5)
    assert calls.made == [("run-1", ["r1"])]


async def test_readers_that_come_during_a_call_go_together_in_the_next_ones() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    calls.gate.clear()
    first = asyncio.create_task(b.submit("run-1", "r0"))
    await asyncio.wait_for(calls.entered.wait(), 5)  # r0's call is under way
    rest = [asyncio.create_task(b.submit("run-1", f"r{i}")) for i in range(1, 101)]
    await asyncio.sleep(0)  # (one turn: all 100 are waiting, not a wait for time)
    calls.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *rest), 5)
    assert [items for _, items in calls.made] == [
        ["r0"], [f"r{i}" for i in range(1, 65)], [f"r{i}" for i in range(65, 101)]]
    assert (b.calls, b.items) == (3, 101)


async def test_each_run_has_its_own_calls() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    await asyncio.wait_for(asyncio.gather(b.submit("a", "r1"), b.submit("b", "r2"), b.submit("a", "r3")), 5)
    assert sorted(calls.made) == [("a", ["r1", "r3"]), ("b", ["r2"])]


async def test_a_failed_call_fails_its_readers_only() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=2, name="t")
    calls.fail[1] = RuntimeError("etcd said no")
    calls.gate.clear()
    tasks = [asyncio.create_task(b.submit("run", f"r{i}")) for i in range(5)]
    await asyncio.wait_for(calls.entered.wait(), 5)
    calls.gate.set()
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    # Calls: [r0, r1] (answers), [r2, r3] (fails), [r4] (answers).
    assert [items for _, items in calls.made] == [["r0", "r1"], ["r2", "r3"], ["r4"]]
    assert done[0] is None and done[1] is None and done[4] is None
    assert isinstance(done[2], RuntimeError) and isinstance(done[3], RuntimeError)


async def test_a_repeated_reader_is_sent_once_and_both_callers_answered() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    calls.gate.clear()
    first = asyncio.create_task(b.submit("run", "x"))
    await asyncio.wait_for(calls.entered.wait(), 5)
    again = [asyncio.create_task(b.submit("run", "y")), asyncio.create_task(b.submit("run", "y"))]
    await asyncio.sleep(0)
    calls.gate.set()
    await asyncio.wait_for(asyncio.gather(first, *again), 5)
    assert [items for _, items in calls.made] == [["x"], ["y"]]


async def test_a_caller_that_gives_up_still_has_its_reader_sent() -> None:
    """The caller's timeout does not take its reader out of the next call: a presence key
    must be removed even by a reader that stopped waiting, so the key and its removal stay
    paired (the reader removes it whatever happened)."""
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    calls.gate.clear()
    first = asyncio.create_task(b.submit("run", "a"))
    await asyncio.wait_for(calls.entered.wait(), 5)
    quitter = asyncio.create_task(b.submit("run", "b"))
    stays = asyncio.create_task(b.submit("run", "c"))
    await asyncio.sleep(0)
    quitter.cancel()
    calls.gate.set()
    await asyncio.wait_for(asyncio.gather(first, stays), 5)
    assert quitter.cancelled()
    assert [items for _, items in calls.made] == [["a"], ["b", "c"]]


async def test_shutting_down_makes_no_call_and_says_so() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    owner.closed = True
    with pytest.raises(BatcherClosed):
        await b.submit("run", "r")
    assert calls.made == []
    owner.closed = False
    await asyncio.wait_for(b.submit("run", "r2"), 5)  # nothing was left queued
    assert calls.made == [("run", ["r2"])]


async def test_the_owner_cancelling_the_calls_cancels_their_waiting_readers() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    calls.gate.clear()
    first = asyncio.create_task(b.submit("run", "a"))
    await asyncio.wait_for(calls.entered.wait(), 5)
    second = asyncio.create_task(b.submit("run", "b"))
    await asyncio.sleep(0)
    for t in owner.tasks:
        t.cancel()
    done = await asyncio.wait_for(asyncio.gather(first, second, return_exceptions=True), 5)
    assert all(isinstance(d, asyncio.CancelledError) for d in done)
    calls.gate.set()
    await asyncio.wait_for(b.submit("run", "c"), 5)  # a new call starts afresh
    assert [items for _, items in calls.made] == [["a"], ["c"]]


def test_a_batch_of_none_is_refused() -> None:
    with pytest.raises(ValueError):
        Batcher(Calls(), Owner().spawn, max_batch=0, name="t")


async def test_the_outcome_of_a_call_outlives_a_caller_that_stopped_waiting() -> None:
    """What a reader's removal waits for: the call that carried its registration, also when
    the reader itself was cancelled while it waited."""
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    calls.gate.clear()
    outcome = b.enqueue("run", "a")

    async def wait() -> None:
        await asyncio.shield(outcome)
    waiter = asyncio.create_task(wait())
    await asyncio.wait_for(calls.entered.wait(), 5)
    waiter.cancel()
    await asyncio.sleep(0)
    assert waiter.cancelled() and not outcome.done()  # the call is still under way
    calls.gate.set()
    await asyncio.wait_for(outcome, 5)
    assert calls.made == [("run", ["a"])]


async def test_calls_cancelled_before_they_began_cancel_their_readers_and_leave_no_queue() -> None:
    calls, owner = Calls(), Owner()
    b: Batcher[str] = Batcher(calls, owner.spawn, max_batch=64, name="t")
    outcome = b.enqueue("run", "a")
    owner.tasks[0].cancel()  # the owner's shutdown, before the task ran at all
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(outcome, 5)
    assert calls.made == []
    await asyncio.wait_for(b.submit("run", "b"), 5)  # the key is not stuck
    assert calls.made == [("run", ["b"])]


async def test_a_reader_queued_as_a_run_s_calls_end_gets_a_call_of_its_own() -> None:
    """The calls' task ended (nothing waited) but its end is not handled yet (a task's done
    callbacks run a turn later) when the next reader comes: that reader must be sent, not
    cancelled with the ended task."""
    owner = Owner()
    made: list[list[str]] = []
    later: list[asyncio.Future[None]] = []
    b: Batcher[str] = Batcher(lambda key, items: send(items), owner.spawn, max_batch=64, name="t")

    async def send(items: list[str]) -> None:
        made.append(items)
        if items == ["a"]:  # runs after this call returns, before its task's end is handled
            asyncio.get_running_loop().call_soon(lambda: later.append(b.enqueue("run", "b")))

    await asyncio.wait_for(b.submit("run", "a"), 5)
    await asyncio.wait_for(later[0], 5)
    assert made == [["a"], ["b"]]
