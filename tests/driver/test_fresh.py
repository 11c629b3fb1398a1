"""Fresh runs end to end (docs/design.md §5.5): real coordinator, host processes, etcd, NATS."""
from __future__ import annotations

import os

from baton.transcript import build_transcript
from tests.conftest import assert_eventually
from tests.driver.conftest import Cluster, status_of

JOURNAL = "claude-stream-json/partial-messages-bash-exit-128.jsonl"
USER = [{"id": "u1", "role": "user", "content": "replay it"}]


async def test_fresh_run_completes_with_accepted_first_transcript_and_sandbox_destroyed(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[0], JOURNAL, messages=USER)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    assert started.created and status_of(started.record) == "running"
    items = await cluster.read_all(run_id)
    chunks = [c for _, c in items]
    # RUN_STARTED opens the log (AG-UI verifiers demand it first), run.accepted follows at
    # once, before the sandbox exists.
    assert chunks[0] == {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id}
    assert chunks[1] == {"type": "CUSTOM", "name": "run.accepted",
                         "value": {"runId": run_id, "threadId": thread_id, "agent": "replay", "messages": USER}}
    assert chunks[-1]["type"] == "RUN_FINISHED"
    assert [int(o) for o, _ in items] == sorted(int(o) for o, _ in items)
    rec = await cluster.wait_status(run_id, "completed")
    assert rec.HasField("finished_at") and rec.driver_epoch == 1 and rec.sandbox_key == run_id
    closed = await cluster.log.close_record(run_id)  # the log tells the same end as the record
    assert closed is not None and closed[0].status == "completed" and closed[1] == rec.finished_at
    msgs, _ = await cluster.transcripts.load(thread_id)
    assert msgs == build_transcript([chunks[0], *chunks[2:]], USER)
    assert msgs[0] == USER[0] and any(m.get("toolCalls") for m in msgs)
    # Destroyed after close and release (docs/design.md §5.5 "Finish").
    await assert_eventually(lambda: _gone(cluster, rec.sandbox_key))
    assert run_id not in os.listdir(cluster.tmp / "sandboxes")
    assert not (cluster.tmp / "journals" / f"{run_id}.ndjson").exists()
    view = await cluster.cc.get_run(run_id)
    assert view.claim is None


async def test_keep_sandbox_after_success_only_when_asked(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[1], JOURNAL, keep_sandbox=True)
    run_id = started.record.run_id
    await cluster.read_all(run_id)
    rec = await cluster.wait_status(run_id, "completed")
    inst = await cluster.cc.get_sandbox(rec.sandbox_key)
    assert inst is not None and inst.run_id == run_id


async def test_truncated_journal_fails_with_run_error_and_destroys_sandbox(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[0], "codex-exec-json/truncated-after-turn-started-v0.46.jsonl",
                                      keep_sandbox=True)
    run_id = started.record.run_id
    chunks = [c for _, c in await cluster.read_all(run_id)]
    assert chunks[-1]["type"] == "RUN_ERROR" and chunks[-1]["code"] == "incomplete_journal"
    rec = await cluster.wait_status(run_id, "failed")
    assert rec.error.code == "incomplete_journal" and rec.HasField("finished_at")
    await assert_eventually(lambda: _gone(cluster, rec.sandbox_key))


async def _gone(cluster: Cluster, key: str) -> bool:
    return await cluster.cc.get_sandbox(key) is None


async def test_start_run_twice_leaves_the_run_as_it_was(cluster: Cluster) -> None:
    first = await cluster.start_run(cluster.hosts[0], JOURNAL)
    again = await cluster.start_run(cluster.hosts[1], JOURNAL, run_id=first.record.run_id,
                                    thread_id=first.record.thread_id)
    assert again.created is False and again.record.run_id == first.record.run_id
    chunks = [c for _, c in await cluster.read_all(first.record.run_id)]
    assert sum(1 for c in chunks if c.get("name") == "run.accepted") == 1
    assert sum(1 for c in chunks if c["type"] == "RUN_STARTED") == 1


async def test_transcript_snapshots_are_saved_while_running(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[1], "claude-stream-json/partial-messages-parallel-bash-denied.jsonl",
                                      delay=0.05, messages=USER)
    run_id, thread_id = started.record.run_id, started.record.thread_id

    async def snapshot() -> list[dict[str, object]]:
        msgs, _ = await cluster.transcripts.load(thread_id)
        return msgs if len(msgs) > 1 else []

    msgs = await assert_eventually(snapshot, timeout=15, interval=0.1)
    # The journal opens with a thinking block: the transcript keeps it as a reasoning message,
    # as the AG-UI client does (docs/translation.md "The transcript").
    assert msgs[0] == USER[0] and msgs[1]["role"] == "reasoning"
    assert status_of(await cluster.record(run_id)) == "running"
    await cluster.cc.request_run_cancel(run_id)
    await cluster.wait_status(run_id, "aborted")


async def test_an_input_with_a_lone_surrogate_is_refused_up_front(cluster: Cluster) -> None:
    import grpc
    import pytest

    from baton import errors
    from baton.grpc_errors import from_rpc_error
    from tests.conftest import unique

    run_id = unique("run-")
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        # json.dumps escapes it ("\ud800"): valid JSON, but no UTF-8 store can hold it.
        await cluster.start_run(cluster.hosts[0], JOURNAL, run_id=run_id,
                                messages=[{"id": "u1", "role": "user", "content": "a\ud800b"}])
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, errors.InvalidArgument) and exc.field == "messages_json"
    with pytest.raises(errors.UnknownRun):
        await cluster.cc.get_run(run_id)  # nothing was created
