"""The snapshot rule (baton.log.snapshot) on every golden chunk sequence: a snapshot is what
the transcript builder makes of the log before it, and a writer that primes itself from any
stored snapshot writes the same bytes after it as one that saw the whole log."""
from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from baton.log.snapshot import (Snapshot, SnapshotPolicy, SnapshotState, decode, encode, replay, split)
from baton.transcript import build_transcript

pytestmark = pytest.mark.unit

GOLDEN = sorted((pathlib.Path(__file__).parents[1] / "sandbox" / "golden").glob("*.json"))


def _log(path: pathlib.Path) -> list[tuple[int, dict[str, Any], int]]:
    """The golden chunks as a stored log: offsets with a gap (a fence) in the middle."""
    data = json.loads(path.read_text())
    chunks = data["chunks"] if isinstance(data, dict) else data
    out = []
    for i, c in enumerate(chunks):
        offset = i + 1 if i < len(chunks) // 2 else i + 2
        out.append((offset, c, len(json.dumps(c, separators=(",", ":"), ensure_ascii=False).encode())))
    return out


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
@pytest.mark.parametrize("policy", [SnapshotPolicy(3, 0), SnapshotPolicy(0, 2000), SnapshotPolicy(1, 1)],
                         ids=["chunks", "bytes", "every"])
def test_a_snapshot_is_the_transcript_of_the_log_before_it(path: pathlib.Path, policy: SnapshotPolicy) -> None:
    log = _log(path)
    snaps = replay(log, policy, closed=True)
    assert snaps, "a closed log with chunks always has its final snapshot"
    assert snaps[-1].offset == log[-1][0] and snaps[-1].chunks == len(log)
    offsets = [o for o, _, _ in log]
    # A snapshot is due only once as many bytes of chunks came after the one before it as
    # that one weighs: all of a run's snapshots but the last two weigh at most its log.
    assert sum(len(encode(s)) for s in snaps[:-2]) <= sum(size for _, _, size in log)
    for snap in snaps:
        k = offsets.index(snap.offset) + 1
        assert snap.chunks == k
        assert snap.messages == build_transcript([c for _, c, _ in log[:k]])
        assert decode(encode(snap)) == snap
        started = [c for _, c, _ in log[:k] if c["type"] == "RUN_STARTED"]
        if started:
            assert snap.events[0] == started[0]


@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_a_primed_writer_writes_the_same_bytes(path: pathlib.Path) -> None:
    """Restore from each snapshot (a successor priming itself), feed the rest: the same
    snapshots, byte for byte, as the writer that fed the whole log."""
    policy = SnapshotPolicy(4, 1500)
    log = _log(path)
    whole = [encode(s) for s in replay(log, policy, closed=True)]
    for i, snap in enumerate(replay(log, policy, closed=True)[:-1]):
        st = SnapshotState.restore(policy, decode(encode(snap)))
        after: list[bytes] = []
        for offset, chunk, size in log:
            if offset > snap.offset and st.feed(offset, chunk, size):
                after.append(encode(st.take()))
        if st.pending:
            after.append(encode(st.take()))
        assert after == whole[i + 1:]


def test_no_snapshot_while_a_message_or_tool_call_is_open() -> None:
    st = SnapshotState(SnapshotPolicy(1, 0))
    seq = [
        ({"type": "RUN_STARTED", "threadId": "t", "runId": "r"}, True),
        ({"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"}, False),
        ({"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "hi"}, False),
        ({"type": "TEXT_MESSAGE_END", "messageId": "m"}, True),
        ({"type": "TOOL_CALL_START", "toolCallId": "t1", "toolCallName": "ls", "parentMessageId": "m"}, False),
        ({"type": "TOOL_CALL_END", "toolCallId": "t1"}, True),
        ({"type": "TEXT_MESSAGE_CHUNK", "messageId": "m2", "delta": "x"}, False),
        ({"type": "TOOL_CALL_RESULT", "toolCallId": "t1", "messageId": "r1", "content": "out"}, True),
    ]
    for i, (chunk, due) in enumerate(seq, 1):
        assert st.feed(i, chunk, 10**6) is due, chunk
        if due:
            st.take()


def test_state_custom_events_and_the_end_are_kept_as_events() -> None:
    st = SnapshotState(SnapshotPolicy(100, 0))
    chunks = [{"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
              {"type": "STATE_SNAPSHOT", "snapshot": {"a": 1}},
              {"type": "STATE_DELTA", "delta": [{"op": "replace", "path": "/a", "value": 2}]},
              {"type": "CUSTOM", "name": "approval-requested", "value": {"toolCallId": "t1"}},
              {"type": "STEP_STARTED", "stepName": "s"}, {"type": "STEP_FINISHED", "stepName": "s"},
              {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}]
    for i, c in enumerate(chunks, 1):
        st.feed(i, c, 10)
    snap = st.take()
    # Nothing a client could learn from the chunks is lost: state, custom events (an approval
    # request), the end; a closed step's structure carries nothing the messages lack.
    assert [ev["type"] for ev in snap.events] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "STATE_SNAPSHOT",
                                                  "STATE_DELTA", "CUSTOM", "RUN_FINISHED"]
    assert snap.events[4] == chunks[3]
    assert snap.offset == 7 and snap.chunks == 7 and st.pending == 0


def test_parts_join_to_the_body_and_bad_bodies_are_refused() -> None:
    snap = Snapshot(7, 3, ({"type": "MESSAGES_SNAPSHOT", "messages": [{"id": "m", "role": "assistant",
                                                                      "content": "é" * 300}]},), 0)
    body = encode(snap)
    parts = split(body, 64)
    assert all(len(p) <= 64 for p in parts) and b"".join(parts) == body and len(parts) > 1
    assert decode(b"".join(parts)) == snap
    for bad in (b"not json", b'{"v": 99}', b'{"v": 1, "offset": 1}\n3', b'{"v": 1}'):
        with pytest.raises(ValueError):
            decode(bad)
