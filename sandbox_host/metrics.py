"""A sandbox host's Prometheus metrics (served on ``BATON_HOST_METRICS_LISTEN``).

One :class:`HostMetrics` per host process, in its own registry. It is also the delivery
log's write observer (:class:`baton.log.WriteObserver`): every record this host's writers
store, every fence, every write refused by a higher epoch's fence and every refusal for
lack of storage is counted where it happens.

The takeover stall is the time from the moment the run lost its previous driver (the
coordinator's leader saw its claim go, or the draining host let go; sent with
``AttachRun``) to this host's fence record stored in the run's log: from then on the
successor appends, so it is the gap readers see, short of the agent's own silence. Clocks
of two machines are compared: keep them in NTP sync.

The journal lag is sampled by the driver's journal follower at each read of the journal
(:func:`sandbox_host.journal.follow_journal`), never per line: the bytes the agent has written
that the driver has not consumed yet. A takeover replaying a journal from byte 0 shows its
whole backlog at its first read.
"""
from __future__ import annotations

import time
from collections import OrderedDict

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from baton.metrics import BYTE_BUCKETS, LATENCY_BUCKETS, new_registry

#: Takeovers awaiting their fence, at most (an attach whose driver never fenced is dropped).
_PENDING_MAX = 4096
LOSS_CAUSES = ("crash", "drain", "session-lost", "closed", "released", "other")


class HostMetrics:
    """The metrics of one sandbox host (a per-instance registry)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else new_registry()
        self.append_seconds = Histogram(
            "baton_host_append_seconds", "One delivery-log record from publish to JetStream's acknowledgement "
            "(retries included)", buckets=LATENCY_BUCKETS, registry=r)
        self.fences = Counter("baton_host_log_fences", "Fence records this host stored, by kind (start|takeover)",
                              ["kind"], registry=r)
        self.fenced_writes = Counter(
            "baton_host_fenced_writes", "Log writes of this host refused because a higher epoch fenced the log "
            "(a stale driver stopped)", registry=r)
        self.storage_full = Counter("baton_host_log_storage_full",
                                    "Log writes refused because JetStream cannot store", registry=r)
        self.takeovers = Counter("baton_host_takeovers", "Runs this host took over (AttachRun accepted), by cause",
                                 ["cause"], registry=r)
        self.takeover_stall = Histogram(
            "baton_host_takeover_stall_seconds", "From the previous driver's loss to this host's fence in the "
            "run's log, by cause (crash|drain|session-lost|closed|released|other)", ["cause"],
            buckets=LATENCY_BUCKETS, registry=r)
        self.runs = Gauge("baton_host_runs", "Runs this host drives now", registry=r)
        self.journal_lag = Histogram(
            "baton_host_journal_lag_bytes", "Bytes of an agent's journal written but not yet consumed by its "
            "driver, sampled at each read of the journal", buckets=BYTE_BUCKETS, registry=r)
        self._pending: OrderedDict[str, tuple[float, str]] = OrderedDict()

    # --- takeovers ----------------------------------------------------------------------

    def expect_takeover(self, run_id: str, lost_at: float, cause: str) -> str:
        """An ``AttachRun`` of ``run_id`` is being served; its fence ends the stall.

        A second attach of the same run with an unknown loss time keeps the first one's.

        Returns:
            The cause the takeover is counted under (unknown causes are ``other``).
        """
        cause = cause if cause in LOSS_CAUSES else "other"
        held = self._pending.get(run_id)
        if held is not None and held[0] > 0 and lost_at <= 0:
            return held[1]
        self._pending[run_id] = (lost_at, cause)
        self._pending.move_to_end(run_id)
        while len(self._pending) > _PENDING_MAX:
            self._pending.popitem(last=False)
        return cause

    def forget_takeover(self, run_id: str) -> None:
        """The attach failed: nothing to observe."""
        self._pending.pop(run_id, None)

    # --- the journal follower's lag observer ---------------------------------------------

    def journal_read(self, lag: int) -> None:
        """A driver read its journal: ``lag`` bytes were written and not yet consumed."""
        self.journal_lag.observe(lag)

    # --- the delivery log's write observer ---------------------------------------------

    def appended(self, seconds: float) -> None:
        self.append_seconds.observe(seconds)

    def fenced(self, run_id: str) -> None:
        held = self._pending.pop(run_id, None)
        self.fences.labels("takeover" if held is not None else "start").inc()
        if held is not None and held[0] > 0:
            self.takeover_stall.labels(held[1]).observe(max(0.0, time.time() - held[0]))

    def latched(self, run_id: str) -> None:
        self.fenced_writes.inc()

    def refused_storage(self, run_id: str) -> None:
        self.storage_full.inc()
