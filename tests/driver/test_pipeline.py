"""The replay pipeline (journal → translator → aligner → tagged batches): pure, no servers."""
from __future__ import annotations

import asyncio
import pathlib
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable

import pytest

from baton.errors import JournalReplayDiverged
from baton.fingerprint import fingerprint
from sandbox_host.journal import JournalExit, JournalItem, JournalLine, JournalTruncated, LineSplitter
from sandbox_host.pipeline import Batch, Replay
from sandbox_host.translate import translator_for

pytestmark = pytest.mark.unit

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "corpus"
JOURNAL = CORPUS / "codex-exec-json" / "zsh-commands-and-file-change.jsonl"
FMT = "codex-exec-json"
Chunk = dict[str, Any]


@dataclass(frozen=True)
class Header:
    kind: str
    origin: str | None
    fingerprint: str | None
    offset: int
    epoch: int = 1


def headers(chunks: Iterable[Chunk], *, host_first: bool = False) -> list[Header]:
    out = [Header("fence", None, None, 1)]
    if host_first:
        out.append(Header("chunk", "host", "accepted", 2))
    out += [Header("chunk", "journal", fingerprint(c), 10 + i) for i, c in enumerate(chunks)]
    return out


def lines_of(data: bytes) -> list[JournalLine]:
    return LineSplitter().feed(data)


async def items(lines: Iterable[JournalItem]) -> AsyncIterator[JournalItem]:
    for it in lines:
        yield it


def journal(*, exit_code: int | None = 0) -> list[JournalItem]:
    data = JOURNAL.read_bytes()
    out: list[JournalItem] = list(lines_of(data))
    if exit_code is not None:
        out.append(JournalExit(exit_code, len(data), len(data)))
    return out


def direct(its: list[JournalItem]) -> list[Chunk]:
    """What the translator alone makes of the journal (the reference)."""
    tr = translator_for(FMT, run_id="r", thread_id="t")
    out: list[Chunk] = []
    code = None
    for it in its:
        if isinstance(it, JournalLine):
            out += tr.feed(it.data)
        elif isinstance(it, JournalExit):
            code = it.code
    return out + tr.finish(code, None)


async def collect(replay: Replay, its: list[JournalItem], **kw: Any) -> list[Batch]:
    return [b async for b in replay.batches(items(its), **kw)]


def flat(batches: list[Batch]) -> list[tuple[str, Chunk]]:
    return [(t.tag, t.chunk) for b in batches for t in b.chunks]


async def test_a_fresh_replay_tags_every_chunk_new_and_equals_the_translator() -> None:
    its = journal()
    want = direct(its)
    batches = await collect(Replay(translator_for(FMT, run_id="r", thread_id="t"), []), its)
    assert flat(batches) == [("new", c) for c in want]
    assert batches[-1].final and not any(b.final for b in batches[:-1])
    last = batches[-1].terminal or batches[-2].terminal
    assert last is not None and last.chunk == want[-1]  # the run's terminal ends the replay


@pytest.mark.parametrize("cut", [1, 7, 20])
async def test_a_takeover_tags_the_stored_prefix_and_appends_only_the_rest(cut: int) -> None:
    its = journal()
    want = direct(its)
    stored = headers(want[:cut], host_first=True)
    replay = Replay(translator_for(FMT, run_id="r", thread_id="t"), stored)
    assert replay.stored_count == cut and not replay.caught_up
    batches = await collect(replay, its)
    assert flat(batches) == [("stored", c) for c in want[:cut]] + [("new", c) for c in want[cut:]]
    assert [c for b in batches for c in b.new] == want[cut:]
    assert replay.caught_up


async def test_a_tampered_journal_yields_what_matched_then_raises_divergence() -> None:
    its = journal()
    want = direct(its)
    stored = headers(want)
    # Change one line's text: its first chunk no longer matches the stored fingerprint.
    target = next(i for i, it in enumerate(its) if isinstance(it, JournalLine) and b'"text"' in it.data)
    line = its[target]
    assert isinstance(line, JournalLine)
    its[target] = JournalLine(line.offset, line.end, line.data.replace(b'"text":"', b'"text":"tampered '))
    replay = Replay(translator_for(FMT, run_id="r", thread_id="t"), stored)
    got: list[Batch] = []
    with pytest.raises(JournalReplayDiverged) as raised:
        async for b in replay.batches(items(its)):
            got.append(b)
    assert all(t.tag == "stored" for b in got for t in b.chunks)
    assert raised.value.index == sum(len(b.chunks) for b in got)
    assert replay.diverged_chunk is not None and "tampered" in str(replay.diverged_chunk)


async def test_a_journal_shorter_than_the_stored_prefix_diverges_after_its_final_batch() -> None:
    its = journal()
    want = direct(its)
    lines = [it for it in its if isinstance(it, JournalLine)]
    short = lines[: len(lines) // 2]  # the journal lost its second half, no exit sentinel
    replay = Replay(translator_for(FMT, run_id="r", thread_id="t"), headers(want))
    got: list[Batch] = []
    with pytest.raises(JournalReplayDiverged) as raised:
        async for b in replay.batches(items(short)):
            got.append(b)
    # The translator's finish (it closes the cut turn) is not what the log stored:
    # its batch (empty here) still comes first.
    assert got[-1].final and got[-1].chunks == ()
    assert raised.value.index == sum(len(b.chunks) for b in got)
    assert replay.diverged_chunk == direct(short)[raised.value.index]  # the first chunk of the finish


async def test_a_stored_prefix_longer_than_the_whole_replay_diverges_once_the_final_batch_was_taken() -> None:
    tr = Scripted({b"1": [A]}, finish=[])
    replay = Replay(tr, headers([A, B]))
    got: list[Batch] = []
    with pytest.raises(JournalReplayDiverged) as raised:
        async for b in replay.batches(items([L(b"1"), JournalExit(0, 0, 0)])):
            got.append(b)
    assert flat(got) == [("stored", A)] and got[-1].final
    assert raised.value.index == 1 and raised.value.replayed is None and replay.diverged_chunk is None


class Scripted:
    """A translator that makes given chunks of each line (by the line's bytes); its finish
    makes ``finish``, or one chunk naming the exit code and fragment it got."""

    def __init__(self, script: dict[bytes, list[Chunk]], finish: list[Chunk] | None = None) -> None:
        self.script, self._finish, self.fed, self.finished = script, finish, 0, False

    def feed(self, line: bytes) -> list[Chunk]:
        self.fed += 1
        return list(self.script.get(line, []))

    def feed_oversized(self, head: bytes, size: int) -> list[Chunk]:
        self.fed += 1
        return [{"type": "CUSTOM", "name": "oversized", "value": size}]

    def finish(self, exit_code: int | None, fragment: bytes | None, fragment_size: int | None = None) -> list[Chunk]:
        self.finished = True
        if self._finish is not None:
            return list(self._finish)
        return [{"type": "CUSTOM", "name": "exit", "value": [exit_code, fragment]}]


def L(data: bytes) -> JournalLine:
    return JournalLine(0, len(data) + 1, data)


A = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "a"}
B = {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "b"}
END = {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}


async def test_a_batch_ends_at_its_terminal_and_one_batch_per_line_with_chunks() -> None:
    tr = Scripted({b"1": [A], b"2": [], b"3": [B, END, A]})
    replay = Replay(tr, [])
    batches = await collect(replay, [L(b"1"), L(b"2"), L(b"3"), JournalExit(3, 0, 0)])
    assert [[t.chunk for t in b.chunks] for b in batches] == [[A], [B, END], [tr.finish(3, None)[0]]]
    assert batches[1].terminal is not None and batches[1].terminal.chunk == END
    assert batches[1].new == [B, END]
    assert tr.fed == 3  # the exit sentinel ends the journal


async def test_a_truncated_fragment_and_exit_code_reach_the_translators_finish() -> None:
    tr = Scripted({})
    batches = await collect(Replay(tr, []), [L(b"1"), JournalTruncated(2, b"{half")])
    assert [t.chunk for t in batches[-1].chunks] == [{"type": "CUSTOM", "name": "exit", "value": [None, b"{half"]}]


async def test_a_partial_replay_neither_finishes_the_translator_nor_checks_the_prefix() -> None:
    tr = Scripted({b"1": [A]})
    replay = Replay(tr, headers([A, B]))
    batches = await collect(replay, [L(b"1")], complete=False)
    assert flat(batches) == [("stored", A)]
    assert not tr.finished and not replay.caught_up


async def test_the_loop_gets_a_turn_every_few_lines() -> None:
    turns = 0

    async def spin() -> None:
        nonlocal turns
        while True:
            await asyncio.sleep(0)
            turns += 1

    spinner = asyncio.create_task(spin())
    try:
        await asyncio.sleep(0)
        seen: list[int] = []
        tr = Scripted({})
        async for _ in Replay(tr, [], yield_every=4).batches(items([L(b"x")] * 12), complete=False):
            pass
        seen.append(turns)
        await asyncio.sleep(0)
        assert seen[0] >= 3  # 12 lines, a turn every 4
        before = turns
        async for _ in Replay(Scripted({}), [], yield_every=0).batches(items([L(b"x")] * 12), complete=False):
            pass
        assert turns == before  # never, when 0
    finally:
        spinner.cancel()
        await asyncio.gather(spinner, return_exceptions=True)
