"""The control-plane rules, pure (docs/design.md §3): claim, update, cancel, presence,
detach (the inputs from people: :mod:`coordinator.input_rules`).

Every write of one run record goes through :meth:`coordinator._store.RunStore.mutate`
``(run_id, decide)``; ``decide`` is one of the functions here bound to its arguments. It
turns a :class:`Snapshot` (the record and claim as etcd held them) into a :class:`Plan`
(the record to put, further compares and ops, or an answer without a write), or raises a
domain error. Nothing here talks to etcd: ``mutate`` does the reads, the transaction and
the retries, and these rules are table-tested without servers (tests/coordinator/test_rules.py).

A rule may be called several times for one request (on a cached snapshot first, then on
what a failed transaction read back), so it must depend on its arguments only. A raise or
an answer without a write is only final on a snapshot read just now, so a rule may judge a
cached snapshot freely: a claim held by a session that has since died, say, reads as
``held`` from the cache, and ``mutate`` reads again before answering.

Liveness of a claim is etcd's: a claim key lives under its session's lease, so a dead
session's claim is absent from a fresh snapshot.
"""
from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Callable, Generic, Sequence, TypeVar

from baton import keep
from baton.errors import RunClaimLost, RunClaimNotAcquired, ThreadBusy, UnknownRun
from baton.v1.coordinator_pb2 import SandboxInstance
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus

from coordinator import _etcd as E
from coordinator._keys import Keys, prefix_end
from coordinator.takeovers import stamp_claim
from coordinator._records import (apply_mask, cancels_on_disconnect, ended_at, is_active, is_ended, is_live,
                                  is_reclaimable, is_starting, is_terminal)

#: Why a claim is taken: ``drive`` runs the agent on; ``finalize`` only ends the run.
PURPOSES = ("drive", "finalize")
#: The cancel reason the reaper writes.
REAPED = "reaped"


class UpdateOutcome(enum.Enum):
    APPLIED = "applied"
    SUPPRESSED = "suppressed"
    UNKNOWN_RUN = "unknown_run"


@dataclass(frozen=True)
class Snapshot:
    """A run's record and claim as etcd held them at ``revision``.

    ``cached`` marks one taken from the record cache rather than read just now: a write
    may start from it (its compare catches staleness), an answer may not.
    """

    run_id: str
    kv: E.KV | None
    record: RunRecord | None
    claim_kv: E.KV | None
    revision: int
    incarnation: bytes
    cached: bool = False


#: The failure branch of every record write reads the record, the claim and the incarnation
#: key first; a plan's own failure ops answer from this index on.
FAILURE_READS = 3


T = TypeVar("T")
KEEP: E.KV = E.KV(key=b"\0keep")  # Plan.claim default: the write leaves the claim key as it is


@dataclass
class Plan(Generic[T]):
    """What one attempt of :meth:`RunStore.mutate` decided from a snapshot.

    Attributes:
        result: what ``mutate`` returns once the write commits (at once if ``write`` is false).
        write: false answers ``result`` without writing (given only from a fresh read).
        new: the record to put; ``None`` leaves it, but its mod revision is still compared.
        cmps: further compares in the same transaction.
        ops: further ops in the same transaction.
        claim: the claim key-value after the write (for the cache): :data:`KEEP` when the
            write leaves it, ``None`` when it deletes it.
        failure: further ops in the failure branch, after its record, claim and incarnation
            reads (so their responses start at index :data:`FAILURE_READS`).
        give_up: called with a failed transaction; true ends ``mutate`` with ``None``
            instead of retrying (e.g. the failure was a reader key existing).
    """

    result: T
    write: bool = True
    new: RunRecord | None = None
    cmps: Sequence[E.Cmp] = ()
    ops: Sequence[E.Op] = ()
    claim: E.KV | None = field(default_factory=lambda: KEEP)
    failure: Sequence[E.Op] = ()
    give_up: Callable[[E.TxnResult], bool] | None = field(default=None)


def claim_of(kv: E.KV | None) -> Claim | None:
    """The claim stored in ``kv`` (``None`` when there is no claim key)."""
    return None if kv is None else Claim.FromString(kv.value)


def holds(claim: Claim | None, session_id: int, epoch: int) -> bool:
    """Whether ``claim`` is the one ``session_id`` took at ``epoch`` (the owner-write check)."""
    return claim is not None and claim.session_id == session_id and claim.epoch == epoch


def _copy(rec: RunRecord) -> RunRecord:
    new = RunRecord()
    new.CopyFrom(rec)
    return new


# --- claims ---------------------------------------------------------------------------------

def claim(snap: Snapshot, *, keys: Keys, session_id: int, host_id: str,
          purpose: str, require_started: bool = False, now: float = 0.0) -> Plan[tuple[int, RunRecord]]:
    """Claim the run under ``session_id``, raising ``driver_epoch`` by one (docs/design.md §3.2).

    The write compares the claim key's absence and puts it under the session's lease.

    Returns:
        A plan whose result is (new epoch, record after the claim).

    ``require_started`` (an ``AttachRun``'s claim) refuses a run still ``starting``: only its
    ``StartRun`` drives it, and checked here it is checked inside the write. A claim after an
    earlier one stamps ``last_takeover`` (``to_host``, ``claimed_at`` = ``now``; takeovers.py).

    Raises:
        RunClaimNotAcquired: reason ``unknown`` | ``terminal`` | ``starting``
            (``require_started`` only) | ``held`` | ``cancel_requested`` (drive only),
            checked in that order.
    """
    run_id = snap.run_id
    claim_key = keys.claim(run_id)
    cur = snap.record
    if cur is None:
        raise RunClaimNotAcquired(run_id, "unknown")
    if is_terminal(cur.status):
        raise RunClaimNotAcquired(run_id, "terminal")
    if require_started and cur.starting:
        raise RunClaimNotAcquired(run_id, "starting")
    if snap.claim_kv is not None:
        raise RunClaimNotAcquired(run_id, "held")
    if purpose == "drive" and cur.cancel_requested:
        raise RunClaimNotAcquired(run_id, "cancel_requested")
    epoch = cur.driver_epoch + 1
    new = _copy(cur)
    new.driver_epoch = epoch
    new.driver_host = host_id
    stamp_claim(cur, new, host_id, now)
    value = Claim(run_id=run_id, epoch=epoch, host_id=host_id, session_id=session_id,
                  purpose=purpose).SerializeToString()
    return Plan((epoch, new), new=new, cmps=[E.cmp_absent(claim_key)],
                ops=[E.put(claim_key, value, session_id)],
                claim=E.KV(key=claim_key, value=value, lease=session_id))


# --- record updates -------------------------------------------------------------------------

def update(snap: Snapshot, *, keys: Keys, patch: RunRecord, paths: Sequence[str], epoch: int,
           session_id: int) -> Plan[tuple[UpdateOutcome, RunRecord | None]]:
    """Apply a field-mask update (docs/design.md §3.1).

    Unknown run → ``UNKNOWN_RUN``, no write. A terminal status written at an ``epoch`` below
    the record's ``driver_epoch`` → ``SUPPRESSED``, no write (a stale driver's last word).
    With ``session_id`` the write is an owner write: the claim must be ``session_id``'s at
    ``epoch``, and its mod revision is compared inside the write.

    Raises:
        RunClaimLost: owner write whose claim is gone (``claim-gone``) or is another one
            (``epoch@<n>``).
    """
    cur = snap.record
    if cur is None:
        return Plan((UpdateOutcome.UNKNOWN_RUN, None), write=False)
    new = apply_mask(cur, patch, paths)
    if "status" in paths and is_terminal(new.status) and epoch < cur.driver_epoch:
        return Plan((UpdateOutcome.SUPPRESSED, cur), write=False)
    cmps: list[E.Cmp] = []
    if session_id:
        held = claim_of(snap.claim_kv)
        if not holds(held, session_id, epoch):
            observed = "claim-gone" if held is None else f"epoch@{held.epoch}"
            raise RunClaimLost(snap.run_id, epoch, observed)
        assert snap.claim_kv is not None
        cmps.append(E.cmp_mod(keys.claim(snap.run_id), snap.claim_kv.mod_revision))
    return Plan((UpdateOutcome.APPLIED, new), new=new, cmps=cmps)


def request_cancel(snap: Snapshot, *, reason: str) -> Plan[RunRecord]:
    """Set ``cancel_requested`` with ``reason`` (no status is written).

    A terminal run, or one already cancelled for the same reason, is answered as it is.

    Raises:
        UnknownRun: no such run.
    """
    cur = snap.record
    if cur is None:
        raise UnknownRun(snap.run_id)
    if is_terminal(cur.status) or (cur.cancel_requested and cur.cancel_reason == reason):
        return Plan(cur, write=False)
    new = _copy(cur)
    new.cancel_requested = True
    new.cancel_reason = reason
    return Plan(new, new=new)


def kept_until_of(rec: RunRecord) -> float | None:
    """The record's ``kept_until`` (a client's keep-alive), or ``None`` when none was asked."""
    return rec.kept_until if rec.HasField("kept_until") else None


def reap_cancel(snap: Snapshot, *, listed_detached_since: float, ttl: float = 0.0,
                now: float | None = None) -> Plan[str | None]:
    """The reaper's cancel (reason :data:`REAPED`), only while the run is detached as listed
    and no client's keep-alive (``kept_until``) holds it past ``now``.

    Args:
        ttl: the default detached TTL (seconds); with ``now``, checked against the record as
            it is when written, so a keep-alive landing after the listing wins.
        now: the sweep's time (Unix seconds); ``None``: no keep-alive check.

    Returns:
        A plan whose result is ``None`` when the cancel is (or already was) requested, else
        the outcome that stops the reap: ``unknown`` (gone or not running),
        ``not-claimed`` (a reader came back, and maybe left again later) or ``kept`` (a
        client asked to keep it longer).
    """
    cur = snap.record
    if cur is None or cur.status != RunStatus.RUN_STATUS_RUNNING:
        return Plan("unknown", write=False)
    if not cur.HasField("detached_since") or cur.detached_since != listed_detached_since:
        return Plan("not-claimed", write=False)
    if now is not None and not keep.expired(cur.detached_since, ttl, kept_until_of(cur), now):
        return Plan("kept", write=False)
    if cur.cancel_requested and cur.cancel_reason == REAPED:
        return Plan(None, write=False)
    new = _copy(cur)
    new.cancel_requested = True
    new.cancel_reason = REAPED
    return Plan(None, new=new)


# --- presence -------------------------------------------------------------------------------

def register_readers(snap: Snapshot, *, keys: Keys, reader_ids: Sequence[str], session_id: int) -> Plan[None]:
    """Put each reader's key under the session's lease and clear ``detached_since``.

    The write compares the record, so a detach stamped meanwhile is seen and cleared. A
    reader of a run with no record is registered too (the gateway serves such logs). A
    repeated id is put once (etcd refuses a transaction that names a key twice).
    """
    readers = [E.put(keys.reader(snap.run_id, r), b"", session_id) for r in dict.fromkeys(reader_ids)]
    cur = snap.record
    if cur is None or not cur.HasField("detached_since"):
        return Plan(None, ops=readers)
    new = _copy(cur)
    new.ClearField("detached_since")
    return Plan(None, new=new, ops=readers)


def register_reader(snap: Snapshot, *, keys: Keys, reader_id: str, session_id: int) -> Plan[None]:
    """:func:`register_readers` of one reader."""
    return register_readers(snap, keys=keys, reader_ids=(reader_id,), session_id=session_id)


def detach(snap: Snapshot, *, keys: Keys, now: float) -> Plan[RunRecord | None]:
    """Stamp ``detached_since = now`` on a running run that has no reader (docs/design.md §3.3).

    A run with ``cancel_on_disconnect`` is also cancelled (reason ``disconnected``), unless
    a cancel is already requested. The write compares "no reader key", and a failure with
    a reader present gives up (a reader that arrives meanwhile wins).

    Returns:
        A plan whose result is the record written, or ``None`` (no write) when the run is
        not running or already detached.
    """
    readers = keys.readers(snap.run_id)
    cur = snap.record
    if not is_active(cur) or cur is None or cur.HasField("detached_since"):
        return Plan(None, write=False)
    new = _copy(cur)
    new.detached_since = now
    if cancels_on_disconnect(cur) and not cur.cancel_requested:
        new.cancel_requested = True
        new.cancel_reason = "disconnected"
    return Plan(new, new=new, cmps=[E.cmp_absent(readers, prefix_end(readers))],
                failure=[E.get(readers, prefix_end(readers), count_only=True)],
                give_up=lambda res: res.count(FAILURE_READS) > 0)


# --- indexes --------------------------------------------------------------------------------

def enters_or_leaves_running(old: RunRecord, new: RunRecord) -> bool:
    """Whether a write from ``old`` to ``new`` changes the thread's active-run index.

    Only then does the store read that index (claims and most updates do not).
    """
    return is_active(new) != is_active(old)


def index_changes(keys: Keys, old: RunRecord, new: RunRecord,
                  active_kv: E.KV | None) -> tuple[list[E.Cmp], list[E.Op]]:
    """Compares and ops that keep the thread-active, reclaimable, starting, live and ended
    indexes in step.

    Args:
        keys: the key layout.
        old: the record as read.
        new: the record to put.
        active_kv: the thread's active-run index entry as read (``None`` when absent or
            not read because :func:`enters_or_leaves_running` is false).

    Raises:
        ThreadBusy: ``new`` enters ``running`` while the index names another run (one
            active run per thread).
    """
    cmps: list[E.Cmp] = []
    ops: list[E.Op] = []
    if enters_or_leaves_running(old, new):
        active_key = keys.thread_active(new.thread_id)
        active_rev = active_kv.mod_revision if active_kv else 0
        points_here = active_kv is not None and active_kv.value.decode() == new.run_id
        # Only a transition into `running` claims the index: a run that stays running (an
        # interrupted-by-new-run one, say) must not take it back from the newer run, and a
        # run coming back to `running` while another run of the thread runs is refused.
        if is_active(new) and not points_here:
            if active_kv is not None:
                raise ThreadBusy(new.thread_id, active_kv.value.decode())
            cmps.append(E.cmp_mod(active_key, active_rev))
            ops.append(E.put(active_key, new.run_id.encode()))
        elif not is_active(new) and points_here:
            cmps.append(E.cmp_mod(active_key, active_rev))
            ops.append(E.delete(active_key))
    old_key = keys.reclaimable(old.detached_since, old.run_id) if is_reclaimable(old) else None
    new_key = keys.reclaimable(new.detached_since, new.run_id) if is_reclaimable(new) else None
    if old_key != new_key:
        if old_key is not None:
            ops.append(E.delete(old_key))
        if new_key is not None:
            ops.append(E.put(new_key, new.run_id.encode()))
    old_s = keys.starting(old.started_at, old.run_id) if is_starting(old) else None
    new_s = keys.starting(new.started_at, new.run_id) if is_starting(new) else None
    ops += _move(old_s, new_s, new.run_id)
    ops += _move(keys.live(old.run_id) if is_live(old) else None,
                 keys.live(new.run_id) if is_live(new) else None, new.run_id)
    ops += _move(keys.ended(ended_at(old), old.run_id) if is_ended(old) else None,
                 keys.ended(ended_at(new), new.run_id) if is_ended(new) else None, new.run_id)
    # Listing keys are (tenant, started_at, run id), and only started_at is writable.
    if (old.started_at, old.tenant, old.run_id) != (new.started_at, new.tenant, new.run_id):
        for old_l, new_l in zip(listing_entries(keys, old), listing_entries(keys, new)):
            ops += _move(old_l, new_l, new.run_id)
    return cmps, ops


# --- a Stop that races the start ----------------------------------------------------------

#: Seconds a cancel intent waits for the start of its run: a client that minted the run id
#: sends its POST at most this long before its Stop can land; after that the intent expires.
CANCEL_INTENT_TTL = 60


def cancel_intent_value(tenant: str, reason: str) -> bytes:
    """The stored cancel intent of ``tenant`` for a run id with no record yet."""
    return json.dumps({"tenant": tenant, "reason": reason}, separators=(",", ":")).encode()


def born_cancelled(intent: bytes | None, tenant: str) -> str | None:
    """The cancel reason a new run of ``tenant`` is born with, or ``None``.

    A run whose id a user of the same tenant cancelled before the run existed starts with
    ``cancel_requested``: its host claims it only to finalize it (``aborted``, no agent
    launched). Another tenant's intent is ignored (it must not stop someone else's run).
    """
    if not intent:
        return None
    try:
        value = json.loads(intent)
    except ValueError:
        return None
    if not isinstance(value, dict) or value.get("tenant") != tenant:
        return None
    return str(value.get("reason") or "user")


def cancel_for_tenant(snap: Snapshot, *, reason: str, tenant: str) -> Plan[RunRecord]:
    """:func:`request_cancel` of a user of ``tenant``: another tenant's run is unknown.

    Raises:
        UnknownRun: no such run, or it is another tenant's.
    """
    if snap.record is not None and snap.record.tenant != tenant:
        raise UnknownRun(snap.run_id)
    return request_cancel(snap, reason=reason)


def _move(old_key: bytes | None, new_key: bytes | None, run_id: str) -> list[E.Op]:
    """Ops that move one index entry (value: the run id) from ``old_key`` to ``new_key``
    (``None``: absent). Nothing when they are the same key."""
    if old_key == new_key:
        return []
    ops: list[E.Op] = []
    if old_key is not None:
        ops.append(E.delete(old_key))
    if new_key is not None:
        ops.append(E.put(new_key, run_id.encode()))
    return ops


def listing_entries(keys: Keys, rec: RunRecord) -> list[bytes]:
    """The record's entries in the run listings by start time, oldest first and newest
    first: every run's, and its tenant's when it has one (``started/...``; the tenant-wide
    ``ListRuns`` pages these, and the newest runs are one range read)."""
    scopes: list[str | None] = [None, rec.tenant] if rec.tenant else [None]
    return [keys.started(t, rec.started_at, rec.run_id, newest_first) for t in scopes
            for newest_first in (False, True)]


def creation_indexes(keys: Keys, new: RunRecord) -> list[E.Op]:
    """Index entries a newly created record gets (its thread's active entry aside)."""
    return _move(None, keys.starting(new.started_at, new.run_id) if is_starting(new) else None, new.run_id) + \
        _move(None, keys.live(new.run_id) if is_live(new) else None, new.run_id) + \
        [E.put(key, new.run_id.encode()) for key in listing_entries(keys, new)]


def backfill_indexes(keys: Keys, rec: RunRecord) -> list[E.Op]:
    """Puts of the live/ended/started entries a record written before those indexes should
    have.

    Idempotent: re-putting an entry that exists changes nothing a reader sees.
    """
    ops: list[E.Op] = [E.put(key, rec.run_id.encode()) for key in listing_entries(keys, rec)]
    if is_live(rec):
        ops.append(E.put(keys.live(rec.run_id), rec.run_id.encode()))
    if is_ended(rec):
        ops.append(E.put(keys.ended(ended_at(rec), rec.run_id), rec.run_id.encode()))
    return ops


# --- retention ------------------------------------------------------------------------------

def expire(keys: Keys, run_id: str, rec_kv: E.KV | None, index_key: bytes, sandbox_kv: E.KV | None,
           *, cutoff: float, retired_lease: int = 0) -> tuple[list[E.Cmp], list[E.Op]] | None:
    """The transaction retention makes for one ended-index entry, or ``None`` to leave it.

    A terminal record that ended at or before ``cutoff`` (inclusive) is deleted together
    with its ended-index entry, its listing entries (``started/...``), its thread-membership
    entry, and its sandbox entry when that entry still names this run (a later run of the
    thread may have taken the sandbox over). The write compares the record's mod revision
    (and the sandbox entry's), so a record that changed since it was read is not deleted.
    The thread's tenant key stays: a thread keeps its owner, so its transcript stays its
    tenant's. The same write puts ``retired/<run>`` (value: the thread id) under
    ``retired_lease`` (0: no lease, kept forever): a start of the same run id is refused while
    it exists, because the run's delivery log may still hold the old run's chunks and fences.

    An entry that no longer matches its record (the record is gone, is not terminal, or
    ended at another time) is stale: only the entry is deleted, comparing the record as read.

    Args:
        run_id: the run the entry names.
        rec_kv: its record as read (``None``: no record).
        index_key: the ended-index key the run was found by.
        sandbox_kv: the ``sandboxes/<record.sandbox_key>`` entry as read, if any.
        cutoff: Unix seconds.
        retired_lease: the lease the ``retired/<run>`` key is put under (0: none).

    Returns:
        ``(compares, ops)``, or ``None`` when the record is too young.
    """
    run_key = keys.run(run_id)
    if rec_kv is None:
        return [E.cmp_absent(run_key)], [E.delete(index_key)]
    rec = RunRecord.FromString(rec_kv.value)
    cmps = [E.cmp_mod(run_key, rec_kv.mod_revision)]
    if not is_ended(rec) or keys.ended(ended_at(rec), run_id) != index_key:
        return cmps, [E.delete(index_key)]
    if ended_at(rec) > cutoff:
        return None
    ops = [E.delete(run_key), E.delete(index_key), E.delete(keys.thread_run(rec.thread_id, run_id)),
           *(E.delete(key) for key in listing_entries(keys, rec)),
           E.put(keys.retired(run_id), rec.thread_id.encode(), retired_lease)]
    if sandbox_kv is not None and SandboxInstance.FromString(sandbox_kv.value).run_id == run_id:
        cmps.append(E.cmp_mod(sandbox_kv.key, sandbox_kv.mod_revision))
        ops.append(E.delete(sandbox_kv.key))
    return cmps, ops
