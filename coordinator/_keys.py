"""The etcd key layout of everything the coordinator stores (one place, so it cannot drift).

Every key starts with the configured prefix (``BATON_ETCD_PREFIX``). Ids are encoded with
:func:`baton.ids.encode_token`, which is injective and never contains ``/``, so a prefix
range over ``readers/<run>/`` can never catch another run's readers.

=====================================  ==================================================
``runs/<run>``                          the RunRecord (protobuf bytes)
``claims/<run>``                        the Claim (protobuf bytes), under the session lease
``threads/<thread>/active``             run id of the thread's active (running) run
``threads/<thread>/tenant``             the tenant the thread belongs to (its first run's)
``threads/<thread>/seq``                the last number given to a run (or queued run) of the
                                        thread, ASCII decimal; kept for good (baton/thread_order.py)
``thread-runs/<thread>/<run>``          membership index for ``ListRuns(thread_id)``
``reclaimable/<µs:020d>/<run>``         running runs by ``detached_since`` (range read)
``starting/<µs:020d>/<run>``            runs whose input is not durable yet, by ``started_at``
``live/<run>``                          every ``running`` run (failover sweep, presence catch-up)
``ended/<µs:020d>/<run>``               terminal runs by ``finished_at`` (retention)
``started/all/<o>/<µs:020d>/<run>``     every run by ``started_at`` (the tenant-wide listing
                                        with auth off); ``<o>`` = ``a``: oldest first (the
                                        paged ListRuns), ``d`` (µs inverted): newest first
``started/t/<tenant>/<o>/<µs>/<run>``   a tenant's runs by ``started_at``, the same two ways
``retired/<run>``                       a run id whose record retention deleted: it cannot
                                        start again while its log may hold the old chunks
                                        (under a lease of the log's max age; retention.py)
``retired-lease``                       the lease id ``retired/`` keys are put under now,
                                        under that lease (one per hour of deletions)
``indexes``                             marker: the live/ended/started indexes were
                                        backfilled for older records (value ``v2``)
``readers/<run>/<reader>``              presence of one reader, under the gateway's lease
``sandboxes/<key>``                     SandboxInstance (protobuf bytes)
``hosts/<host>``                        HostInfo (protobuf bytes), under the host's lease
``sessions/<lease hex>``                owner of a session, under its lease (operators)
``keepers/<lease hex>``                 token of the keep-alive stream that armed the session
                                        for fast failover, under its lease (_liveness.py)
``session-ends/<lease hex>``          why a session ended before its TTL (``crash``: fast
                                        failover revoked it; ``closed``: CloseSession), under
                                        a lease of 10 min (takeovers.py)
``cancel-intents/<run>/<tenant>``       a user's Stop of a run id with no record yet, under a
                                        lease of 60 s (_intents.py)
``election/<lease hex>``                leader-election candidates (as etcd election.go)
``incarnation``                         created once per etcd data set (record cache validity)
=====================================  ==================================================
"""
from __future__ import annotations

from dataclasses import dataclass

from baton.ids import decode_token, encode_token, run_position
from baton.ids import micros as micros  # re-exported: the unit of every time index here


#: Larger than any µs timestamp (``micros``): inverted timestamps stay non-negative.
_MAX_US = 10**19


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key greater than every key starting with ``prefix`` (etcd range_end)."""
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


@dataclass(frozen=True)
class Keys:
    """Key builder for one prefix."""

    prefix: str

    def _k(self, *parts: str) -> bytes:
        return (self.prefix + "/".join(parts)).encode()

    def run(self, run_id: str) -> bytes:
        return self._k("runs", encode_token(run_id))

    @property
    def runs(self) -> bytes:
        return self._k("runs", "")

    def claim(self, run_id: str) -> bytes:
        return self._k("claims", encode_token(run_id))

    @property
    def claims(self) -> bytes:
        return self._k("claims", "")

    def run_id_of_claim(self, key: bytes) -> str:
        return decode_token(key[len(self.claims) :].decode())

    def thread_active(self, thread_id: str) -> bytes:
        return self._k("threads", encode_token(thread_id), "active")

    def thread_tenant(self, thread_id: str) -> bytes:
        """The tenant a thread belongs to (written with its first run)."""
        return self._k("threads", encode_token(thread_id), "tenant")

    def thread_seq(self, thread_id: str) -> bytes:
        """The thread's counter: the last number a run (or a queued run) of it was given
        (:mod:`baton.thread_order`). Never deleted, so no number is given twice."""
        return self._k("threads", encode_token(thread_id), "seq")

    def cancel_intent(self, run_id: str, tenant: str) -> bytes:
        """A user's cancel of a run id that has no record yet (leased: it expires), one key
        per tenant: another tenant's cancel of the same id cannot replace it."""
        return self._k("cancel-intents", encode_token(run_id), encode_token(tenant))

    def queue(self, thread_id: str) -> bytes:
        """The prefix of a thread's queued runs, in dispatch order."""
        return self._k("queue", encode_token(thread_id), "")

    @property
    def queues(self) -> bytes:
        return self._k("queue", "")

    def queued(self, thread_id: str, order: str) -> bytes:
        return self._k("queue", encode_token(thread_id), order)

    def queued_run(self, run_id: str) -> bytes:
        """A queued run's entry by run id (its value: the entry's key)."""
        return self._k("queued-runs", encode_token(run_id))

    def thread_run(self, thread_id: str, run_id: str) -> bytes:
        return self._k("thread-runs", encode_token(thread_id), encode_token(run_id))

    def thread_runs(self, thread_id: str) -> bytes:
        return self._k("thread-runs", encode_token(thread_id), "")

    def run_id_of_thread_run(self, thread_id: str, key: bytes) -> str:
        return decode_token(key[len(self.thread_runs(thread_id)) :].decode())

    def reclaimable(self, detached_since: float, run_id: str) -> bytes:
        return self._k("reclaimable", f"{micros(detached_since):020d}", encode_token(run_id))

    @property
    def reclaimable_prefix(self) -> bytes:
        return self._k("reclaimable", "")

    def reclaimable_until(self, cutoff: float) -> bytes:
        """range_end covering every index key with ``detached_since <= cutoff`` (inclusive)."""
        return self._k("reclaimable", f"{micros(cutoff) + 1:020d}")

    def starting(self, started_at: float, run_id: str) -> bytes:
        return self._k("starting", f"{micros(started_at):020d}", encode_token(run_id))

    @property
    def starting_prefix(self) -> bytes:
        return self._k("starting", "")

    def starting_until(self, cutoff: float) -> bytes:
        """range_end covering every starting-index key with ``started_at <= cutoff``."""
        return self._k("starting", f"{micros(cutoff) + 1:020d}")

    def live(self, run_id: str) -> bytes:
        return self._k("live", encode_token(run_id))

    @property
    def live_prefix(self) -> bytes:
        return self._k("live", "")

    def run_id_of_live(self, key: bytes) -> str:
        return decode_token(key[len(self.live_prefix) :].decode())

    def ended(self, finished_at: float, run_id: str) -> bytes:
        return self._k("ended", f"{micros(finished_at):020d}", encode_token(run_id))

    @property
    def ended_prefix(self) -> bytes:
        return self._k("ended", "")

    def ended_until(self, cutoff: float) -> bytes:
        """range_end covering every ended-index key with ``finished_at <= cutoff``."""
        return self._k("ended", f"{micros(cutoff) + 1:020d}")

    def started_scope(self, tenant: str | None, newest_first: bool = False) -> bytes:
        """The prefix of one listing: every run (``tenant`` ``None``) or one tenant's, in key
        order oldest first or newest first."""
        order = "d" if newest_first else "a"
        if tenant is None:
            return self._k("started", "all", order, "")
        return self._k("started", "t", encode_token(tenant), order, "")

    def started(self, tenant: str | None, started_at: float, run_id: str, newest_first: bool = False) -> bytes:
        """A run's entry in a listing (:meth:`started_scope`): by ``started_at`` µs (inverted
        when ``newest_first``), then by the encoded run id."""
        if not newest_first:
            return self.started_scope(tenant) + run_position(started_at, run_id)
        return self.started_scope(tenant, True) + f"{_MAX_US - micros(started_at):020d}/{encode_token(run_id)}".encode()

    def run_id_of_started(self, key: bytes) -> str:
        return decode_token(key.rsplit(b"/", 1)[1].decode())

    def retired(self, run_id: str) -> bytes:
        return self._k("retired", encode_token(run_id))

    @property
    def retired_lease(self) -> bytes:
        """The lease id (decimal) that retention passes put ``retired/`` keys under now."""
        return self._k("retired-lease")

    @property
    def indexes_marker(self) -> bytes:
        """Present once the live and ended indexes cover records written before them."""
        return self._k("indexes")

    def readers(self, run_id: str) -> bytes:
        return self._k("readers", encode_token(run_id), "")

    @property
    def all_readers(self) -> bytes:
        return self._k("readers", "")

    def reader(self, run_id: str, reader_id: str) -> bytes:
        return self._k("readers", encode_token(run_id), encode_token(reader_id))

    def run_id_of_reader(self, key: bytes) -> str:
        rest = key[len(self.all_readers) :].decode()
        return decode_token(rest.split("/", 1)[0])

    @property
    def sandboxes(self) -> bytes:
        return self._k("sandboxes", "")

    def sandbox(self, sandbox_key: str) -> bytes:
        return self._k("sandboxes", encode_token(sandbox_key))

    def host(self, host_id: str) -> bytes:
        return self._k("hosts", encode_token(host_id))

    @property
    def hosts(self) -> bytes:
        return self._k("hosts", "")

    @property
    def all_sessions(self) -> bytes:
        return self._k("sessions", "")

    def session(self, session_id: int) -> bytes:
        return self._k("sessions", f"{session_id:016x}")

    def keeper(self, session_id: int) -> bytes:
        return self._k("keepers", f"{session_id:016x}")

    def session_end(self, session_id: int) -> bytes:
        return self._k("session-ends", f"{session_id:016x}")

    @property
    def incarnation(self) -> bytes:
        return self._k("incarnation")

    @property
    def election(self) -> bytes:
        return self._k("election", "")

    def candidate(self, lease_id: int) -> bytes:
        return self._k("election", f"{lease_id:016x}")
