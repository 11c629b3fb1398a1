"""The live, ended and started indexes (docs/design.md §3.5): reading live runs, and the
one-time backfill for records written before the indexes existed.

``live/<run>`` holds every ``running`` run and ``ended/<µs>/<run>`` every terminal one; both
change in the same etcd transaction as the record's status (:func:`coordinator.rules.index_changes`),
so the failover sweep and the presence catch-up at the start of a leadership term read only
what is live, however many finished records etcd holds. ``started/...`` lists every run by
start time, for everyone and per tenant (written at creation, deleted by retention), so a
tenant-wide listing reads one page, not every record.

A store written by an older coordinator has records but no (or not all) index entries. The
first leader task that needs the indexes backfills them once, in pages, and then writes the
marker key ``indexes`` = :data:`INDEXES_VERSION`; every later term finds the marker in one
read. A store marked ``v1`` (live and ended, from before the started index) serves the
failover sweep and the presence catch-up at once; the leader task :func:`backfill` walks it
once more in the background for the started index (until then, listings miss the older
runs). Each backfill write compares the record's mod revision, so an entry is never put for
a status the record has left meanwhile.
"""
from __future__ import annotations

import asyncio
import logging
from typing import Sequence

from baton.errors import StoreUnavailable
from baton.v1.runs_pb2 import RunRecord

from coordinator import _etcd as E
from coordinator import rules
from coordinator._election import LeaderContext
from coordinator._keys import prefix_end
from coordinator._records import is_live
from coordinator._store import RunStore

log = logging.getLogger(__name__)

#: Records per backfill transaction (one compare and at most five puts each; etcd allows 128).
BACKFILL_BATCH = 24
#: The marker's value once every index this version keeps is backfilled.
INDEXES_VERSION = b"v2"
#: The marker value from which the live and ended indexes are complete.
LIVE_INDEXES = b"v1"
#: Records read per transaction (one get each).
READ_BATCH = 100


async def records(store: RunStore, run_ids: Sequence[str], *, timeout: float) -> list[tuple[str, E.KV | None]]:
    """The record key-values of ``run_ids`` (``None`` for a run with no record), in order.

    Args:
        timeout: seconds per transaction (one per :data:`READ_BATCH` runs, all at once).
    """
    async def read(chunk: Sequence[str]) -> list[tuple[str, E.KV | None]]:
        r = await store.etcd.txn([], [E.get(store.keys.run(x)) for x in chunk], timeout=timeout)
        return [(x, (r.kvs(j) or [None])[0]) for j, x in enumerate(chunk)]

    # The transactions go together (one round trip's wait for many records).
    parts = await asyncio.gather(*(read(run_ids[i : i + READ_BATCH]) for i in range(0, len(run_ids), READ_BATCH)))
    return [item for part in parts for item in part]


def _parse(kv: E.KV) -> RunRecord:
    rec = RunRecord.FromString(kv.value)
    rec.revision = kv.mod_revision
    return rec


async def live_runs(store: RunStore, *, timeout: float, revision: int = 0) -> list[RunRecord]:
    """Every ``running`` run, by the live index (backfilled first if need be).

    Args:
        timeout: seconds per etcd call (the reads are paged).
        revision: read the index as it was at this revision (0: now). The records are read
            now, and only those still running are returned.

    Raises:
        StoreUnavailable: etcd did not answer.
    """
    await ensure_indexes(store, timeout=timeout, version=LIVE_INDEXES)
    k = store.keys
    kvs, _ = await store.etcd.range_all(k.live_prefix, prefix_end(k.live_prefix), keys_only=True,
                                        revision=revision, timeout=timeout)
    found = await records(store, [k.run_id_of_live(kv.key) for kv in kvs], timeout=timeout)
    return [rec for _id, kv in found if kv is not None and is_live(rec := _parse(kv))]


async def ensure_indexes(store: RunStore, *, timeout: float, version: bytes = INDEXES_VERSION) -> int:
    """Backfill the live, ended and started indexes once per etcd data set (marker key
    ``indexes``), unless the marker says the indexes are complete up to ``version``.

    Args:
        version: what the caller needs (:data:`LIVE_INDEXES`: the live and ended indexes).

    Returns:
        How many records were looked at (0 when the marker was there).

    Raises:
        StoreUnavailable: etcd did not answer (nothing is lost: the marker is written last,
            so the next attempt walks again, and every put is idempotent).
    """
    k = store.keys
    async with store.backfill_lock:
        kvs, _ = await store.etcd.range(k.indexes_marker, timeout=timeout)
        if kvs and kvs[0].value >= version:
            return 0
        seen = 0
        # Unpinned: a walk over many records must not fail when etcd compacts meanwhile.
        async for page, _rev in store.etcd.range_pages(k.runs, prefix_end(k.runs), timeout=timeout, pin=False):
            for i in range(0, len(page), BACKFILL_BATCH):
                await _backfill(store, page[i : i + BACKFILL_BATCH], timeout)
            seen += len(page)
        await store.etcd.txn([], [E.put(k.indexes_marker, INDEXES_VERSION)], timeout=timeout)
        log.info("live, ended and started indexes backfilled over %d record(s)", seen)
        return seen


async def _backfill(store: RunStore, kvs: Sequence[E.KV], timeout: float) -> None:
    """Index entries for ``kvs``, in one transaction that compares every record's revision;
    when one changed meanwhile, record by record from a fresh read."""
    k = store.keys
    ops = [op for kv in kvs for op in rules.backfill_indexes(k, RunRecord.FromString(kv.value))]
    if not ops:
        return
    res = await store.etcd.txn([E.cmp_mod(kv.key, kv.mod_revision) for kv in kvs], ops, timeout=timeout)
    if res.succeeded:
        return
    for kv in kvs:
        while True:
            cur, _ = await store.etcd.range(kv.key, timeout=timeout)
            if not cur:
                break  # deleted meanwhile: nothing to index
            ops = rules.backfill_indexes(k, RunRecord.FromString(cur[0].value))
            if not ops:
                break
            res = await store.etcd.txn([E.cmp_mod(kv.key, cur[0].mod_revision)], ops, timeout=timeout)
            if res.succeeded:
                break


async def backfill(ctx: LeaderContext) -> None:
    """Leader task: complete the indexes of an older store in the background (retrying
    while etcd does not answer), then wait. A store already complete costs one read."""
    while True:
        try:
            await ensure_indexes(ctx.store, timeout=ctx.config.etcd_timeout)
            break
        except StoreUnavailable as exc:
            log.warning("index backfill failed (retrying): %s", exc)
            await asyncio.sleep(1.0)
    await asyncio.Event().wait()
