"""The coordinator's Prometheus metrics, and how a lost claim's cause is told from etcd events.

One :class:`CoordinatorMetrics` per replica (its own registry, served on
``BATON_COORDINATOR_METRICS_LISTEN``). Counters of the leader's tasks (failovers, sessions
ended) move only on the replica that leads: sum them over replicas.

Why a session ended is read from the watch that sees its keys go (the leader's failover
watch, :func:`ended_sessions`): a session closed by ``CloseSession`` or revoked by fast
failover gets a marker on its keeper key (``closed`` / ``revoked``, on the same lease) in
the write that ends it, so the deletion event's previous value names the cause on whichever
replica leads; a session key deleted without a marker is a lease that expired.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from prometheus_client import CollectorRegistry, Counter, Histogram

from baton.metrics import LATENCY_BUCKETS, new_registry
from baton.v1.runs_pb2 import Claim

from coordinator._keys import Keys

#: Values of the keeper key that mark how its session was ended on purpose.
CLOSED_MARK = b"closed"
REVOKED_MARK = b"revoked"

SessionEnd = Literal["closed", "revoked", "expired"]
#: Why a run lost its driver, as the takeover stall histogram labels it.
LossCause = Literal["crash", "drain", "session_lost", "other"]


@dataclass(frozen=True)
class Loss:
    """How a run lost its driver: when the leader saw the claim go (Unix seconds) and why.

    ``released_by`` names the host that let the claim go while its session lived (its
    cause is ``drain`` if that host is draining, which is read only for an orphaned run).
    """

    at: float
    cause: LossCause
    released_by: str = ""


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
            "(crash|drain|session_lost|other), seen by the leader", ["cause"], registry=r)
        self.failovers = Counter(
            "baton_coordinator_failovers", "Hand-overs of orphaned runs by the leader, by outcome "
            "(attached|taken|skipped|failed)", ["outcome"], registry=r)
        self.fenced_writes = Counter(
            "baton_coordinator_fenced_writes", "Writes refused because the writer's claim (epoch or session) no "
            "longer holds the run", ["op"], registry=r)


def session_end(marker: bytes | None) -> SessionEnd:
    """The cause of a session's end from its keeper key's last value (``None``: no keeper)."""
    if marker == CLOSED_MARK:
        return "closed"
    if marker == REVOKED_MARK:
        return "revoked"
    return "expired"


def ended_sessions(keys: Keys, events: Iterable[object]) -> dict[int, SessionEnd]:
    """Sessions whose key was deleted in ``events`` (one watch response, one revision per
    lease revoke), with the cause their keeper marker names."""
    ended: set[int] = set()
    marks: dict[int, bytes] = {}
    for ev in events:
        key: bytes = ev.kv.key  # type: ignore[attr-defined]
        if key.startswith(keys.all_sessions):
            ended.add(int(key[len(keys.all_sessions):], 16))
        elif key.startswith(keys.all_keepers):
            prev = ev.prev_kv  # type: ignore[attr-defined]
            marks[int(key[len(keys.all_keepers):], 16)] = prev.value if prev is not None else b""
    return {sid: session_end(marks.get(sid)) for sid in ended}


def loss_of(claim_prev: bytes | None, ended: dict[int, SessionEnd], *, at: float) -> Loss:
    """Why a claim vanished.

    Args:
        claim_prev: the deleted claim's value (a ``Claim``), ``None`` when unknown.
        ended: sessions ended in the same revision (:func:`ended_sessions`).
        at: when the deletion was seen (Unix seconds).

    Returns:
        ``crash`` (fast failover revoked the session: its process refused connections),
        ``session_lost`` (the session's lease expired: the host stopped refreshing it, being
        dead, paused or cut off), else ``other`` (its session closed; or the claim was
        released while the session lived, with ``released_by`` set: see :func:`settle_drain`).
    """
    if claim_prev is None:
        return Loss(at, "other")
    claim = Claim.FromString(claim_prev)
    end = ended.get(claim.session_id)
    if end == "revoked":
        return Loss(at, "crash")
    if end == "expired":
        return Loss(at, "session_lost")
    return Loss(at, "other", released_by=claim.host_id if end is None else "")


def settle_drain(loss: Loss, draining: set[str]) -> Loss:
    """``loss`` with cause ``drain`` when the host that released the claim is draining."""
    if loss.released_by and loss.released_by in draining:
        return Loss(loss.at, "drain", loss.released_by)
    return loss
