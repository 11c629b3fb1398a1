"""The reaper (docs/design.md §7): ends runs nobody came back to.

One sweep lists every detached running run (by the reclaimable index, no scan of all runs)
and decides each:

* **expired** (detached for at least ``ttl``, inclusive as in the reference reaper, and
  past any ``kept_until`` a client asked for): the
  cancel is requested *only if the run is still detached as listed* (one etcd compare on
  the record's revision), so a reader that came back between listing and claim wins.
  A live driver sees the cancel via ``WatchRun`` (and the fast path ``CancelRun`` on its
  host); an orphan is handed to a live host with purpose ``finalize``. The run ends
  ``aborted`` with reason ``reaped``, its sandbox destroyed.
* **finalized**: not expired and nobody drives it (no claim): a live host attaches and
  drives it on; when its journal already ends with the exit sentinel the host replays,
  appends the rest and finishes, so its transcript is saved.
* **producing**: not expired and a live host drives it: left untouched. A run still
  ``starting`` (its input not durable) is never handed to a host to drive either.
* **kept**: detached past ``ttl`` but a client asked to keep it longer (``kept_until`` on
  its record, :mod:`baton.keep`): treated as not expired. Also when that keep-alive landed
  between listing and cancel (checked in the cancel's compare).
* **not-claimed**: a reader came back (``detached_since`` cleared or moved) before the
  reaper acted: left untouched.
* **unknown**: the run vanished or became terminal between listing and acting.
* **reclaim-failed**: no live host accepted the run.
* **failed**: the sweep's etcd or gRPC call for this run failed.

The same sweep ends **abandoned starts**: runs still ``starting`` (their ``StartRun``
failed half-way, or their gateway or host died during it) for at least ``start_grace``
seconds after ``started_at`` with nobody holding their claim. Their cancel is requested
(reason ``start-abandoned``, only while still starting and unclaimed: one etcd compare) and
a live host finalizes them: ``aborted``, no agent ever launched (outcome
``start-abandoned``). Until then a retried ``POST`` with the same run id starts them.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Awaitable, Callable

import grpc

from baton import keep
from baton.errors import StoreUnavailable
from baton.v1 import runs_pb2, sandbox_host_pb2
from baton.v1.runs_pb2 import RunRecord

from coordinator import _etcd as E
from coordinator._election import LeaderContext
from coordinator._store import RunStore
from coordinator.rules import REAPED, Plan, Snapshot, kept_until_of, reap_cancel
from coordinator.failover import HostPool, attach_somewhere

log = logging.getLogger(__name__)

OUTCOMES = ("expired", "finalized", "producing", "unknown", "not-claimed", "reclaim-failed", "failed",
            "start-abandoned", "kept")
START_ABANDONED = "start-abandoned"
#: Seconds a run may stay ``starting`` before the reaper ends it (a client retrying a
#: failed POST has this long to start it).
START_GRACE = 60.0


async def _cancel_if_still_detached(store: RunStore, listed: RunRecord, timeout: float, *,
                                    ttl: float, now: float | None) -> str | None:
    """Set ``cancel_requested`` (reason ``reaped``) only while the run is detached as listed
    and expired at ``now`` (``ttl`` and the record's ``kept_until`` as written).

    Returns:
        ``None`` when the cancel was requested, else the outcome that stops the reap
        (``unknown``, ``not-claimed`` or ``kept``).
    """
    def decide(snap: Snapshot) -> Plan[str | None]:
        return reap_cancel(snap, listed_detached_since=listed.detached_since, ttl=ttl, now=now)

    return await store.mutate(listed.run_id, decide, timeout=timeout)


async def _cancel_if_still_starting(store: RunStore, run_id: str, timeout: float) -> bool:
    """Set ``cancel_requested`` (reason ``start-abandoned``) only while the run is still
    starting and nobody claims it (compared in the write, so a retried start wins).

    Returns:
        True when the run is (now) cancelled as an abandoned start.
    """
    claim_key = store.keys.claim(run_id)

    def decide(snap: Snapshot) -> Plan[bool]:
        cur = snap.record
        if cur is None or cur.status != runs_pb2.RUN_STATUS_RUNNING or not cur.starting:
            return Plan(False, write=False)
        if cur.cancel_requested:
            return Plan(snap.claim_kv is None, write=False)
        if snap.claim_kv is not None:
            return Plan(False, write=False)  # a start (or finalizer) holds it right now
        new = RunRecord()
        new.CopyFrom(cur)
        new.cancel_requested = True
        new.cancel_reason = START_ABANDONED
        return Plan(True, new=new, cmps=[E.cmp_absent(claim_key)])

    cancelled = await store.mutate(run_id, decide, timeout=timeout)  # bool | None (None: gave up)
    return bool(cancelled)


class ReaperSweep:
    """The reaper: ``await sweep(ttl, now)`` → outcome counts (the ``Reap`` RPC's callable).

    Args:
        store: the etcd-backed store.
        ctx: a :class:`LeaderContext` (store, config, ``list_hosts``).
        default_ttl: ``detached_run_ttl`` used when a sweep is asked with ``ttl <= 0``.
        clock: Unix-seconds clock.
        patience: seconds to keep asking hosts to take a run before ``reclaim-failed``.
    """

    def __init__(self, ctx: LeaderContext, default_ttl: float, clock: Callable[[], float] = time.time,
                 *, patience: float = 1.0, start_grace: float = START_GRACE) -> None:
        self.ctx = ctx
        self.start_grace = start_grace
        self.patience = patience
        self.default_ttl = default_ttl
        self.clock = clock
        self._lock = asyncio.Lock()
        #: (ttl, now) of the sweep under way (``now`` None outside one: no keep-alive check).
        self._swept: tuple[float, float | None] = (default_ttl, None)

    async def __call__(self, ttl: float, now: float) -> dict[str, int]:
        return await self.sweep(ttl, now)

    async def sweep(self, ttl: float = 0, now: float = 0) -> dict[str, int]:
        """One sweep (serialised: two concurrent sweeps would race on the same runs)."""
        ttl = ttl if ttl > 0 else self.default_ttl
        now = now if now > 0 else self.clock()
        counts = {k: 0 for k in OUTCOMES}
        async with self._lock:
            self._swept = (ttl, now)
            store, cfg = self.ctx.store, self.ctx.config
            detached = await store.list_reclaimable(now, 0.0, 0, timeout=cfg.etcd_timeout)
            pool = HostPool()
            try:
                for rec in detached:
                    try:
                        expired = keep.expired(rec.detached_since, ttl, kept_until_of(rec), now)
                        outcome = await self._reap_one(pool, rec, expired=expired)
                    except (StoreUnavailable, grpc.aio.AioRpcError) as exc:
                        log.warning("reaper: run %s: %s", rec.run_id, exc)
                        outcome = "failed"
                    counts[outcome] += 1
                try:
                    abandoned = await store.list_starting(now - self.start_grace, timeout=cfg.etcd_timeout)
                except StoreUnavailable as exc:
                    log.warning("reaper: listing abandoned starts: %s", exc)
                    abandoned = []
                for rec in abandoned:
                    try:
                        if await _cancel_if_still_starting(store, rec.run_id, cfg.etcd_timeout):
                            res = await attach_somewhere(self.ctx, pool, rec.run_id, "finalize",
                                                         patience=self.patience)
                            counts["reclaim-failed" if res == "no-host" else "start-abandoned"] += 1
                    except (StoreUnavailable, grpc.aio.AioRpcError) as exc:
                        log.warning("reaper: abandoned start %s: %s", rec.run_id, exc)
                        counts["failed"] += 1
            finally:
                await pool.close()
        log.info("reaper sweep: %s", counts)
        return counts

    async def _reap_one(self, pool: HostPool, listed: RunRecord, *, expired: bool) -> str:
        """One listed run's outcome. ``expired``: as listed (TTL and ``kept_until``); during
        a sweep the cancel checks ``kept_until`` again as the record is when written."""
        store, cfg = self.ctx.store, self.ctx.config
        ttl, now = self._swept
        if expired:
            stop = await _cancel_if_still_detached(store, listed, cfg.etcd_timeout, ttl=ttl, now=now)
            if stop is not None:
                return stop
            _, claim = await store.get_run(listed.run_id, timeout=cfg.etcd_timeout)
            if claim is not None:
                await self._fast_cancel(pool, claim.host_id, listed.run_id)
                return "expired"
            res = await attach_somewhere(self.ctx, pool, listed.run_id, "finalize", patience=self.patience)
            return "reclaim-failed" if res == "no-host" else "expired"
        cur, claim = await store.get_run(listed.run_id, timeout=cfg.etcd_timeout)
        if cur is None or cur.status != runs_pb2.RUN_STATUS_RUNNING:
            return "unknown"
        if not cur.HasField("detached_since"):
            return "not-claimed"
        if claim is not None or cur.starting:
            # Detached past the default TTL, held by a client's keep-alive: say so.
            held = now is not None and keep.expired(listed.detached_since, ttl, None, now)
            return "kept" if held else "producing"
        res = await attach_somewhere(self.ctx, pool, listed.run_id, "drive", patience=self.patience)
        if res == "no-host":
            return "reclaim-failed"
        return "finalized"

    async def _fast_cancel(self, pool: HostPool, host_id: str, run_id: str) -> None:
        for h in await self.ctx.list_hosts():
            if h.host_id == host_id and h.address:
                try:
                    await pool.stub(h.address).CancelRun(
                        sandbox_host_pb2.CancelRunRequest(run_id=run_id, reason=REAPED), timeout=2.0)
                except grpc.aio.AioRpcError as exc:
                    # The durable flag is set; the driver sees it via WatchRun anyway.
                    log.info("reaper: fast cancel of %s on %s failed: %s", run_id, host_id, exc.code())
                return


def reaper_loop(sweep: ReaperSweep, interval: float) -> Callable[[LeaderContext], Awaitable[None]]:
    """A leader task that runs ``sweep`` every ``interval`` seconds (0 = never).

    It never returns while leading: the election ends a term when a leader task returns.
    """

    async def loop(ctx: LeaderContext) -> None:
        if interval <= 0:
            await asyncio.Event().wait()
        while True:
            await asyncio.sleep(interval)
            try:
                await sweep.sweep()
            except StoreUnavailable as exc:
                log.warning("reaper sweep failed: %s", exc)

    return loop
