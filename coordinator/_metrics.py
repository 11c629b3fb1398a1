"""The coordinator's Prometheus metrics, and how a lost claim's cause is told from etcd events.

One :class:`CoordinatorMetrics` per replica (its own registry, served on
``BATON_COORDINATOR_METRICS_LISTEN``). Counters of the leader's tasks (failovers, sessions
ended) move only on the replica that leads: sum them over replicas.

Why a session ended is read from the watch that sees its key go (the leader's failover
watch, :class:`SessionEnds`): a session closed by ``CloseSession`` or revoked by fast
failover gets a marker as its key's value (``closed`` / ``revoked``) in the write just
before its lease is revoked, so the deletion event's previous value names the cause on
whichever replica leads; a session key deleted without a marker is a lease that expired.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Iterable, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

from baton.metrics import LATENCY_BUCKETS, new_registry
from baton.v1.runs_pb2 import Claim

from coordinator._keys import Keys

#: Values of a session key that mark how its session was ended on purpose.
CLOSED_MARK = b"closed"
REVOKED_MARK = b"revoked"

SessionEnd = Literal["closed", "revoked", "expired"]
#: Why a run lost its driver, as the takeover stall histogram labels it.
#: The same words as ``Takeover.cause`` on the run record (:mod:`coordinator.takeovers`).
LossCause = Literal["crash", "drain", "session-lost", "closed", "released", "other"]


@dataclass(frozen=True)
class Loss:
    """How a run lost its driver: when the leader saw the claim go (Unix seconds), why, and
    the lost claim's session and host (0 and "" when unknown)."""

    at: float
    cause: LossCause
    session_id: int = 0
    host_id: str = ""


class CoordinatorMetrics:
    """The metrics of one coordinator replica (a per-instance registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else new_registry()
        self.claim_seconds = Histogram(
            "baton_coordinator_claim_seconds", "ClaimRun latency in the coordinator (validation + etcd), by outcome",
            ["purpose", "outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.sessions_ended = Counter(
            "baton_coordinator_sessions_ended", "Sessions whose lease ended, seen by the leader: closed "
            "(CloseSession), revoked (fast failover: the process was gone) or expired (lease TTL ran out)",
            ["cause"], registry=r)
        self.orphans = Counter(
            "baton_coordinator_orphaned_runs", "Running runs whose claim vanished, by cause "
            "(crash|drain|session-lost|closed|released|other), seen by the leader", ["cause"], registry=r)
        self.failovers = Counter(
            "baton_coordinator_failovers", "Hand-overs of orphaned runs by the leader, by outcome "
            "(attached|taken|skipped|failed)", ["outcome"], registry=r)
        self.fenced_writes = Counter(
            "baton_coordinator_fenced_writes", "Writes refused because the writer's claim (epoch or session) no "
            "longer holds the run", ["op"], registry=r)


def session_end(value: bytes | None) -> SessionEnd:
    """The cause of a session's end from its key's last value (the owner's name unless marked)."""
    if value == CLOSED_MARK:
        return "closed"
    if value == REVOKED_MARK:
        return "revoked"
    return "expired"


class SessionEnds:
    """The sessions that ended lately, with their causes (bounded: the newest are kept).

    The leader's one watch stream carries the claims' and the sessions' deletions as
    separate watches, so a claim and its session, deleted in one revision, arrive in two
    responses in either order: a hand-over looks its session up here when it needs it.
    """

    def __init__(self, keep: int = 4096) -> None:
        self._ends: OrderedDict[int, SessionEnd] = OrderedDict()
        self._keep = keep

    def saw(self, keys: Keys, events: Iterable[Any]) -> dict[int, SessionEnd]:
        """Take the session key deletions of one watch response → the sessions they ended."""
        ended: dict[int, SessionEnd] = {}
        for ev in events:
            key: bytes = ev.kv.key
            if key.startswith(keys.all_sessions):
                sid = int(key[len(keys.all_sessions):], 16)
                ended[sid] = session_end(ev.prev_kv.value if ev.prev_kv is not None else None)
                self._ends[sid] = ended[sid]
        while len(self._ends) > self._keep:
            self._ends.popitem(last=False)
        return ended

    def get(self, session_id: int) -> SessionEnd | None:
        return self._ends.get(session_id)


def loss_of(claim_prev: bytes | None, *, at: float) -> Loss:
    """The loss of a deleted claim (``claim_prev``: its value, ``None`` when unknown), its
    cause not known yet (:func:`cause_of`)."""
    if claim_prev is None:
        return Loss(at, "other")
    claim = Claim.FromString(claim_prev)
    return Loss(at, "other", session_id=claim.session_id, host_id=claim.host_id)


def cause_of(end: SessionEnd | None, *, session_lives: bool, host_draining: bool) -> LossCause:
    """Why a claim vanished, in the words of the run record's ``Takeover.cause``.

    Returns:
        ``crash`` (fast failover revoked the session: its process refused connections),
        ``closed`` (the session was closed), ``session-lost`` (the session's lease expired:
        the host stopped refreshing it, being dead, paused or cut off), ``drain`` (released
        by a draining host while its session lived), ``released`` (released otherwise while
        its session lived), else ``other`` (not known).
    """
    if end == "revoked":
        return "crash"
    if end == "closed":
        return "closed"
    if end == "expired":
        return "session-lost"
    if end is None and session_lives:
        return "drain" if host_draining else "released"
    return "other"
