"""Proactive failover (DESIGN.md §3.2): the leader hands a dead host's runs to a live host.

When a claim key disappears (its session lease expired because the host died, or a
draining host released it) and the run is still ``running``, the leader calls ``AttachRun``
on a live, non-draining host that is not full, least loaded first (load = claims it holds
now; full = load at its registered capacity), within milliseconds of the etcd delete event. A run with a cancel requested is handed over with
purpose ``finalize``, so a cancelled run whose host died still ends ``aborted``. Clients
still connected see a pause, then the rest of the run.

A run that has never been claimed (``driver_epoch == 0``: its ``StartRun`` is between
create and claim) is left alone.
"""
from __future__ import annotations

import asyncio
import logging

import grpc

from baton import internal_auth

from baton.errors import JournalAttachUnavailable, RunClaimNotAcquired, StoreUnavailable
from baton.grpc_errors import from_rpc_error
from baton.retry import Attempts, Deadline, retry
from baton.v1 import runs_pb2, sandbox_host_pb2, sandbox_host_pb2_grpc
from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import Claim

from coordinator._election import LeaderContext
from coordinator._keys import prefix_end

log = logging.getLogger(__name__)

_GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]
#: How long a hand-over keeps trying when no host can take the run (seconds).
HANDOVER_PATIENCE = 30.0


class HostPool:
    """gRPC channels to sandbox hosts, by address (owned by one leader task; ``close()``)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> sandbox_host_pb2_grpc.SandboxHostStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = internal_auth.insecure_channel(address, _GRPC_OPTIONS)
        return sandbox_host_pb2_grpc.SandboxHostStub(ch)

    async def close(self) -> None:
        chans, self._channels = list(self._channels.values()), {}
        for ch in chans:
            await ch.close()


async def host_loads(ctx: LeaderContext) -> dict[str, int]:
    """Claims held per host id now (one range read over the claims prefix)."""
    keys = ctx.store.keys
    kvs, _ = await ctx.store.etcd.range(keys.claims, prefix_end(keys.claims), timeout=ctx.config.etcd_timeout)
    loads: dict[str, int] = {}
    for kv in kvs:
        host = Claim.FromString(kv.value).host_id
        loads[host] = loads.get(host, 0) + 1
    return loads


async def live_hosts_by_load(ctx: LeaderContext, exclude: str = "") -> list[HostInfo]:
    """Live, non-draining hosts with an address and room for one more run, least loaded
    first (ties by host id).

    Load is the claims a host holds now (fresher than the load it publishes); a host with a
    ``capacity`` > 0 and that many claims is skipped (it would refuse with
    ``HOST_AT_CAPACITY`` anyway).
    """
    hosts = [h for h in await ctx.list_hosts() if not h.draining and h.address and h.host_id != exclude]
    loads = await host_loads(ctx)
    room = [h for h in hosts if h.capacity <= 0 or loads.get(h.host_id, 0) < h.capacity]
    return sorted(room, key=lambda h: (loads.get(h.host_id, 0), h.host_id))


async def attach_somewhere(ctx: LeaderContext, pool: HostPool, run_id: str, purpose: str, *,
                           patience: float = HANDOVER_PATIENCE, exclude: str = "") -> str:
    """Ask live hosts, least loaded first, to take ``run_id`` over.

    Returns:
        ``"attached"`` (a host holds the claim now), ``"taken"`` (someone else already
        holds it, or the run cannot be attached: terminal or gone), or ``"no-host"`` (no
        host accepted within ``patience`` seconds).
    """
    # ``patience`` bounds how long hosts are asked, not one AttachRun (which may take its
    # 5 s: the host claims, checks the journal and fences before it answers).
    async for _ in Attempts(Deadline.after(patience), first_pause=0.05, max_pause=0.5):
        for h in await live_hosts_by_load(ctx, exclude):
            try:
                await pool.stub(h.address).AttachRun(
                    sandbox_host_pb2.AttachRunRequest(run_id=run_id, purpose=purpose), timeout=5.0)
                log.info("failover: run %s handed to %s (%s)", run_id, h.host_id, purpose)
                return "attached"
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
                if isinstance(exc, (RunClaimNotAcquired, JournalAttachUnavailable)):
                    return "taken"
                log.warning("failover: %s refused run %s: %s", h.host_id, run_id, err.details())
    return "no-host"


async def hand_over_if_orphaned(ctx: LeaderContext, pool: HostPool, run_id: str) -> str:
    """Hand ``run_id`` to a live host when it is running, was claimed before, and has no claim.

    Returns:
        ``"skipped"`` or the outcome of :func:`attach_somewhere`.
    """
    rec, claim = await ctx.store.get_run(run_id, timeout=ctx.config.etcd_timeout)
    if rec is None or claim is not None or rec.status != runs_pb2.RUN_STATUS_RUNNING or rec.driver_epoch == 0:
        return "skipped"
    purpose = "finalize" if rec.cancel_requested else "drive"
    return await attach_somewhere(ctx, pool, run_id, purpose)


async def failover_scheduler(ctx: LeaderContext) -> None:
    """Leader task: watch claim deletions and hand orphaned runs over at once.

    On start (a new leader) it also sweeps the claims it cannot have seen vanish: every
    running run with no claim. A claim's deletion is reported once, so nothing may lose
    it: a hand-over is retried through transient etcd/gRPC failures, and a deletion that
    arrives while a hand-over of the same run is in flight is looked at again after it.
    Runs until cancelled (leadership lost).
    """
    store, keys, cfg = ctx.store, ctx.store.keys, ctx.config
    pool = HostPool()
    pending: dict[str, asyncio.Task[str]] = {}
    # Runs whose claim vanished while a hand-over of theirs was in flight: that hand-over
    # may have read the claim before it went ("skipped"), so the run is looked at again.
    recheck: set[str] = set()
    stopping = False

    def spawn(run_id: str) -> None:
        t = pending.get(run_id)
        if t is not None and not t.done():
            recheck.add(run_id)
            return
        task = asyncio.create_task(_guarded(ctx, pool, run_id), name=f"failover:{run_id}")
        pending[run_id] = task
        task.add_done_callback(lambda t, r=run_id: finished(r, t))

    def finished(run_id: str, task: asyncio.Task[str]) -> None:
        if pending.get(run_id) is task:
            del pending[run_id]
        if not stopping and not task.cancelled() and run_id in recheck:
            recheck.discard(run_id)
            spawn(run_id)

    try:
        while True:
            try:
                _, rev = await store.etcd.range(keys.claims, prefix_end(keys.claims), keys_only=True,
                                                timeout=cfg.etcd_timeout)
                for rec in await store.list_runs("", "", 0, timeout=cfg.etcd_timeout):
                    if rec.status == runs_pb2.RUN_STATUS_RUNNING and rec.driver_epoch > 0:
                        spawn(rec.run_id)
                async for _rev, events in store.etcd.watch([(keys.claims, prefix_end(keys.claims))],
                                                           start_revision=rev + 1, deletes_only=True):
                    for ev in events:
                        spawn(keys.run_id_of_claim(ev.kv.key))
            except StoreUnavailable as exc:
                log.warning("failover watch: %s; watching again", exc)
                await asyncio.sleep(0.2)
    finally:
        stopping = True
        tasks = list(pending.values())
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await pool.close()


async def _guarded(ctx: LeaderContext, pool: HostPool, run_id: str, *,
                   patience: float = HANDOVER_PATIENCE) -> str:
    """:func:`hand_over_if_orphaned`, retried while etcd (or a host) fails transiently.

    No later event reports this run again (its claim is gone already), so giving up at the
    first slow etcd answer would leave it orphaned until a reader or the reaper came.
    Each attempt re-reads the record, so a retry never hands over a run that found a driver.
    """
    try:
        return await retry(lambda: hand_over_if_orphaned(ctx, pool, run_id),
                           deadline=Deadline.after(patience),
                           retry_on=(StoreUnavailable, grpc.aio.AioRpcError), first_pause=0.1,
                           max_pause=1.0,
                           on_retry=lambda exc: log.info("failover of run %s: %s; retrying", run_id, exc))
    except (StoreUnavailable, grpc.aio.AioRpcError) as exc:
        log.warning("failover of run %s failed: %s", run_id, exc)
        return "failed"

