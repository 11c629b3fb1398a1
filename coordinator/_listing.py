"""Tenant-wide run listings by start time (docs/design.md §3.5): one bounded read per call.

Every run has entries in the ``started/`` indexes (:func:`coordinator.rules.listing_entries`,
written with the record, deleted by retention): for every run and for its tenant, oldest
first (``.../a/<µs>/<run>``) and newest first (``.../d/<inverted µs>/<run>``). So

* a page of ``ListRuns`` is one range read of ``page_size + 1`` keys after the page token's
  position, then the records of that page;
* "the newest N runs" (the web pages' thread list, the overview, the metrics) is one range
  read of N keys;

and neither reads more of etcd as the tenant's runs grow.

A page token is the position (``started_at`` µs, encoded run id) of the last run of the page
before, base64url (:func:`baton.ids.page_token`): keyset paging, so a walk over the pages
returns every run that existed throughout exactly once, in order, whatever is created or
deleted meanwhile (a run created during the walk is returned when its position is after
the walk's; a run deleted before its page is read is not).
"""
from __future__ import annotations

import asyncio
from typing import Sequence

from baton.ids import page_position, page_token
from baton.v1.runs_pb2 import RunRecord

from coordinator import _etcd as E
from coordinator._keys import Keys, prefix_end

#: Records read per transaction (one get each; etcd allows 128 ops).
READ_BATCH = 100


async def _records(etcd: E.Etcd, keys: Keys, run_ids: Sequence[str], timeout: float) -> list[RunRecord]:
    """The records of ``run_ids`` in order; a run whose record is gone is left out."""
    async def read(chunk: Sequence[str]) -> list[RunRecord]:
        r = await etcd.txn([], [E.get(keys.run(x)) for x in chunk], timeout=timeout)
        out = []
        for j in range(len(chunk)):
            for kv in r.kvs(j):
                rec = RunRecord.FromString(kv.value)
                rec.revision = kv.mod_revision
                out.append(rec)
        return out

    parts = await asyncio.gather(*(read(run_ids[i : i + READ_BATCH]) for i in range(0, len(run_ids), READ_BATCH)))
    return [rec for part in parts for rec in part]


def _visible(recs: list[RunRecord], tenant: str | None) -> list[RunRecord]:
    # The index is the tenant's by construction; the check keeps a stray entry harmless.
    return recs if tenant is None else [r for r in recs if r.tenant == tenant]


async def page(etcd: E.Etcd, keys: Keys, tenant: str | None, size: int, token: str, *,
               timeout: float) -> tuple[list[RunRecord], str]:
    """One page of the runs of ``tenant`` (``None``: every run), oldest first.

    Args:
        tenant: the tenant whose runs are listed; ``None`` lists every run.
        size: at most this many runs (> 0).
        token: ``""`` for the first page, else the ``next_page_token`` of the page before.
        timeout: seconds per etcd call (two calls).

    Returns:
        (runs, next page token; ``""`` when this is the last page). A page may hold fewer
        than ``size`` runs when a record went between the index read and the record read.

    Raises:
        InvalidArgument: ``token`` is not a token this function returned.
        StoreUnavailable: etcd did not answer in time.
    """
    scope = keys.started_scope(tenant)
    start = scope + page_position(token) + b"\0" if token else scope
    kvs, _ = await etcd.range(start, prefix_end(scope), limit=size + 1, keys_only=True, timeout=timeout)
    more = len(kvs) > size
    kvs = kvs[:size]
    recs = await _records(etcd, keys, [keys.run_id_of_started(kv.key) for kv in kvs], timeout)
    return _visible(recs, tenant), page_token(kvs[-1].key[len(scope):]) if more else ""


async def newest(etcd: E.Etcd, keys: Keys, tenant: str | None, limit: int, *,
                 timeout: float) -> list[RunRecord]:
    """The newest ``limit`` runs of ``tenant`` (``None``: of every tenant), oldest first.

    One range read of ``limit`` keys on the newest-first index, then their records.
    """
    scope = keys.started_scope(tenant, newest_first=True)
    kvs, _ = await etcd.range(scope, prefix_end(scope), limit=limit, keys_only=True, timeout=timeout)
    recs = await _records(etcd, keys, [keys.run_id_of_started(kv.key) for kv in kvs], timeout)
    return list(reversed(_visible(recs, tenant)))
