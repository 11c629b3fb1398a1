"""Property: two writers (epoch 1 and epoch 2) racing on one log never break the fence."""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from baton.errors import AppendConflict, RunClaimLost
from baton.fingerprint import fingerprint
from baton.log import DeliveryLog, LogWriter
from tests.conftest import unique

# Each writer's plan: a list of (batch size, scheduler yields before the call, wait until
# the epoch-2 fence has landed before the call: the paused writer holding a stale head).
plan = st.lists(st.tuples(st.integers(1, 3), st.integers(0, 3), st.booleans()), min_size=1, max_size=4)
Plan = list[tuple[int, int, bool]]


@pytest_asyncio.fixture(autouse=True, loop_scope="session")
async def loop_without_debug() -> AsyncIterator[None]:
    """asyncio's debug mode off for the 1,000 examples, back on after.

    Debug mode records a stack trace for every callback the loop schedules; the examples
    schedule tens of thousands (each ``sleep(0)`` and JetStream reply), which took 2.4 times
    the CPU and, on a loaded machine, about three times the wall time (over the test's
    timeout). What debug mode adds is not what this test checks: the writers run in one
    thread, a coroutine never awaited still warns (an error here), and slow steps are not
    asserted.
    """
    loop = asyncio.get_running_loop()
    was = loop.get_debug()
    loop.set_debug(False)
    try:
        yield
    finally:
        loop.set_debug(was)


def c(tag: str, i: int) -> dict[str, Any]:
    return {"type": "TEXT_MESSAGE_CONTENT", "messageId": tag, "delta": str(i)}


async def drive(w: LogWriter, tag: str, steps: Plan, fence_first: bool,
                fence_delay: int, landed: list[str], fenced: asyncio.Event) -> bool:
    """Run a writer's plan, retrying conflicts; record offsets the log acknowledged.

    Returns True if the writer latched.
    """
    n = 0
    try:
        if fence_first:
            for _ in range(fence_delay):
                await asyncio.sleep(0)
            await w.fence()
            fenced.set()
        for size, yields, after_fence in steps:
            if after_fence and not fence_first:
                await fenced.wait()
            for _ in range(yields):
                await asyncio.sleep(0)
            batch = [c(tag, n + k) for k in range(size)]
            while batch:
                try:
                    offsets = await w.append(batch)
                    landed += offsets
                    batch = []
                except AppendConflict as exc:
                    landed += exc.landed
                    batch = batch[len(exc.landed):]
                    await w.resync()
            n += size
    except RunClaimLost:
        return True
    return False


# 1,000 examples of a few JetStream round trips each: 85 s at a load of 10 on two cores,
# so the default 120 s left no margin.
@pytest.mark.timeout(300)
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(p1=plan, p2=plan, fence_delay=st.integers(0, 6))
async def test_two_writers_never_break_the_fence(
    dlog: DeliveryLog, p1: Plan, p2: Plan, fence_delay: int
) -> None:
    run_id = unique("race")
    w1 = dlog.writer(run_id, 1)
    w2 = dlog.writer(run_id, 2)
    await w1.fence()
    landed1: list[str] = []
    landed2: list[str] = []
    fenced = asyncio.Event()
    latched1, latched2 = await asyncio.gather(
        drive(w1, "w1", p1, False, 0, landed1, fenced),
        drive(w2, "w2", p2, True, fence_delay, landed2, fenced),
    )
    assert not latched2
    event(f"epoch-1 writer latched during its plan: {latched1}")
    recs = await dlog.stored_headers(run_id)
    fences = [r for r in recs if r.kind == "fence" and r.epoch == 2]
    assert len(fences) == 1
    fence_at = fences[0].offset
    # no epoch-1 record after the epoch-2 fence
    assert all(r.epoch == 2 for r in recs if r.offset > fence_at)
    # no chunk twice, and exactly what the writers were told landed is stored
    chunks = [r for r in recs if r.kind == "chunk"]
    fps = [r.fingerprint for r in chunks]
    assert len(fps) == len(set(fps))
    # epoch 1: what it was told landed is a prefix of what is stored (a batch cut short by
    # the latch may have landed a few chunks before the refused one), all in plan order
    stored1 = [r for r in chunks if r.epoch == 1]
    assert [str(r.offset) for r in stored1][: len(landed1)] == landed1
    assert [r.fingerprint for r in stored1] == [fingerprint(c("w1", i)) for i in range(len(stored1))]
    assert [str(r.offset) for r in chunks if r.epoch == 2] == landed2
    assert [r.fingerprint for r in chunks if r.epoch == 2] == [
        fingerprint(c("w2", i)) for i in range(sum(step[0] for step in p2))
    ]
    # the epoch-1 writer is latched (now, if not already) and silent afterwards
    try:
        await w1.append([c("w1", 999)])
        raise AssertionError("epoch 1 appended after the epoch-2 fence")
    except RunClaimLost:
        pass
    assert w1.latched
    assert await w1.close("failed") is False
    assert len(await dlog.stored_headers(run_id)) == len(recs)
    assert latched1 or all(r.offset < fence_at for r in stored1)
