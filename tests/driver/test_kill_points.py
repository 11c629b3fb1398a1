"""Kill points: SIGKILL the driving host anywhere; another host takes over (docs/design.md §5.4).

A reader connected the whole time must receive exactly the chunk sequence of the same run
without a kill (no gap, no duplicate, same order), the saved transcript must be equal and
the record must end ``completed``.

What an uninterrupted reader sees (the baseline): ``RUN_STARTED`` (journal origin, appended
by the fresh start before the sandbox exists), ``CUSTOM run.accepted`` (host origin, written
once by the fresh start) and then the rest of the translator's chunks. A takeover appends no
host chunk of its own, so the sequences compare exactly (run and thread ids normalised).
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from tests.conftest import assert_eventually
from tests.driver.conftest import Cluster, make_cluster, normalize, normalize_obj, status_of

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
DELAY = 0.01  # seconds per journal line: the host is never far ahead of the reader

# (name, how to find the chunk index k at which the reader triggers the SIGKILL)
KILL_POINTS = [
    "start",                        # right after StartRun returned: before the sandbox is ready
    "accepted",                     # run.accepted seen
    "first:RUN_STARTED",            # the log's first chunk, before run.accepted
    "first:REASONING_START",
    "nth:REASONING_MESSAGE_CONTENT:3",
    "first:REASONING_END",
    "first:TEXT_MESSAGE_START",
    "nth:TEXT_MESSAGE_CONTENT:1",   # inside a long text message
    "nth:TEXT_MESSAGE_CONTENT:4",
    "first:TOOL_CALL_START",        # between TOOL_CALL_START and its TOOL_CALL_ARGS
    "nth:TOOL_CALL_ARGS:0",
    "nth:TOOL_CALL_ARGS:2",         # tool args cut between deltas
    "first:TOOL_CALL_END",
    "first:TOOL_CALL_RESULT",
    "last:TEXT_MESSAGE_START",
    "nth-last:TEXT_MESSAGE_CONTENT:2",
    "last:TEXT_MESSAGE_CONTENT",
    "last:TEXT_MESSAGE_END",        # just before the terminal line
    "index:10",
    "fraction:0.5",
    "double:20",                    # kill at chunk 20, then kill the successor right after its fence
]


def resolve(point: str, base: list[dict[str, Any]]) -> int:
    kind, _, arg = point.partition(":")
    types = [c["type"] for c in base]
    if kind == "start":
        return -1
    if kind == "accepted":
        return 1
    if kind == "first":
        return types.index(arg)
    if kind == "last":
        return len(types) - 1 - types[::-1].index(arg)
    if kind == "nth":
        t, n = arg.split(":")
        return [i for i, x in enumerate(types) if x == t][int(n)]
    if kind == "nth-last":
        t, n = arg.split(":")
        return [i for i, x in enumerate(types) if x == t][-1 - int(n)]
    if kind in ("index", "double"):
        return int(arg)
    if kind == "fraction":
        return int(len(base) * float(arg))
    raise ValueError(point)


@pytest.fixture(scope="module")
async def kcluster(etcd: Any, nats: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("kill"), hosts=3)
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture(scope="module")
async def baseline(kcluster: Cluster) -> dict[str, Any]:
    return await uninterrupted(kcluster)


async def uninterrupted(c: Cluster) -> dict[str, Any]:
    """What a reader and the transcript get from the same run without a kill."""
    started = await c.start_run(c.hosts[0], JOURNAL, delay=DELAY)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    chunks = [ch for _, ch in await c.read_all(run_id)]
    await c.wait_status(run_id, "completed")
    msgs, _ = await c.transcripts.load(thread_id)
    return {"chunks": chunks, "norm": normalize(chunks, run_id, thread_id),
            "transcript": normalize_obj(msgs, run_id, thread_id)}


async def _wait_fence(c: Cluster, run_id: str, epoch: int) -> None:
    async def fenced() -> bool:
        rec = await c.log.last_record(run_id)
        return rec is not None and rec.epoch >= epoch
    await assert_eventually(fenced, timeout=20, interval=0.005)


@pytest.mark.parametrize("point", KILL_POINTS)
async def test_kill_point(kcluster: Cluster, baseline: dict[str, Any], point: str) -> None:
    await run_kill_point(kcluster, baseline, point)


async def run_kill_point(c: Cluster, baseline: dict[str, Any], point: str) -> None:
    """Start the corpus run, SIGKILL its driving host at ``point``, compare with the baseline."""
    base = baseline["chunks"]
    k = resolve(point, base)
    victim = c.hosts[0]
    started = await c.start_run(victim, JOURNAL, delay=DELAY)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    restarts: dict[str, asyncio.Task[None]] = {}
    still_running = True

    async def kill(h: Any) -> None:
        pending = restarts.get(h.host_id)
        if pending is not None:
            await pending  # a host that is coming back up is killed once it serves
        h.kill_now()
        restarts[h.host_id] = asyncio.create_task(h.start())

    if k < 0:
        await kill(victim)
    got: list[dict[str, Any]] = []
    try:
        async with c.log.read(run_id) as reader:
            async for _, chunk in reader:
                got.append(chunk)
                if len(got) - 1 == k:
                    await kill(victim)
                    # On a slow machine the victim may have ended the run before the kill landed.
                    still_running = status_of((await c.cc.get_run(run_id)).record) == "running"
                    if point.startswith("double:"):
                        await _wait_fence(c, run_id, 2)
                        view = await c.cc.get_run(run_id)
                        successor = next((h for h in c.hosts if view.claim and h.host_id == view.claim.host_id), None)
                        # On a slow machine the successor may have finished the run (its claim
                        # released) before we look, or before the kill lands: only a successor
                        # killed mid-run forces a third claim.
                        if successor is None:
                            still_running = False
                        else:
                            await kill(successor)
                            still_running = status_of((await c.cc.get_run(run_id)).record) == "running"
    finally:
        await asyncio.gather(*restarts.values())
    rec = await c.wait_status(run_id, "completed")
    assert rec.driver_epoch >= ((3 if point.startswith("double:") else 2) if still_running else 1)
    assert normalize(got, run_id, thread_id) == baseline["norm"]
    msgs, _ = await c.transcripts.load(thread_id)
    assert normalize_obj(msgs, run_id, thread_id) == baseline["transcript"]
    assert status_of(rec) == "completed"
