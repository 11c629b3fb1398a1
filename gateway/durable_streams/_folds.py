"""Which folds of a stream raced another gateway's write (pure bookkeeping on one loop).

A gateway drops its cached view of a stream when another gateway writes it (the record
arrives on its core NATS subscription), which wakes the view's readers. A write that
arrives while the stream is being folded from JetStream finds no view to drop, and may be
missing from the fold: a view cached from that fold would be stale, its readers waiting
with nobody to wake them (a long-poll then answers only at its timeout). Since a gateway
can run as several workers (gateway/_workers.py), whose readers and writers of one stream
are often in different processes, that race is common, not rare.
"""
from __future__ import annotations

__all__ = ["FoldRaces"]


class FoldRaces:
    """Counts other gateways' records per stream while a fold of it is in flight."""

    def __init__(self) -> None:
        self._folding: dict[str, list[int]] = {}  # key -> [records seen, folds in flight]

    def begin(self, key: str) -> int:
        """A fold of stream ``key`` starts; returns its token for :meth:`end`."""
        slot = self._folding.setdefault(key, [0, 0])
        slot[1] += 1
        return slot[0]

    def saw(self, key: str) -> None:
        """Another gateway's record of stream ``key`` arrived."""
        slot = self._folding.get(key)
        if slot is not None:
            slot[0] += 1

    def end(self, key: str, token: int) -> bool:
        """The fold that :meth:`begin` returned ``token`` for ended: whether another
        gateway's record of the stream arrived meanwhile (the fold may lack it)."""
        slot = self._folding[key]
        slot[1] -= 1
        if slot[1] == 0:
            del self._folding[key]
        return slot[0] != token
