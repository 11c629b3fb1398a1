"""Runs and threads as a caller may see them: tenancy, a run's settled view, a join's wait.

Shared by every operation of the run service (and so by every edge); no request here.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Awaitable, Callable

from baton import errors as e
from baton.runs import STATUS_TO_PB, TERMINAL_PB
from baton.v1 import runs_pb2
from gateway._auth import check_run_visible
from gateway._errors import UnknownThread
from gateway._state import GatewayState


async def run_view_for(st: GatewayState, tenant_id: str, run_id: str) -> Any:
    """The run's ``RunView`` as ``tenant_id`` may see it (no request: shared by HTTP and gRPC).

    Raises:
        UnknownRun: no record, or one of another tenant.
        StoreUnavailable: the coordinator cannot be reached.
    """
    view = await st.coordinator.get_run(run_id)
    check_run_visible(view.record, tenant_id, st.settings.auth_enabled)
    return view


async def settled_view_for(st: GatewayState, tenant_id: str, run_id: str) -> Any:
    """:func:`run_view_for`, with the run's end as its closed log tells it.

    A host closes a run's log before it writes the record's final status (docs/design.md
    §5.5: a successor finalizes a ``running`` record from a closed log), so for one write's
    time, or longer while the store is unavailable, a reader has seen the stream end while
    the record still says ``running``. The close record is the run's end: a record that is
    not terminal over a closed log is shown with the close record's status and error, and
    the close's time as ``finishedAt`` (the record's own comes a write later). Costs one log
    read for a run that is not terminal; a log that does not answer leaves the record as it is.

    Raises:
        UnknownRun, StoreUnavailable: as :func:`run_view_for`.
    """
    view = await run_view_for(st, tenant_id, run_id)
    if view.record.status in TERMINAL_PB:
        return view
    try:
        closed = await st.log.close_record(run_id)
    except e.BatonError:
        return view
    if closed is None:
        return view
    tail, closed_at = closed
    record = runs_pb2.RunRecord()
    record.CopyFrom(view.record)
    record.status = STATUS_TO_PB.get(tail.status or "completed", STATUS_TO_PB["completed"])  # type: ignore[assignment]
    if closed_at and not record.HasField("finished_at"):
        record.finished_at = closed_at
    if tail.error or tail.error_code:
        record.error.message = tail.error or ""
        record.error.code = tail.error_code or ""
    return dataclasses.replace(view, record=record)


async def thread_visible_for(st: GatewayState, tenant_id: str, thread_id: str, *, must_exist: bool) -> None:
    """With auth, a thread belongs to the tenant of its first run; other tenants get 404.

    Ownership is the thread's owner key (``threads/<thread>/tenant``), which retention keeps
    when it deletes the thread's old records, so their transcript stays readable.

    Args:
        must_exist: when true, a thread the caller's tenant does not own is unknown;
            otherwise a thread nobody owns yet is free to use.

    Raises:
        UnknownThread: as above.
    """
    if not st.settings.auth_enabled:
        return
    recs, owner = await st.coordinator.thread_runs(thread_id, limit=1)
    # The owner key outlives the records (retention), so a thread whose runs are gone stays
    # its tenant's and its transcript readable; a thread from before owner keys has runs.
    owner = owner or (recs[0].tenant if recs else "")
    if owner and owner != tenant_id:
        raise UnknownThread(thread_id)
    if must_exist and not owner:
        raise UnknownThread(thread_id)


async def maybe_view_for(st: GatewayState, tenant_id: str, run_id: str) -> Any | None:
    """Like :func:`run_view_for` but ``None`` when the run has no record."""
    try:
        return await run_view_for(st, tenant_id, run_id)
    except e.UnknownRun:
        # Another tenant's run reads as unknown too: re-raise then, so it is never served.
        if st.settings.auth_enabled:
            raise
        return None


#: Seconds a join waits for the record of a run it does not know yet. A client that mints
#: run ids (TanStack does) may join a run whose POST is still on its way; the record
#: appears as soon as a host takes the start, so a short wait tells "not yet" from "never".
JOIN_RECORD_WAIT = 3.0


async def join_view_for(st: GatewayState, tenant_id: str, run_id: str, wait: float = JOIN_RECORD_WAIT, *,
                        waiting: Callable[[], Awaitable[None]] | None = None) -> Any | None:
    """The run's ``RunView`` for a join, waiting up to ``wait`` seconds for the run to exist.

    A run exists when it has a record or a delivery log (the log is what readers read; it
    outlives a record that was removed). Without auth a run with a log but no record is
    served as such (``None``); with auth a run must have a record of the caller's tenant.

    Args:
        waiting: awaited once the run was not found at once, before the wait (what was
            looked up beside the first lookup is stale by the end of it).

    Raises:
        UnknownRun: neither a record nor a log after ``wait`` seconds (or another tenant's run).
        StoreUnavailable: the coordinator cannot be reached.
        LogUnavailable: JetStream did not answer.
    """
    found, view = await _run_exists(st, tenant_id, run_id)
    if found:
        return view
    if waiting is not None:
        await waiting()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait
    # Counted once the run was not found at once (``baton_gateway_joins_waiting_for_run``):
    # operators see joins piling up on ids that never come, tests see a join is waiting.
    with st.metrics.join_waits.track_inprogress():
        while loop.time() < deadline:
            await asyncio.sleep(min(0.1, max(deadline - loop.time(), 0)))
            found, view = await _run_exists(st, tenant_id, run_id)
            if found:
                return view
    raise e.UnknownRun(run_id)


async def _run_exists(st: GatewayState, tenant_id: str, run_id: str) -> tuple[bool, Any | None]:
    """Whether the run exists for a join, with its view (``None``: a log with no record)."""
    try:
        view = await maybe_view_for(st, tenant_id, run_id)
    except e.UnknownRun:
        # With auth "no record yet" reads as unknown too (maybe_view_for re-raises): keep
        # waiting. Another tenant's run waits as long, so the 404 tells nothing about it.
        view = None
    if view is not None:
        return True, view
    if not st.settings.auth_enabled and await st.log.last_record(run_id) is not None:
        return True, None
    return False, None


async def visible_head(st: GatewayState, tenant_id: str, thread_id: str) -> Any | None:
    """The thread's workspace head (``baton.workspaces.ThreadHead``) if the caller may see it:
    ``None`` when the thread has none (no coding session), the gateway keeps no workspace
    store, or, with auth, the head is another tenant's.

    Raises:
        LogUnavailable: the workspace store did not answer.
    """
    if st.workspaces is None:
        return None
    head, _ = await st.workspaces.load_head(thread_id)
    if head is None or (st.settings.auth_enabled and head.tenant != tenant_id):
        return None
    return head


async def load_thread_transcript(st: GatewayState, tenant_id: str, thread_id: str) -> tuple[list[Any], int | None]:
    """The thread's saved transcript and its revision, for a caller that may see the thread.

    A thread is known when it has a saved transcript or a run (one still going has no
    transcript yet), or is a fork of the caller's (before its first run); anything else is
    unknown, as is another tenant's thread.

    Raises:
        UnknownThread: as above.
    """
    try:
        await thread_visible_for(st, tenant_id, thread_id, must_exist=True)
    except UnknownThread:
        # A fork before its first run has no owner key and no run: its head names its tenant.
        if await visible_head(st, tenant_id, thread_id) is None:
            raise
    msgs, revision = await st.transcripts.load(thread_id)
    if revision is None and not st.settings.auth_enabled:
        # With auth, thread_visible_for already required a run of the caller's tenant.
        if not await st.coordinator.list_runs(thread_id=thread_id, limit=1):
            raise UnknownThread(thread_id)
    return list(msgs or []), revision
