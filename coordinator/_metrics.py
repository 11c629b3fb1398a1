"""The coordinator's Prometheus metrics, and how a lost claim's cause is told from etcd events.

One :class:`CoordinatorMetrics` per replica (its own registry, served on
``BATON_COORDINATOR_METRICS_LISTEN``). Counters of the leader's tasks (failovers, sessions
ended) move only on the replica that leads: sum them over replicas.

Why a session ended, and why a claim went, are read from the ``session-ends/<lease>`` note
the coordinator writes before it revokes a session on purpose (:mod:`coordinator.takeovers`,
the run record's ``last_takeover`` reads the same): no note is a lease that expired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

from baton.metrics import LATENCY_BUCKETS, new_registry
from baton.v1.runs_pb2 import Claim

from coordinator import takeovers

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


def session_end(note: bytes) -> SessionEnd:
    """How a session ended, from its ``session-ends/`` note (``b""``: none, the lease expired)."""
    if note == takeovers.CLOSED.encode():
        return "closed"
    if note == takeovers.CRASH.encode():
        return "revoked"
    return "expired"


def loss_of(claim_prev: bytes | None, *, at: float) -> Loss:
    """The loss of a deleted claim (``claim_prev``: its value, ``None`` when unknown), its
    cause not known yet (``other``; the failover reads it for an orphan)."""
    if claim_prev is None:
        return Loss(at, "other")
    claim = Claim.FromString(claim_prev)
    return Loss(at, "other", session_id=claim.session_id, host_id=claim.host_id)
