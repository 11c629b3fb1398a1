"""A paused old host never overwrites a successor's final transcript.

The driving host of several runs is frozen (SIGSTOP) past its lease; the other host takes
every run over and finishes it, saving each thread's final transcript. Then the old host
wakes up (SIGCONT). Its periodic snapshot is due at once, before it notices that its
session is gone: before the transcript fence, such stale saves replaced the successor's
transcript (last writer won). Now every save is fenced inside the compare-and-set, so each
saved transcript stays exactly what the successor saved.
"""
from __future__ import annotations

from typing import Any, AsyncIterator

import pytest

from tests.conftest import assert_eventually
from tests.driver.conftest import Cluster, make_cluster

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
RUNS = 4


@pytest.fixture
async def cluster(etcd: Any, nats: Any, tmp_path: Any) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path, hosts=2, BATON_SESSION_TTL="5")  # a loaded machine
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.timeout(240)
async def test_a_woken_old_host_leaves_every_successors_transcript_alone(cluster: Cluster) -> None:
    c = cluster
    a, b = c.hosts
    runs = [await c.start_run(a, LONG, delay=0.02) for _ in range(RUNS)]
    ids = [(r.record.run_id, r.record.thread_id) for r in runs]

    async def snapshotted(thread_id: str) -> bool:  # the old host saved this run's transcript
        msgs, _ = await c.transcripts.load(thread_id)
        return len(msgs) > 1

    for _, thread_id in ids:
        await assert_eventually(lambda t=thread_id: snapshotted(t), timeout=60, interval=0.05)
    a.sigstop()  # frozen past its lease: the leader hands every run to the other host
    try:
        for run_id, _ in ids:
            rec = await c.wait_status(run_id, "completed", timeout=120)
            assert rec.driver_epoch == 2 and rec.driver_host == b.host_id
        saved = {t: await c.transcripts.load(t) for _, t in ids}
        heads = {r: await c.log.stored_headers(r) for r, _ in ids}
    finally:
        a.sigcont()
    # The old host wakes up; every driver of it ends at epoch 1 without landing anything.
    for run_id, _ in ids:
        await assert_eventually(lambda r=run_id: f"run {r}: driver ended at epoch 1" in a.log_text(),
                                timeout=30, interval=0.05)
    for run_id, thread_id in ids:
        assert await c.transcripts.load(thread_id) == saved[thread_id]
        assert await c.log.stored_headers(run_id) == heads[run_id]
    msgs = saved[ids[0][1]][0]
    assert msgs[0]["role"] == "user" and msgs[-1]["role"] == "assistant"
