"""Alignment (docs/design.md §5.4): pure, no servers."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import pytest

from baton.errors import JournalReplayDiverged, JournalReplayThreadIdMismatch
from sandbox_host.align import Aligner, align


def fp(chunk: dict[str, Any]) -> str:
    body = {k: v for k, v in chunk.items() if k not in ("timestamp", "rawEvent")}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class H:
    kind: str
    origin: str | None
    fingerprint: str | None
    offset: int


def headers(chunks: list[dict[str, Any]], *, host_at: tuple[int, ...] = (), fence_at: tuple[int, ...] = ()) -> list[H]:
    out: list[H] = []
    seq = 1
    for i, c in enumerate(chunks):
        if i in fence_at:
            out.append(H("fence", None, None, seq))
            seq += 1
        if i in host_at:
            out.append(H("chunk", "host", fp({"type": "CUSTOM", "name": "run.accepted"}), seq))
            seq += 1
        out.append(H("chunk", "journal", fp(c), seq))
        seq += 1
    return out


def run(n: int, thread: str = "th") -> list[dict[str, Any]]:
    chunks: list[dict[str, Any]] = [{"type": "RUN_STARTED", "threadId": thread, "runId": "r"}]
    chunks += [{"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": f"d{i}"} for i in range(n)]
    return chunks


def test_prefix_tagged_stored_and_suffix_new_skipping_host_and_fences() -> None:
    chunks = run(6)
    stored = headers(chunks[:4], host_at=(0, 2), fence_at=(0, 3))
    tagged = list(align(stored, chunks, fingerprint=fp))
    assert [t.tag for t in tagged] == ["stored"] * 4 + ["new"] * 3
    assert [t.index for t in tagged] == list(range(7))
    assert [t.chunk for t in tagged] == chunks


def test_empty_stored_prefix_is_all_new() -> None:
    assert [t.tag for t in align([], run(2), fingerprint=fp)] == ["new"] * 3


def test_mismatch_raises_divergence_with_index_and_fingerprints() -> None:
    chunks = run(5)
    stored = headers(chunks)
    tampered = list(chunks)
    tampered[3] = {**tampered[3], "delta": "XX"}
    with pytest.raises(JournalReplayDiverged) as ei:
        list(align(stored, tampered, fingerprint=fp))
    assert type(ei.value) is JournalReplayDiverged
    assert ei.value.index == 3
    assert ei.value.stored == fp(chunks[3]) and ei.value.replayed == fp(tampered[3])
    assert str(ei.value) == "journal replay diverged at index 3"


def test_thread_id_only_mismatch_raises_subclass() -> None:
    stored = headers(run(2, thread="old-thread"))
    with pytest.raises(JournalReplayThreadIdMismatch) as ei:
        list(align(stored, run(2, thread="new-thread"), fingerprint=fp, thread_ids=["old-thread"]))
    assert ei.value.index == 0


def test_other_mismatch_on_chunk_with_thread_id_is_plain_divergence() -> None:
    stored = headers([{"type": "RUN_STARTED", "threadId": "a", "runId": "r1"}])
    with pytest.raises(JournalReplayDiverged) as ei:
        list(align(stored, [{"type": "RUN_STARTED", "threadId": "b", "runId": "r2"}], fingerprint=fp, thread_ids=["a"]))
    assert type(ei.value) is JournalReplayDiverged


def test_replay_ending_before_stored_prefix_is_divergence() -> None:
    chunks = run(5)
    with pytest.raises(JournalReplayDiverged) as ei:
        list(align(headers(chunks), chunks[:4], fingerprint=fp))
    assert ei.value.index == 4 and ei.value.replayed is None


def test_incomplete_replay_may_end_early_when_not_complete() -> None:
    chunks = run(5)
    assert all(t.tag == "stored" for t in align(headers(chunks), chunks[:4], fingerprint=fp, complete=False))


def test_incremental_aligner_caught_up() -> None:
    chunks = run(2)
    a = Aligner(headers(chunks[:2]), fingerprint=fp)
    assert a.stored_count == 2 and not a.caught_up
    a.feed(chunks[0])
    a.feed(chunks[1])
    assert a.caught_up
    assert a.feed(chunks[2]).tag == "new"
    a.finish()


def test_100k_stored_prefix_fully_matched() -> None:
    # Speed is measured in bench/takeover.py (no timed assertions in tests).
    chunks = run(100_000)
    tagged = list(align(headers(chunks), chunks, fingerprint=fp))
    assert sum(1 for t in tagged if t.tag == "stored") == len(chunks)
