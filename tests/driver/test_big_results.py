"""A tool result bigger than a delivery-log message (journal-formats.md §0.2: Read results over
1 MiB are reported in the wild). NATS refuses messages over ``max_payload`` (1 MiB by default),
so the translator keeps a deterministic prefix with a marker; the run completes, and the saved
transcript is the one the delivered chunks make.
"""
from __future__ import annotations

import json
import pathlib
from typing import Any, AsyncIterator

import pytest

from baton_tools.testing.servers import EtcdServer, NatsServer
from baton.transcript import build_transcript
from sandbox_host.translate._base import MAX_RESULT_BYTES
from tests.driver.conftest import CORPUS, Cluster, make_cluster, status_of

SOURCE = CORPUS / "claude-stream-json" / "partial-messages-bash-exit-128.jsonl"
USER = [{"id": "u1", "role": "user", "content": "replay it"}]
BIG = ("héllo wörld ✓ \"quoted\"\n" * 150_000)  # ~3.6 MB of UTF-8, escapes included


def _big_journal(path: pathlib.Path) -> str:
    """The corpus journal with its one tool result replaced by BIG; returns the tool id."""
    out, tool_id = [], ""
    for line in SOURCE.read_text().splitlines():
        obj = json.loads(line)
        blocks = obj.get("message", {}).get("content") if obj.get("type") == "user" else None
        if isinstance(blocks, list) and blocks and blocks[0].get("type") == "tool_result" and not tool_id:
            blocks[0]["content"] = BIG
            tool_id = blocks[0]["tool_use_id"]
        out.append(json.dumps(obj, ensure_ascii=False, separators=(",", ":")))
    path.write_text("\n".join(out) + "\n")
    assert tool_id
    return tool_id


@pytest.fixture(scope="module")
async def big_cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    tmp = tmp_path_factory.mktemp("big")
    (tmp / "journals-in").mkdir()
    c = await make_cluster(etcd, nats, tmp, hosts=1, BATON_REPLAY_DIRS=f"{CORPUS}:{tmp / 'journals-in'}")
    try:
        yield c
    finally:
        await c.close()


async def test_a_tool_result_over_a_message_is_cut_with_a_marker_and_the_run_completes(big_cluster: Cluster) -> None:
    journal = big_cluster.tmp / "journals-in" / "big-result.jsonl"
    tool_id = _big_journal(journal)
    started = await big_cluster.start_run(big_cluster.hosts[0], str(journal), speed=0, messages=USER)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    items = await big_cluster.read_all(run_id)
    chunks = [c for _, c in items]
    results = [c for c in chunks if c["type"] == "TOOL_CALL_RESULT" and c["toolCallId"] == tool_id]
    assert len(results) == 1
    result: dict[str, Any] = results[0]
    kept = result["metadata"]["truncated"]["keptChars"]
    assert result["metadata"]["truncated"] == {"keptChars": kept, "totalChars": len(BIG)}
    assert 0 < kept < len(BIG)
    assert result["content"] == BIG[:kept] + f"\n[baton: tool result cut to {kept} of {len(BIG)} characters]"
    assert len(json.dumps(result["content"], ensure_ascii=False).encode()) <= MAX_RESULT_BYTES
    assert chunks[-1]["type"] == "RUN_FINISHED"
    rec = await big_cluster.wait_status(run_id, "completed")
    assert status_of(rec) == "completed"
    msgs, _ = await big_cluster.transcripts.load(thread_id)
    assert msgs == build_transcript([chunks[0], *chunks[2:]], USER)


async def test_an_input_too_big_for_its_accepted_chunk_is_refused_up_front(big_cluster: Cluster) -> None:
    import grpc

    from baton import errors
    from baton.grpc_errors import from_rpc_error
    from sandbox_host.manager import MAX_MESSAGES_BYTES

    huge = [{"id": "u1", "role": "user", "content": "x" * (MAX_MESSAGES_BYTES + 1)}]
    with pytest.raises(grpc.aio.AioRpcError) as ei:
        await big_cluster.start_run(big_cluster.hosts[0], "claude-stream-json/partial-messages-bash-exit-128.jsonl",
                                    run_id="too-big-input", messages=huge)
    exc = from_rpc_error(ei.value)
    assert isinstance(exc, errors.InvalidArgument) and exc.field == "messages_json"
    assert str(MAX_MESSAGES_BYTES) in exc.problem
    with pytest.raises(errors.UnknownRun):
        await big_cluster.cc.get_run("too-big-input")   # nothing was created
    # Just under the limit is accepted, and the run completes.
    fits = [{"id": "u1", "role": "user", "content": "x" * (MAX_MESSAGES_BYTES - 100)}]
    started = await big_cluster.start_run(big_cluster.hosts[0], "claude-stream-json/partial-messages-bash-exit-128.jsonl",
                                          speed=0, messages=fits)
    chunks = [c for _, c in await big_cluster.read_all(started.record.run_id)]
    assert chunks[1]["name"] == "run.accepted" and chunks[1]["value"]["messages"] == fits
    await big_cluster.wait_status(started.record.run_id, "completed")


async def test_a_journal_line_too_long_to_hold_is_reported_and_the_run_completes(big_cluster: Cluster) -> None:
    """Sandboxed code can write the journal: a 96 MiB line (over MAX_LINE_BYTES) is reported
    as CUSTOM journal.oversized_line with its size and head, and the run goes on to its end
    with the transcript its chunks make (that the host never holds such a line:
    tests/sandbox/test_journal.py)."""
    from sandbox_host.journal import MAX_LINE_BYTES, OVERSIZED_HEAD

    journal = big_cluster.tmp / "journals-in" / "oversized-line.jsonl"
    lines = SOURCE.read_bytes().splitlines()
    huge = b'{"type":"user","message":{"role":"user","content":"' + b"\xc3\xa9" * (48 << 20) + b'"}}'
    assert len(huge) > MAX_LINE_BYTES
    journal.write_bytes(b"\n".join([*lines[:3], huge, *lines[3:]]) + b"\n")
    started = await big_cluster.start_run(big_cluster.hosts[0], str(journal), speed=0, messages=USER)
    run_id, thread_id = started.record.run_id, started.record.thread_id
    chunks = [c for _, c in await big_cluster.read_all(run_id)]
    reported = [c for c in chunks if c["type"] == "CUSTOM" and c["name"] == "journal.oversized_line"]
    assert len(reported) == 1
    value = reported[0]["value"]
    assert value["bytes"] == len(huge)
    assert value["text"] == huge[:OVERSIZED_HEAD].decode("utf-8", "replace")
    assert chunks[-1]["type"] == "RUN_FINISHED"
    await big_cluster.wait_status(run_id, "completed")
    msgs, _ = await big_cluster.transcripts.load(thread_id)
    assert msgs == build_transcript([chunks[0], *chunks[2:]], USER)
