"""Retention of terminal run records (docs/design.md §3.5): a leader task deletes what is old.

A terminal record, its thread-membership entry (``thread-runs/<thread>/<run>``) and its
sandbox entry (when that still names the run) are deleted once the run ended
``BATON_RECORD_RETENTION`` seconds ago (default: the delivery log's retention,
``BATON_LOG_MAX_AGE``, so a record goes about when its log does; 0 keeps records forever). Runs are found by the ended index (``ended/<µs>/<run>``, oldest
first), read in bounded batches, and deleted by transactions that compare each record's mod
revision: a record that changed since it was read is not deleted (the next pass looks again).

What stays: the thread's tenant key (a thread keeps its owner), its transcript (NATS KV)
and its delivery log until the log's own retention drops it. The gateway serves a transcript
by thread id and ownership by the tenant key, so it stays readable without its records.

A run id whose record went cannot start a new run while its delivery log may still hold the
old run's chunks (a reader of the new run would get them, and its fence would refuse the new
run's epoch 1): the delete puts ``retired/<run>`` under a lease of the log's max age
(``BATON_LOG_MAX_AGE``; no lease, so kept forever, when the log never expires), and
``CreateOrResumeRun`` refuses such an id with ``RunIdRetired``. The passes of one span
(:data:`RETIRED_LEASE_SPAN`, an hour; a tenth of the max age when that is shorter) share one
lease of max age + span, named by ``retired-lease``: a pass reuses it while it has at least
the max age left, so an id stays retired at least the max age and at most one span longer,
and a 30-day max age holds about 720 leases, not one per pass.
"""
from __future__ import annotations

import asyncio
import logging
import math
from typing import Awaitable, Callable

from baton.errors import StoreUnavailable
from baton.v1.runs_pb2 import RunRecord

from coordinator import _etcd as E
from coordinator import rules
from coordinator._election import LeaderContext
from coordinator._indexes import LIVE_INDEXES, READ_BATCH, ensure_indexes, records
from coordinator._store import RunStore

log = logging.getLogger(__name__)

#: Ended-index entries read per batch (their records are read and deleted together).
BATCH = 500
#: Records deleted per transaction (at most eight deletes, one put and two compares each;
#: etcd allows 128 ops).
PER_TXN = 12
#: Pause between batches (seconds), so a large backlog does not crowd out the RPCs' etcd calls.
PAUSE = 0.01
#: Longest time (seconds) retention passes share one lease for the ids they retire.
RETIRED_LEASE_SPAN = 3600.0


async def retired_lease(store: RunStore, ttl: float, *, timeout: float) -> int:
    """A lease to put ``retired/<run>`` keys under that has at least ``ttl`` seconds left.

    The one named by ``retired-lease`` when it has that much left; otherwise a new one of
    ``ttl`` + span (span: :data:`RETIRED_LEASE_SPAN`, at most a tenth of ``ttl``, at least
    1 s), which ``retired-lease`` then names (put under that lease, so the name goes with it).
    The remaining time is etcd's, so neither a leader change nor clock skew between
    coordinators can shorten an id's retirement.

    Returns:
        The lease id.

    Raises:
        StoreUnavailable: etcd did not answer.
    """
    key = store.keys.retired_lease
    kvs, _ = await store.etcd.range(key, timeout=timeout)
    if kvs:
        try:
            left = await store.etcd.time_to_live(int(kvs[0].value), timeout=timeout)
        except E.LeaseNotFound:
            left = -1
        if left >= math.ceil(ttl):
            return int(kvs[0].value)
    span = min(RETIRED_LEASE_SPAN, max(1.0, ttl / 10))
    lease, _granted = await store.etcd.grant(math.ceil(ttl + span), timeout=timeout)
    named = E.cmp_mod(key, kvs[0].mod_revision) if kvs else E.cmp_absent(key)
    # Lost to another pass (a former leader's): this lease serves this pass just as well,
    # and the next pass reuses the one named.
    await store.etcd.txn([named], [E.put(key, str(lease).encode(), lease)], timeout=timeout)
    return lease


async def expire_batch(store: RunStore, cutoff: float, *, timeout: float, batch: int = BATCH,
                       retired_lease: int = 0) -> tuple[int, int]:
    """Delete the oldest terminal records that ended at or before ``cutoff`` (one batch).

    Args:
        cutoff: Unix seconds (inclusive).
        timeout: seconds per etcd call.
        batch: ended-index entries looked at.
        retired_lease: the lease each deleted run's ``retired/<run>`` key is put under
            (0: none, the key stays).

    Returns:
        (index entries looked at, records deleted). Fewer entries than ``batch``: nothing
        more is due.

    Raises:
        StoreUnavailable: etcd did not answer.
    """
    k = store.keys
    entries, _ = await store.etcd.range(k.ended_prefix, k.ended_until(cutoff), limit=batch, timeout=timeout)
    if not entries:
        return 0, 0
    found = await records(store, [kv.value.decode() for kv in entries], timeout=timeout)
    sandbox_keys = [_sandbox_key(store, kv) for _id, kv in found]
    sandboxes = await _get_each(store, sandbox_keys, timeout)
    plans: list[tuple[list[E.Cmp], list[E.Op], bool]] = []
    for entry, (run_id, kv), sandbox in zip(entries, found, sandboxes):
        plan = rules.expire(k, run_id, kv, entry.key, sandbox, cutoff=cutoff, retired_lease=retired_lease)
        if plan is not None:
            # More than one op: the record goes (a stale entry alone is one delete).
            plans.append((*plan, len(plan[1]) > 1))
    # The transactions of one batch go together: etcd commits concurrent ones in one fsync.
    chunks = [plans[i : i + PER_TXN] for i in range(0, len(plans), PER_TXN)]
    deleted = sum(await asyncio.gather(*(_delete(store, chunk, timeout) for chunk in chunks)))
    for _id, kv in found:
        if kv is not None:
            store.cache.forget(_id)
    return len(entries), deleted


def _sandbox_key(store: RunStore, kv: E.KV | None) -> bytes:
    """The sandbox entry key of the record in ``kv`` (``b""``: none)."""
    key = RunRecord.FromString(kv.value).sandbox_key if kv is not None else ""
    return store.keys.sandbox(key) if key else b""


async def _delete(store: RunStore, chunk: list[tuple[list[E.Cmp], list[E.Op], bool]], timeout: float) -> int:
    """One transaction for ``chunk``; when one of its records changed meanwhile, each on its
    own (the changed one fails its compare and stays). Returns the records deleted."""
    res = await store.etcd.txn([c for p in chunk for c in p[0]], [o for p in chunk for o in p[1]], timeout=timeout)
    if res.succeeded:
        return sum(p[2] for p in chunk)
    deleted = 0
    for cmps, ops, removes in chunk:
        res = await store.etcd.txn(cmps, ops, timeout=timeout)
        deleted += res.succeeded and removes
    return deleted


async def _get_each(store: RunStore, keys: list[bytes], timeout: float) -> list[E.KV | None]:
    """The key-value at each key (``b""``: not asked, ``None``)."""
    asked = [key for key in keys if key]
    got: dict[bytes, E.KV] = {}

    async def read(part: list[bytes]) -> None:
        r = await store.etcd.txn([], [E.get(key) for key in part], timeout=timeout)
        got.update({kv.key: kv for j in range(len(part)) for kv in r.kvs(j)})

    await asyncio.gather(*(read(asked[i : i + READ_BATCH]) for i in range(0, len(asked), READ_BATCH)))
    return [got.get(key) if key else None for key in keys]


async def expire(store: RunStore, cutoff: float, *, timeout: float, batch: int = BATCH,
                 pause: float = PAUSE, retired_ttl: float = 0.0) -> int:
    """Delete every terminal record that ended at or before ``cutoff``, batch after batch.

    Stops when nothing more is due, or when a whole batch deleted nothing (what is left
    changed meanwhile; the next pass looks again).

    Args:
        retired_ttl: seconds the deleted runs' ids stay retired at least (under a lease
            shared with other passes, :func:`retired_lease`, asked for when something is
            due); 0: forever.

    Returns:
        How many records were deleted.
    """
    total = 0
    lease = 0
    if retired_ttl > 0:
        k = store.keys
        due, _ = await store.etcd.range(k.ended_prefix, k.ended_until(cutoff), limit=1, keys_only=True,
                                        timeout=timeout)
        if not due:
            return 0
        lease = await retired_lease(store, retired_ttl, timeout=timeout)
    while True:
        seen, deleted = await expire_batch(store, cutoff, timeout=timeout, batch=batch, retired_lease=lease)
        total += deleted
        if seen < batch or deleted == 0:
            return total
        await asyncio.sleep(pause)


def retention_loop(retention: float, interval: float,
                   retired_ttl: float = 0.0) -> Callable[[LeaderContext], Awaitable[None]]:
    """A leader task deleting records older than ``retention`` seconds every ``interval``
    seconds (either 0 = never). Deleted run ids stay retired ``retired_ttl`` seconds (the
    delivery log's max age; 0 = forever). It never returns while leading."""

    async def retention_pass(ctx: LeaderContext) -> None:
        if retention <= 0 or interval <= 0:
            await asyncio.Event().wait()
        store, timeout = ctx.store, ctx.config.etcd_timeout
        while True:
            await asyncio.sleep(interval)
            try:
                await ensure_indexes(store, timeout=timeout, version=LIVE_INDEXES)
                n = await expire(store, store.clock() - retention, timeout=timeout, retired_ttl=retired_ttl)
                if n:
                    log.info("retention: %d terminal record(s) older than %gs deleted", n, retention)
            except StoreUnavailable as exc:
                log.warning("retention pass failed: %s", exc)

    return retention_pass
