"""Takeovers: when and why a run's claim moved to a new owner (docs/operating.md, "Takeovers").

A claim key vanishes for one of a few reasons, and no single party sees them all:

- ``crash``: the holder's keep-alive stream broke and its port refused a connect, so fast
  failover (:mod:`coordinator._liveness`) revoked its session. It notes the cause in
  ``session-ends/<lease>`` before it revokes.
- ``closed``: the session was closed (``CloseSession``), noted the same way.
- ``session-lost``: the session's lease expired by its TTL with no note: the process
  stopped refreshing it but may live on (paused, partitioned: a zombie the epoch fences).
- ``drain``: the holder released the claim while its session lives and its host is
  registered as draining.
- ``released``: released otherwise (the session lives, the host is not draining).

The leader's failover watch sees every deletion with the claim it deleted, classifies it
(:func:`classify`, from one read of the session, host and note keys) and writes the
record's ``last_takeover`` (:func:`after_loss`); the successor's ``ClaimRun`` stamps its side
(:func:`stamp_claim`). The two writes may come in either order and converge. The functions
here are pure, except :func:`note_session_end`, one etcd write.
"""
from __future__ import annotations

from typing import Final

from baton.errors import StoreUnavailable
from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus, Takeover

from coordinator import _etcd as E
from coordinator._keys import Keys

CRASH: Final = "crash"
DRAIN: Final = "drain"
SESSION_LOST: Final = "session-lost"
CLOSED: Final = "closed"
RELEASED: Final = "released"
#: Every cause, as ``Takeover.cause`` spells it.
CAUSES: Final = (CRASH, DRAIN, SESSION_LOST, CLOSED, RELEASED)
#: Seconds a ``session-ends/`` note lives: far longer than the leader takes to read it
#: after the revoke it precedes.
SESSION_END_TTL: Final = 600


async def note_session_end(etcd: E.Etcd, keys: Keys, session_id: int, cause: str, *, timeout: float) -> None:
    """Note why ``session_id`` is about to end (call it just before revoking the lease).

    Best effort: a note that fails to be written leaves the loss classified ``session-lost``.
    The note lives under its own lease of :data:`SESSION_END_TTL` seconds.

    Raises:
        StoreUnavailable: etcd did not answer within ``timeout`` seconds.
    """
    lease, _ = await etcd.grant(SESSION_END_TTL, timeout=timeout)
    try:
        await etcd.txn([], [E.put(keys.session_end(session_id), cause.encode(), lease)], timeout=timeout)
    except E.LeaseNotFound as exc:  # granted just now: only a wiped etcd loses it
        raise StoreUnavailable(f"session-end note: {exc}") from exc


def loss_reads(keys: Keys, lost: Claim) -> list[E.Op]:
    """The reads :func:`classify` needs, in its argument order (one transaction)."""
    return [E.get(keys.session(lost.session_id)), E.get(keys.host(lost.host_id)),
            E.get(keys.session_end(lost.session_id))]


def classify(lost: Claim, *, session_alive: bool, host: HostInfo | None, session_end: bytes) -> str:
    """Why ``lost`` went, from what etcd held just after its key was deleted.

    Args:
        lost: the deleted claim (its session and host).
        session_alive: its session's ``sessions/<lease>`` key still exists.
        host: the host's registry entry now (``None``: not registered).
        session_end: the ``session-ends/<lease>`` note (``b""``: none).
    """
    if session_end:
        return session_end.decode(errors="replace")
    if not session_alive:
        return SESSION_LOST
    if host is not None and host.session_id == lost.session_id and host.draining:
        return DRAIN
    return RELEASED


def stamp_claim(cur: RunRecord, new: RunRecord, host_id: str, now: float) -> None:
    """The successor's side of a takeover, in the claim's write (``new`` is the record after it).

    A run claimed before (``driver_epoch`` > 0) gets ``last_takeover`` for the move from the
    previous epoch: the leader's note of that loss is kept when it came first.
    """
    if cur.driver_epoch <= 0:
        return
    t = Takeover()
    if cur.HasField("last_takeover") and cur.last_takeover.from_epoch == cur.driver_epoch:
        t.CopyFrom(cur.last_takeover)
    else:
        t.from_epoch, t.from_host = cur.driver_epoch, cur.driver_host
    t.to_host, t.claimed_at = host_id, now
    new.last_takeover.CopyFrom(t)


def after_loss(cur: RunRecord | None, lost: Claim, cause: str, at: float) -> RunRecord | None:
    """The record with the leader's side of a takeover noted, or ``None`` (nothing to write).

    Nothing is written for a run that ended (a claim released at the end is no takeover),
    one still starting, or a loss older than the record's last move.
    """
    # An interrupted run (a HITL pause) lets its claim go by design: no takeover either.
    if cur is None or cur.status != RunStatus.RUN_STATUS_RUNNING:
        return None
    if cur.starting or cur.driver_epoch not in (lost.epoch, lost.epoch + 1):
        return None
    t = Takeover()
    if cur.HasField("last_takeover") and cur.last_takeover.from_epoch == lost.epoch:
        t.CopyFrom(cur.last_takeover)
        if t.cause and t.lost_at:
            return None  # noted already (the leader saw the deletion twice)
    elif cur.driver_epoch != lost.epoch:
        return None  # claimed again, but the claim did not stamp this loss: not ours
    else:
        t.from_epoch, t.from_host = lost.epoch, lost.host_id
    t.cause, t.lost_at = cause, at
    new = RunRecord()
    new.CopyFrom(cur)
    new.last_takeover.CopyFrom(t)
    return new
