"""Proactive failover (docs/design.md §3.2): the leader hands a dead host's runs to a live host.

When a claim key disappears (its session lease expired because the host died, or a
draining host released it) and the run is still ``running``, the leader calls ``AttachRun``
on a live, non-draining host that is not full, within milliseconds of the etcd delete
event. The host is chosen by :func:`baton.placement.assign` (load = claims it holds now
plus hand-overs of this leader still in flight, so the orphans of one dead host spread
over the hosts with room instead of all landing on the one least loaded before them). Hand-overs run in parallel, at most :data:`MAX_PARALLEL_HANDOVERS` at a time, and the
picks that start together share one read of the hosts and their claims. A run with a cancel requested is handed over with
purpose ``finalize``, so a cancelled run whose host died still ends ``aborted``. Clients
still connected see a pause, then the rest of the run.

The same watch notes why each claim went (``last_takeover`` on the record, beside the
hand-over: :func:`record_loss`, coordinator/takeovers.py), so operators see crash, drain or a
lost session with each takeover.

A run still ``starting`` (its ``StartRun`` has not made its input durable; this includes
one never claimed) is left alone: only a retried ``StartRun`` drives it, and the reaper
ends it when nobody retries (:mod:`coordinator.reaper`).
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Mapping, Sequence

import grpc

from baton import internal_auth, telemetry

from baton.errors import BatonError, JournalAttachUnavailable, RunClaimNotAcquired, StoreUnavailable
from baton.grpc_errors import from_rpc_error
from baton.placement import Candidate, assign
from baton.retry import Attempts, Deadline, retry
from baton.v1 import runs_pb2, sandbox_host_pb2, sandbox_host_pb2_grpc
from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import Claim

from coordinator._election import LeaderContext
from coordinator._indexes import ensure_indexes, live_runs
from coordinator._keys import prefix_end
from coordinator._liveness import Verdict, probe
from coordinator._metrics import CoordinatorMetrics, Loss, loss_of, session_end
from coordinator import takeovers
from coordinator.rules import Plan, Snapshot

log = logging.getLogger(__name__)

_GRPC_OPTIONS = [("grpc.enable_http_proxy", 0)]
#: How long one round of a hand-over asks hosts before it pauses and asks again (seconds).
HANDOVER_PATIENCE = 30.0
#: Seconds before an orphan no host took within the patience is offered again.
NO_HOST_PAUSE = 1.0
#: Hand-overs of one leader in flight at once (the orphans of a dead host come together).
MAX_PARALLEL_HANDOVERS = 64
#: Seconds a takeover's note on the run record waits for the run's hand-over to end first.
NOTE_WAIT = 2.0
#: Seconds a takeover's note then waits between its read and its write: the successor replays
#: and appends meanwhile, and on a busy machine the notes of a dead host's runs (reads, a
#: connect and a write each) took CPU from those first appends (bench/results/README.md, "Takeover").
NOTE_DEFER = 0.5
#: Departed hosts' registry entries the leader remembers (to judge their claims' loss).
MAX_GONE_HOSTS = 1000


class HostPool:
    """gRPC channels to sandbox hosts, by address (owned by one leader task; ``close()``)."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> sandbox_host_pb2_grpc.SandboxHostStub:
        ch = self._channels.get(address)
        if ch is None:
            ch = self._channels[address] = internal_auth.channel(address, _GRPC_OPTIONS)
        return sandbox_host_pb2_grpc.SandboxHostStub(ch)

    async def close(self) -> None:
        chans, self._channels = list(self._channels.values()), {}
        for ch in chans:
            await ch.close(None)  # grace=None, the default (grpc-stubs makes it positional)


async def host_loads(ctx: LeaderContext) -> dict[str, int]:
    """Claims held per host id now (a paged range read over the claims prefix)."""
    keys = ctx.store.keys
    kvs, _ = await ctx.store.etcd.range_all(keys.claims, prefix_end(keys.claims), timeout=ctx.config.etcd_timeout)
    loads: dict[str, int] = {}
    for kv in kvs:
        host = Claim.FromString(kv.value).host_id
        loads[host] = loads.get(host, 0) + 1
    return loads


@dataclass
class _Assignment:
    host_id: str
    finished: int | None = None  # tick of the attach's end, None while in flight


class Placer:
    """Picks the host for each hand-over, counting this leader's own assignments as load.

    The load of a host is the claims it holds in etcd; an ``AttachRun`` in flight has not
    claimed yet, so without this book every orphan of one dead host would see the same
    loads and go to the same host. An assignment counts until a later read of the claims
    surely sees its claim: it counts for every pick whose read began before the attach
    ended (a tick orders the two; no lock, picks read concurrently).
    """

    def __init__(self, ctx: LeaderContext) -> None:
        self.ctx = ctx
        self._tick = itertools.count(1)
        self._book: list[_Assignment] = []
        # Ticks of the reads picks use now, one count per pick (a read may be shared).
        self._reading: Counter[int] = Counter()
        self._read: tuple[int, asyncio.Future[tuple[list[HostInfo], dict[str, int]]]] | None = None

    async def _snapshot(self) -> tuple[int, list[HostInfo], dict[str, int]]:
        """(tick, live hosts, claims per host): one read shared by the picks that start
        while it is in flight. The orphans of a dead host come together; each reading the
        registry and every claim again made the hand-overs of 50 runs O(n²) in etcd reads.
        Sharing is sound under the book's rule: a joiner uses the read's tick, so every
        assignment that ended after the read began still counts as pending for it.

        The caller holds one count of the tick in ``_reading`` and must release it.
        """
        if self._read is not None:
            t0, shared = self._read
            self._reading[t0] += 1
            try:
                hosts, loads = await asyncio.shield(shared)
            except BaseException:
                self._release(t0)
                raise
            return t0, hosts, loads
        t0 = next(self._tick)
        self._reading[t0] += 1
        fut: asyncio.Future[tuple[list[HostInfo], dict[str, int]]] = asyncio.get_running_loop().create_future()
        self._read = (t0, fut)
        try:
            # Two etcd reads, side by side: a hand-over's pick waits for the slower only.
            hosts, loads = await asyncio.gather(self.ctx.list_hosts(), host_loads(self.ctx))
        except BaseException as exc:
            self._release(t0)
            # Joiners retry as after any store failure; this pick's own cancel stays its own.
            fut.set_exception(exc if isinstance(exc, Exception) else StoreUnavailable("placement read cancelled"))
            fut.exception()  # retrieved: there may be no joiner
            raise
        else:
            fut.set_result((hosts, loads))
        finally:
            self._read = None
        return t0, hosts, loads

    def _release(self, t0: int) -> None:
        self._reading[t0] -= 1
        if self._reading[t0] <= 0:
            del self._reading[t0]

    async def pick(self, *, exclude: str = "", tried: frozenset[str] = frozenset()) -> tuple[HostInfo, _Assignment] | None:
        """The best live host for one more run, or ``None`` when no host has room.

        The caller must pass the assignment to :meth:`done` when its attach ended.
        """
        t0, live, loads = await self._snapshot()
        try:
            hosts = [h for h in live
                     if not h.draining and h.address and h.host_id != exclude and h.host_id not in tried]
            pending: dict[str, int] = {}
            for a in self._book:
                if a.finished is None or a.finished > t0:
                    pending[a.host_id] = pending.get(a.host_id, 0) + 1
        finally:
            self._release(t0)
        got = assign([Candidate(h.host_id, loads.get(h.host_id, 0), h.capacity) for h in hosts], 1, pending=pending)
        if not got:
            return None
        a = _Assignment(got[0])
        self._book.append(a)
        return next(h for h in hosts if h.host_id == got[0]), a

    def done(self, a: _Assignment) -> None:
        """The attach of ``a`` ended (its claim, if any, is in etcd now)."""
        a.finished = next(self._tick)
        oldest = min(self._reading, default=a.finished + 1)
        self._book = [x for x in self._book if x.finished is None or x.finished > oldest]


async def attach_somewhere(ctx: LeaderContext, pool: HostPool, run_id: str, purpose: str, *,
                           patience: float = HANDOVER_PATIENCE, exclude: str = "",
                           placer: Placer | None = None, loss: Loss | None = None) -> str:
    """Ask live hosts, best placed first (see :class:`Placer`), to take ``run_id`` over.

    ``loss`` (when and why the run lost its driver) goes to the host with the request, for
    its takeover stall histogram.

    Returns:
        ``"attached"`` (a host holds the claim now), ``"taken"`` (someone else already
        holds it, or the run cannot be attached: terminal, gone or still starting), or
        ``"no-host"`` (no host accepted within ``patience`` seconds).
    """
    placer = placer or Placer(ctx)
    # ``patience`` bounds how long hosts are asked, not one AttachRun (which may take its
    # 5 s: the host claims, checks the journal and fences before it answers).
    async for _ in Attempts(Deadline.after(patience), first_pause=0.05, max_pause=0.5):
        tried: set[str] = set()
        while (picked := await placer.pick(exclude=exclude, tried=frozenset(tried))) is not None:
            h, a = picked
            try:
                await pool.stub(h.address).AttachRun(
                    sandbox_host_pb2.AttachRunRequest(run_id=run_id, purpose=purpose,
                                                      lost_at=loss.at if loss else 0.0,
                                                      loss_cause=loss.cause if loss else ""), timeout=5.0)
                log.info("failover: run %s handed to %s (%s)", run_id, h.host_id, purpose)
                return "attached"
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
                if isinstance(exc, (RunClaimNotAcquired, JournalAttachUnavailable)):
                    # Said once per run: a run that stops here and never ends is then traceable.
                    log.info("failover: run %s not handed over: %s says %s", run_id, h.host_id, exc)
                    return "taken"
                log.warning("failover: %s refused run %s: %s", h.host_id, run_id, err.details())
                tried.add(h.host_id)
            finally:
                placer.done(a)
    return "no-host"


async def loss_cause(ctx: LeaderContext, lost: Claim, at: float) -> str | None:
    """Why ``lost`` went (:func:`coordinator.takeovers.classify`), read with its run's record
    in one transaction, or ``None`` when the loss is no takeover (the run ended, is still
    starting, or moved on since: most deletions). Read at once: the cause is what etcd holds
    just after the deletion (a drained host's entry, a session's end note).

    Raises:
        StoreUnavailable: etcd did not answer within the configured timeout.
    """
    store = ctx.store
    rec, _, read = await store.get_run_with(lost.run_id, takeovers.loss_reads(store.keys, lost),
                                            timeout=ctx.config.etcd_timeout)
    if takeovers.after_loss(rec, lost, "", at) is None:
        return None
    return _classified(lost, read)


async def record_loss(ctx: LeaderContext, lost: Claim, at: float,
                      gone_hosts: Mapping[str, HostInfo] | None = None, *, cause: str) -> str | None:
    """Note why ``lost`` went on its run's record (``last_takeover``; coordinator/takeovers.py).

    A session that ran out with no note (``session-lost``) whose host's registry entry went
    with it is told apart by one connect to the host's address, as fast failover does
    (:func:`coordinator._liveness.probe`): refused means the process is gone (``crash``: a
    SIGKILL the TTL saw before the keep-alive's break was judged); anything else leaves it
    ``session-lost`` (alive and paused, or cut off: a zombie).

    Args:
        lost: the claim whose key was just deleted (the watch's previous value).
        at: when the deletion was seen (Unix seconds).
        gone_hosts: registry entries of hosts whose entry vanished, by host id.
        cause: what :func:`loss_cause` read at the deletion (not ``None``: the loss is a
            takeover).

    Returns:
        The cause written, or ``None`` when the loss is no takeover (the run ended, is
        still starting, or moved on since).

    Raises:
        StoreUnavailable: etcd did not answer within the configured timeout.
    """
    host = (gone_hosts or {}).get(lost.host_id)
    if (cause == takeovers.SESSION_LOST and host is not None and host.session_id == lost.session_id
            and host.address and await probe(host.address) is Verdict.GONE):
        cause = takeovers.CRASH

    def decide(snap: Snapshot) -> Plan[str | None]:
        new = takeovers.after_loss(snap.record, lost, cause, at)
        return Plan(None, write=False) if new is None else Plan(cause, new=new)

    written = await ctx.store.mutate(lost.run_id, decide, timeout=ctx.config.etcd_timeout)
    if written:
        log.info("takeover of run %s from %s (epoch %d): %s", lost.run_id, lost.host_id, lost.epoch, cause)
    return written


def _classified(lost: Claim, read: Sequence[Sequence[Any]]) -> str:
    """:func:`takeovers.classify` of what :func:`takeovers.loss_reads` answered (key-values per read)."""
    session_kv, host_kv, end_kv = (kvs[0] if kvs else None for kvs in read)
    return takeovers.classify(lost, session_alive=session_kv is not None,
                              host=HostInfo.FromString(host_kv.value) if host_kv is not None else None,
                              session_end=end_kv.value if end_kv is not None else b"")


def orphaned(rec: runs_pb2.RunRecord | None, claim: Claim | None) -> bool:
    """Whether failover hands the run over: running, started (input durable), no claim."""
    return (rec is not None and claim is None and rec.status == runs_pb2.RUN_STATUS_RUNNING
            and rec.driver_epoch > 0 and not rec.starting)


async def hand_over_if_orphaned(ctx: LeaderContext, pool: HostPool, run_id: str,
                                placer: Placer | None = None, loss: Loss | None = None,
                                metrics: CoordinatorMetrics | None = None) -> str:
    """Hand ``run_id`` to a live host when :func:`orphaned`.

    Returns:
        ``"skipped"`` or the outcome of :func:`attach_somewhere`.
    """
    # A loss's cause is read with the record (one round trip), used only for an orphan. The
    # run record's note of the same loss may say ``crash`` where this says ``session-lost``:
    # it also probes a host whose lease ran out (record_loss), which a hand-over does not wait for.
    lost = Claim(session_id=loss.session_id, host_id=loss.host_id) if loss is not None and loss.session_id else None
    rec, claim, read = await ctx.store.get_run_with(
        run_id, takeovers.loss_reads(ctx.store.keys, lost) if lost is not None else (),
        timeout=ctx.config.etcd_timeout)
    if not orphaned(rec, claim):
        return "skipped"
    assert rec is not None
    purpose = "finalize" if rec.cancel_requested else "drive"
    if loss is not None and lost is not None:
        loss = replace(loss, cause=_classified(lost, read))  # type: ignore[arg-type]  # takeovers' words, LossCause's
    if loss is not None and metrics is not None:
        metrics.orphans.labels(loss.cause).inc()
    with telemetry.log_fields(run_id=run_id, thread_id=rec.thread_id, epoch=rec.driver_epoch):
        if not rec.trace_parent:
            return await attach_somewhere(ctx, pool, run_id, purpose, placer=placer, loss=loss)
        # The hand-over joins the run's trace (its AttachRun carries it to the new host).
        span = telemetry.run_span("run.failover", rec.trace_parent, {
            "baton.run_id": run_id, "baton.epoch": rec.driver_epoch, "baton.host": rec.driver_host,
            "baton.purpose": purpose}, takeover=True)
        with telemetry.in_span(span):
            outcome = await attach_somewhere(ctx, pool, run_id, purpose, placer=placer, loss=loss)
            span.set_attribute("baton.outcome", outcome)
            return outcome


async def settle_hosts(ctx: LeaderContext, drivers: set[str], budget: float, *, quiet: float = 0.3,
                       poll: float = 0.1) -> list[str]:
    """Let hosts come back before a leader's first sweep places what it found orphaned.

    Runs are orphaned at the start of a term when the cluster had no leader, most often an
    etcd outage that also ended every host's session: the hosts are alive and re-open their
    sessions one by one. Placing at once would hand every run to the first host back (issue
    19 E). So wait until every host that drove an orphan is registered again and the set of
    live hosts has not grown for ``quiet`` seconds, or ``budget`` seconds (the session TTL:
    a live host re-registers within it) have passed, whichever comes first.

    Args:
        drivers: ``driver_host`` of the orphaned runs.
        budget: seconds to wait at most.

    Returns:
        The live host ids seen last (for logs and tests).
    """
    deadline = Deadline.after(budget)
    seen: set[str] = set()
    stable_since = 0.0
    loop = asyncio.get_running_loop()
    while True:
        try:
            live = {h.host_id for h in await ctx.list_hosts() if not h.draining and h.address}
        except StoreUnavailable:
            live = seen
        now = loop.time()
        if live - seen:
            stable_since = now
        seen = live
        if (drivers <= live and now - stable_since >= quiet) or deadline.left() <= 0:
            return sorted(live)
        await asyncio.sleep(min(poll, max(deadline.left(), 0.0)))


async def failover_scheduler(ctx: LeaderContext, metrics: CoordinatorMetrics | None = None) -> None:
    """Leader task: watch claim deletions and hand orphaned runs over at once.

    On start (a new leader) it also sweeps the claims it cannot have seen vanish: every
    running run with no claim, read from the live index (:mod:`coordinator._indexes`), so
    the sweep reads only live runs, however many finished records etcd holds. A claim's deletion is reported once, so nothing may lose
    it: a hand-over is retried through transient etcd/gRPC failures, and a deletion that
    arrives while a hand-over of the same run is in flight is looked at again after it.
    Runs until cancelled (leadership lost).

    The same watch sees sessions end (their keys go with their lease; counted by their
    ``session-ends/`` note) and hosts leave the registry; each vanished claim is noted on
    its run's record (:func:`record_loss`) and its cause (:func:`loss_cause`) goes with
    the hand-over, for the metrics and the host.
    """
    store, keys, cfg = ctx.store, ctx.store.keys, ctx.config
    metrics = metrics or CoordinatorMetrics()
    pool = HostPool()
    placer = Placer(ctx)
    slots = asyncio.Semaphore(MAX_PARALLEL_HANDOVERS)
    pending: dict[str, asyncio.Task[str]] = {}
    # Runs whose claim vanished while a hand-over of theirs was in flight: that hand-over
    # may have read the claim before it went ("skipped"), so the run is looked at again.
    recheck: set[str] = set()
    stopping = False
    # Takeover notes (record_loss), one per deleted claim, beside the hand-overs.
    notes: set[asyncio.Task[None]] = set()
    note_slots = asyncio.Semaphore(MAX_PARALLEL_HANDOVERS)
    # Hosts whose registry entry went (their session ended), newest last, for record_loss.
    gone_hosts: dict[str, HostInfo] = {}

    async def note(lost: Claim, at: float, after: asyncio.Task[str] | None) -> None:
        try:
            # The cause at once: what etcd holds just after the deletion. After the hand-over
            # it may be gone (a drained host undrained as soon as its runs moved reads as
            # "released").
            async with note_slots:
                cause = await loss_cause(ctx, lost, at)
            if cause is None:
                return
            if after is not None:
                # The hand-over before the write: the note and the successor's claim both
                # write the run's record, and a note landing between the claim's read and
                # write made the claim write again, on the takeover's way. The record takes
                # either order (takeovers.after_loss); a hand-over that keeps failing does
                # not hold it long.
                await asyncio.wait([after], timeout=NOTE_WAIT)
                # The successors' first appends before the note's connect and write: their
                # CPU is a reader's stall, a note's is not (no slot held meanwhile).
                await asyncio.sleep(NOTE_DEFER)
            async with note_slots:
                await record_loss(ctx, lost, at, gone_hosts, cause=cause)
        except BatonError as exc:  # a note is for operators: the hand-over goes on without it
            log.warning("takeover of run %s not noted: %s", lost.run_id, exc)

    async def count_end(session_id: int) -> None:
        async with note_slots:
            try:
                kvs, _ = await store.etcd.range(keys.session_end(session_id), timeout=cfg.etcd_timeout)
            except StoreUnavailable as exc:
                log.warning("end of session %x not counted: %s", session_id, exc)
                return
            metrics.sessions_ended.labels(session_end(kvs[0].value if kvs else b"")).inc()

    def side_task(coro: Any, name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        notes.add(task)
        task.add_done_callback(notes.discard)

    def spawn(run_id: str, loss: Loss | None = None) -> None:
        t = pending.get(run_id)
        if t is not None and not t.done():
            recheck.add(run_id)
            return
        task = asyncio.create_task(_guarded(ctx, pool, run_id, placer=placer, slots=slots, loss=loss,
                                            metrics=metrics),
                                   name=f"failover:{run_id}")
        pending[run_id] = task
        task.add_done_callback(functools.partial(finished, run_id))

    def finished(run_id: str, task: asyncio.Task[str]) -> None:
        if pending.get(run_id) is task:
            del pending[run_id]
        if not task.cancelled() and task.exception() is None and task.result() != "skipped":
            metrics.failovers.labels(task.result()).inc()
        if not stopping and not task.cancelled() and run_id in recheck:
            recheck.discard(run_id)
            spawn(run_id)

    try:
        while True:
            try:
                t0 = asyncio.get_running_loop().time()
                await ensure_indexes(store, timeout=cfg.etcd_timeout)
                # Only the revision matters: the watch starts after it.
                _, rev = await store.etcd.range(keys.claims, prefix_end(keys.claims), keys_only=True,
                                                limit=1, timeout=cfg.etcd_timeout)
                live = await live_runs(store, timeout=cfg.etcd_timeout)
                orphans = [rec for rec in live if rec.driver_epoch > 0 and not rec.starting]
                # Start-up work, measured: it reads live runs only (tests/faults/test_volume.py).
                log.info("failover sweep: %d live run(s) read (%d checked for a claim) in %.3f s", len(live), len(orphans),
                         asyncio.get_running_loop().time() - t0)
                if orphans:
                    await settle_hosts(ctx, {rec.driver_host for rec in orphans}, cfg.session_ttl)
                for rec in orphans:
                    spawn(rec.run_id)
                ranges = [(p, prefix_end(p)) for p in (keys.claims, keys.all_sessions, keys.hosts)]
                async for _rev, events in store.etcd.watch(ranges, start_revision=rev + 1, deletes_only=True,
                                                           prev_kv=True):
                    now = store.clock()
                    for ev in events:
                        key, prev = ev.kv.key, ev.prev_kv.value if ev.prev_kv is not None else b""
                        if key.startswith(keys.hosts):
                            if prev:  # noted before the batch's tasks run
                                h = HostInfo.FromString(prev)
                                gone_hosts.pop(h.host_id, None)
                                gone_hosts[h.host_id] = h
                                while len(gone_hosts) > MAX_GONE_HOSTS:
                                    gone_hosts.pop(next(iter(gone_hosts)))
                        elif key.startswith(keys.all_sessions):
                            sid = int(key[len(keys.all_sessions):], 16)
                            side_task(count_end(sid), f"session-end:{sid:x}")
                        elif key.startswith(keys.claims):
                            run_id = keys.run_id_of_claim(key)
                            spawn(run_id, loss_of(prev or None, at=now))
                            if prev:
                                lost = Claim.FromString(prev)
                                side_task(note(lost, now, pending.get(run_id)), f"takeover-note:{lost.run_id}")
            except StoreUnavailable as exc:
                log.warning("failover watch: %s; watching again", exc)
                await asyncio.sleep(0.2)
    finally:
        stopping = True
        tasks = [*pending.values(), *notes]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await pool.close()


async def _guarded(ctx: LeaderContext, pool: HostPool, run_id: str, *, placer: Placer,
                   slots: asyncio.Semaphore, patience: float = HANDOVER_PATIENCE,
                   loss: Loss | None = None, metrics: CoordinatorMetrics | None = None) -> str:
    """:func:`hand_over_if_orphaned`, retried while etcd (or a host) fails transiently.

    No later event reports this run again (its claim is gone already), so giving up at the
    first slow etcd answer would leave it orphaned until a reader or the reaper came.
    Each attempt re-reads the record, so a retry never hands over a run that found a driver.
    """
    async def once() -> str:
        async with slots:
            return await hand_over_if_orphaned(ctx, pool, run_id, placer, loss, metrics)

    while True:
        try:
            res = await retry(once, deadline=Deadline.after(patience),
                              retry_on=(StoreUnavailable, grpc.aio.AioRpcError), first_pause=0.1, max_pause=1.0,
                              on_retry=lambda exc: log.info("failover of run %s: %s; retrying", run_id, exc))
        except (StoreUnavailable, grpc.aio.AioRpcError) as exc:
            log.warning("failover of run %s failed: %s", run_id, exc)
            return "failed"
        if res != "no-host":
            return res
        # Every host refused for ``patience`` seconds (busy: 200 runs at once on a starved
        # machine answered AttachRun later than its 5 s; or full). Nothing reports the run
        # again, and its readers wait for its end: ask again (the record is re-read first).
        log.warning("failover of run %s: no host took it within %gs; asking again", run_id, patience)
        await asyncio.sleep(NO_HOST_PAUSE)

