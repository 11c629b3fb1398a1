"""Compaction of old logs (docs/design.md §4.4): a leader task that compacts finished runs' logs.

A terminal run's delivery log older than ``BATON_LOG_COMPACT_AFTER`` seconds (0: never, the
default) is compacted to its final snapshot and its close (:func:`baton.log._compact.compact_outcome`):
a later join from the start gets ``CUSTOM stream.compacted`` and the snapshot, never a silent
gap. Only a log whose final snapshot covers its last chunk is compacted; another is left whole
and says so in a log line (outcome ``uncovered``). A reader in the middle of a log while it
is compacted gets a gap (``OffsetExpired``; baton/log/_reader.py), never a jump to the end.

Runs are found by the ended index (``ended/<µs>/<run>``, oldest first, the index retention
reads), in batches up to ``now - age``. A pass remembers how far it got (in memory: a new
leader looks at every ended run once more; compaction is idempotent, each look one or two
JetStream reads). A log whose close is younger than the age although its record ended
earlier (clocks apart) stops the pass there; the next pass looks again.

The task runs on the leader only (as the reaper and retention), and holds its own NATS
connection for its term.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import nats.errors

from baton.errors import LogUnavailable, StoreUnavailable
from baton.log._compact import OUTCOMES as LOG_OUTCOMES

from coordinator._election import LeaderContext
from coordinator._store import RunStore

log = logging.getLogger(__name__)

#: Ended-index entries looked at per batch.
BATCH = 200
#: Seconds the task's NATS connection may take to close when its term ends.
CLOSE_TIMEOUT = 5.0
#: A pass's counts: the log outcomes, and ``failed`` (JetStream did not answer).
OUTCOMES = (*LOG_OUTCOMES, "failed")


class CompactionSweep:
    """Compacts what is due: ``await sweep(now)`` → outcome counts.

    Args:
        store: the etcd-backed store (its ended index).
        delivery_log: a :class:`baton.log.DeliveryLog` (``compact_outcome``).
        age: seconds after its run ended (and its log closed) a log is compacted.
        clock: Unix-seconds clock.
        batch: ended-index entries read at once.
    """

    def __init__(self, store: RunStore, delivery_log: Any, age: float, *,
                 clock: Callable[[], float] = time.time, batch: int = BATCH) -> None:
        self.store = store
        self.log = delivery_log
        self.age = age
        self.clock = clock
        self.batch = batch
        self._after = b""  # the ended-index key the last pass got past (exclusive)
        self._lock = asyncio.Lock()

    async def sweep(self, now: float = 0.0, *, timeout: float = 5.0) -> dict[str, int]:
        """One pass over the runs that ended at least ``age`` seconds before ``now``.

        Returns:
            Counts per outcome (:data:`OUTCOMES`).

        Raises:
            StoreUnavailable: etcd did not answer (what was done stays done).
        """
        now = now if now > 0 else self.clock()
        counts = {k: 0 for k in OUTCOMES}
        k = self.store.keys
        async with self._lock:
            end = k.ended_until(now - self.age)
            while True:
                start = max(self._after, k.ended_prefix)
                entries, _ = await self.store.etcd.range(start, end, limit=self.batch, timeout=timeout)
                stop = False
                for kv in entries:
                    run_id = kv.value.decode()
                    try:
                        outcome = await self.log.compact_outcome(run_id, now=now, older_than=self.age)
                    except LogUnavailable as exc:
                        log.warning("compaction: run %s: %s", run_id, exc)
                        counts["failed"] += 1
                        stop = True
                        break
                    counts[outcome] += 1
                    if outcome == "uncovered":
                        log.info("compaction: log of run %s left whole: no final snapshot covers its end", run_id)
                    if outcome == "young":
                        stop = True  # its close is younger than its record says: look again next pass
                        break
                    self._after = kv.key + b"\0"
                if stop or len(entries) < self.batch:
                    break
        if counts["compacted"] or counts["uncovered"] or counts["failed"]:
            log.info("compaction pass: %s", {n: c for n, c in counts.items() if c})
        return counts


Connect = Callable[[], Awaitable[Any]]


def compaction_loop(age: float, interval: float, connect: Connect) -> Callable[[LeaderContext], Awaitable[None]]:
    """A leader task compacting logs older than ``age`` seconds every ``interval`` seconds
    (either 0 = never). ``connect()`` opens the task's :class:`baton.log.DeliveryLog` (closed
    when leadership ends). It never returns while leading."""

    async def compaction_pass(ctx: LeaderContext) -> None:
        if age <= 0 or interval <= 0:
            await asyncio.Event().wait()
        delivery_log: Any = None
        sweep: CompactionSweep | None = None
        try:
            while True:
                await asyncio.sleep(interval)
                try:
                    if delivery_log is None:
                        delivery_log = await connect()
                        sweep = CompactionSweep(ctx.store, delivery_log, age)
                    assert sweep is not None
                    await sweep.sweep(timeout=ctx.config.etcd_timeout)
                except (StoreUnavailable, LogUnavailable, OSError, nats.errors.Error, asyncio.TimeoutError) as exc:
                    log.warning("compaction pass failed: %s", exc)
        finally:
            if delivery_log is not None:
                # The term ended (a cancel): the close still runs, bounded.
                await asyncio.shield(_close_bounded(delivery_log))

    return compaction_pass


async def _close_bounded(delivery_log: Any) -> None:
    """Close ``delivery_log`` within :data:`CLOSE_TIMEOUT` seconds (``asyncio.timeout``, not
    ``wait_for``, which can lose a cancellation on Python 3.11)."""
    async with asyncio.timeout(CLOSE_TIMEOUT):
        await delivery_log.close()
