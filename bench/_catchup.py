"""A takeover's catch-up as the sandbox host consumes it, for ``bench/sandbox_daemon.py``.

The journal is real: the Claude Code journals of the corpus (``corpus/claude-stream-json``,
copied byte for byte from the team's research corpus) one after another, again and again,
up to the size asked for, then the wrapper's exit sentinel. The bytes go through what a
successor host runs on them (:meth:`sandbox_host.driver` ``_steps``/``_stream``):
:func:`sandbox_host.journal.follow_journal` (lines with offsets, the sentinel) into a
:class:`sandbox_host.pipeline.Replay` with a fresh ``claude-stream-json`` translator and the
host's ``replay_yield_lines``, aligned against a stored prefix that holds every chunk the
journal makes (a takeover whose predecessor had appended all of it: every chunk translated,
fingerprinted and matched; nothing appended, so the figure is the read and the host's own
work, with no JetStream in it).
"""
from __future__ import annotations

import contextlib
import pathlib
from typing import Any, AsyncIterator, Callable, cast

from baton.fingerprint import fingerprint
from baton.log import StoredRecord
from sandbox_host.deps import HostSettings
from sandbox_host.journal import exit_sentinel, follow_journal, new_nonce
from sandbox_host.pipeline import Replay
from sandbox_host.providers import Provider, SandboxHandle
from sandbox_host.translate import translator_for

CORPUS = pathlib.Path(__file__).resolve().parent.parent / "corpus" / "claude-stream-json"
FORMAT = "claude-stream-json"
#: The corpus journals with streamed deltas, tool calls and subagents (the others are a few lines).
SOURCES = ("partial-messages-parallel-bash-denied.jsonl", "partial-messages-bash-exit-128.jsonl",
           "subagents-parallel-tools-v2.0.25.jsonl")
RUN_ID, THREAD_ID = "bench-run", "bench-thread"


def write_journal(path: pathlib.Path, mib: int) -> tuple[int, int, str]:
    """Write the corpus journals in turn until ``mib`` MiB, then an exit sentinel (code 0).

    Returns:
        (bytes, lines, the sentinel's nonce).
    """
    parts = []
    for name in SOURCES:
        data = (CORPUS / name).read_bytes()
        parts.append(data if data.endswith(b"\n") else data + b"\n")
    nonce = new_nonce()
    size = lines = 0
    with path.open("wb") as f:
        while size < mib << 20:
            for data in parts:
                f.write(data)
                size += len(data)
                lines += data.count(b"\n")
        f.write(exit_sentinel(0, nonce))
    return path.stat().st_size, lines + 1, nonce


class _Source:
    """The provider side ``follow_journal`` asks for: a follow from an offset (the run's
    agent counts as alive, so the end is the sentinel, as on a live takeover)."""

    can_follow = True
    cheap_file_size = False

    def __init__(self, follow: Callable[[int], AsyncIterator[bytes]]) -> None:
        self._follow = follow

    def follow(self, handle: SandboxHandle, path: str, offset: int) -> AsyncIterator[bytes]:
        return self._follow(offset)

    async def processes_alive(self, handle: SandboxHandle) -> bool:
        return True

    async def read_file(self, handle: SandboxHandle, path: str, offset: int = 0) -> bytes:
        raise AssertionError("a follow that ends at its sentinel never reads the file directly")


async def replay(follow: Callable[[int], AsyncIterator[bytes]], nonce: str,
                 stored: list[StoredRecord]) -> list[Any]:
    """Run the journal from byte 0 through the host's catch-up pipeline.

    Args:
        follow: the bytes of the journal from an offset (local or through a daemon).
        nonce: the journal's exit-sentinel nonce.
        stored: the stored prefix to align with (``[]``: every chunk is new).

    Returns:
        Every replayed chunk, in order (the translator's ``finish`` included).

    Raises:
        JournalReplayDiverged: the replay does not match ``stored``.
    """
    source = cast(Provider, _Source(follow))
    handle = cast(SandboxHandle, None)
    chunks: list[Any] = []
    rp = Replay(translator_for(FORMAT, RUN_ID, THREAD_ID), stored, yield_every=HostSettings().replay_yield_lines)
    async with contextlib.aclosing(follow_journal(source, handle, "journal", nonce=nonce)) as items:
        async for batch in rp.batches(items):
            chunks.extend(t.chunk for t in batch.chunks)
    return chunks


def stored_prefix(chunks: list[Any]) -> list[StoredRecord]:
    """The log's headers of ``chunks`` appended by a predecessor (journal origin)."""
    return [StoredRecord(i + 1, "chunk", 1, "journal", fingerprint(c)) for i, c in enumerate(chunks)]
