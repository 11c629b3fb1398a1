"""Presence sweeper (leader task): detach a run when its last reader's key goes away.

``UnregisterReader`` detaches at once on the replica that serves it; this task covers
reader keys that vanish with their session's lease (a dead gateway), which no RPC reports
(docs/design.md §3.3). It watches deletions under ``readers/`` and resumes after an etcd
outage from the last revision it fully handled, so no deletion is missed while etcd keeps
history.

A watch only sees what happens after the leader began watching: a reader lease that
expired while no replica led (or before etcd compacted the revision a former leader had
reached) leaves no event. So each term starts with a catch-up sweep over the runs
themselves: a ``running``, not detached run with no reader key is detached now.
"""
from __future__ import annotations

import asyncio
import logging

from baton.errors import StoreUnavailable
from baton.retry import Attempts, Deadline

from coordinator._election import LeaderContext
from coordinator._indexes import ensure_indexes, live_runs
from coordinator._keys import prefix_end
from coordinator._records import is_active

log = logging.getLogger(__name__)

#: Seconds a fresh run is left alone by the catch-up sweep: the gateway registers its first
#: reader right after ``StartRun`` returns, and judging the run in that gap would detach it
#: (or, for a run that cancels on disconnect, cancel it) though a reader is on its way.
START_GRACE = 5.0


async def presence_sweeper(ctx: LeaderContext) -> None:
    """Run until cancelled (leadership lost)."""
    store, timeout = ctx.store, ctx.config.etcd_timeout
    prefix = store.keys.all_readers
    # Before the term's revision, so the catch-up (which reads the live index as it was
    # then) sees every entry the backfill writes.
    await ensure_indexes(store, timeout=timeout)
    _, handled = await store.etcd.range(prefix, timeout=timeout)
    # The catch-up judges the runs that existed at ``handled``; every deletion after it
    # reaches the watch (from handled + 1), and detaching twice is a no-op.
    async with asyncio.TaskGroup() as tg:
        tg.create_task(catch_up_sweep(ctx, handled), name="presence-catch-up")
        # Watch again after a failure, until leadership is lost (this task is cancelled).
        async for _ in Attempts(Deadline.never(), first_pause=0.2, max_pause=0.2):
            try:
                async for _rev, events in store.etcd.watch([(prefix, prefix_end(prefix))],
                                                          start_revision=handled + 1, deletes_only=True):
                    for run_id in {store.keys.run_id_of_reader(ev.kv.key) for ev in events}:
                        await store.detach_if_unread(run_id, timeout=timeout)
                    handled = max(ev.kv.mod_revision for ev in events)
            except StoreUnavailable as exc:
                log.warning("presence sweeper: %s; resuming after revision %d", exc, handled)


async def catch_up_sweep(ctx: LeaderContext, term_revision: int, *, grace: float = START_GRACE) -> int:
    """Detach every running, not detached run that has no reader key (start of a term).

    Only runs that existed at ``term_revision`` (the revision the term's watch starts
    after) are judged: a reader of a later run can only vanish in view of the watch. The
    runs come from the live index as it was at ``term_revision`` (paged; no finished record
    is read), the readers from one paged keys-only read; each candidate is then
    detached by :meth:`RunStore.detach_if_unread`, which compares "no reader" inside its
    write, so a reader that arrives meanwhile wins. A run started less than ``grace``
    seconds ago is judged once it is that old.

    Returns:
        How many runs were detached.

    Raises:
        StoreUnavailable: etcd did not answer (the leader task is restarted).
    """
    store, keys, timeout = ctx.store, ctx.store.keys, ctx.config.etcd_timeout
    t0 = asyncio.get_running_loop().time()
    live = await live_runs(store, revision=term_revision, timeout=timeout)
    readers, _ = await store.etcd.range_all(keys.all_readers, prefix_end(keys.all_readers),
                                            keys_only=True, timeout=timeout)
    log.info("presence catch-up: %d live run(s) and %d reader(s) read in %.3f s", len(live), len(readers),
             asyncio.get_running_loop().time() - t0)
    read = {keys.run_id_of_reader(kv.key) for kv in readers}
    now = store.clock()
    due: list[tuple[float, str]] = []
    for rec in live:
        if not is_active(rec) or rec.HasField("detached_since") or rec.run_id in read:
            continue
        age = now - rec.started_at if rec.HasField("started_at") else grace
        # started_at comes from the host's clock: bound the wait so a skewed one cannot park it.
        due.append((min(grace, max(0.0, grace - age)), rec.run_id))
    detached = 0
    for wait, run_id in sorted(due):
        if wait > 0:
            await asyncio.sleep(max(0.0, wait - (store.clock() - now)))
        detached += await store.detach_if_unread(run_id, timeout=timeout) is not None
    if detached:
        log.info("presence catch-up: %d run(s) had lost their last reader while no leader watched", detached)
    return detached
