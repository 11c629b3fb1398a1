"""A run interrupted by a newer run of its thread still ends: when the newer
run saved the thread's transcript first, the interrupted run's own save is refused (the
transcript fence), and it must still close its log and write its terminal status. Real
coordinator, host processes, agent processes, etcd and NATS.
"""
from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
from typing import AsyncIterator

import pytest

from baton.v1 import runs_pb2, sandbox_host_pb2
from baton_tools.testing.servers import EtcdServer, NatsServer
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, make_cluster

SLOW = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
FAST = "claude-stream-json/partial-messages-bash-exit-128.jsonl"


@pytest.fixture
async def cluster2(etcd: EtcdServer, nats: NatsServer, tmp_path: pathlib.Path) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path, hosts=2, BATON_CANCEL_GRACE="30")
    try:
        yield c
    finally:
        await c.close()


def agent_group(tmp: pathlib.Path, run_id: str) -> int:
    """The process group of the run's agent (the local sandbox records it)."""
    found = [p for p in (tmp / "sandboxes").glob("*/.baton/pgid") if run_id in str(p)]
    assert found, f"no agent of {run_id} yet"
    return int(found[0].read_text().strip())


@pytest.mark.timeout(180)
async def test_an_interrupted_run_whose_transcript_save_is_refused_still_ends(cluster2: Cluster) -> None:
    c = cluster2
    h0, h1 = c.hosts
    thread = unique("thr-")
    first_in = [{"id": "u1", "role": "user", "content": "first"}]
    a = await c.start_run(h0, SLOW, thread_id=thread, messages=first_in, speed=0.001)
    run_a = a.record.run_id
    pgid = await assert_eventually(lambda: agent_group(c.tmp, run_a), timeout=30, interval=0.1)
    # The agent of A stops answering signals until we let it: A's cancel waits on it.
    os.killpg(pgid, signal.SIGSTOP)
    try:
        second_in = [*first_in, {"id": "u2", "role": "user", "content": "second"}]
        req = sandbox_host_pb2.StartRunRequest(
            run_id=unique("run-"), thread_id=thread, interrupt_active=True,
            agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(
                {"journal": str(CORPUS / FAST), "speed": 0})),
            messages_json=json.dumps(second_in))
        b = await c.stub(h1).StartRun(req, timeout=15, wait_for_ready=True)
        run_b = b.record.run_id
        await c.wait_status(run_b, "completed", timeout=60)
        msgs, _ = await c.transcripts.load(thread)
        assert [m["id"] for m in msgs[:2]] == ["u1", "u2"]
        assert (await c.record(run_a)).cancel_requested
    finally:
        # The host may already have ended the stopped group (its cancel escalates to SIGKILL).
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGCONT)
    # A's agent now takes the SIGTERM; A finishes: its save is refused (B is later), yet it
    # closes its log and ends aborted.
    rec = await c.wait_status(run_a, "aborted", timeout=60)
    assert rec.cancel_reason == "interrupted-by-new-run"
    chunks = [ch for _, ch in await c.read_all(run_a, timeout=30)]
    assert chunks[-1]["type"] in ("RUN_FINISHED", "RUN_ERROR")
    msgs, _ = await c.transcripts.load(thread)
    assert [m["id"] for m in msgs[:2]] == ["u1", "u2"]  # still B's
