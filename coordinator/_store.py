"""The etcd-backed store behind every Coordinator RPC (docs/design.md §3).

Every change is one etcd transaction that compares what it read (optimistic concurrency,
as etcd's ``concurrency/stm.go``) and retries on a conflict until the caller's budget is
spent. Indexes (the thread's active run, the reclaimable, starting, live and ended sets) change in the same
transaction as the record, so they can never disagree with it.

A run this replica has seen recently starts from its cached record and claim
(:mod:`coordinator._cache`), so a claim or update is one transaction, not a read and a
transaction. The compare is the same either way, and a failed transaction reads the record
back in its failure branch; answers that write nothing are always given from a fresh read.

What each write decides (claim, update, cancel, presence, detach, the indexes) is a pure
rule in :mod:`coordinator.rules`; this module does the etcd I/O around it.

It is longer than 600 lines because every read and write of the run keys sits here, behind
the one class the RPCs use; the leader-only index walks live in :mod:`coordinator._indexes`
and :mod:`coordinator.retention`.
"""
from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
import uuid
from typing import AsyncIterator, Callable, Sequence, TypeVar

from baton.errors import (BatonError, InvalidArgument, QueuedRunStarted, QueueFull, RunIdRetired, SessionLost, StoreUnavailable,
                          ThreadBusy, UnknownThread)
from baton.retry import Deadline
from baton.runs import MAX_QUEUED_RUNS
from baton.thread_order import ThreadPosition, thread_position
from baton.v1.coordinator_pb2 import EnqueueRunResponse, HostInfo, QueuedRun, SandboxInstance
from baton.v1.runs_pb2 import Claim, RunInput, RunRecord, RunStatus

from coordinator import _etcd as E
from coordinator import _intents, _listing, _thread_seq, input_rules, rules, takeovers
from coordinator._cache import RecordCache
from coordinator._keys import Keys, prefix_end
from coordinator._records import is_active, is_reclaimable, is_starting
from coordinator.rules import KEEP as _KEEP
from coordinator.rules import FAILURE_READS, PURPOSES, Plan, Snapshot, UpdateOutcome, holds

#: The cancel reason a run gets when its start raced a user's removal from its queue.
DEQUEUED = "dequeued"

__all__ = ["FAILURE_READS", "PURPOSES", "Plan", "RunStore", "Snapshot", "UpdateOutcome"]

log = logging.getLogger(__name__)


class _Budget:
    """A deadline shared by every etcd call and retry of one operation."""

    def __init__(self, timeout: float) -> None:
        self._deadline = Deadline.after(timeout)

    def left(self) -> float:
        """Seconds left. Raises StoreUnavailable when the budget is spent."""
        rest = self._deadline.left()
        if rest <= 0:
            raise StoreUnavailable("deadline exceeded before etcd answered")
        return rest


def _record(kv: E.KV | None) -> RunRecord | None:
    if kv is None:
        return None
    rec = RunRecord.FromString(kv.value)
    rec.revision = kv.mod_revision
    return rec


_claim = rules.claim_of


def _value(kv: E.KV | None) -> bytes:
    return kv.value if kv is not None else b""


def _first(kvs: Sequence[E.KV]) -> E.KV | None:
    return kvs[0] if kvs else None


def _bytes(rec: RunRecord) -> bytes:
    clean = RunRecord()
    clean.CopyFrom(rec)
    clean.ClearField("revision")
    return clean.SerializeToString(deterministic=True)


T = TypeVar("T")


class RunStore:
    """Run records, sessions, claims, presence, sandboxes and hosts over etcd.

    Args:
        etcd: the etcd adapter.
        prefix: key prefix (``BATON_ETCD_PREFIX``).
        clock: Unix-seconds clock (injected so tests can pin time).
        cache_size: runs whose last record and claim are remembered (``0`` disables the
            cache; see :mod:`coordinator._cache`).

    Every method takes ``timeout`` (seconds, the whole budget including retries) and raises
    :class:`~baton.errors.StoreUnavailable` when etcd does not answer within it.
    """

    def __init__(self, etcd: E.Etcd, prefix: str, clock: Callable[[], float] = time.time,
                 cache_size: int = 10_000) -> None:
        self.etcd = etcd
        self.keys = Keys(prefix)
        self.clock = clock
        self.cache = RecordCache(cache_size)
        self._incarnation = b""  # value of the incarnation key last seen
        # Serialises the one-time index backfill (coordinator._indexes) between leader tasks.
        self.backfill_lock = asyncio.Lock()

    # --- reads -----------------------------------------------------------------------

    def _reads(self, run_id: str) -> list[E.Op]:
        k = self.keys
        return [E.get(k.run(run_id)), E.get(k.claim(run_id)), E.get(k.incarnation)]

    async def _snapshot(self, run_id: str, b: _Budget) -> Snapshot:
        """Record, claim and incarnation in one read (remembered in the cache).

        Creates the incarnation key when it is missing (first use of the prefix, or etcd's
        data was wiped) and reads again.
        """
        while True:
            r = await self.etcd.txn([], self._reads(run_id), timeout=b.left(), batch=True)
            snap = self._observed(run_id, r, 0)
            if snap.incarnation:
                return snap
            await self._create_incarnation(b)

    async def _create_incarnation(self, b: _Budget) -> None:
        """Write the incarnation key (a random id) unless it exists."""
        key = self.keys.incarnation
        await self.etcd.txn([E.cmp_absent(key)], [E.put(key, uuid.uuid4().hex.encode())], timeout=b.left())

    def _observed(self, run_id: str, r: E.TxnResult, at: int) -> Snapshot:
        """The snapshot in responses ``at`` .. ``at + 2`` (record, claim, incarnation) of ``r``."""
        kv, claim_kv, inc_kv = _first(r.kvs(at)), _first(r.kvs(at + 1)), _first(r.kvs(at + 2))
        incarnation = _value(inc_kv)
        if incarnation != self._incarnation:
            if self._incarnation:
                # etcd's data is not the one the cache was filled from (wiped while we ran):
                # revisions may repeat, forget them all.
                log.warning("etcd incarnation changed (%s -> %s): record cache cleared",
                            self._incarnation.decode(errors="replace"), incarnation.decode(errors="replace"))
                self.cache.clear()
            self._incarnation = incarnation
        self.cache.put(run_id, kv, claim_kv, r.revision, incarnation)
        return Snapshot(run_id, kv, _record(kv), claim_kv, r.revision, incarnation)

    def _cached(self, run_id: str) -> Snapshot | None:
        entry = self.cache.get(run_id)
        if entry is None:
            return None
        return Snapshot(run_id, entry.run_kv, _record(entry.run_kv), entry.claim_kv,
                        entry.revision, entry.incarnation, cached=True)

    async def _index_ops(self, snap: Snapshot, new: RunRecord, b: _Budget) -> tuple[list[E.Cmp], list[E.Op]]:
        """Compares and ops that keep the thread-active and reclaimable indexes in step.

        The thread index is read only when the run enters or leaves ``running`` (claims and
        most updates do not), and its revision is compared in the write.
        """
        old = snap.record
        assert old is not None
        active_kv = None
        if rules.enters_or_leaves_running(old, new):
            kvs, _ = await self.etcd.range(self.keys.thread_active(new.thread_id), timeout=b.left())
            active_kv = _first(kvs)
        return rules.index_changes(self.keys, old, new, active_kv)

    async def mutate(self, run_id: str, decide: Callable[[Snapshot], Plan[T]], *,
                     timeout: float) -> T | None:
        """Optimistic read-modify-write of one run's record (and claim), retried on conflict.

        Starts from the cached snapshot when there is one, else reads etcd. ``decide`` turns
        a snapshot into a :class:`Plan` or raises a :class:`~baton.errors.BatonError`; a
        raise or an answer without a write is only final on a snapshot read just now (a
        cached one is re-read first). The write compares the record's mod revision (absent
        when there was none) plus ``plan.cmps``; when it fails, its failure branch carries
        the current record and claim and ``decide`` runs again on those.

        Args:
            run_id: the run.
            decide: pure function of the snapshot; may be called several times.
            timeout: seconds for the whole operation, retries included.

        Returns:
            ``plan.result`` of the attempt that answered, or ``None`` when ``give_up`` said so.

        Raises:
            BatonError: whatever ``decide`` raised on a fresh snapshot; ``ThreadBusy`` when
                the write would make the run ``running`` while another run of its thread is.
            StoreUnavailable: etcd did not answer within ``timeout``.
            coordinator._etcd.LeaseNotFound: a put named a lease etcd does not know.
        """
        b = _Budget(timeout)
        snap = self._cached(run_id) or await self._snapshot(run_id, b)
        while True:
            try:
                plan = decide(snap)
            except BatonError:
                if not snap.cached:
                    raise
                snap = await self._snapshot(run_id, b)
                continue
            if not plan.write:
                if not snap.cached:
                    return plan.result
                snap = await self._snapshot(run_id, b)
                continue
            value = _bytes(plan.new) if plan.new is not None else b""
            try:
                res = await self._write(snap, plan.new, value, b, plan.cmps, plan.ops, plan.failure)
            except BatonError:  # the indexes refused the write (ThreadBusy): as for decide
                if not snap.cached:
                    raise
                snap = await self._snapshot(run_id, b)
                continue
            if res.succeeded:
                self._remember(snap, plan, value, res.revision)
                return plan.result
            if plan.give_up is not None and plan.give_up(res):
                return None
            snap = self._observed(run_id, res, 0)
            if not snap.incarnation:
                snap = await self._snapshot(run_id, b)

    def _remember(self, snap: Snapshot, plan: Plan[T], value: bytes, revision: int) -> None:
        """Cache what a committed write left in etcd (all its keys carry ``revision``)."""
        run_kv = snap.kv
        if plan.new is not None:
            plan.new.revision = revision
            run_kv = E.KV(key=self.keys.run(snap.run_id), value=value, mod_revision=revision)
        claim_kv = snap.claim_kv
        if plan.claim is not _KEEP:
            claim_kv = None
            if plan.claim is not None:
                claim_kv = E.KV()
                claim_kv.CopyFrom(plan.claim)
                claim_kv.mod_revision = revision
        self.cache.put(snap.run_id, run_kv, claim_kv, revision, snap.incarnation)

    async def _write(self, snap: Snapshot, new: RunRecord | None, value: bytes, b: _Budget,
                     cmps: Sequence[E.Cmp] = (), ops: Sequence[E.Op] = (),
                     failure: Sequence[E.Op] = ()) -> E.TxnResult:
        """Put ``new`` (``None``: leave the record) if the record, indexes and incarnation
        are still as in ``snap``. The failure branch reads the record, claim and incarnation
        (responses 0 to 2), then runs ``failure``."""
        run_key = self.keys.run(snap.run_id)
        all_cmps = [E.cmp_mod(run_key, snap.kv.mod_revision if snap.kv is not None else 0),
                    E.cmp_value(self.keys.incarnation, snap.incarnation), *cmps]
        all_ops = list(ops)
        if new is not None:
            icmps, iops = await self._index_ops(snap, new, b)
            all_cmps += icmps
            all_ops = [E.put(run_key, value), *iops, *ops]
        # Batched with other runs' writes on their way at the same time (each keeps its own
        # compares: coordinator._batching).
        return await self.etcd.txn(all_cmps, all_ops, [*self._reads(snap.run_id), *failure],
                                   timeout=b.left(), batch=True)

    async def get_run(self, run_id: str, *, timeout: float) -> tuple[RunRecord | None, Claim | None]:
        """The record and the live claim (either may be ``None``)."""
        rec, claim, _ = await self.get_run_with(run_id, (), timeout=timeout)
        return rec, claim

    async def get_run_with(self, run_id: str, extra: Sequence[E.Op], *,
                           timeout: float) -> tuple[RunRecord | None, Claim | None, list[Sequence[E.KV]]]:
        """:meth:`get_run` and ``extra`` reads in the same transaction (one round trip).

        Returns:
            (record, claim, the key-values each of ``extra`` answered, in its order).
        """
        reads = self._reads(run_id)
        r = await self.etcd.txn([], [*reads, *extra], timeout=timeout)
        snap = self._observed(run_id, r, 0)
        return snap.record, _claim(snap.claim_kv), [r.kvs(len(reads) + i) for i in range(len(extra))]

    async def _get_many(self, run_ids: Sequence[str], b: _Budget) -> list[RunRecord]:
        out: list[RunRecord] = []
        for i in range(0, len(run_ids), 100):  # etcd allows 128 ops per transaction
            chunk = run_ids[i : i + 100]
            r = await self.etcd.txn([], [E.get(self.keys.run(x)) for x in chunk], timeout=b.left())
            out += [rec for j in range(len(chunk)) if (rec := _record(_first(r.kvs(j)))) is not None]
        return out

    async def find_active_run(self, thread_id: str, *, timeout: float) -> RunRecord | None:
        """The newest running run of the thread, from the index (docs/design.md §3.1)."""
        b = _Budget(timeout)
        kvs, _ = await self.etcd.range(self.keys.thread_active(thread_id), timeout=b.left())
        if not kvs:
            return None
        rec, _claim_ = await self.get_run(kvs[0].value.decode(), timeout=b.left())
        return rec if is_active(rec) else None

    async def list_runs(self, thread_id: str, tenant: str, limit: int, *, timeout: float) -> list[RunRecord]:
        """Records of one thread (or all), optionally of one tenant, oldest first; with
        ``limit``, only the newest ``limit``. A thread's runs are in the thread's order (their
        numbers, :mod:`baton.thread_order`); every run's by ``started_at``.

        A thread's records are read by its membership index, paged (``Etcd.page_size`` keys
        per response), keeping only the newest ``limit`` while reading. Without a thread the
        ``started/`` index answers (:mod:`coordinator._listing`): the newest ``limit`` are one
        range read of ``limit`` keys; ``limit`` 0 walks every page of it (for tests and tools:
        the RPCs page with :meth:`list_page`). ``timeout`` is per etcd call.
        """
        k = self.keys
        scope = tenant or None
        if not thread_id:
            if limit > 0:
                return await _listing.newest(self.etcd, k, scope, limit, timeout=timeout)
            out: list[RunRecord] = []
            token = ""
            while True:
                recs, token = await _listing.page(self.etcd, k, scope, self.etcd.page_size, token, timeout=timeout)
                out += recs
                if not token:
                    return out
        newest: list[tuple[ThreadPosition, RunRecord]] = []  # a min-heap when limit > 0
        p = k.thread_runs(thread_id)
        async for kvs, _ in self.etcd.range_pages(p, prefix_end(p), keys_only=True, timeout=timeout):
            for r in await self._get_many([k.run_id_of_thread_run(thread_id, kv.key) for kv in kvs],
                                          _Budget(timeout)):
                if tenant and r.tenant != tenant:
                    continue
                item = (thread_position(r.thread_seq, r.started_at, r.run_id), r)
                if limit <= 0:
                    newest.append(item)
                elif len(newest) < limit:
                    heapq.heappush(newest, item)
                elif item[0] > newest[0][0]:
                    heapq.heapreplace(newest, item)
        return [r for _key, r in sorted(newest, key=lambda item: item[0])]

    async def list_page(self, tenant: str, size: int, token: str, *, timeout: float) -> tuple[list[RunRecord], str]:
        """One page of ``tenant``'s runs (``""``: every run), oldest first → (runs, next page
        token, ``""`` on the last page). See :func:`coordinator._listing.page`.

        Raises:
            InvalidArgument: ``token`` is not a token this method returned.
        """
        return await _listing.page(self.etcd, self.keys, tenant or None, size, token, timeout=timeout)

    async def thread_tenant(self, thread_id: str, *, timeout: float) -> str:
        """The tenant the thread belongs to (``threads/<thread>/tenant``; kept by retention),
        or ``""`` for a thread with no such key."""
        kvs, _ = await self.etcd.range(self.keys.thread_tenant(thread_id), timeout=timeout)
        return kvs[0].value.decode() if kvs else ""

    async def list_reclaimable(self, now: float, ttl: float, limit: int, *, timeout: float) -> list[RunRecord]:
        """Running runs with ``detached_since <= now - ttl`` (inclusive), by a range read."""
        b = _Budget(timeout)
        k = self.keys
        if limit > 0:
            kvs, _ = await self.etcd.range(k.reclaimable_prefix, k.reclaimable_until(now - ttl),
                                           limit=limit, timeout=b.left())
        else:
            kvs, _ = await self.etcd.range_all(k.reclaimable_prefix, k.reclaimable_until(now - ttl),
                                               timeout=b.left())
        recs = await self._get_many([kv.value.decode() for kv in kvs], b)
        return [r for r in recs if is_reclaimable(r)]

    async def list_starting(self, cutoff: float, *, timeout: float) -> list[RunRecord]:
        """Runs still ``starting`` (input not durable) with ``started_at <= cutoff``."""
        b = _Budget(timeout)
        k = self.keys
        kvs, _ = await self.etcd.range_all(k.starting_prefix, k.starting_until(cutoff), timeout=b.left())
        recs = await self._get_many([kv.value.decode() for kv in kvs], b)
        return [r for r in recs if is_starting(r)]

    # --- record writes ------------------------------------------------------------------

    async def create_or_resume(self, seed: RunRecord, interrupt_active: bool, *,
                               timeout: float) -> tuple[RunRecord, bool]:
        """Return the existing record unchanged, or create it ``running``.

        An existing run id is returned as it is, whoever asks (the gateway checks its tenant
        before serving it). A thread belongs to the tenant of its first run
        (``threads/<thread>/tenant``, written in the same transaction; for a thread from before
        that key, the tenant of its first run): a new run of another tenant on it is refused as
        if the thread did not exist, before anything about its runs is looked at.

        Raises:
            UnknownThread: the thread belongs to another tenant.
            ThreadBusy: the thread has another running run and ``interrupt_active`` is false.
            RunIdRetired: retention deleted a record of this run id, and the id is still
                retired (its delivery log may hold the old run's chunks).
        """
        b = _Budget(timeout)
        k = self.keys
        run_key, active_key = k.run(seed.run_id), k.thread_active(seed.thread_id)
        owner_key = k.thread_tenant(seed.thread_id)
        while True:
            member = k.thread_runs(seed.thread_id)
            r = await self.etcd.txn([], [E.get(run_key), E.get(active_key), E.get(owner_key), E.get(k.incarnation),
                                         E.get(member, prefix_end(member), limit=1), E.get(k.cancel_intent(seed.run_id, seed.tenant)),
                                         E.get(k.retired(seed.run_id), keys_only=True),
                                         E.get(k.thread_seq(seed.thread_id))],
                                    timeout=b.left())
            existing = _record(_first(r.kvs(0)))
            if existing is not None:
                return existing, False
            if r.kvs(6):
                raise RunIdRetired(seed.run_id)
            if not r.kvs(3):  # first use of the prefix (or a wiped etcd): see _snapshot
                await self._create_incarnation(b)
                continue
            active_kv, owner_kv = _first(r.kvs(1)), _first(r.kvs(2))
            if owner_kv is not None and owner_kv.value.decode() != seed.tenant:
                raise UnknownThread(seed.thread_id)
            if owner_kv is None and r.kvs(4):
                # A thread from before owner keys: it belongs to the tenant of its runs.
                first = await self._snapshot(k.run_id_of_thread_run(seed.thread_id, r.kvs(4)[0].key), b)
                if first.record is not None and first.record.tenant != seed.tenant:
                    raise UnknownThread(seed.thread_id)
            cmps = [E.cmp_absent(run_key), E.cmp_absent(k.retired(seed.run_id)),
                    E.cmp_mod(active_key, active_kv.mod_revision if active_kv else 0),
                    E.cmp_mod(owner_key, owner_kv.mod_revision if owner_kv else 0)]
            ops: list[E.Op] = []
            other = None
            if active_kv is not None:
                other_snap = await self._snapshot(active_kv.value.decode(), b)
                other = other_snap.record
                if is_active(other):
                    assert other is not None and other_snap.kv is not None
                    if not interrupt_active:
                        raise ThreadBusy(seed.thread_id, other.run_id)
                    if not other.cancel_requested:
                        # Cancel first (durably, the driver watches its record), then start.
                        other.cancel_requested = True
                        other.cancel_reason = "interrupted-by-new-run"
                        cmps.append(E.cmp_mod(other_snap.kv.key, other_snap.kv.mod_revision))
                        ops.append(E.put(other_snap.kv.key, _bytes(other)))
            new = RunRecord()
            new.CopyFrom(seed)
            for f in ("finished_at", "detached_since", "error", "revision", "driver_epoch",
                      "driver_host", "cancel_requested", "cancel_reason", "thread_seq"):
                new.ClearField(f)
            new.status = RunStatus.RUN_STATUS_RUNNING
            ops += _intents.on_create(k, new, _first(r.kvs(5)), cmps)  # a Stop before the start
            if not new.HasField("started_at"):
                new.started_at = self.clock()
            # Its number in the thread, taken in this write: what orders the thread's runs
            # (the transcript fence, the thread's listing), whatever this replica's clock
            # says against the one that stamped the run before it.
            new.thread_seq, seq_cmps, seq_ops = _thread_seq.take_thread_seq(k, new.thread_id, _first(r.kvs(7)))
            cmps += seq_cmps
            ops += seq_ops
            value = _bytes(new)
            ops += [E.put(run_key, value), E.put(active_key, new.run_id.encode()),
                    E.put(k.thread_run(new.thread_id, new.run_id), b"")]
            # live/ (failover, presence) and starting/ (the reaper ends a start that never
            # completes) from the first write on.
            ops += rules.creation_indexes(k, new)
            if owner_kv is None:
                ops.append(E.put(owner_key, seed.tenant.encode()))
            res = await self.etcd.txn(cmps, ops, timeout=b.left())
            if res.succeeded:
                new.revision = res.revision
                if active_kv is not None:
                    self.cache.forget(active_kv.value.decode())
                inc_kv = _first(r.kvs(3))
                self.cache.put(new.run_id, E.KV(key=run_key, value=value, mod_revision=res.revision),
                               None, res.revision, _value(inc_kv))
                return new, True

    async def update_run(self, run_id: str, patch: RunRecord, paths: Sequence[str], epoch: int,
                         session_id: int, *, timeout: float) -> tuple[UpdateOutcome, RunRecord | None]:
        """Apply a field-mask update (docs/design.md §3.1).

        Unknown run → ``UNKNOWN_RUN`` (nothing done). A terminal status with ``epoch`` below
        the record's ``driver_epoch`` → ``SUPPRESSED`` (nothing done). With ``session_id``
        the write is an owner write: it compares the claim key's lease inside the
        transaction.

        Raises:
            RunClaimLost: owner write whose claim is gone or belongs to another epoch.
            ThreadBusy: the write makes the run ``running`` again while another run of its
                thread is running (one active run per thread).
        """
        def decide(snap: Snapshot) -> Plan[tuple[UpdateOutcome, RunRecord | None]]:
            return rules.update(snap, keys=self.keys, patch=patch, paths=paths, epoch=epoch,
                                session_id=session_id)

        out = await self.mutate(run_id, decide, timeout=timeout)
        assert out is not None
        return out

    async def request_cancel(self, run_id: str, reason: str, *, timeout: float) -> RunRecord:
        """Set ``cancel_requested`` (no status is written). Terminal runs are returned as is.

        Raises:
            UnknownRun: no such run.
        """
        def decide(snap: Snapshot) -> Plan[RunRecord]:
            return rules.request_cancel(snap, reason=reason)

        out = await self.mutate(run_id, decide, timeout=timeout)
        assert out is not None
        return out

    async def put_run_input(self, run_id: str, op: int, given: RunInput, *, tenant: str = "",
                            session_id: int = 0, epoch: int = 0, now: float = 0.0,
                            known_inputs: int = 0, timeout: float) -> input_rules.InputResult:
        """One input op (:func:`coordinator.input_rules.put_input`): one compare-and-set of the record.

        Returns:
            (outcome, record after the op or as found, the stored input on ``CONFLICT``).
        """
        def decide(snap: Snapshot) -> Plan[input_rules.InputResult]:
            return input_rules.put_input(snap, keys=self.keys, op=op, given=given, tenant=tenant,
                                         session_id=session_id, epoch=epoch, now=now,
                                         known_inputs=known_inputs)

        out = await self.mutate(run_id, decide, timeout=timeout)
        assert out is not None
        return out

    # --- thread queues (docs/hitl.md) ---------------------------------------------------

    async def enqueue_run(self, run: QueuedRun, *, timeout: float) -> tuple[int, int, str]:
        """Queue ``run`` behind its thread's active run.

        The write compares the thread's active-run entry as read (so a thread that went idle
        meanwhile is seen), the absence of a record or a queued entry with the run id, and
        that no entry joined the thread's queue since it was counted, so the queue never
        holds more than :data:`~baton.runs.MAX_QUEUED_RUNS` runs however many gateways
        enqueue at once (a conflicting enqueue reads again, within ``timeout``).
        Interrupting runs go before enqueued ones; each kind in arrival order.

        Returns:
            (``EnqueueRunResponse.Outcome``, position (1 = next), the active run id, "" when
            the thread is idle but runs wait in its queue). ``IDLE`` only when the thread
            has neither an active run nor a queue.

        Raises:
            QueueFull: the thread's queue holds :data:`~baton.runs.MAX_QUEUED_RUNS` runs.
            StoreUnavailable: etcd did not answer, or the queue kept changing, within ``timeout``.
        """
        b = _Budget(timeout)
        k = self.keys
        Out = EnqueueRunResponse
        queue = k.queue(run.thread_id)
        stored = QueuedRun()
        stored.CopyFrom(run)
        stored.ClearField("position")
        while True:
            # One read at one revision: the active run, whether the id is taken, the queue's
            # length, the thread's counter.
            read = await self.etcd.txn([], [E.get(k.thread_active(run.thread_id)),
                                            E.get(k.run(run.run_id), count_only=True),
                                            E.get(k.queued_run(run.run_id), count_only=True),
                                            E.get(queue, prefix_end(queue), count_only=True),
                                            E.get(k.thread_seq(run.thread_id))], timeout=b.left())
            active = read.kvs(0)
            if not active and not read.count(3):
                return Out.IDLE, 0, ""
            if read.count(1) or read.count(2):
                return Out.EXISTS, 0, ""
            if read.count(3) >= MAX_QUEUED_RUNS:
                raise QueueFull(run.thread_id, MAX_QUEUED_RUNS)
            # A thread idle between two runs of its queue (the next not dispatched yet) is
            # not free: the run queues behind those waiting, never ahead of them.
            same_active = (E.cmp_mod(k.thread_active(run.thread_id), active[0].mod_revision) if active
                           else E.cmp_absent(k.thread_active(run.thread_id)))
            # Its place in the queue is a number taken from the thread's counter in this
            # write, not the enqueuing gateway's clock (gateways' clocks may disagree).
            seq, seq_cmps, seq_ops = _thread_seq.take_thread_seq(k, run.thread_id, _first(read.kvs(4)))
            key = k.queued(run.thread_id, _thread_seq.queue_order(run.strategy, seq, run.run_id))
            res = await self.etcd.txn(
                [same_active, E.cmp_absent(k.run(run.run_id)),
                 E.cmp_absent(k.queued_run(run.run_id)), E.cmp_none_created_after(queue, prefix_end(queue), read.revision),
                 *seq_cmps],
                [E.put(key, stored.SerializeToString()), E.put(k.queued_run(run.run_id), key),
                 E.get(queue, key + b"\0", count_only=True), *seq_ops],
                timeout=b.left())
            if res.succeeded:
                return Out.QUEUED, res.count(2), active[0].value.decode() if active else ""

    async def list_queued_runs(self, thread_id: str, *, tenant: str | None = None, run_id: str = "",
                               timeout: float) -> list[QueuedRun]:
        """Queued runs in dispatch order (``thread_id`` "" = every thread's; positions per thread)."""
        k = self.keys
        if run_id:
            ref, _ = await self.etcd.range(k.queued_run(run_id), timeout=timeout)
            entry, _ = await self.etcd.range(ref[0].value, timeout=timeout) if ref else ([], 0)
            if not entry:
                return []
            thread_id = QueuedRun.FromString(entry[0].value).thread_id
        prefix = k.queue(thread_id) if thread_id else k.queues
        kvs, _ = await self.etcd.range_all(prefix, prefix_end(prefix), timeout=timeout)
        out: list[QueuedRun] = []
        positions: dict[str, int] = {}
        for kv in kvs:
            q = QueuedRun.FromString(kv.value)
            positions[q.thread_id] = positions.get(q.thread_id, 0) + 1
            q.position = positions[q.thread_id]
            if tenant is not None and q.tenant != tenant:
                continue
            if run_id and q.run_id != run_id:
                continue
            out.append(q)
        return out

    async def remove_queued_run(self, thread_id: str, run_id: str, *, tenant: str | None = None,
                                timeout: float) -> bool:
        """Take a run out of its thread's queue (a user's cancel, or a dispatcher that started
        it); ``False`` when it is not queued (for ``tenant``)."""
        b = _Budget(timeout)
        k = self.keys
        ref, _ = await self.etcd.range(k.queued_run(run_id), timeout=b.left())
        if not ref:
            return False
        entry, _ = await self.etcd.range(ref[0].value, timeout=b.left())
        if entry:
            q = QueuedRun.FromString(entry[0].value)
            if q.thread_id != thread_id or (tenant is not None and q.tenant != tenant):
                return False
        res = await self.etcd.txn([E.cmp_mod(k.queued_run(run_id), ref[0].mod_revision)],
                                  [E.delete(ref[0].value), E.delete(k.queued_run(run_id))], timeout=b.left())
        return res.succeeded

    async def cancel_queued_run(self, thread_id: str, run_id: str, *, tenant: str | None,
                                timeout: float) -> bool:
        """A user's cancel of a queued run: consistent with a dispatcher starting it at the
        same moment. One transaction takes the entry out only while the run has no record,
        and leaves a cancel intent (:mod:`coordinator._intents`, reason ``dequeued``), so a
        start already on its way is born cancelled (no agent launched); a run whose record
        exists started first and is :class:`QueuedRunStarted`, its entry left to its dispatcher.

        Returns:
            ``True`` when removed; ``False`` when not queued (or another ``tenant``'s).

        Raises:
            QueuedRunStarted: the run has a record (it started): nothing removed.
            StoreUnavailable: etcd did not answer within ``timeout``.
        """
        b = _Budget(timeout)
        k = self.keys
        while True:
            ref, _ = await self.etcd.range(k.queued_run(run_id), timeout=b.left())
            if not ref:
                return False
            entry, _ = await self.etcd.range(ref[0].value, timeout=b.left())
            if not entry:
                return False
            q = QueuedRun.FromString(entry[0].value)
            if q.thread_id != thread_id or (tenant is not None and q.tenant != tenant):
                return False
            lease_id, _ = await self.etcd.grant(rules.CANCEL_INTENT_TTL, timeout=b.left())
            res = await self.etcd.txn(
                [E.cmp_mod(k.queued_run(run_id), ref[0].mod_revision), E.cmp_absent(k.run(run_id))],
                [E.delete(ref[0].value), E.delete(k.queued_run(run_id)),
                 E.put(k.cancel_intent(run_id, q.tenant), rules.cancel_intent_value(q.tenant, DEQUEUED), lease_id)],
                [E.get(k.run(run_id), count_only=True)], timeout=b.left())
            if res.succeeded:
                return True
            if res.count(0):
                raise QueuedRunStarted(run_id)
            # The entry changed meanwhile (removed, or queued again): read it again.

    # --- sessions -----------------------------------------------------------------------

    async def open_session(self, ttl: float, owner: str, *, timeout: float) -> tuple[int, int]:
        """Grant one lease → (session id, granted TTL in whole seconds, at least 1)."""
        b = _Budget(timeout)
        lease_id, granted = await self.etcd.grant(max(1, math.ceil(ttl)), timeout=b.left())
        await self.etcd.txn([], [E.put(self.keys.session(lease_id), owner.encode(), lease_id)],
                            timeout=b.left())
        return lease_id, granted

    async def close_session(self, session_id: int, *, timeout: float) -> None:
        """Revoke the lease: its claims, readers and host entry go at once. Idempotent.

        Only a session's lease (its ``sessions/<lease>`` key is on it): another lease id (the
        election's, a cancel intent's) is left alone, as is a session already gone.
        """
        b = _Budget(timeout)
        k = self.keys.session(session_id)
        r = await self.etcd.txn([E.cmp_lease(k, session_id)], [], timeout=b.left())
        if not r.succeeded:
            return
        await takeovers.note_session_end(self.etcd, self.keys, session_id, takeovers.CLOSED, timeout=b.left())
        try:
            await self.etcd.revoke(session_id, timeout=b.left())
        except E.LeaseNotFound:
            pass

    # --- claims -------------------------------------------------------------------------

    async def claim_run(self, run_id: str, session_id: int, host_id: str, purpose: str, *,
                        timeout: float, require_started: bool = False) -> tuple[int, RunRecord]:
        """Claim a run under a session, raising ``driver_epoch`` (docs/design.md §3.2).

        One etcd transaction when the run is in the record cache: it compares the record's
        mod revision and the claim key's absence, and puts the record and the claim.

        Returns:
            (epoch, record after the claim).

        Raises:
            RunClaimNotAcquired: reason ``unknown`` | ``terminal`` | ``starting``
                (``require_started`` only) | ``held`` | ``cancel_requested`` (drive only),
                checked in that order.
            SessionLost: the session's lease is gone.
        """
        now = self.clock()

        def decide(snap: Snapshot) -> Plan[tuple[int, RunRecord]]:
            return rules.claim(snap, keys=self.keys, session_id=session_id, host_id=host_id,
                               purpose=purpose, require_started=require_started, now=now)

        try:
            out = await self.mutate(run_id, decide, timeout=timeout)
        except E.LeaseNotFound as exc:
            raise SessionLost(session_id) from exc
        assert out is not None
        return out

    async def release_claim(self, run_id: str, session_id: int, epoch: int, *, timeout: float) -> bool:
        """Delete the claim if this session holds it at ``epoch``; ``False`` otherwise."""
        b = _Budget(timeout)
        key, run_key = self.keys.claim(run_id), self.keys.run(run_id)
        while True:
            kvs, _ = await self.etcd.range(key, timeout=b.left())
            if not holds(_claim(_first(kvs)), session_id, epoch):
                return False
            res = await self.etcd.txn([E.cmp_mod(key, kvs[0].mod_revision)],
                                      [E.delete(key), E.get(run_key), E.get(self.keys.incarnation)],
                                      timeout=b.left())
            if res.succeeded:
                inc_kv = _first(res.kvs(2))
                self.cache.put(run_id, _first(res.kvs(1)), None, res.revision,
                               _value(inc_kv))
                return True

    async def watch_run(self, run_id: str, *, timeout: float) -> AsyncIterator[tuple[RunRecord | None, Claim | None]]:
        """The current (record, claim), then a new pair after every change.

        ``timeout`` bounds the initial read only; the watch runs until the caller stops.

        Raises:
            StoreUnavailable: etcd went away (the caller re-subscribes).
        """
        k = self.keys
        run_key, claim_key = k.run(run_id), k.claim(run_id)
        r = await self.etcd.txn([], [E.get(run_key), E.get(claim_key)], timeout=timeout)
        rec, claim = _record(_first(r.kvs(0))), _claim(_first(r.kvs(1)))
        yield rec, claim
        async for _rev, events in self.etcd.watch([(run_key, b""), (claim_key, b"")],
                                                  start_revision=r.revision + 1):
            for ev in events:
                gone = ev.type == ev.DELETE
                if ev.kv.key == run_key:
                    rec = None if gone else _record(ev.kv)
                elif ev.kv.key == claim_key:
                    claim = None if gone else _claim(ev.kv)
            yield rec, claim

    # --- presence -----------------------------------------------------------------------

    async def register_reader(self, run_id: str, session_id: int, reader_id: str, *,
                              timeout: float) -> None:
        """:meth:`register_readers` of one reader."""
        await self.register_readers(run_id, session_id, (reader_id,), timeout=timeout)

    async def register_readers(self, run_id: str, session_id: int, reader_ids: Sequence[str], *,
                               timeout: float) -> None:
        """Add readers under the session's lease and clear ``detached_since`` (one txn).

        Each reader is a key of its own, as if registered alone. The write compares the
        record, so a detach stamped meanwhile is seen and cleared. A reader of a run with no
        record is registered too (the gateway serves such logs).

        Raises:
            SessionLost: the session's lease is gone.
        """
        def decide(snap: Snapshot) -> Plan[None]:
            return rules.register_readers(snap, keys=self.keys, reader_ids=reader_ids,
                                          session_id=session_id)

        try:
            await self.mutate(run_id, decide, timeout=timeout)
        except E.LeaseNotFound as exc:
            raise SessionLost(session_id) from exc

    async def unregister_reader(self, run_id: str, reader_id: str, *, timeout: float) -> None:
        """Remove a reader; when it was the last, the run detaches (see :meth:`detach_if_unread`)."""
        await self.unregister_readers(run_id, (reader_id,), timeout=timeout)

    async def unregister_readers(self, run_id: str, reader_ids: Sequence[str], *, timeout: float) -> None:
        """Remove readers (one txn); when none is left, the run detaches (see :meth:`detach_if_unread`)."""
        b = _Budget(timeout)
        await self.etcd.txn([], [E.delete(self.keys.reader(run_id, r)) for r in dict.fromkeys(reader_ids)],
                            timeout=b.left())
        await self.detach_if_unread(run_id, timeout=b.left())

    async def detach_if_unread(self, run_id: str, *, timeout: float) -> RunRecord | None:
        """When a running run has no reader left: stamp ``detached_since`` (docs/design.md §3.3).

        A run with ``cancel_on_disconnect`` is cancelled instead (reason ``disconnected``),
        as runs.proto specifies. The stamp compares "no reader key" inside
        the transaction, so a reader that arrives meanwhile wins.

        Returns:
            The record written, or ``None`` when nothing was to be done.
        """
        def decide(snap: Snapshot) -> Plan[RunRecord | None]:
            return rules.detach(snap, keys=self.keys, now=self.clock())

        return await self.mutate(run_id, decide, timeout=timeout)

    async def reader_count(self, run_id: str, *, timeout: float) -> int:
        p = self.keys.readers(run_id)
        r = await self.etcd.txn([], [E.get(p, prefix_end(p), count_only=True)], timeout=timeout)
        return r.count(0)

    # --- sandboxes and hosts ------------------------------------------------------------

    async def put_sandbox(self, sb: SandboxInstance, *, timeout: float) -> None:
        await self.etcd.txn([], [E.put(self.keys.sandbox(sb.sandbox_key), sb.SerializeToString())],
                            timeout=timeout)

    async def get_sandbox(self, sandbox_key: str, *, timeout: float) -> SandboxInstance | None:
        kvs, _ = await self.etcd.range(self.keys.sandbox(sandbox_key), timeout=timeout)
        return SandboxInstance.FromString(kvs[0].value) if kvs else None

    async def delete_sandbox(self, sandbox_key: str, *, timeout: float) -> None:
        await self.etcd.txn([], [E.delete(self.keys.sandbox(sandbox_key))], timeout=timeout)

    async def register_host(self, host: HostInfo, *, timeout: float) -> None:
        """Put the host entry under its session's lease (it vanishes with the session).

        Raises:
            InvalidArgument: no ``session_id``.
            SessionLost: the session's lease is gone.
        """
        if not host.session_id:
            raise InvalidArgument("host.session_id", "a host registers under its session")
        try:
            await self.etcd.txn([], [E.put(self.keys.host(host.host_id), host.SerializeToString(),
                                           host.session_id)], timeout=timeout)
        except E.LeaseNotFound as exc:
            raise SessionLost(host.session_id) from exc

    async def list_hosts(self, *, timeout: float) -> list[HostInfo]:
        """Live hosts (their session lease still holds), sorted by host id."""
        k = self.keys
        kvs, _ = await self.etcd.range_all(k.hosts, prefix_end(k.hosts), timeout=timeout)
        return [HostInfo.FromString(kv.value) for kv in kvs]
