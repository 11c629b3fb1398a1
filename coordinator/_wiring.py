"""Where leader-only tasks and the reaper are plugged into the coordinator.

``coordinator/failover.py`` (proactive failover) and ``coordinator/reaper.py`` are written
against :class:`~coordinator._election.LeaderContext` and hook in here: edit
:func:`build_leader_tasks` and :func:`build_reaper`; ``__main__`` calls both.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coordinator._config import CoordinatorConfig
from coordinator._election import LeaderTask
from coordinator._metrics import CoordinatorMetrics
from coordinator._service import Reaper
from coordinator._store import RunStore

if TYPE_CHECKING:
    from coordinator.reaper import ReaperSweep


@dataclass(frozen=True)
class WiringContext:
    """What a builder may use: the replica's config, its etcd-backed store and its metrics."""

    config: CoordinatorConfig
    store: RunStore
    metrics: CoordinatorMetrics = field(default_factory=CoordinatorMetrics)


def _reaper_sweep(ctx: WiringContext) -> "ReaperSweep":
    from coordinator._election import LeaderContext
    from coordinator.reaper import ReaperSweep

    # The leader loop and the Reap RPC each get a sweep; two sweeps racing on one run are
    # safe: the cancel is a compare on the record's revision, and attaches are claims.
    lctx = LeaderContext(store=ctx.store, config=ctx.config, replica_id=ctx.config.replica_id, lease_id=0)
    return ReaperSweep(lctx, ctx.config.detached_run_ttl)


def build_leader_tasks(ctx: WiringContext) -> list[LeaderTask]:
    """Leader-only tasks beyond the built-in presence sweeper (failover scheduler, index
    backfill, reaper loop, record retention, log compaction)."""
    from coordinator._indexes import backfill
    from coordinator.failover import failover_scheduler
    from coordinator.reaper import reaper_loop
    from coordinator.compaction import compaction_loop
    from coordinator.retention import retention_loop

    tasks: list[LeaderTask] = [functools.partial(failover_scheduler, metrics=ctx.metrics), backfill]
    if ctx.config.reaper_interval > 0:
        tasks.append(reaper_loop(_reaper_sweep(ctx), ctx.config.reaper_interval))
        # Retention passes run at the reaper's pace.
        if ctx.config.record_retention > 0:
            tasks.append(retention_loop(ctx.config.record_retention, ctx.config.reaper_interval,
                                        ctx.config.log_max_age))
        # Log compaction too (it needs NATS: only configured leaders connect).
        if ctx.config.log_compact_after > 0:
            tasks.append(compaction_loop(ctx.config.log_compact_after, ctx.config.reaper_interval,
                                         functools.partial(_connect_log, ctx.config)))
    return tasks


async def _connect_log(config: CoordinatorConfig) -> Any:
    """The compaction task's delivery log (``BATON_NATS_*``, ``BATON_RUNS_STREAM``...)."""
    from baton.log import DeliveryLog, LogConfig

    return await DeliveryLog.connect(config.nats_url, LogConfig.from_env())


def build_reaper(ctx: WiringContext) -> Reaper:
    """The ``Reap`` RPC's sweep ``(ttl, now) -> outcome counts``."""
    return _reaper_sweep(ctx)
