"""The replay pipeline of a driven run: journal items → translator → aligner → tagged chunks
(docs/design.md §5.4). Pure: no I/O of its own besides consuming the journal items it is given.

A :class:`Replay` turns the journal of a run, read from byte 0 (``JournalLine`` /
``JournalTruncated`` / ``JournalExit`` items, e.g. from :func:`~sandbox_host.journal.follow_journal`),
into :class:`Batch` es: the chunks a fresh translator makes of one journal line, each tagged
``stored`` (the log already holds it: the stored prefix of a takeover, or the ``RUN_STARTED``
a fresh start appended) or ``new`` (to be appended). One batch per line keeps the driver's
appends as they were: one append per line's new chunks.

Rules the driver relies on (same bytes → same batches):

* a batch ends at its first terminal chunk (``RUN_FINISHED`` / ``RUN_ERROR``): the chunks a
  translator makes after it in the same line are never fed to the aligner;
* a divergence inside a line first yields the chunks of that line tagged before it, then
  raises :class:`~baton.errors.JournalReplayDiverged` (:attr:`Replay.diverged_chunk` is
  the replayed chunk that did not match);
* at the journal's end (``complete``) the translator's ``finish`` chunks come as one last
  batch (``final``), and only after the consumer took it does the aligner check that the
  stored prefix was consumed (a journal that lost lines raises the divergence then);
* every ``yield_every`` journal lines the loop gets a turn (``asyncio.sleep(0)``): a replay
  over a long stored prefix appends nothing, so nothing else would await, and one read of
  the journal (up to 1 MiB) would be translated and aligned in one step of the loop (several
  takeovers at once held the loop, and the host's keep-alive with it, for seconds).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncGenerator, AsyncIterable, Iterable, Protocol, Sequence

from baton.errors import JournalReplayDiverged
from sandbox_host.align import Aligner, Fingerprint, StoredHeader, Tagged
from sandbox_host.journal import JournalExit, JournalItem, JournalLine, JournalOversized, JournalTruncated

Chunk = dict[str, Any]
__all__ = ["Batch", "Replay", "Translator", "is_terminal"]


class Translator(Protocol):
    """What the pipeline needs of a journal translator (:mod:`sandbox_host.translate`)."""

    def feed(self, line: bytes) -> list[Chunk]: ...

    def feed_oversized(self, head: bytes, size: int) -> list[Chunk]: ...

    def finish(self, exit_code: int | None, fragment: bytes | None,
               fragment_size: int | None = None) -> list[Chunk]: ...


def is_terminal(chunk: Chunk) -> bool:
    """Whether ``chunk`` ends a run (``RUN_FINISHED`` or ``RUN_ERROR``)."""
    return chunk.get("type") in ("RUN_FINISHED", "RUN_ERROR")


@dataclass(frozen=True)
class Batch:
    """The tagged chunks of one journal line, or of the translator's finish.

    Attributes:
        chunks: in replay order; if one is terminal it is the last.
        final: the translator's ``finish`` chunks at the journal's end.
    """

    chunks: tuple[Tagged, ...]
    final: bool = False

    @property
    def new(self) -> list[Chunk]:
        """The chunks to append (tagged ``new``), in order."""
        return [t.chunk for t in self.chunks if t.tag == "new"]

    @property
    def terminal(self) -> Tagged | None:
        """The batch's terminal chunk (its last), or ``None``."""
        if self.chunks and is_terminal(self.chunks[-1].chunk):
            return self.chunks[-1]
        return None


class Replay:
    """One replay of a run's journal against what its log stored (one per driver or rebuild).

    Args:
        translator: a fresh translator of the run's journal format.
        stored: headers of every record the log held before this claim's fence, in log order
            (a fresh start: the ``RUN_STARTED`` it appended; empty: everything is new).
        yield_every: journal lines between two turns given to the loop (0 = never).
        fingerprint: the chunk fingerprint function (default: the log's).
        thread_ids: see :class:`~sandbox_host.align.Aligner`.
    """

    def __init__(self, translator: Translator, stored: Iterable[StoredHeader], *, yield_every: int = 0,
                 fingerprint: Fingerprint | None = None, thread_ids: Sequence[str] = ()) -> None:
        self._translator = translator
        self._aligner = Aligner(stored, fingerprint=fingerprint, thread_ids=thread_ids)
        self._every = yield_every
        #: The replayed chunk a divergence was raised for (``None``: none, or the journal
        #: ended before the stored prefix did).
        self.diverged_chunk: Chunk | None = None

    @property
    def stored_count(self) -> int:
        """How many journal-origin chunks the stored prefix holds."""
        return self._aligner.stored_count

    @property
    def caught_up(self) -> bool:
        """Whether the replay matched the whole stored prefix (every later chunk is new)."""
        return self._aligner.caught_up

    def header(self, index: int) -> StoredHeader | None:
        """The stored header of the journal-origin chunk at ``index`` (``None`` past the end)."""
        return self._aligner.header(index)

    async def batches(self, items: AsyncIterable[JournalItem], *, complete: bool = True) -> AsyncGenerator[Batch, None]:
        """Tag the chunks of the journal ``items``, one :class:`Batch` per line with chunks.

        Args:
            items: the journal from byte 0; a ``JournalExit`` ends it.
            complete: ``items`` is the whole journal: finish the translator (its chunks are
                the ``final`` batch) and check that the stored prefix was consumed. ``False``
                for a partial read (the transcript rebuild), which ends with the items.

        Raises:
            JournalReplayDiverged: see the module docstring.
        """
        exit_code: int | None = None
        fragment: bytes | None = None
        fragment_size: int | None = None
        lines = 0
        async for item in items:
            if isinstance(item, JournalLine):
                if isinstance(item, JournalOversized):
                    chunks = self._translator.feed_oversized(item.data, item.size)
                else:
                    chunks = self._translator.feed(item.data)
                batch, diverged = self._tag(chunks)
                if batch.chunks:
                    yield batch
                if diverged is not None:
                    raise diverged
                lines += 1
                if self._every and lines % self._every == 0:
                    await asyncio.sleep(0)
            elif isinstance(item, JournalTruncated):
                fragment, fragment_size = item.data, item.length
            elif isinstance(item, JournalExit):
                exit_code = item.code
                break
        if not complete:
            return
        batch, diverged = self._tag(self._translator.finish(exit_code, fragment, fragment_size), final=True)
        yield batch
        if diverged is not None:
            raise diverged
        self._aligner.finish()

    def _tag(self, chunks: list[Chunk], *, final: bool = False) -> tuple[Batch, JournalReplayDiverged | None]:
        """Feed ``chunks`` to the aligner up to the first terminal; stop at a divergence.

        Returns:
            The batch of the chunks tagged, and the divergence that stopped it (or ``None``).
        """
        tagged: list[Tagged] = []
        for c in chunks:
            try:
                tagged.append(self._aligner.feed(c))
            except JournalReplayDiverged as exc:
                self.diverged_chunk = c
                return Batch(tuple(tagged), final), exc
            if is_terminal(c):
                break
        return Batch(tuple(tagged), final), None
