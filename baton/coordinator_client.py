"""Typed asyncio client of ``baton.v1.Coordinator`` and the :class:`Session` it opens.

Every method raises the domain exception rebuilt from the gRPC status and its
``google.rpc.ErrorInfo`` (:func:`baton.grpc_errors.from_rpc_error`), so callers branch on
classes (``RunClaimNotAcquired.reason``, ``ThreadBusy.active_run_id``), never on messages;
an unreachable coordinator (or etcd behind it) is :class:`~baton.errors.StoreUnavailable`.

A :class:`Session` is one etcd lease, kept alive over a bidirectional stream to any
coordinator replica (the lease lives in etcd, so it survives a coordinator restart). Its
``lost`` event fires when the coordinator says the lease is gone or when no refresh
succeeded for a whole TTL; work that needs the session stops then (etcd
``concurrency/session.go``).

It runs over 600 lines: one short method per RPC of the service, all behind one replica and
retry policy (``_unary``) that a split would scatter, and the :class:`Session` (the lease and
its keep-alive on the loop) beside the client whose channels and replicas it uses.
"""
from __future__ import annotations

import asyncio
import collections
import enum
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncGenerator, Awaitable, Callable, Sequence, TypeVar

import grpc
from grpc_status import rpc_status
from google.protobuf.field_mask_pb2 import FieldMask

from baton import internal_auth
from baton.errors import InvalidArgument, SessionLost, StoreUnavailable
from baton.grpc_errors import from_rpc_error
from baton.retry import Attempts, Deadline
from baton.runs import MAX_READERS_PER_CALL
from baton.tls import GrpcTls
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.coordinator_pb2 import HostInfo, SandboxInstance
from baton.v1.runs_pb2 import Claim, RunInput, RunRecord

log = logging.getLogger(__name__)

#: Seconds presence calls go one per reader after a replica answered UNIMPLEMENTED to a
#: batched one (:meth:`CoordinatorClient.register_readers`).
UNBATCHED_RETRY = 60.0

T = TypeVar("T")

__all__ = ["Claim", "CoordinatorClient", "HostInfo", "RunRecord", "RunView", "SandboxInstance", "Session",
           "UpdateOutcome", "WatchEvent"]

_CHANNEL_OPTIONS = (
    # Reconnect fast after a coordinator restart (gRPC's default backoff grows to 120 s).
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_http_proxy", 0),
)


class UpdateOutcome(enum.Enum):
    """What ``UpdateRun`` did."""

    APPLIED = "applied"
    SUPPRESSED = "suppressed"  # terminal write with an epoch below driver_epoch (DESIGN §3.1)
    UNKNOWN_RUN = "unknown_run"  # no such run: nothing done, not an error


_OUTCOMES = {
    pb.UPDATE_OUTCOME_APPLIED: UpdateOutcome.APPLIED,
    pb.UPDATE_OUTCOME_SUPPRESSED: UpdateOutcome.SUPPRESSED,
    pb.UPDATE_OUTCOME_UNKNOWN_RUN: UpdateOutcome.UNKNOWN_RUN,
}


@dataclass(frozen=True)
class RunView:
    """A record with its live claim and when the reaper will act (Unix seconds)."""

    record: RunRecord
    claim: Claim | None
    reap_at: float | None


@dataclass(frozen=True)
class WatchEvent:
    """The run's state after a change (``record`` is ``None`` when it was deleted)."""

    record: RunRecord | None
    claim: Claim | None


def _never_sent(err: grpc.aio.AioRpcError) -> bool:
    """Whether ``err`` failed the call before its request left (no connection was made).

    gRPC reports a channel that could not connect to any address as ``UNAVAILABLE`` with
    "failed to connect to all addresses" (grpc core's pick_first/round_robin wording); a
    call that reached a server and lost it says otherwise ("Socket closed", "Connection
    reset"), and is not retried by this test.
    """
    if err.code() != grpc.StatusCode.UNAVAILABLE or "failed to connect to all addresses" not in (err.details() or ""):
        return False
    # A coordinator that answered sends a rich status (its StoreUnavailable can quote etcd's
    # own "failed to connect"); the client's connect failure has none.
    return rpc_status.from_call(err) is None  # type: ignore[arg-type]


def _sid(session: "Session | int") -> int:
    return session.id if isinstance(session, Session) else int(session)


class Session:
    """One etcd lease held through the coordinator. Use ``await cc.open_session(...)``.

    Attributes:
        id: the session id (the etcd lease id).
        ttl: granted TTL in seconds.
        owner: who opened it (for operators).
        probe_address: ``host:port`` that accepts TCP connections while this process lives
            (sent with every keep-alive; may be set once the process listens). When the
            keep-alive stream breaks and a connect there is refused, the coordinator revokes
            the session at once (fast failover). Empty: the lease TTL only.
        lost: set when the lease is gone (or could not be refreshed for a whole TTL).
    """

    def __init__(self, client: "CoordinatorClient", session_id: int, ttl: float, owner: str,
                 probe_address: str = "", own_thread: bool = False) -> None:
        self.id = session_id
        self.ttl = ttl
        self.owner = owner
        self._probe_address = probe_address
        self.lost = asyncio.Event()
        self._client = client
        self._closed = False
        self._task: asyncio.Task[None] | None = None
        self._thread: Any = None
        self._poke = asyncio.Event()  # refresh now: see the probe_address setter
        if own_thread:
            from baton.keepalive import KeepAliveThread

            self._loop = asyncio.get_running_loop()
            self._thread = KeepAliveThread(
                session_id, ttl, client.addresses, first=client._current, token=client._token, tls=client._tls,
                probe_address=lambda: self.probe_address, options=_CHANNEL_OPTIONS,
                on_lost=self._lost_from_thread)
            self._thread.start()
        else:
            self._task = asyncio.create_task(self._keepalive(), name=f"session-{session_id:x}")

    @property
    def probe_address(self) -> str:
        """See the class docstring. Setting a new one sends a refresh at once: the
        coordinator arms the session for fast failover on the first refresh that carries
        it, and a process that dies before the next scheduled refresh (up to a third of the
        TTL away) would otherwise be left to the TTL."""
        return self._probe_address

    @probe_address.setter
    def probe_address(self, address: str) -> None:
        changed = address != self._probe_address
        self._probe_address = address
        if changed and address:
            if self._thread is not None:
                self._thread.refresh_now()
            self._poke.set()

    def _lost_from_thread(self, _why: str) -> None:
        """The keep-alive thread found the lease gone: ``lost`` is set on the loop (unless closed)."""
        self._loop.call_soon_threadsafe(lambda: None if self._closed else self.lost.set())

    async def _keepalive(self) -> None:
        """Refresh the lease until close(); any other end of this task sets ``lost``.

        A dead heartbeat must stop the work that needs the lease (CONVENTIONS: a lease is a
        ``Session`` with a ``lost`` signal), so an unexpected exception or a cancel that
        did not come from :meth:`close` is logged and reported as a lost session.
        """
        try:
            await self._refresh()
        except asyncio.CancelledError:
            if not self._closed:
                log.warning("session %x lost: keep-alive cancelled", self.id)
            raise
        except Exception:
            # Not re-raised: it is logged here with its traceback, and nobody reads the
            # task's result (close() only waits for it).
            log.exception("session %x lost: keep-alive failed", self.id)
        finally:
            if not self._closed:
                self.lost.set()

    async def _refresh(self) -> None:
        """Send a refresh every TTL/3 on one stream, whatever the answers' pace.

        The schedule counts from the sends, not from the answers: when each refresh was
        sent a third of the TTL after the previous *answer*, a coordinator answering in
        1.5 s (2 cores at load 20) stretched the gap between two refreshes reaching etcd
        to nearly the whole TTL, and leases expired while every answer came in time
        (hosts lost their sessions under load). Answers are read by their own task: cancelling a pending gRPC read cancels
        the whole call, so a slow answer is waited for, not abandoned.

        The lease is known to hold until the send time of the last answered refresh plus
        the TTL (etcd refreshed it after that send); ``lost`` is set when that time is
        reached without a newer answer. A replica that leaves a refresh unanswered for two
        intervals is left for the next one (a hung coordinator), a third of the TTL before
        the lease would lapse.
        """
        interval = self.ttl / 3
        last_ok = time.monotonic()  # send time of the last answered refresh
        # ``_closed`` is checked as well as cancellation (close() cancels this task).
        while not self._closed:
            replica = self._client._current
            call = self._client._stub(replica).KeepAlive(wait_for_ready=False)
            sent: collections.deque[float] = collections.deque()
            answered: list[float] = []

            async def read_answers() -> bool:
                """Until the stream ends; ``True`` when the coordinator said the lease is gone."""
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:  # type: ignore[attr-defined]  # grpc-stubs lacks grpc.aio.EOF
                        raise StoreUnavailable("keep-alive stream ended")
                    at = sent.popleft() if sent else time.monotonic()
                    if resp.ttl_seconds <= 0:
                        return True
                    answered.append(at)

            reader = asyncio.ensure_future(read_answers())
            try:
                while not self._closed:
                    await call.write(pb.KeepAliveRequest(session_id=self.id, probe_address=self.probe_address))
                    sent.append(time.monotonic())
                    poked = asyncio.ensure_future(self._poke.wait())
                    try:  # the interval, the stream's end, or a new probe address (refresh now)
                        await asyncio.wait({reader, poked}, timeout=interval, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        poked.cancel()
                        await asyncio.wait({poked})
                    self._poke.clear()
                    if answered:
                        last_ok = max(last_ok, answered[-1])
                        answered.clear()
                    if reader.done():
                        if reader.result():
                            log.warning("session %x lost: lease gone", self.id)
                            self.lost.set()
                            return
                        raise StoreUnavailable("keep-alive stream ended")  # not reached: read raises
                    if time.monotonic() - last_ok >= self.ttl:
                        raise StoreUnavailable(f"no refresh answered for {self.ttl:.1f}s")
                    if sent and time.monotonic() - sent[0] >= 2 * interval:
                        raise StoreUnavailable(f"a refresh unanswered for {2 * interval:.1f}s")
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, StoreUnavailable,
                    asyncio.InvalidStateError) as exc:
                self._client._rotate(replica)
                log.info("session %x: keep-alive failed %.1fs after the last answered refresh (%s: %s); "
                         "reconnecting", self.id, time.monotonic() - last_ok, type(exc).__name__, exc)
                if time.monotonic() - last_ok >= self.ttl:
                    log.warning("session %x lost: no refresh for %.1fs (%s)", self.id, self.ttl, exc)
                    self.lost.set()
                    return
                await asyncio.sleep(min(0.1, interval))
            finally:
                call.cancel()
                reader.cancel()
                await asyncio.wait({reader})
                if not reader.cancelled():
                    reader.exception()  # retrieved: the stream's end is handled above

    async def close(self, timeout: float = 2.0) -> None:
        """Stop the keep-alive and revoke the lease (claims and readers go at once). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._client._sessions.discard(self)
        if self._thread is not None:
            await asyncio.to_thread(self._thread.stop, timeout)
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=timeout)
        if not self.lost.is_set():
            try:
                await self._client._unary("CloseSession", pb.CloseSessionRequest(session_id=self.id),
                                          timeout)
            except StoreUnavailable:
                log.warning("session %x: close not confirmed; the lease expires by itself", self.id)
        self.lost.set()

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class CoordinatorClient:
    """Async client of one or more coordinator replicas.

    Args:
        addresses: ``host:port`` or a list of them (replicas). After ``UNAVAILABLE`` the
            next call goes to the next replica; reads are retried on each replica once.
        timeout: default per-call deadline in seconds.
        token: the cluster's internal token sent on every call (:mod:`baton.internal_auth`);
            ``None`` reads ``BATON_INTERNAL_TOKEN``; ``""`` sends none.
        tls: the internal links' TLS (:class:`baton.tls.GrpcTls`); ``None`` reads ``BATON_TLS_*``.
    """

    def __init__(self, addresses: str | Sequence[str], timeout: float = 5.0, token: str | None = None,
                 tls: GrpcTls | None = None) -> None:
        if isinstance(addresses, str):
            addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not addresses:
            raise ValueError("at least one coordinator address is required")
        self.addresses = list(addresses)
        self.timeout = timeout
        self._token, self._tls = token, tls
        self._channels: list[grpc.aio.Channel] = []
        self._stubs: list[pb_grpc.CoordinatorStub] = []
        self._current = 0
        self._sessions: set[Session] = set()
        #: Until when (``time.monotonic()``) presence calls go one per reader: a replica
        #: answered UNIMPLEMENTED to a batched one (an older release, in a rolling upgrade).
        self._unbatched_until = 0.0

    # --- plumbing -------------------------------------------------------------------

    def _stub(self, replica: int | None = None) -> pb_grpc.CoordinatorStub:
        """The stub of replica ``replica`` (an index into ``addresses``; default: current)."""
        if not self._stubs:
            for a in self.addresses:
                ch = internal_auth.channel(a, _CHANNEL_OPTIONS, self._token, self._tls)
                self._channels.append(ch)
                self._stubs.append(pb_grpc.CoordinatorStub(ch))
        return self._stubs[(self._current if replica is None else replica) % len(self._stubs)]

    def _rotate(self, failed: int) -> None:
        """Move the shared cursor past replica ``failed``, unless a caller already moved it.

        Several callers (reads, keep-alives, watches) fail on a dead replica at once; if each
        advanced the cursor, every second one would move it back onto the dead replica.
        """
        if self._current == failed:
            self._current = (failed + 1) % max(len(self.addresses), 1)

    async def _unary(self, method: str, request: Any, timeout: float | None = None,
                     idempotent: bool = False) -> Any:
        # ``timeout`` is the budget of the call, not of each replica tried: the next replica
        # gets what the last one left.
        # An idempotent call tries every replica once, then goes on trying them (with a
        # growing pause) while its budget lasts, so a coordinator restart or a replica that
        # is still starting costs a pause, not an error. Other calls get one try, unless
        # the channel never connected ("failed to connect to all addresses": the request was
        # never sent, so asking again cannot apply it twice). A starved machine's TCP
        # handshake can time out once while the replica is up.
        deadline = Deadline.after(timeout or self.timeout)
        first = self._current
        pause = 0.05
        i = 0
        while True:
            replica = (first + i) % len(self.addresses)  # each retry on another replica
            try:
                return await getattr(self._stub(replica), method)(request, timeout=deadline.left())
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
                if err.code() == grpc.StatusCode.CANCELLED and exc is err:  # the replica ended it (shutdown)
                    exc = StoreUnavailable(f"CANCELLED by coordinator {self.addresses[replica]}: {err.details()}")
                if err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
                    self._rotate(replica)
                    i += 1
                    again = idempotent or _never_sent(err)
                    if again and i < len(self.addresses):
                        continue
                    if again and deadline.left() > pause:
                        await asyncio.sleep(pause)
                        pause = min(pause * 2, 0.5)
                        continue
                try:
                    if exc is err:
                        raise
                    raise exc from err
                finally:
                    # The error's traceback holds this frame: keeping it in a local made a
                    # cycle that held the caller's frames (a start's whole request, for its
                    # expected UnknownRun) until a full collection.
                    del exc

    async def close(self) -> None:
        """Close open sessions (revoking their leases) and the channels."""
        await asyncio.gather(*(s.close() for s in list(self._sessions)), return_exceptions=True)
        self._sessions.clear()
        for ch in self._channels:
            await ch.close(None)  # grace=None, the default (grpc-stubs makes it positional)
        self._channels.clear()
        self._stubs.clear()

    async def __aenter__(self) -> "CoordinatorClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # --- run records ------------------------------------------------------------------

    async def create_or_resume_run(self, record: RunRecord, interrupt_active: bool = False, *,
                                   timeout: float | None = None) -> tuple[RunRecord, bool]:
        """Create the run ``running``, or return the existing record unchanged.

        Returns:
            (record, created).

        Raises:
            ThreadBusy: the thread has another running run (and ``interrupt_active`` is false;
                when true, that run gets a cancel request first).
            InvalidArgument: a bad run id or thread id.
        """
        r = await self._unary("CreateOrResumeRun", pb.CreateOrResumeRunRequest(
            record=record, interrupt_active=interrupt_active), timeout)
        return r.record, r.created

    async def get_run(self, run_id: str, *, timeout: float | None = None) -> RunView:
        """The record, its live claim and ``reap_at``. Raises UnknownRun."""
        r = await self._unary("GetRun", pb.GetRunRequest(run_id=run_id), timeout, idempotent=True)
        return RunView(r.record, r.claim if r.HasField("claim") else None,
                       r.reap_at if r.HasField("reap_at") else None)

    async def update_run(self, run_id: str, record: RunRecord, paths: Sequence[str], *,
                         epoch: int = 0, session_id: "Session | int" = 0,
                         timeout: float | None = None) -> tuple[UpdateOutcome, RunRecord | None]:
        """Write the fields named by ``paths`` (a path unset in ``record`` clears the field).

        Args:
            epoch: the writer's epoch; a terminal status below ``driver_epoch`` is suppressed.
            session_id: when set, an owner write: the claim must still be this session's at
                ``epoch`` (compared inside the etcd transaction).

        Returns:
            (outcome, record after the write; the unchanged record when suppressed; ``None``
            for an unknown run).

        Raises:
            RunClaimLost: owner write whose claim is gone or at another epoch.
        """
        r = await self._unary("UpdateRun", pb.UpdateRunRequest(
            run_id=run_id, record=record, update_mask=FieldMask(paths=list(paths)), epoch=epoch,
            session_id=_sid(session_id)), timeout)
        outcome = _OUTCOMES[r.outcome]
        return outcome, (r.record if r.HasField("record") else None)

    async def find_active_run(self, thread_id: str, *, timeout: float | None = None) -> RunRecord | None:
        """The thread's running run, or ``None``."""
        r = await self._unary("FindActiveRun", pb.FindActiveRunRequest(thread_id=thread_id), timeout,
                              idempotent=True)
        return r.record if r.HasField("record") else None

    async def list_runs(self, thread_id: str | None = None, limit: int = 100, tenant: str | None = None,
                        *, timeout: float | None = None) -> list[RunRecord]:
        """Runs of a thread (or all), oldest first, at most ``limit`` (the newest)."""
        r = await self._unary("ListRuns", pb.ListRunsRequest(
            thread_id=thread_id or "", limit=limit, tenant=tenant or ""), timeout, idempotent=True)
        return list(r.records)

    async def list_page(self, tenant: str | None = None, page_size: int = 100, page_token: str = "", *,
                        timeout: float | None = None) -> tuple[list[RunRecord], str]:
        """One page of a tenant's runs (``None``: every tenant's), oldest first → (runs, next
        page token, ``""`` on the last page). One bounded etcd read, however many runs exist.

        Raises:
            InvalidArgument: ``page_token`` is not a token this call returned, or
                ``page_size`` is not in ``[1, 1000]``.
        """
        if page_size <= 0:
            raise InvalidArgument("page_size", "must be in [1, 1000]")
        r = await self._unary("ListRuns", pb.ListRunsRequest(tenant=tenant or "", page_size=page_size,
                                                             page_token=page_token), timeout, idempotent=True)
        return list(r.records), r.next_page_token

    async def thread_runs(self, thread_id: str, limit: int = 1, *,
                          timeout: float | None = None) -> tuple[list[RunRecord], str]:
        """The thread's newest ``limit`` runs (oldest first) and the tenant it belongs to.

        The tenant is the thread's owner key, which outlives the records (retention deletes
        old records, not the owner): ``""`` only for a thread from before that key.
        """
        r = await self._unary("ListRuns", pb.ListRunsRequest(thread_id=thread_id, limit=limit), timeout,
                              idempotent=True)
        return list(r.records), r.thread_tenant

    async def list_reclaimable(self, now: float, ttl: float, limit: int = 0, *,
                               timeout: float | None = None) -> list[RunRecord]:
        """Running runs with ``detached_since <= now - ttl`` (inclusive). ``now=0``: coordinator clock."""
        r = await self._unary("ListReclaimable", pb.ListReclaimableRequest(
            now=now, ttl_seconds=ttl, limit=limit), timeout, idempotent=True)
        return list(r.records)

    async def request_run_cancel(self, run_id: str, reason: str = "user", *,
                                 timeout: float | None = None) -> RunRecord:
        """Set ``cancel_requested`` (no status written). Raises UnknownRun."""
        r = await self._unary("RequestRunCancel", pb.RequestRunCancelRequest(run_id=run_id, reason=reason),
                              timeout)
        record: RunRecord = r.record
        return record

    async def user_cancel(self, run_id: str, tenant: str, reason: str = "user", *,
                          timeout: float | None = None) -> RunRecord | None:
        """A user's cancel (tenant-scoped): the record with ``cancel_requested``, or ``None``
        when the run does not exist yet and a cancel intent its start will find was recorded
        (it expires after a bounded time). Raises UnknownRun for another tenant's run."""
        r = await self._unary("RequestRunCancel", pb.RequestRunCancelRequest(run_id=run_id, reason=reason,
                                                                             tenant=tenant), timeout)
        return None if r.intent else r.record

    async def put_run_input(self, run_id: str, op: pb.PutRunInputRequest.Op.ValueType, input: RunInput, *, tenant: str = "",
                            session_id: int = 0, epoch: int = 0, now: float = 0.0, known_inputs: int = 0,
                            timeout: float | None = None) -> tuple[int, RunRecord, RunInput | None]:
        """One input op on a live run (docs/hitl.md): ``op`` is a ``PutRunInputRequest.Op``.

        Returns:
            (``PutRunInputResponse.Outcome``, the record after the op or as found, the stored
            input when the outcome is ``CONFLICT`` else ``None``).

        Raises:
            InvalidArgument: a malformed request (see ``coordinator._service.check_run_input``).
        """
        r = await self._unary("PutRunInput", pb.PutRunInputRequest(
            run_id=run_id, op=op, input=input, tenant=tenant, session_id=session_id, epoch=epoch,
            now=now, known_inputs=known_inputs), timeout)
        existing: RunInput | None = r.existing if r.HasField("existing") else None
        record: RunRecord = r.record
        return r.outcome, record, existing

    async def enqueue_run(self, run: pb.QueuedRun, *, timeout: float | None = None) -> tuple[int, int, str]:
        """Queue a run behind its thread's active run → (``EnqueueRunResponse.Outcome``,
        position, the active run id); ``IDLE``: the thread is idle, start the run instead."""
        r = await self._unary("EnqueueRun", pb.EnqueueRunRequest(run=run), timeout)
        return r.outcome, r.position, r.active_run_id

    async def list_queued_runs(self, thread_id: str = "", *, tenant: str | None = None, run_id: str = "",
                               timeout: float | None = None) -> list[pb.QueuedRun]:
        """Queued runs in dispatch order (``thread_id`` "" = every thread's)."""
        req = pb.ListQueuedRunsRequest(thread_id=thread_id, run_id=run_id)
        if tenant is not None:
            req.tenant = tenant
        r = await self._unary("ListQueuedRuns", req, timeout)
        return list(r.runs)

    async def remove_queued_run(self, thread_id: str, run_id: str, *, tenant: str | None = None,
                                user_cancel: bool = False, timeout: float | None = None) -> bool:
        """Take a run out of its thread's queue; ``False`` when it is not queued. ``user_cancel``:
        only while the run has no record (a start on its way is born cancelled), else raises
        ``QueuedRunStarted``."""
        req = pb.RemoveQueuedRunRequest(thread_id=thread_id, run_id=run_id, user_cancel=user_cancel)
        if tenant is not None:
            req.tenant = tenant
        r = await self._unary("RemoveQueuedRun", req, timeout)
        return bool(r.removed)

    # --- sessions and claims ----------------------------------------------------------

    async def open_session(self, ttl: float = 2.0, owner: str = "", *, probe_address: str = "",
                           timeout: float | None = None, own_thread: bool = False) -> Session:
        """Open a session (one etcd lease, TTL rounded up to whole seconds) and keep it alive.

        ``probe_address``: see :attr:`Session.probe_address`. ``own_thread``: refresh it from
        a thread and channel of its own (:mod:`baton.keepalive`), so a busy event loop
        cannot starve it.
        """
        # Every replica is tried (a process starting while the first is down); a lease granted
        # twice (an answer lost) is kept alive by nobody and expires after ``ttl``.
        r = await self._unary("OpenSession", pb.OpenSessionRequest(ttl_seconds=ttl, owner=owner), timeout,
                              idempotent=True)
        s = Session(self, r.session_id, r.ttl_seconds, owner, probe_address, own_thread)
        self._sessions.add(s)
        return s

    async def claim_run(self, run_id: str, session: "Session | int", host_id: str,
                        purpose: str = "drive", *, timeout: float | None = None,
                        require_started: bool = False) -> tuple[int, RunRecord]:
        """Claim a run under ``session`` → (epoch, record).

        ``require_started`` refuses a run still ``starting`` (an ``AttachRun``'s claim).

        Raises:
            RunClaimNotAcquired: ``reason`` is ``unknown`` | ``terminal`` | ``starting``
                (``require_started`` only) | ``held`` | ``cancel_requested``.
            SessionLost: the session's lease is gone.
        """
        r = await self._claim(run_id, session, host_id, purpose, timeout, require_started, with_sandbox=False)
        return r.epoch, r.record

    async def _claim(self, run_id: str, session: "Session | int", host_id: str, purpose: str,
                     timeout: float | None, require_started: bool, *, with_sandbox: bool) -> pb.ClaimRunResponse:
        if isinstance(session, Session) and session.lost.is_set():
            raise SessionLost(session.id)
        return await self._unary("ClaimRun", pb.ClaimRunRequest(  # type: ignore[no-any-return]
            run_id=run_id, session_id=_sid(session), host_id=host_id, purpose=purpose,
            require_started=require_started, with_sandbox=with_sandbox), timeout)

    async def claim_run_with_sandbox(self, run_id: str, session: "Session | int", host_id: str,
                                     purpose: str = "drive", *, timeout: float | None = None,
                                     require_started: bool = False
                                     ) -> tuple[int, RunRecord, "tuple[SandboxInstance | None] | None"]:
        """:meth:`claim_run`, answered with the registry entry of the record's ``sandbox_key``
        read once the claim landed (a takeover's claim, whose driver needs it next).

        Returns:
            ``(epoch, record, (entry or None,))``; the last is ``None`` when the record names
            no sandbox or the entry was not read (the caller reads it itself).

        Raises:
            As :meth:`claim_run`.
        """
        r = await self._claim(run_id, session, host_id, purpose, timeout, require_started, with_sandbox=True)
        if not r.sandbox_read:
            return r.epoch, r.record, None
        return r.epoch, r.record, (r.sandbox if r.HasField("sandbox") else None,)

    async def release_claim(self, run_id: str, session: "Session | int", epoch: int, *,
                            timeout: float | None = None) -> bool:
        """Release the claim if ``session`` holds it at ``epoch``; ``False`` otherwise."""
        r = await self._unary("ReleaseClaim", pb.ReleaseClaimRequest(
            run_id=run_id, session_id=_sid(session), epoch=epoch), timeout)
        return bool(r.released)

    async def watch_run(self, run_id: str) -> AsyncGenerator[WatchEvent, None]:
        """The run's state now, then after every change, until the caller stops iterating.

        Re-subscribes by itself (to any replica) when the coordinator or etcd goes away; a
        re-subscription starts with the current state again, so events are idempotent.

        Raises:
            InvalidArgument: a bad run id.
        """
        tries = Attempts(Deadline.never(), first_pause=0.05, max_pause=1.0)
        async for _ in tries:
            replica = self._current
            call = self._stub(replica).WatchRun(pb.WatchRunRequest(run_id=run_id))
            try:
                async for resp in call:
                    tries.reset()
                    yield WatchEvent(resp.record if resp.HasField("record") else None,
                                     resp.claim if resp.HasField("claim") else None)
            except grpc.aio.AioRpcError as err:
                exc = from_rpc_error(err)
                if not isinstance(exc, StoreUnavailable):
                    try:
                        raise (exc if exc is not err else err) from None
                    finally:
                        del exc  # (as in _unary: no cycle through this frame)
                self._rotate(replica)
            finally:
                call.cancel()

    # --- presence -----------------------------------------------------------------------

    async def register_reader(self, run_id: str, session: "Session | int", reader_id: str, *,
                              timeout: float | None = None) -> None:
        """Register a reader under ``session``; clears the run's ``detached_since``."""
        await self._unary("RegisterReader", pb.RegisterReaderRequest(
            run_id=run_id, session_id=_sid(session), reader_id=reader_id), timeout)

    async def unregister_reader(self, run_id: str, reader_id: str, *, timeout: float | None = None) -> None:
        """Remove a reader; the last one leaving detaches the run."""
        await self._unary("UnregisterReader", pb.UnregisterReaderRequest(run_id=run_id, reader_id=reader_id),
                          timeout)

    async def register_readers(self, run_id: str, session: "Session | int", reader_ids: Sequence[str], *,
                               timeout: float | None = None) -> None:
        """Register several readers of one run under ``session`` in one call per
        :data:`~baton.runs.MAX_READERS_PER_CALL` ids; each is a key of its own, as with
        :meth:`register_reader`. A coordinator without the batched call (an older release,
        during a rolling upgrade) gets one :meth:`register_reader` per id, and so do all
        replicas for :data:`UNBATCHED_RETRY` seconds after, before a batched call is tried again."""
        await self._readers_batched("RegisterReaders", run_id, reader_ids, timeout,
                                    lambda ids: pb.RegisterReadersRequest(run_id=run_id, session_id=_sid(session),
                                                                          reader_ids=ids),
                                    lambda r, t: self.register_reader(run_id, session, r, timeout=t))

    async def unregister_readers(self, run_id: str, reader_ids: Sequence[str], *,
                                 timeout: float | None = None) -> None:
        """Remove several readers of one run (see :meth:`register_readers`); the run detaches
        when none is left."""
        await self._readers_batched("UnregisterReaders", run_id, reader_ids, timeout,
                                    lambda ids: pb.UnregisterReadersRequest(run_id=run_id, reader_ids=ids),
                                    lambda r, t: self.unregister_reader(run_id, r, timeout=t))

    async def _readers_batched(self, method: str, run_id: str, reader_ids: Sequence[str], timeout: float | None,
                               request: Callable[[list[str]], Any],
                               one: Callable[[str, float], Awaitable[None]]) -> None:
        deadline = Deadline.after(timeout or self.timeout)
        ids = list(dict.fromkeys(reader_ids))
        for i in range(0, len(ids), MAX_READERS_PER_CALL):
            part = ids[i:i + MAX_READERS_PER_CALL]
            if time.monotonic() >= self._unbatched_until:
                try:
                    await self._unary(method, request(part), deadline.left())
                    continue
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.UNIMPLEMENTED:
                        raise
                    log.info("a coordinator has no %s: one call per reader for %.0f s", method, UNBATCHED_RETRY)
                    self._unbatched_until = time.monotonic() + UNBATCHED_RETRY
            await asyncio.gather(*(one(r, deadline.left()) for r in part))

    # --- sandboxes and hosts ------------------------------------------------------------

    async def put_sandbox(self, sandbox: SandboxInstance, *, timeout: float | None = None) -> None:
        await self._unary("PutSandbox", pb.PutSandboxRequest(sandbox=sandbox), timeout)

    async def get_sandbox(self, sandbox_key: str, *, timeout: float | None = None) -> SandboxInstance | None:
        r = await self._unary("GetSandbox", pb.GetSandboxRequest(sandbox_key=sandbox_key), timeout,
                              idempotent=True)
        return r.sandbox if r.HasField("sandbox") else None

    async def delete_sandbox(self, sandbox_key: str, *, timeout: float | None = None) -> None:
        await self._unary("DeleteSandbox", pb.DeleteSandboxRequest(sandbox_key=sandbox_key), timeout)

    async def register_host(self, host: HostInfo, *, timeout: float | None = None) -> None:
        """Register (or update) a host under ``host.session_id``; it vanishes with the session."""
        await self._unary("RegisterHost", pb.RegisterHostRequest(host=host), timeout)

    async def list_hosts(self, *, timeout: float | None = None) -> list[HostInfo]:
        """Live hosts."""
        r = await self._unary("ListHosts", pb.ListHostsRequest(), timeout, idempotent=True)
        return list(r.hosts)

    async def reap(self, ttl: float = 0, now: float = 0, *, timeout: float | None = None) -> dict[str, int]:
        """One reaper sweep now → outcome counts. ``0`` = configured TTL / coordinator clock."""
        r = await self._unary("Reap", pb.ReapRequest(ttl_seconds=ttl, now=now), timeout or 60.0)
        return dict(r.outcomes)
