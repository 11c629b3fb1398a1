"""Presence sweeper (leader task): detach a run when its last reader's key goes away.

``UnregisterReader`` detaches at once on the replica that serves it; this task covers
reader keys that vanish with their session's lease (a dead gateway), which no RPC reports
(DESIGN.md §3.3). It watches deletions under ``readers/`` and resumes after an etcd
outage from the last revision it fully handled, so no deletion is missed while etcd keeps
history.
"""
from __future__ import annotations

import asyncio
import logging

from baton.errors import StoreUnavailable

from coordinator._election import LeaderContext
from coordinator._keys import prefix_end

log = logging.getLogger(__name__)


async def presence_sweeper(ctx: LeaderContext) -> None:
    """Run until cancelled (leadership lost)."""
    store, timeout = ctx.store, ctx.config.etcd_timeout
    prefix = store.keys.all_readers
    _, handled = await store.etcd.range(prefix, timeout=timeout)
    while True:
        try:
            async for _rev, events in store.etcd.watch([(prefix, prefix_end(prefix))],
                                                      start_revision=handled + 1, deletes_only=True):
                for run_id in {store.keys.run_id_of_reader(ev.kv.key) for ev in events}:
                    await store.detach_if_unread(run_id, timeout=timeout)
                handled = max(ev.kv.mod_revision for ev in events)
        except StoreUnavailable as exc:
            log.warning("presence sweeper: %s; resuming after revision %d", exc, handled)
            await asyncio.sleep(0.2)
