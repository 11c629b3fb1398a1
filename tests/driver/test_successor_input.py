"""A successor never launches an agent without the run's input (the successor's half).

A start that failed half-way can leave a log with the fence and the opening but no
``run.accepted`` (the chunk that carries the run's input). The leader hands the orphaned run
to a live host; that host must not launch the agent on an empty prompt: it ends the run
``failed`` with ``run_input_missing``, closes the log (readers get the end), builds no
sandbox and leaves the thread's saved transcript alone.
"""
from __future__ import annotations

import json
import os
from typing import Any, AsyncIterator

import pytest

from baton.ids import file_stem
from baton.v1 import runs_pb2
from tests.conftest import unique
from tests.driver.conftest import CORPUS, Cluster, make_cluster




@pytest.fixture(scope="module")
async def cluster(etcd: Any, nats: Any, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("input-missing"), hosts=1)
    try:
        yield c
    finally:
        await c.close()


@pytest.mark.timeout(90)
async def test_a_run_whose_log_lacks_its_input_is_failed_not_launched(cluster: Cluster) -> None:
    c = cluster
    journal = next(p for p in sorted((CORPUS / "claude-stream-json").glob("*.jsonl")))
    run_id, thread_id = unique("run-"), unique("thr-")
    opts = {"journal": str(journal), "speed": 1.0, "delay": 0.0}
    await c.cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=run_id, thread_id=thread_id, status=runs_pb2.RUN_STATUS_RUNNING, started_at=1.0,
        agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts))))
    # The first host claimed, fenced and wrote the opening, then died before run.accepted.
    first = await c.cc.open_session(ttl=2, owner="first-host")
    epoch, _ = await c.cc.claim_run(run_id, first, "first-host", purpose="drive")
    w = c.log.writer(run_id, epoch)
    await w.fence()
    started = {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}
    await w.append([started], origin="journal")
    earlier = [{"id": "u0", "role": "user", "content": "an earlier run's messages"}]
    _, rev = await c.transcripts.load(thread_id)
    saved_rev = await c.transcripts.save(thread_id, earlier, expected_revision=rev)
    await first.close()  # the claim goes with the session: the leader hands the run over

    chunks = [ch for _, ch in await c.read_all(run_id, timeout=60)]
    assert chunks == [started, {"type": "RUN_ERROR", "code": "run_input_missing",
                                "message": "the run's input (run.accepted) is missing from its log"}]
    rec = await c.wait_status(run_id, "failed")
    assert rec.error.code == "run_input_missing"
    assert rec.driver_epoch > epoch
    heads = await c.log.stored_headers(run_id)
    closes = [h for h in heads if h.kind == "close"]
    assert len(closes) == 1 and closes[0].status == "failed"
    # no agent was launched: the successor built no sandbox at all
    sandboxes = c.tmp / "sandboxes"
    assert not any(name.startswith(file_stem(run_id)) for name in (os.listdir(sandboxes) if sandboxes.exists() else []))
    # the thread's transcript is not replaced by one without the input
    assert await c.transcripts.load(thread_id) == (earlier, saved_rev)
