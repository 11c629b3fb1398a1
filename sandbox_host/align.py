"""Alignment of a journal replay with the stored delivery log (docs/design.md §5.4).

Alignment runs only on attach (aligning a fresh run would swallow its own chunks). The
driver reads the headers of everything stored before its own fence, once, and feeds the
chunks of a replay from byte 0 (fresh translator) through an :class:`Aligner`, which tags
each replayed chunk ``stored`` (the matched prefix: clients already have it) or ``new``
(the suffix: to be appended). Stored ``host``-origin chunks and ``fence``/``close``
records are skipped by their tag, never by guessing from the event type. ``journal``-origin
chunks are compared positionally by fingerprint; the first mismatch raises
:class:`~baton.errors.JournalReplayDiverged` (or its subclass
:class:`~baton.errors.JournalReplayThreadIdMismatch` when only the thread id differs).

The walk is linear in the number of stored headers plus replayed chunks: one list filter
up front, then O(1) per chunk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Literal, Protocol, Sequence

from baton.errors import JournalReplayDiverged, JournalReplayThreadIdMismatch

Chunk = dict[str, Any]
Tag = Literal["stored", "new"]
Fingerprint = Callable[[Chunk], str]


class StoredHeader(Protocol):
    """What alignment needs of one stored record (``baton.log.StoredRecord`` fits)."""

    @property
    def kind(self) -> str: ...  # "chunk" | "fence" | "close"

    @property
    def origin(self) -> str | None: ...  # "journal" | "host" (chunks only)

    @property
    def fingerprint(self) -> str | None: ...

    @property
    def offset(self) -> Any: ...


@dataclass(frozen=True)
class Tagged:
    """A replayed chunk with its alignment tag.

    Attributes:
        chunk: the replayed chunk.
        tag: ``stored`` when the log already holds it, ``new`` when it must be appended.
        index: its position among journal-origin chunks of the run (0-based).
    """

    chunk: Chunk
    tag: Tag
    index: int


def _default_fingerprint() -> Fingerprint:
    # Imported late: the fingerprint module belongs to the delivery-log package.
    from baton.fingerprint import fingerprint

    return fingerprint


def journal_prefix(stored: Iterable[StoredHeader]) -> list[StoredHeader]:
    """The stored journal-origin chunks, in log order (host chunks, fences, closes dropped)."""
    return [r for r in stored if r.kind == "chunk" and (r.origin or "journal") == "journal"]


class Aligner:
    """Incremental positional alignment of replayed chunks against a stored prefix.

    Args:
        stored: headers of every record stored before this claim's fence, in log order.
        fingerprint: the chunk fingerprint function (default :func:`baton.fingerprint.fingerprint`).
        thread_ids: thread ids the stored chunks may carry instead of the replay's one; a
            mismatch that disappears when ``threadId`` is replaced by one of them raises
            :class:`JournalReplayThreadIdMismatch` instead of the plain divergence.

    Not thread-safe; one aligner per attach.
    """

    def __init__(
        self,
        stored: Iterable[StoredHeader],
        *,
        fingerprint: Fingerprint | None = None,
        thread_ids: Sequence[str] = (),
    ) -> None:
        self._prefix = journal_prefix(stored)
        self._fp = fingerprint or _default_fingerprint()
        self._thread_ids = tuple(thread_ids)
        self._index = 0

    @property
    def stored_count(self) -> int:
        """How many journal-origin chunks the stored prefix holds."""
        return len(self._prefix)

    @property
    def index(self) -> int:
        """How many replayed chunks have been fed so far."""
        return self._index

    @property
    def caught_up(self) -> bool:
        """Whether the whole stored prefix has been matched (every later chunk is new)."""
        return self._index >= len(self._prefix)

    def header(self, index: int) -> StoredHeader | None:
        """The stored header of the journal-origin chunk at ``index`` (``None`` past the end)."""
        return self._prefix[index] if 0 <= index < len(self._prefix) else None

    def feed(self, chunk: Chunk) -> Tagged:
        """Tag the next replayed chunk.

        Raises:
            JournalReplayThreadIdMismatch: the chunk differs from the stored one only in
                its thread id.
            JournalReplayDiverged: the chunk's fingerprint differs from the stored one at
                the same journal-origin position.
        """
        i = self._index
        self._index += 1
        if i >= len(self._prefix):
            return Tagged(chunk, "new", i)
        want = self._prefix[i].fingerprint
        got = self._fp(chunk)
        if want == got:
            return Tagged(chunk, "stored", i)
        raise self._divergence(i, want, got, chunk)

    def finish(self) -> None:
        """The replay ended (final EOF): the stored prefix must have been consumed.

        Raises:
            JournalReplayDiverged: with ``replayed=None`` when the stored prefix is longer
                than the whole replay (the journal lost lines).
        """
        if self._index < len(self._prefix):
            raise JournalReplayDiverged(self._index, self._prefix[self._index].fingerprint, None)

    def _divergence(self, i: int, want: str | None, got: str, chunk: Chunk) -> JournalReplayDiverged:
        if "threadId" in chunk:
            for tid in self._thread_ids:
                if tid != chunk["threadId"] and self._fp({**chunk, "threadId": tid}) == want:
                    return JournalReplayThreadIdMismatch(i, want, got)
        return JournalReplayDiverged(i, want, got)


def align(
    stored: Iterable[StoredHeader],
    replayed: Iterable[Chunk],
    *,
    fingerprint: Fingerprint | None = None,
    thread_ids: Sequence[str] = (),
    complete: bool = True,
) -> Iterator[Tagged]:
    """Tag every replayed chunk ``stored`` or ``new`` (a generator over :class:`Aligner`).

    Args:
        stored: stored headers before this claim's fence, in log order.
        replayed: the replay's chunks from byte 0, in order.
        fingerprint: chunk fingerprint function.
        thread_ids: see :class:`Aligner`.
        complete: ``True`` when ``replayed`` is the whole journal (then a stored prefix
            longer than the replay is a divergence).

    Raises:
        JournalReplayDiverged: at the first mismatch, or when the replay ends before the
            stored prefix does (only when ``complete``).
    """
    aligner = Aligner(stored, fingerprint=fingerprint, thread_ids=thread_ids)
    for chunk in replayed:
        yield aligner.feed(chunk)
    if complete:
        aligner.finish()
