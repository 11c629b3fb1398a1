"""The run service: every run operation of the gateway, whatever the edge.

HTTP (``gateway._routes_*``), gRPC (``gateway._grpc``) and Durable Streams
(``gateway.durable_streams._runs``) parse their own format into the requests of
:mod:`gateway._service._requests`, call one method here, and render its answer in their
format. Tenancy is checked here: ``tenant`` is the caller's tenant (``""`` without auth).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from baton import errors as e
from baton.ids import page_position, page_token, thread_run_position
from baton.runs import TERMINAL_PB
from baton.v1 import runs_pb2
from gateway._reader import OffsetCheck, RunRead
from gateway._snapshots import log_compacted, parse_snapshot_cursor
from gateway._service import _cancel, _hydration, _inputs, _keep, _queue, _start, _threads, _views
from gateway._service._cancel import CancelOutcome
from gateway._service._requests import (CancelRequest, JoinRequest, ListRunsRequest, StartLimits, StartRequest,
                                        agent_list)
from gateway._state import GatewayState

log = logging.getLogger("gateway.service")


def _position(record: runs_pb2.RunRecord) -> bytes:
    """Where a run sits among its thread's runs: its number, not its clock (baton/thread_order.py)."""
    return thread_run_position(record.thread_seq, record.started_at, record.run_id)


def _drop(task: "asyncio.Task[Any]") -> None:
    """Cancel a lookup whose answer is not wanted; its outcome, whatever it is, goes unread."""
    task.cancel()
    task.add_done_callback(lambda t: t.cancelled() or t.exception())


class RunService:
    """The gateway's run operations over one app's state (built in the app's lifespan).

    Args:
        state: the app's clients and owned tasks.
    """

    def __init__(self, state: GatewayState) -> None:
        self.state = state

    @property
    def limits(self) -> StartLimits:
        """What a start request is checked against."""
        s = self.state.settings
        return StartLimits(s.replay_dirs, s.default_agent, s.max_messages, s.workspace_dirs)

    # --- streams --------------------------------------------------------------------------

    async def start(self, tenant: str, req: StartRequest, *, resume_after: str = "-1") -> RunRead:
        """Start the run on a host (or serve the run its id already names) and read its log.

        Args:
            resume_after: where to serve an existing run's log from (a reconnect's offset).

        Returns:
            The read (not yet open). A run started with ``cancel_on_disconnect`` is
            cancelled when the read is closed before its log ended.

        Raises:
            UnknownRun, UnknownThread, InvalidArgument, ThreadBusy, NoHostAvailable,
            StartFailed (a 5xx cause, ``runExists``), LogStorageFull, …
        """
        st = self.state
        after = await _start.open_start(st, req, tenant, resume_after)
        on_disconnect = None
        if req.cancel_on_disconnect:
            run_id = req.run_id

            async def on_disconnect() -> None:
                # Started with detachOnDisconnect: false: the client leaving cancels the run.
                log.info("client of run %s left; cancelling it (detachOnDisconnect: false)", run_id)
                st.spawn(_cancel.request_cancel(st, run_id, "client-disconnected"), name=f"cancel:{run_id}")
        return RunRead(st, req.run_id, after, on_disconnect=on_disconnect)

    async def start_or_queue(self, tenant: str, req: StartRequest, *, resume_after: str = "-1"
                             ) -> RunRead | _queue.Queued | _queue.Steered:
        """:meth:`start`, with ``req.multitask`` deciding what a busy thread does with the run
        (docs/hitl.md): ``reject`` raises ``ThreadBusy``; ``enqueue`` answers the run's place
        in the queue; ``interrupt`` cancels the active run and reads this run once it started
        (its place in the queue when that takes longer than ``INTERRUPT_WAIT``); ``steer``
        answers the active run and the message's input id.

        Raises:
            As :meth:`start`; a steer's errors (``RunEnded``, ``SteerUnsupported``...).
        """
        for _ in range(3):
            placed = await _queue.queue_or_steer(self.state, tenant, req, req.multitask)
            if isinstance(placed, _queue.Queued):
                if req.multitask == "interrupt" and await _queue.wait_started(self.state, req.run_id):
                    return await self.join(tenant, JoinRequest(req.run_id, "-1"))
                return placed
            if placed is not None:
                return placed
            try:
                return await self.start(tenant, req, resume_after=resume_after)
            except e.ThreadBusy:
                if req.multitask == "reject":
                    raise
                # The thread became busy between the look and the start: place it again.
        raise e.StoreUnavailable("the thread's active run kept changing")

    def _scope(self, tenant: str) -> str | None:
        """The tenant a coordinator read is scoped to (``None`` without auth)."""
        return tenant if self.state.settings.auth_enabled else None

    async def list_queue(self, tenant: str, thread_id: str) -> list[Any]:
        """The thread's queued runs, next first (``UnknownThread`` for another tenant's; a
        thread without runs has an empty queue)."""
        await _views.thread_visible_for(self.state, tenant, thread_id, must_exist=False)
        return list(await self.state.coordinator.list_queued_runs(thread_id, tenant=self._scope(tenant)))

    async def cancel_queued(self, tenant: str, thread_id: str, run_id: str) -> bool:
        """Take a queued run out of its thread's queue; ``False`` when it is not queued. A
        dispatcher starting it at the same moment either finds it gone (the run, if its start
        was on its way, is born cancelled: no agent launched) or started it first.

        Raises:
            QueuedRunStarted: the run started first: nothing removed.
        """
        return bool(await self.state.coordinator.remove_queued_run(thread_id, run_id, tenant=self._scope(tenant),
                                                                   user_cancel=True))

    async def queued_run(self, tenant: str, run_id: str) -> Any | None:
        """The queued run ``run_id`` of ``tenant`` (with its position), or ``None``."""
        found = await self.state.coordinator.list_queued_runs(run_id=run_id, tenant=self._scope(tenant))
        return found[0] if found else None

    async def join(self, tenant: str, req: JoinRequest) -> RunRead:
        """A run's log strictly after ``req.after``; looks at the run for a takeover.

        Waits briefly for a run that does not exist yet (a client minting run ids may join
        before its start landed).

        Raises:
            UnknownRun: no such run (or another tenant's). StoreUnavailable, LogUnavailable.
        """
        st = self.state
        # A resume's offset check (the log's tail and the run's first record) begins beside
        # the run's lookup (a coordinator RPC): neither needs the other. Its answer reaches
        # the caller only through the read, once the lookup showed the run to this tenant;
        # a lookup that fails drops it; one that has to wait for the run drops it too (stale
        # by then), and the read checks again when it opens.
        check = OffsetCheck(st, req.run_id, req.after) if req.after.isascii() and req.after.isdigit() else None
        if check is not None and not st.settings.auth_enabled and req.keep_ttl <= 0:
            read = await self._resume_without_auth(req.run_id, req.after, check)
            if read is not None:
                return read
        try:
            view = await _views.join_view_for(st, tenant, req.run_id,
                                              waiting=check.discard if check is not None else None)
            st.takeovers.consider(req.run_id, view.record if view else None, view.claim if view else None)
            if req.keep_ttl > 0 and view is not None and view.record.status not in TERMINAL_PB:
                try:
                    await _keep.keep_run(st, tenant, _keep.KeepRequest(req.run_id, req.keep_ttl))
                except e.RunEnded:
                    pass  # it ended meanwhile: nothing to keep, the join serves its end
            gone = view is not None and await self._log_gone(view.record)
        except BaseException:
            if check is not None:
                await check.discard()
            raise
        if check is not None:  # a decimal offset: no snapshot, no compaction question
            return RunRead(st, req.run_id, req.after, gone=gone, check=check)
        after, snapshot = req.after, None
        if after == "-1" and not gone and await log_compacted(st.log, req.run_id):
            # Its chunks are gone, its final snapshot stands for them: say so, then serve it.
            served = await st.snapshots.latest(st.log, req.run_id)
            if served is not None:
                after, snapshot = str(served.offset), served.compacted()
        elif after == "snapshot":
            # The latest snapshot, then every chunk strictly after the offset it covers; a run
            # without one yet is read from the start (docs/api.md "Joining from a snapshot").
            if gone:
                snapshot = None
            elif req.messages:
                # Its newest messages only, after a snapshot.window event naming what was left out.
                snapshot = await st.snapshots.newest(st.log, req.run_id, req.messages)  # LogUnavailable
            else:
                snapshot = await st.snapshots.latest(st.log, req.run_id)  # LogUnavailable
            after = "-1" if snapshot is None else str(snapshot.offset)
        return RunRead(st, req.run_id, after, gone=gone, snapshot=snapshot)

    async def run_messages(self, tenant: str, run_id: str, limit: int, before: str | None) -> dict[str, Any]:
        """A page of the messages of the run's latest snapshot, newest first (the older messages
        a ``snapshot.window`` join left out): ``{messages: [JSON bytes], total, first_index,
        cursor, snapshot_offset}`` (``snapshot_offset`` ``None``: the run has no snapshot yet,
        and no messages are answered).

        Raises:
            UnknownRun: no such run (or another tenant's). InvalidArgument: ``before`` is not a
                cursor of this run's messages. LogUnavailable.
        """
        st = self.state
        parsed = parse_snapshot_cursor(before)  # InvalidArgument before anything is read
        await _views.join_view_for(st, tenant, run_id, wait=0)  # the tenant check of a join
        # A cursor names the snapshot it came from (a later one may have placed a tool result
        # before its position); when that one is gone, the latest, checked by the message id.
        served = None if parsed is None else await st.snapshots.at(st.log, run_id, parsed[2])
        served = served or await st.snapshots.latest(st.log, run_id)
        if served is None or served.msg_ends is None:
            if before:
                raise e.InvalidArgument("before", "is not a cursor of this run's messages")
            return {"messages": [], "total": 0, "first_index": 0, "cursor": "",
                    "snapshot_offset": None if served is None else served.offset}
        msgs, start, cursor = served.page(limit, before)
        return {"messages": msgs, "total": served.total, "first_index": start, "cursor": cursor,
                "snapshot_offset": served.offset}

    def read(self, run_id: str, after: str, *, until: int | None = None, presence: bool = True) -> RunRead:
        """A read of a run the caller was already shown (see :meth:`read_view`)."""
        return RunRead(self.state, run_id, after, until=until, presence=presence)

    async def read_view(self, tenant: str, run_id: str, *, reading: bool) -> Any:
        """The run's ``RunView`` for a reader of its log; ``reading``: look at it for a takeover.

        Raises:
            UnknownRun: no record, or another tenant's. StoreUnavailable.
        """
        view = await _views.run_view_for(self.state, tenant, run_id)
        if reading:
            self.state.takeovers.consider(run_id, view.record, view.claim)
        return view

    async def closed_after(self, run_id: str, after: str, *, tail_read: bool = False, tail: Any = None) -> bool:
        """Whether the run's log is closed with no chunk after ``after`` (a decimal offset).

        Args:
            tail_read: ``tail`` is the log's last record as just read (a reader's offset
                check, :attr:`RunRead.log_tail`): it is not read again.
            tail: that record (``None``: the log is empty).

        Raises:
            LogUnavailable: JetStream did not answer.
        """
        st = self.state
        if after in ("-1", "now", "snapshot"):
            return False
        if not tail_read:
            tail = await st.log.last_record(run_id)
        if tail is None or tail.kind != "close":
            return False
        if tail.offset <= int(after):
            return True  # closed at or before the offset: nothing can come after it
        reader = st.log.read(run_id, after=after)
        try:
            async with asyncio.timeout(_cancel.CONFIRMATION_READ_TIMEOUT):
                async for _item in reader:
                    return False
        except (TimeoutError, e.BatonError):
            return False  # let the stream itself answer (a gap, or the rest)
        finally:
            await reader.aclose()
        return True

    async def _resume_without_auth(self, run_id: str, after: str, check: OffsetCheck) -> RunRead | None:
        """A resume on a gateway without auth, when the run's log has records: served without
        waiting for the run's record (``None``: it has none, take the usual way).

        Without auth the record decides nothing such a read needs: a run with a log exists
        (:func:`_views.join_view_for` serves a log without a record), and a log with records
        is not gone. The record is still looked up, beside the read, for the takeover look
        (:meth:`TakeoverTrigger.consider`, which never blocks a read either way).
        """
        st = self.state
        lookup = asyncio.get_running_loop().create_task(_views.maybe_view_for(st, "", run_id),
                                                        name=f"join-lookup:{run_id}")
        try:
            has_records = await check.log_has_records()
        except BaseException:
            _drop(lookup)
            raise
        if not has_records:
            _drop(lookup)
            return None
        if st.spawn(self._consider_takeover(run_id, lookup), name=f"join-takeover-look:{run_id}") is None:
            _drop(lookup)
        return RunRead(st, run_id, after, check=check)

    async def _consider_takeover(self, run_id: str, lookup: "asyncio.Task[Any]") -> None:
        try:
            view = await lookup
        except e.BatonError as exc:
            log.warning("run %s: its record was not read for the takeover look: %s", run_id, exc)
            return
        self.state.takeovers.consider(run_id, view.record if view else None, view.claim if view else None)

    async def _log_gone(self, record: runs_pb2.RunRecord) -> bool:
        """Whether a terminal run's whole log is gone (expired): readers then get a gap, not a wait.

        A run that is not terminal yet may simply not have written; a terminal run always
        wrote at least its close record, so an empty log means retention removed it.
        """
        if record.status not in TERMINAL_PB:
            return False
        try:
            return await self.state.log.last_record(record.run_id) is None
        except e.BatonError:
            return False

    # --- one-shot operations ----------------------------------------------------------------

    async def cancel(self, tenant: str, req: CancelRequest) -> CancelOutcome:
        """See :func:`gateway._service._cancel.cancel`."""
        return await _cancel.cancel(self.state, tenant, req)

    async def answer_approval(self, tenant: str, req: _inputs.ApprovalAnswer) -> runs_pb2.RunInput:
        """See :func:`gateway._service._inputs.answer`."""
        return await _inputs.answer(self.state, tenant, req)

    async def steer(self, tenant: str, req: _inputs.SteerRequest) -> runs_pb2.RunInput:
        """See :func:`gateway._service._inputs.steer`."""
        return await _inputs.steer(self.state, tenant, req)

    async def keep(self, tenant: str, req: _keep.KeepRequest) -> _keep.Kept:
        """See :func:`gateway._service._keep.keep_run`."""
        return await _keep.keep_run(self.state, tenant, req)

    async def run_view(self, tenant: str, run_id: str) -> Any:
        """The run's settled ``RunView`` (its end as its closed log tells it).

        Raises:
            UnknownRun, StoreUnavailable.
        """
        return await _views.settled_view_for(self.state, tenant, run_id)

    async def find_active_run(self, tenant: str, thread_id: str) -> runs_pb2.RunRecord | None:
        """The thread's active run if the caller may see it; not one whose log is closed
        (its record's final status comes a write later: ``get_run`` already shows it ended,
        :func:`_views.settled_view_for`, and the two answers agree)."""
        rec = await _cancel.visible_active(self.state, tenant, thread_id)
        if rec is None:
            return None
        try:
            closed = await self.state.log.close_record(rec.run_id)
        except e.BatonError:
            return rec  # a log that does not answer leaves the record as it is
        return rec if closed is None else None

    async def thread_ui(self, tenant: str, thread_id: str) -> tuple[list[dict[str, Any]], runs_pb2.RunRecord | None]:
        """The thread as the live TanStack client showed it: ``(UI messages, active run)``
        (:mod:`gateway._service._hydration`).

        Raises:
            UnknownThread: another tenant's thread.
        """
        return await _hydration.thread_ui(self.state, tenant, thread_id)

    async def transcript(self, tenant: str, thread_id: str) -> tuple[list[Any], int | None]:
        """The thread's saved transcript and its revision.

        Raises:
            UnknownThread: no transcript and no run, or another tenant's thread.
        """
        return await _views.load_thread_transcript(self.state, tenant, thread_id)

    async def list_runs(self, tenant: str, req: ListRunsRequest) -> tuple[list[runs_pb2.RunRecord], str]:
        """One page of runs, oldest first: ``(records, next page token or "")``.

        Raises:
            InvalidArgument: a page token this API did not make. UnknownThread.
        """
        st = self.state
        # Tenant-scoped in the store read (auth off: the empty tenant reads every run).
        scope = tenant if st.settings.auth_enabled else None
        if not req.thread_id:
            # One page from the coordinator's started index: one call never reads every run.
            recs, token = await st.coordinator.list_page(scope, req.page_size, req.page_token)
            return list(recs), token
        # A thread's runs are few (one runs at a time): read them and page here, in the
        # thread's order (the runs' numbers), with tokens of the position of the page's last run.
        after = page_position(req.page_token, thread=True) if req.page_token else None
        await _views.thread_visible_for(st, tenant, req.thread_id, must_exist=False)
        recs = sorted(await st.coordinator.list_runs(thread_id=req.thread_id, limit=0, tenant=scope), key=_position)
        if after is not None:
            recs = [r for r in recs if _position(r) > after]
        page = recs[:req.page_size]
        return page, page_token(_position(page[-1])) if len(recs) > req.page_size else ""

    async def fork_thread(self, tenant: str, req: _threads.ForkRequest) -> _threads.Forked:
        """See :func:`gateway._service._threads.fork`."""
        return await _threads.fork(self.state, tenant, req)

    async def delete_thread(self, tenant: str, thread_id: str) -> None:
        """See :func:`gateway._service._threads.delete`."""
        await _threads.delete(self.state, tenant, thread_id)

    def list_agents(self) -> tuple[str, list[dict[str, str]]]:
        """``(default kind, agents)``: what a client may pick (replay journals, then the kinds)."""
        s = self.state.settings
        return s.default_agent, agent_list(s.replay_dirs)
