"""Which folds of a stream raced another gateway's write, and how far (pure bookkeeping on
one loop).

A gateway marks its cached view of a stream behind when another gateway writes it (the
record arrives on its core NATS subscription, with the sequence the write was fenced on),
which wakes the view's readers. A write that arrives while the stream is being folded from
JetStream finds no view to mark, and may be missing from the fold: a view cached from that
fold as it is would be stale, its readers waiting with nobody to wake them (a long-poll then
answers only at its timeout). Since a gateway can run as several workers
(gateway/_workers.py), whose readers and writers of one stream are often in different
processes, that race is common, not rare.

So each fold learns the highest fence of the writes that raced it. The fence says where the
write can be: JetStream stored it only right after that sequence. A fold that reached that
sequence may lack the write, and is marked behind it (caught up record by record from
there, ``_catchup.py``, as a cached view that heard the write would be); a fold past it has
the write or the write was refused. Only a write with no fence, or a fold that found no
stream, is not placed this way: that fold is done again. (Done again whole each time, a
long stream written fast through another gateway was raced by its writes fold after fold.)
"""
from __future__ import annotations

import time
from collections import OrderedDict
from typing import Callable

__all__ = ["FoldRaces", "Token", "UNFENCED"]

#: What :meth:`FoldRaces.end` returns when a write with no fence raced the fold.
UNFENCED = -1


class _Slot:
    __slots__ = ("fences", "folds")

    def __init__(self) -> None:
        self.fences: list[int] = []  # of the records seen (UNFENCED for none), in order
        self.folds = 0  # folds in flight


#: What :meth:`FoldRaces.begin` returns: where the fold's records start in its stream's list,
#: and the fence of a record heard a moment before it began (``None``: none).
Token = tuple[int, "int | None"]


class FoldRaces:
    """Other gateways' records per stream while a fold of it is in flight, and for a moment
    before: a record is heard when it is published, and may be stored a little later, after
    a fold that began once it was heard read where the stream ended (``_catchup.py`` waits
    up to 0.5 s for such a record).

    Args:
        clock: monotonic seconds.
        recent: seconds a record heard counts for a fold that begins after it.
        keep: streams whose last record heard is remembered (least recent forgotten first).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, recent: float = 0.5, keep: int = 4096) -> None:
        self._folding: dict[str, _Slot] = {}
        self._clock, self._recent, self._keep = clock, recent, keep
        self._heard: OrderedDict[str, tuple[int, float]] = OrderedDict()  # key -> (fence, when)

    def begin(self, key: str) -> Token:
        """A fold of stream ``key`` starts; returns its token for :meth:`end`."""
        slot = self._folding.get(key)
        if slot is None:
            slot = self._folding[key] = _Slot()
        slot.folds += 1
        last = self._heard.get(key)
        recent = last[0] if last is not None and self._clock() - last[1] <= self._recent else None
        return len(slot.fences), recent  # (a record heard a moment ago may not be stored yet)

    def saw(self, key: str, prev: int | None) -> None:
        """Another gateway's record of stream ``key`` arrived, fenced on the subject's
        sequence ``prev`` (``None``: written with no fence)."""
        fence = UNFENCED if prev is None else prev
        slot = self._folding.get(key)
        if slot is not None:
            slot.fences.append(fence)
        self._heard[key] = (fence, self._clock())
        self._heard.move_to_end(key)
        if len(self._heard) > self._keep:
            self._heard.popitem(last=False)

    def wrote(self, key: str, prev: int) -> None:
        """This gateway stored a record of stream ``key``, fenced on ``prev`` (never heard
        here): a fold in flight may lack it; a fold that begins later has it."""
        slot = self._folding.get(key)
        if slot is not None:
            slot.fences.append(prev)

    def lost_sight(self) -> None:
        """Other gateways' records may have been missed (the connection was down): every
        fold in flight may lack a write it cannot place (as one with no fence)."""
        for slot in self._folding.values():
            slot.fences.append(UNFENCED)

    def end(self, key: str, token: Token) -> int | None:
        """The fold that :meth:`begin` returned ``token`` for ended.

        Returns:
            ``None`` when no other gateway's record of the stream arrived meanwhile; else
            the highest fence among those records, or :data:`UNFENCED` when one had none.
        """
        slot = self._folding[key]
        fences = slot.fences[token[0]:]
        if token[1] is not None:
            fences.append(token[1])
        slot.folds -= 1
        if slot.folds == 0:
            del self._folding[key]
        if not fences:
            return None
        return UNFENCED if UNFENCED in fences else max(fences)
