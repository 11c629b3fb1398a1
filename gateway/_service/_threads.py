"""Thread operations of the run service: fork a thread at one of its runs, delete a thread.

A fork is a new thread whose workspace and agent session start where the source thread's
run left them (the source's turn record: its snapshot, its agent session, its transcript
length), and whose transcript is the source's up to that run. Nothing is copied but the
transcript prefix: the snapshot's packs are shared. The source thread is untouched. The
fork's first run resumes the source's agent session under a new id (Claude
``--fork-session``; Codex: a copy of the rollout under a new id), so the two threads go on
independently (sandbox_host/thread_session.py).

Deleting a thread deletes its workspace head (its snapshots go at the store's next gc) and
its saved transcript; its runs' records stay until retention removes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from baton.errors import InvalidArgument, ThreadBusy, ThreadExists, UnknownRun, UnknownThread
from baton.ids import validate_id
from baton.log._transcript_fence import TranscriptWriter
from baton.runs import TERMINAL, record_status
from gateway._service import _views
from gateway._state import GatewayState

#: The writer of a fork's head: any run of the new thread may replace it (its start time 0
#: orders before every run).
FORK_WRITER = TranscriptWriter("", 0, 0.0)


@dataclass(frozen=True)
class ForkRequest:
    """Fork ``thread_id`` at its run ``run_id`` into ``new_thread_id``."""

    thread_id: str
    run_id: str
    new_thread_id: str


@dataclass(frozen=True)
class Forked:
    """A fork: the new thread, where it started, and its transcript's length."""

    thread_id: str
    source_thread_id: str
    source_run_id: str
    messages: int


def fork_request(thread_id: Any, run_id: Any, new_thread_id: Any) -> ForkRequest:
    """A checked fork request (any edge).

    Raises:
        InvalidArgument: an id missing or breaking the id rules (field ``runId``,
            ``newThreadId``), or the new thread the same as the source.
    """
    for value, field in ((thread_id, "threadId"), (run_id, "runId"), (new_thread_id, "newThreadId")):
        if not isinstance(value, str) or not value:
            raise InvalidArgument(field, "is required")
        validate_id(value, field)
    if new_thread_id == thread_id:
        raise InvalidArgument("newThreadId", "must differ from the thread forked")
    return ForkRequest(thread_id, run_id, new_thread_id)


async def fork(st: GatewayState, tenant: str, req: ForkRequest) -> Forked:
    """Fork a thread at one of its runs (see the module docstring).

    Raises:
        UnknownThread: the source is not the caller's thread.
        UnknownRun: the run is not a run of that thread the caller may see.
        InvalidArgument: (``runId``) the run has not ended, or left no workspace (only
            ``claude-code`` and ``codex`` turns do).
        ThreadExists: the new thread exists already (it has runs, a transcript or a
            workspace).
        LogUnavailable, StoreUnavailable: a store did not answer.
    """
    await _views.thread_visible_for(st, tenant, req.thread_id, must_exist=True)
    # Settled: a run whose log closed has ended, even while its record's last write is on
    # its way (the host closes the log one store write before the record turns terminal).
    view = await _views.settled_view_for(st, tenant, req.run_id)
    record = view.record
    if record.thread_id != req.thread_id:
        raise UnknownRun(req.run_id)
    if record_status(record) not in TERMINAL:
        raise InvalidArgument("runId", "the run has not ended: fork a thread at a run that has ended")
    head, _ = await st.workspaces.load_head(req.thread_id)
    turn = head.turns.get(req.run_id) if head is not None else None
    if head is None or turn is None or turn.snapshot is None:
        raise InvalidArgument("runId", "the run left no workspace to fork from "
                                       "(only claude-code and codex turns keep one)")
    if st.settings.auth_enabled and head.tenant != tenant:
        raise UnknownThread(req.thread_id)
    await _new_thread_is_free(st, req.new_thread_id)
    source, _rev = await st.transcripts.load(req.thread_id)
    prefix = list(source[:turn.messages])
    await st.workspaces.fork(req.thread_id, req.run_id, req.new_thread_id, FORK_WRITER)
    await st.transcripts.save(req.new_thread_id, prefix, expected_revision=None)
    return Forked(req.new_thread_id, req.thread_id, req.run_id, len(prefix))


async def _new_thread_is_free(st: GatewayState, thread_id: str) -> None:
    recs, owner = await st.coordinator.thread_runs(thread_id, limit=1)
    _, rev = await st.transcripts.load(thread_id)
    head, _ = await st.workspaces.load_head(thread_id)
    if recs or owner or rev is not None or head is not None:
        raise ThreadExists(thread_id)


async def delete(st: GatewayState, tenant: str, thread_id: str) -> None:
    """Delete a thread's workspace, transcript and queued runs (see the module docstring).

    Raises:
        UnknownThread: no such thread, or not the caller's.
        ThreadBusy: a run of the thread is still going (cancel it first).
        LogUnavailable, StoreUnavailable: a store did not answer.
    """
    validate_id(thread_id, "threadId")
    head, _ = await st.workspaces.load_head(thread_id)
    recs, owner = await st.coordinator.thread_runs(thread_id, limit=1)
    # A thread is its first run's tenant's; a fork with no run yet, its source's.
    owner = owner or (recs[0].tenant if recs else "") or (head.tenant if head is not None else "")
    _, rev = await st.transcripts.load(thread_id)
    if not (recs or owner or head is not None or rev is not None):
        raise UnknownThread(thread_id)
    if st.settings.auth_enabled and owner != tenant:
        raise UnknownThread(thread_id)
    active = await st.coordinator.find_active_run(thread_id)
    if active is not None and record_status((await _views.settled_view_for(st, tenant, active.run_id)).record) \
            not in TERMINAL:
        raise ThreadBusy(thread_id, active.run_id)
    # Its queued runs go first: none may start on a thread being deleted.
    for q in await st.coordinator.list_queued_runs(thread_id):
        await st.coordinator.remove_queued_run(thread_id, q.run_id)
    await st.workspaces.delete_thread(thread_id)
    await st.transcripts.delete(thread_id)
