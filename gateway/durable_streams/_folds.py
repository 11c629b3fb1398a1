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

__all__ = ["FoldRaces", "UNFENCED"]

#: What :meth:`FoldRaces.end` returns when a write with no fence raced the fold.
UNFENCED = -1


class _Slot:
    __slots__ = ("fences", "folds")

    def __init__(self) -> None:
        self.fences: list[int] = []  # of the records seen (UNFENCED for none), in order
        self.folds = 0  # folds in flight


class FoldRaces:
    """Other gateways' records per stream while a fold of it is in flight."""

    def __init__(self) -> None:
        self._folding: dict[str, _Slot] = {}

    def begin(self, key: str) -> int:
        """A fold of stream ``key`` starts; returns its token for :meth:`end`."""
        slot = self._folding.get(key)
        if slot is None:
            slot = self._folding[key] = _Slot()
        slot.folds += 1
        return len(slot.fences)

    def saw(self, key: str, prev: int | None) -> None:
        """Another gateway's record of stream ``key`` arrived, fenced on the subject's
        sequence ``prev`` (``None``: written with no fence)."""
        slot = self._folding.get(key)
        if slot is not None:
            slot.fences.append(UNFENCED if prev is None else prev)

    def lost_sight(self) -> None:
        """Other gateways' records may have been missed (the connection was down): every
        fold in flight may lack a write it cannot place (as one with no fence)."""
        for slot in self._folding.values():
            slot.fences.append(UNFENCED)

    def end(self, key: str, token: int) -> int | None:
        """The fold that :meth:`begin` returned ``token`` for ended.

        Returns:
            ``None`` when no other gateway's record of the stream arrived meanwhile; else
            the highest fence among those records, or :data:`UNFENCED` when one had none.
        """
        slot = self._folding[key]
        fences = slot.fences[token:]
        slot.folds -= 1
        if slot.folds == 0:
            del self._folding[key]
        if not fences:
            return None
        return UNFENCED if UNFENCED in fences else max(fences)
