"""The ``baton.v1.Coordinator`` gRPC servicer: validation and error mapping at the edge.

Each handler validates its request (ids per :func:`baton.ids.validate_id`), gives the store a
budget that ends before the caller's deadline (so an unreachable etcd answers
``UNAVAILABLE`` in time, never a hang), and maps domain errors once via
:mod:`baton.grpc_errors`.
"""
from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Sequence, TypeVar

import grpc

from baton import errors, keep
from baton.grpc_errors import abort
from baton.ids import validate_id, validate_input_id
from baton.runs import MAX_INPUT_TEXT, MAX_READERS_PER_CALL
from baton.v1 import coordinator_pb2 as pb
from baton.v1 import coordinator_pb2_grpc as pb_grpc
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus

from coordinator import _etcd as E
from coordinator import _intents
from coordinator._records import check_enums, check_paths
from coordinator.rules import kept_until_of
from coordinator._store import PURPOSES, RunStore, UpdateOutcome
from coordinator._etcd import LeaseNotFound
from coordinator._liveness import FastFailover, StreamKeeper
from coordinator._metrics import CoordinatorMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")
Reaper = Callable[[float, float], Awaitable[dict[str, int]]]

#: Most runs one ListRuns page may hold (a page of records stays well under 1 MiB).
MAX_PAGE = 1000
# Leave the caller part of its deadline to receive our UNAVAILABLE answer (a loaded host
# needs more than a few milliseconds to send it).
_DEADLINE_SLACK = 0.1
_DEADLINE_SLACK_SHARE = 0.1
_OUTCOMES = {
    UpdateOutcome.APPLIED: pb.UPDATE_OUTCOME_APPLIED,
    UpdateOutcome.SUPPRESSED: pb.UPDATE_OUTCOME_SUPPRESSED,
    UpdateOutcome.UNKNOWN_RUN: pb.UPDATE_OUTCOME_UNKNOWN_RUN,
}


async def no_reaper(ttl: float, now: float) -> dict[str, int]:
    """The default reaper: does nothing (the real one is wired in ``coordinator._wiring``)."""
    return {}


#: Bytes of a queued run's start request (its messages, agent and workspace).
MAX_QUEUED_START = 1024 * 1024


def check_run_input(request: pb.PutRunInputRequest) -> None:
    """Validate a ``PutRunInput`` request's shape (the rules judge it against the record).

    Raises:
        InvalidArgument: unknown op; an input id that is not an id; an answer whose decision
            is not allow/deny; REQUEST/EXPIRE/CLOSE without a session and epoch; a negative
            ``known_inputs``; a text field over
            :data:`MAX_INPUT_TEXT` bytes.
    """
    op, given = request.op, request.input
    if op not in (pb.PutRunInputRequest.REQUEST, pb.PutRunInputRequest.ANSWER,
                  pb.PutRunInputRequest.EXPIRE, pb.PutRunInputRequest.STEER, pb.PutRunInputRequest.CLOSE):
        raise errors.InvalidArgument("op", "must be REQUEST, ANSWER, EXPIRE, STEER or CLOSE")
    if op == pb.PutRunInputRequest.CLOSE:
        if not (request.session_id and request.epoch):
            raise errors.InvalidArgument("session_id", "CLOSE needs the claim's session and epoch")
        if request.known_inputs < 0:
            raise errors.InvalidArgument("known_inputs", "must be >= 0")
        return
    validate_input_id(given.id, "input.id")
    if op == pb.PutRunInputRequest.ANSWER and given.decision not in ("allow", "deny"):
        raise errors.InvalidArgument("input.decision", "must be allow or deny")
    if op in (pb.PutRunInputRequest.REQUEST, pb.PutRunInputRequest.EXPIRE) and not (
            request.session_id and request.epoch):
        raise errors.InvalidArgument("session_id", "REQUEST and EXPIRE need the claim's session and epoch")
    for name in ("tool_input_json", "message", "updated_input_json"):
        if len(getattr(given, name).encode()) > MAX_INPUT_TEXT:
            raise errors.InvalidArgument(f"input.{name}", f"must be at most {MAX_INPUT_TEXT} bytes")


def _positive(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise errors.InvalidArgument(field, "must be a finite number >= 0")
    return value


def _session(value: int, field: str = "session_id") -> int:
    if value <= 0:
        raise errors.InvalidArgument(field, "must be a session id from OpenSession")
    return value


def _reader_ids(values: Sequence[str]) -> tuple[str, ...]:
    """The reader ids of a batched presence call, each checked; a repeated id counts once.

    Raises:
        InvalidArgument: none, more than :data:`MAX_READERS_PER_CALL` distinct ids, or a bad id
            (``reader_ids[i]``: the ``i``-th distinct id).
    """
    ids = tuple(dict.fromkeys(values))
    if not 1 <= len(ids) <= MAX_READERS_PER_CALL:
        raise errors.InvalidArgument("reader_ids", f"must name 1 to {MAX_READERS_PER_CALL} distinct readers")
    for i, v in enumerate(ids):
        validate_id(v, f"reader_ids[{i}]")
    return ids


class CoordinatorService(pb_grpc.CoordinatorServicer):
    """Serves every Coordinator RPC from one :class:`RunStore`.

    Args:
        store: the etcd-backed store.
        etcd_timeout: seconds an RPC may spend on etcd when the caller set no deadline.
        detached_run_ttl: seconds, for ``reap_at`` and the default ``Reap`` TTL.
        reaper: one reaper sweep ``(ttl, now) -> outcome counts``.
        fast_failover: judges broken keep-alive streams; default: disabled (TTL only).
    """

    def __init__(self, store: RunStore, *, etcd_timeout: float, detached_run_ttl: float,
                 reaper: Reaper = no_reaper, fast_failover: FastFailover | None = None,
                 metrics: CoordinatorMetrics | None = None) -> None:
        self.store = store
        self.metrics = metrics or CoordinatorMetrics()
        self.fast_failover = fast_failover or FastFailover(store, enabled=False, etcd_timeout=etcd_timeout)
        self.etcd_timeout = etcd_timeout
        self.detached_run_ttl = detached_run_ttl
        self.reaper = reaper
        self._stopping = asyncio.Event()

    def stop_streams(self) -> None:
        """Ends every open WatchRun/KeepAlive stream (graceful shutdown)."""
        self._stopping.set()

    def _budget(self, context: grpc.aio.ServicerContext[Any, Any]) -> float:
        left = context.time_remaining()
        if left is None:
            return self.etcd_timeout
        slack = max(_DEADLINE_SLACK, left * _DEADLINE_SLACK_SHARE)
        return max(min(self.etcd_timeout, left - slack), 0.001)

    async def _call(self, context: grpc.aio.ServicerContext[Any, Any], coro: Awaitable[T]) -> T:
        try:
            return await coro
        except errors.BatonError as exc:
            if isinstance(exc, errors.RunClaimLost):
                self.metrics.fenced_writes.labels("other").inc()
            await abort(context, exc)
        raise AssertionError("unreachable")

    # --- run records ------------------------------------------------------------------

    async def CreateOrResumeRun(self, request: pb.CreateOrResumeRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.CreateOrResumeRunResponse:
        async def go() -> pb.CreateOrResumeRunResponse:
            rec = request.record
            validate_id(rec.run_id, "record.run_id")
            validate_id(rec.thread_id, "record.thread_id")
            if rec.parent_run_id:
                validate_id(rec.parent_run_id, "record.parent_run_id")
            if rec.tenant:
                validate_id(rec.tenant, "record.tenant")
            check_enums(rec, "record")
            out, created = await self.store.create_or_resume(rec, request.interrupt_active,
                                                             timeout=self._budget(context))
            return pb.CreateOrResumeRunResponse(record=out, created=created)
        return await self._call(context, go())

    async def GetRun(self, request: pb.GetRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.GetRunResponse:
        async def go() -> pb.GetRunResponse:
            validate_id(request.run_id, "run_id")
            rec, claim = await self.store.get_run(request.run_id, timeout=self._budget(context))
            if rec is None:
                raise errors.UnknownRun(request.run_id)
            resp = pb.GetRunResponse(record=rec)
            if claim is not None:
                resp.claim.CopyFrom(claim)
            if rec.status == RunStatus.RUN_STATUS_RUNNING and rec.HasField("detached_since"):
                resp.reap_at = keep.reap_deadline(rec.detached_since, self.detached_run_ttl, kept_until_of(rec))
            return resp
        return await self._call(context, go())

    async def UpdateRun(self, request: pb.UpdateRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.UpdateRunResponse:
        async def go() -> pb.UpdateRunResponse:
            validate_id(request.run_id, "run_id")
            paths = check_paths(request.update_mask.paths)
            if not paths:
                raise errors.InvalidArgument("update_mask", "must name at least one field")
            if request.epoch < 0:
                raise errors.InvalidArgument("epoch", "must be >= 0")
            check_enums(request.record, "record")
            outcome, rec = await self.store.update_run(
                request.run_id, request.record, paths, request.epoch, request.session_id,
                timeout=self._budget(context))
            if outcome is UpdateOutcome.SUPPRESSED:
                self.metrics.fenced_writes.labels("update_run").inc()
            resp = pb.UpdateRunResponse(outcome=_OUTCOMES[outcome])
            if rec is not None:
                resp.record.CopyFrom(rec)
            return resp
        return await self._call(context, go())

    async def FindActiveRun(self, request: pb.FindActiveRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.FindActiveRunResponse:
        async def go() -> pb.FindActiveRunResponse:
            validate_id(request.thread_id, "thread_id")
            rec = await self.store.find_active_run(request.thread_id, timeout=self._budget(context))
            return pb.FindActiveRunResponse(record=rec) if rec is not None else pb.FindActiveRunResponse()
        return await self._call(context, go())

    async def ListRuns(self, request: pb.ListRunsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListRunsResponse:
        async def go() -> pb.ListRunsResponse:
            if request.thread_id:
                validate_id(request.thread_id, "thread_id")
            if request.tenant:
                validate_id(request.tenant, "tenant")
            if request.limit < 0:
                raise errors.InvalidArgument("limit", "must be >= 0")
            if not 0 <= request.page_size <= MAX_PAGE:
                raise errors.InvalidArgument("page_size", f"must be in [0, {MAX_PAGE}]")
            if request.page_size and request.thread_id:
                raise errors.InvalidArgument("page_size", "pages list a tenant's runs, not a thread's")
            budget = self._budget(context)
            if request.page_size:
                recs, token = await self.store.list_page(request.tenant, request.page_size, request.page_token,
                                                         timeout=budget)
                return pb.ListRunsResponse(records=recs, next_page_token=token)
            recs = await self.store.list_runs(request.thread_id, request.tenant, request.limit,
                                              timeout=budget)
            owner = await self.store.thread_tenant(request.thread_id, timeout=budget) if request.thread_id else ""
            return pb.ListRunsResponse(records=recs, thread_tenant=owner)
        return await self._call(context, go())

    async def ListReclaimable(self, request: pb.ListReclaimableRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListReclaimableResponse:
        async def go() -> pb.ListReclaimableResponse:
            now = _positive(request.now, "now") or self.store.clock()
            ttl = _positive(request.ttl_seconds, "ttl_seconds")
            if request.limit < 0:
                raise errors.InvalidArgument("limit", "must be >= 0")
            recs = await self.store.list_reclaimable(now, ttl, request.limit, timeout=self._budget(context))
            return pb.ListReclaimableResponse(records=recs)
        return await self._call(context, go())

    async def RequestRunCancel(self, request: pb.RequestRunCancelRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RequestRunCancelResponse:
        async def go() -> pb.RequestRunCancelResponse:
            validate_id(request.run_id, "run_id")
            if len(request.reason.encode()) > 256:
                raise errors.InvalidArgument("reason", "must be at most 256 bytes")
            if request.HasField("tenant"):
                found = await _intents.user_cancel(self.store, request.run_id, request.reason or "user",
                                                   request.tenant, timeout=self._budget(context))
                if found is None:
                    return pb.RequestRunCancelResponse(intent=True)
                return pb.RequestRunCancelResponse(record=found)
            rec = await self.store.request_cancel(request.run_id, request.reason or "user",
                                                  timeout=self._budget(context))
            return pb.RequestRunCancelResponse(record=rec)
        return await self._call(context, go())

    async def PutRunInput(self, request: pb.PutRunInputRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.PutRunInputResponse:
        async def go() -> pb.PutRunInputResponse:
            validate_id(request.run_id, "run_id")
            check_run_input(request)
            outcome, rec, existing = await self.store.put_run_input(
                request.run_id, request.op, request.input, tenant=request.tenant,
                session_id=request.session_id, epoch=request.epoch, now=request.now,
                known_inputs=request.known_inputs, timeout=self._budget(context))
            return pb.PutRunInputResponse(outcome=outcome, record=rec, existing=existing)  # type: ignore[arg-type]
        return await self._call(context, go())

    async def EnqueueRun(self, request: pb.EnqueueRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.EnqueueRunResponse:
        async def go() -> pb.EnqueueRunResponse:
            run = request.run
            validate_id(run.run_id, "run.run_id")
            validate_id(run.thread_id, "run.thread_id")
            if run.strategy not in ("enqueue", "interrupt"):
                raise errors.InvalidArgument("run.strategy", "must be enqueue or interrupt")
            if len(run.start_request) > MAX_QUEUED_START or len(run.prompt.encode()) > MAX_INPUT_TEXT:
                raise errors.InvalidArgument("run.start_request", f"must be at most {MAX_QUEUED_START} bytes")
            if run.enqueued_at <= 0:
                run.enqueued_at = self.store.clock()
            outcome, position, active = await self.store.enqueue_run(run, timeout=self._budget(context))
            return pb.EnqueueRunResponse(outcome=outcome, position=position, active_run_id=active)  # type: ignore[arg-type]
        return await self._call(context, go())

    async def ListQueuedRuns(self, request: pb.ListQueuedRunsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListQueuedRunsResponse:
        async def go() -> pb.ListQueuedRunsResponse:
            if request.thread_id:
                validate_id(request.thread_id, "thread_id")
            if request.run_id:
                validate_id(request.run_id, "run_id")
            runs = await self.store.list_queued_runs(
                request.thread_id, tenant=request.tenant if request.HasField("tenant") else None,
                run_id=request.run_id, timeout=self._budget(context))
            return pb.ListQueuedRunsResponse(runs=runs)
        return await self._call(context, go())

    async def RemoveQueuedRun(self, request: pb.RemoveQueuedRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RemoveQueuedRunResponse:
        async def go() -> pb.RemoveQueuedRunResponse:
            validate_id(request.thread_id, "thread_id")
            validate_id(request.run_id, "run_id")
            remove = self.store.cancel_queued_run if request.user_cancel else self.store.remove_queued_run
            removed = await remove(
                request.thread_id, request.run_id, tenant=request.tenant if request.HasField("tenant") else None,
                timeout=self._budget(context))
            return pb.RemoveQueuedRunResponse(removed=removed)
        return await self._call(context, go())

    # --- sessions ---------------------------------------------------------------------

    async def OpenSession(self, request: pb.OpenSessionRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.OpenSessionResponse:
        async def go() -> pb.OpenSessionResponse:
            ttl = _positive(request.ttl_seconds, "ttl_seconds")
            if ttl > 3600:
                raise errors.InvalidArgument("ttl_seconds", "must be at most 3600")
            if request.owner:
                validate_id(request.owner, "owner")
            sid, granted = await self.store.open_session(ttl or 2.0, request.owner,
                                                         timeout=self._budget(context))
            return pb.OpenSessionResponse(session_id=sid, ttl_seconds=float(granted))
        return await self._call(context, go())

    async def KeepAlive(self, request_iterator: AsyncIterator[pb.KeepAliveRequest], context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[pb.KeepAliveResponse]:
        """Refresh leases for as long as the client streams requests.

        Each request refreshes its session's lease through one etcd keep-alive stream; the
        answer's ``ttl_seconds <= 0`` says the session is gone. When etcd is unreachable the
        stream ends with ``UNAVAILABLE`` and the client reconnects (to any replica). A
        stream that ends by the client's side (a reset connection, a cancel) is judged by
        :class:`FastFailover`, which revokes the lease of a process that is gone.
        """
        ka = self.store.etcd.keepalive_stream()
        stream = StreamKeeper()
        sessions: set[int] = set()  # ids this stream found to be sessions (checked once each)
        # grpcio's server reports a reset connection as the plain end of the request stream
        # (not as a cancellation), so every end this handler did not cause is judged; the
        # probe, not the way the stream ended, is what is definite.
        ended_here = False
        try:
            async for req in request_iterator:
                if self._stopping.is_set():
                    ended_here = True
                    break
                if req.session_id <= 0:
                    ended_here = True
                    await abort(context, errors.InvalidArgument("session_id", "must be a session id"))
                try:
                    if req.session_id in sessions or await self._is_session(req.session_id):
                        sessions.add(req.session_id)
                        ttl = await ka.refresh(req.session_id, timeout=self.etcd_timeout)
                    else:
                        ttl = 0  # not a session's lease (the election's, an intent's): left to expire
                except errors.StoreUnavailable as exc:
                    ended_here = True
                    await abort(context, exc)
                except LeaseNotFound:
                    ttl = 0
                if ttl > 0:
                    self.fast_failover.refreshed(stream, req.session_id, req.probe_address)
                yield pb.KeepAliveResponse(session_id=req.session_id, ttl_seconds=float(ttl))
        finally:
            ka.close()
            stream.ended = True
            if not ended_here and not self._stopping.is_set():
                self.fast_failover.broken(stream)

    async def _is_session(self, lease_id: int) -> bool:
        """Whether ``lease_id`` is a session's lease (its ``sessions/<lease>`` key is on it)."""
        k = self.store.keys.session(lease_id)
        txn = await self.store.etcd.txn([E.cmp_lease(k, lease_id)], [], timeout=self.etcd_timeout)
        return bool(txn.succeeded)

    async def CloseSession(self, request: pb.CloseSessionRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.CloseSessionResponse:
        async def go() -> pb.CloseSessionResponse:
            await self.store.close_session(_session(request.session_id), timeout=self._budget(context))
            return pb.CloseSessionResponse()
        return await self._call(context, go())

    # --- claims -----------------------------------------------------------------------

    async def ClaimRun(self, request: pb.ClaimRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ClaimRunResponse:
        async def go() -> pb.ClaimRunResponse:
            validate_id(request.run_id, "run_id")
            validate_id(request.host_id, "host_id")
            purpose = request.purpose or "drive"
            if purpose not in PURPOSES:
                raise errors.InvalidArgument("purpose", "must be 'drive' or 'finalize'")
            t0, outcome = time.monotonic(), "error"
            try:
                epoch, rec = await self.store.claim_run(request.run_id, _session(request.session_id),
                                                        request.host_id, purpose,
                                                        timeout=self._budget(context),
                                                        require_started=request.require_started)
                outcome = "claimed"
            except errors.RunClaimNotAcquired as refused:
                outcome = refused.reason
                raise
            finally:
                self.metrics.claim_seconds.labels(purpose, outcome).observe(time.monotonic() - t0)
            answer = pb.ClaimRunResponse(epoch=epoch, record=rec)
            if request.with_sandbox and rec.sandbox_key:
                # The claim landed: its answer must not be lost to this read. A failed read
                # answers without the entry, and the host reads it itself.
                try:
                    sb = await self.store.get_sandbox(rec.sandbox_key, timeout=self._budget(context))
                except errors.StoreUnavailable:
                    return answer
                answer.sandbox_read = True
                if sb is not None:
                    answer.sandbox.CopyFrom(sb)
            return answer
        return await self._call(context, go())

    async def ReleaseClaim(self, request: pb.ReleaseClaimRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ReleaseClaimResponse:
        async def go() -> pb.ReleaseClaimResponse:
            validate_id(request.run_id, "run_id")
            ok = await self.store.release_claim(request.run_id, _session(request.session_id),
                                                request.epoch, timeout=self._budget(context))
            return pb.ReleaseClaimResponse(released=ok)
        return await self._call(context, go())

    async def WatchRun(self, request: pb.WatchRunRequest, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[pb.WatchRunResponse]:
        """Stream (record, claim) now and after every change, until the client leaves.

        Ends with ``UNAVAILABLE`` when etcd goes away, so the client re-subscribes.
        """
        try:
            validate_id(request.run_id, "run_id")
        except errors.BatonError as exc:
            await abort(context, exc)
        stop = asyncio.ensure_future(self._stopping.wait())
        it = self.store.watch_run(request.run_id, timeout=self._budget(context)).__aiter__()
        # The pending ``__anext__`` lives in its own task; it must be finished before the
        # generator is closed, or ``aclose()`` finds the generator still running (a client
        # that cancels the stream cancels this handler while that task is mid-step).
        nxt: asyncio.Future[tuple[RunRecord | None, Claim | None]] | None = None
        try:
            while True:
                nxt = asyncio.ensure_future(it.__anext__())
                done, _ = await asyncio.wait({nxt, stop}, return_when=asyncio.FIRST_COMPLETED)
                if nxt not in done:
                    return
                try:
                    rec, claim = nxt.result()
                except StopAsyncIteration:
                    return
                except errors.BatonError as exc:
                    await abort(context, exc)
                resp = pb.WatchRunResponse()
                if rec is not None:
                    resp.record.CopyFrom(rec)
                if claim is not None:
                    resp.claim.CopyFrom(claim)
                yield resp
        finally:
            pending = [f for f in (stop, nxt) if f is not None and not f.done()]
            for f in pending:
                f.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await it.aclose()  # type: ignore[attr-defined]

    # --- presence ---------------------------------------------------------------------

    async def RegisterReader(self, request: pb.RegisterReaderRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RegisterReaderResponse:
        async def go() -> pb.RegisterReaderResponse:
            validate_id(request.run_id, "run_id")
            validate_id(request.reader_id, "reader_id")
            await self.store.register_reader(request.run_id, _session(request.session_id),
                                             request.reader_id, timeout=self._budget(context))
            return pb.RegisterReaderResponse()
        return await self._call(context, go())

    async def UnregisterReader(self, request: pb.UnregisterReaderRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.UnregisterReaderResponse:
        async def go() -> pb.UnregisterReaderResponse:
            validate_id(request.run_id, "run_id")
            validate_id(request.reader_id, "reader_id")
            await self.store.unregister_reader(request.run_id, request.reader_id,
                                               timeout=self._budget(context))
            return pb.UnregisterReaderResponse()
        return await self._call(context, go())

    async def RegisterReaders(self, request: pb.RegisterReadersRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RegisterReaderResponse:
        async def go() -> pb.RegisterReaderResponse:
            validate_id(request.run_id, "run_id")
            ids = _reader_ids(request.reader_ids)
            await self.store.register_readers(request.run_id, _session(request.session_id), ids,
                                              timeout=self._budget(context))
            return pb.RegisterReaderResponse()
        return await self._call(context, go())

    async def UnregisterReaders(self, request: pb.UnregisterReadersRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.UnregisterReaderResponse:
        async def go() -> pb.UnregisterReaderResponse:
            validate_id(request.run_id, "run_id")
            ids = _reader_ids(request.reader_ids)
            await self.store.unregister_readers(request.run_id, ids, timeout=self._budget(context))
            return pb.UnregisterReaderResponse()
        return await self._call(context, go())

    # --- sandboxes and hosts ----------------------------------------------------------

    async def PutSandbox(self, request: pb.PutSandboxRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.PutSandboxResponse:
        async def go() -> pb.PutSandboxResponse:
            sb = request.sandbox
            validate_id(sb.sandbox_key, "sandbox.sandbox_key")
            if sb.run_id:
                validate_id(sb.run_id, "sandbox.run_id")
            if sb.provider not in ("local", "docker", "kubernetes"):
                raise errors.InvalidArgument("sandbox.provider", "must be 'local', 'docker' or 'kubernetes'")
            await self.store.put_sandbox(sb, timeout=self._budget(context))
            return pb.PutSandboxResponse()
        return await self._call(context, go())

    async def GetSandbox(self, request: pb.GetSandboxRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.GetSandboxResponse:
        async def go() -> pb.GetSandboxResponse:
            validate_id(request.sandbox_key, "sandbox_key")
            sb = await self.store.get_sandbox(request.sandbox_key, timeout=self._budget(context))
            return pb.GetSandboxResponse(sandbox=sb) if sb is not None else pb.GetSandboxResponse()
        return await self._call(context, go())

    async def DeleteSandbox(self, request: pb.DeleteSandboxRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.DeleteSandboxResponse:
        async def go() -> pb.DeleteSandboxResponse:
            validate_id(request.sandbox_key, "sandbox_key")
            await self.store.delete_sandbox(request.sandbox_key, timeout=self._budget(context))
            return pb.DeleteSandboxResponse()
        return await self._call(context, go())

    async def RegisterHost(self, request: pb.RegisterHostRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.RegisterHostResponse:
        async def go() -> pb.RegisterHostResponse:
            h = request.host
            validate_id(h.host_id, "host.host_id")
            validate_id(h.address, "host.address")
            if h.capacity < 0:
                raise errors.InvalidArgument("host.capacity", "must be >= 0")
            await self.store.register_host(h, timeout=self._budget(context))
            return pb.RegisterHostResponse()
        return await self._call(context, go())

    async def ListHosts(self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ListHostsResponse:
        async def go() -> pb.ListHostsResponse:
            return pb.ListHostsResponse(hosts=await self.store.list_hosts(timeout=self._budget(context)))
        return await self._call(context, go())

    async def Reap(self, request: pb.ReapRequest, context: grpc.aio.ServicerContext[Any, Any]) -> pb.ReapResponse:
        async def go() -> pb.ReapResponse:
            ttl = _positive(request.ttl_seconds, "ttl_seconds") or self.detached_run_ttl
            now = _positive(request.now, "now") or self.store.clock()
            counts = await self.reaper(ttl, now)
            return pb.ReapResponse(outcomes={k: int(v) for k, v in counts.items()})
        return await self._call(context, go())
