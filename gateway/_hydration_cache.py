"""The folded hydrations of recently opened threads, kept in a gateway's memory (LRU).

Filled and read by :mod:`gateway._service._hydration`; one per gateway, in its state.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any


class HydrationCache:
    """The folded UI messages of recently hydrated threads (gateway memory, LRU).

    Keyed by the thread and the ids of its finished runs, oldest first: a finished run's log
    never changes, so an entry is good until another run of the thread finishes (a new key)
    or the thread's records change (deleted, retention). TanStack's paging asks the same
    thread again for every older page; this makes those requests read no log.

    Args:
        max_threads: entries kept (the least recently used goes first).
    """

    def __init__(self, max_threads: int = 32) -> None:
        self._max = max_threads
        self._entries: OrderedDict[tuple[str, tuple[str, ...]], list[dict[str, Any]]] = OrderedDict()

    def get(self, key: tuple[str, tuple[str, ...]]) -> list[dict[str, Any]] | None:
        """The entry (a reference: copy before changing it), or ``None``."""
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: tuple[str, tuple[str, ...]], messages: list[dict[str, Any]]) -> None:
        """Keep ``messages`` for ``key``; a thread's older entries go."""
        for old in [k for k in self._entries if k[0] == key[0]]:
            del self._entries[old]
        self._entries[key] = messages
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)
