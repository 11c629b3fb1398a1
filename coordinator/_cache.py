"""The coordinator's record cache: the last record and claim it saw for each run.

A hint for writes, never an answer. A write built on a cached entry still compares the
record's (and the claim's) mod revision inside its etcd transaction, and that transaction's
failure branch reads the record and claim back, so a stale entry costs one more round trip
and nothing else. An answer that writes nothing (a refusal, "already so") is never given from
the cache: the store reads etcd first. With the cache, a claim or an update of a run this
replica has seen is one etcd transaction instead of a read and a transaction.

Revisions are only unique within one etcd data set: after a data wipe, revisions start over
and a new record could land at a cached mod revision. The store therefore keeps an
*incarnation* key holding a random id (written once, and again after a wipe); every entry
carries the id read with it, and every write compares it too.

Entries come from the store's own reads and writes (no watch: a watch would make every
replica parse every change of every run to save a round trip on runs it may never touch).
Pure and bounded (least recently used goes first); no I/O.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from aetcd import rpc


@dataclass(frozen=True)
class Entry:
    """What etcd held for one run as of ``revision``.

    Attributes:
        run_kv: the record's key-value (``mod_revision`` is what a write compares).
        claim_kv: the claim's key-value, ``None`` when there was no claim.
        revision: the etcd revision the two were read or written at.
        incarnation: the store's incarnation id when they were read (a write compares it
            too, so an entry from before an etcd data wipe never matches).
    """

    run_kv: rpc.KeyValue
    claim_kv: rpc.KeyValue | None
    revision: int
    incarnation: bytes


class RecordCache:
    """Last known record + claim per run id, at most ``size`` runs (``0`` disables it).

    Args:
        size: the most runs remembered; the least recently used is dropped first.
    """

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError(f"record cache size must be >= 0, got {size}")
        self.size = size
        self._entries: OrderedDict[str, Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, run_id: str) -> Entry | None:
        """The entry for ``run_id`` (marked recently used), or ``None``."""
        entry = self._entries.get(run_id)
        if entry is not None:
            self._entries.move_to_end(run_id)
        return entry

    def put(self, run_id: str, run_kv: rpc.KeyValue | None, claim_kv: rpc.KeyValue | None,
            revision: int, incarnation: bytes) -> None:
        """Remember what etcd held at ``revision`` in ``incarnation``.

        An older observation of the same incarnation (``revision`` below the entry's) is
        ignored, so a slow read cannot overwrite a newer write. ``run_kv=None`` (no record)
        or an empty ``incarnation`` (unknown) forgets the run.
        """
        if self.size == 0:
            return
        old = self._entries.get(run_id)
        if old is not None and old.incarnation == incarnation and old.revision > revision:
            return
        if run_kv is None or not incarnation:
            self._entries.pop(run_id, None)
            return
        self._entries[run_id] = Entry(run_kv, claim_kv, revision, incarnation)
        self._entries.move_to_end(run_id)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def forget(self, run_id: str) -> None:
        """Drop the entry (the next write of this run reads etcd first)."""
        self._entries.pop(run_id, None)

    def clear(self) -> None:
        """Drop every entry (etcd's data is not the one they were read from)."""
        self._entries.clear()
