"""A thread's turn on this host: where it starts, its restore before the launch, its snapshot
at the end (docs/design.md §4.3).

The I/O around :mod:`sandbox_host.thread_session`, in three calls:

- :func:`plan_start` (``StartRun``, before the record exists): the thread's head decides
  where the run starts; recorded on the run as ``turn_json`` (and the thread's workspace as
  ``workspace_json``).
- :func:`restore` (:meth:`RunSandboxes.prepare_launch`, before the agent's launch): the
  snapshot the turn starts from goes into the sandbox, unless the sandbox's thread directory
  already holds exactly it (a warm follow-up on the same machine).
- :func:`snapshot_turn` (a final write, before the log's close): the sandbox's tree is
  snapshotted and the thread's head moves to it, fenced by the run's claim like its
  transcript. A run whose agent never announced a session (it refused to resume, or never
  started) leaves the head as it was: the next turn starts where this one started.
"""
from __future__ import annotations

import asyncio
import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from baton import config
from baton.errors import UnknownThread, LogUnavailable, SandboxBuildFailed, SandboxError, SnapshotMissing, WorkspaceError
from baton.log._transcript_fence import TranscriptWriter
from baton.v1 import runs_pb2
from sandbox_host.thread_session import SESSION_KINDS, ResumeUnavailable, TurnStart, plan_turn, prepare_tree, turn_session

if TYPE_CHECKING:
    from sandbox_host.deps import HostDeps
    from sandbox_host.providers import Sandbox

log = logging.getLogger("baton.sandbox_host.turns")

#: Seconds a start waits for the thread's head (the store unavailable: the start is refused,
#: nothing created, and the client may retry).
HEAD_TIMEOUT = 5.0
#: Bytes of the journal's head read for the agent's session id (its first line announces it).
JOURNAL_HEAD = 256 * 1024


def kind_of(record: runs_pb2.RunRecord) -> str:
    return record.agent.kind or config.get("BATON_DEFAULT_AGENT")


async def plan_start(deps: "HostDeps", req: Any, kind: str, workspace_json: str) -> tuple[str, str]:
    """Where a new run of a thread starts: ``(workspace_json, turn_json)`` for its record.

    Args:
        deps: the host's clients.
        req: the ``StartRunRequest`` (``thread_id``, ``tenant``).
        kind: the run's agent kind.
        workspace_json: the workspace the request names, checked (``""``: none).

    Raises:
        UnknownThread: the thread is another tenant's.
        InvalidArgument: the request names another workspace than the thread's.
        LogUnavailable: the workspace store did not answer.
    """
    if deps.workspaces is None or (kind not in SESSION_KINDS and not req.tenant):
        # Without tenants (no API keys) a run that keeps no session needs nothing of the head.
        return workspace_json, ""
    try:
        async with asyncio.timeout(HEAD_TIMEOUT):
            head, _ = await deps.workspaces.load_head(req.thread_id)
    except TimeoutError:
        raise LogUnavailable(req.thread_id, "loading the thread head timed out") from None
    if head is not None and head.tenant != req.tenant:
        # A fork has a head before its first run (and so before the coordinator knows its
        # owner): it is its source's tenant's, whatever agent another tenant asks for.
        raise UnknownThread(req.thread_id)
    if kind not in SESSION_KINDS:
        return workspace_json, ""
    requested = json.loads(workspace_json) if workspace_json else None
    turn = plan_turn(head, thread_id=req.thread_id, agent_kind=kind, tenant=req.tenant, workspace=requested,
                     new_session_id=lambda: str(uuid.uuid4()))
    ws = json.dumps(turn.workspace, sort_keys=True, separators=(",", ":")) if turn.workspace else ""
    return ws, turn.to_json()


async def restore(deps: "HostDeps", record: runs_pb2.RunRecord, sbx: "Sandbox") -> None:
    """Put the snapshot the run starts from into its new sandbox (before the launch).

    Raises:
        SandboxBuildFailed: ``restore`` (the snapshot is gone, or the store did not answer)
            or ``resume`` (the agent session to resume is not in the snapshot): the run
            fails naming the step, and the thread's head stays as it was.
    """
    turn = TurnStart.from_json(record.turn_json)
    if turn is None or turn.snapshot is None or deps.workspaces is None:
        return
    provider, handle = sbx.provider, sbx.handle
    if turn.fork_of is None and await provider.tree_marker(handle) == turn.snapshot:
        log.info("run %s: warm workspace (snapshot %s already in place)", record.run_id, turn.snapshot[:12])
        # From here on the agent changes it: only this turn's own snapshot marks it again.
        await provider.mark_tree(handle, "")
        return
    try:
        tar = await deps.workspaces.restore_tar(turn.snapshot)
    except SnapshotMissing as exc:
        raise SandboxBuildFailed("restore", f"the thread's workspace snapshot is gone: {exc}") from exc
    except LogUnavailable as exc:
        raise SandboxBuildFailed("restore", f"the workspace store did not answer: {exc.detail}") from exc
    try:
        tar = prepare_tree(tar, agent_kind=kind_of(record), workdir=handle.workdir, turn=turn)
    except ResumeUnavailable as exc:
        raise SandboxBuildFailed("resume", str(exc)) from exc
    await provider.import_tree(handle, tar, replace=True)


async def announced_session(deps: "HostDeps", record: runs_pb2.RunRecord, sbx: "Sandbox") -> str | None:
    """The agent session id the run's journal announces (its first lines), else ``None``."""
    from sandbox_host.agents import journal_format_for
    from sandbox_host.agents.sessions import agent_session_id

    try:
        head = await sbx.provider.read_file(sbx.handle, sbx.handle.journal_path, 0, JOURNAL_HEAD)
    except FileNotFoundError:
        return None
    fmt = journal_format_for(kind_of(record), deps.agent_options(record))
    for line in head.split(b"\n")[:64]:
        found = agent_session_id(fmt, line)
        if found:
            return found
    return None


async def snapshot_turn(deps: "HostDeps", record: runs_pb2.RunRecord, epoch: int, sbx: "Sandbox | None",
                        messages: int) -> str | None:
    """Snapshot the run's sandbox and move the thread's head to it (a final write).

    Args:
        deps: the host's clients.
        record: the run.
        epoch: this claim's epoch (the head's fence).
        sbx: the run's sandbox (``None``: gone; nothing is kept of this turn).
        messages: the thread transcript's length at the run's end.

    Returns:
        The snapshot's digest, or ``None`` when the head was left as it was.

    Raises:
        LogUnavailable: the store did not answer (the caller retries within its budget).
        WorkspaceFenced: a successor of this run, or a later run, moved the head.
    """
    turn = TurnStart.from_json(record.turn_json)
    if turn is None or deps.workspaces is None or sbx is None:
        return None
    announced = await announced_session(deps, record, sbx)
    if announced is None:
        log.info("run %s: the agent announced no session; the thread's head stays", record.run_id)
        return None
    try:
        tar = await sbx.provider.export_tree(sbx.handle)
        info = await deps.workspaces.snapshot(tar, parent=turn.snapshot)
    except LogUnavailable:
        raise  # the store: retried by the caller within its budget
    except (WorkspaceError, SandboxError, OSError, ValueError) as exc:
        # Too large, unsafe, or a tree that cannot be read (the agent removed its working
        # directory): the next turn starts where this one did, and says so (its
        # run.accepted names this turn): never a silent loss.
        log.error("run %s: workspace not snapshotted: %s", record.run_id, exc)
        await deps.workspaces.note_lost_turn(
            record.thread_id, run_id=record.run_id, reason=f"the workspace could not be saved: {exc}"[:500],
            writer=TranscriptWriter(record.run_id, epoch, record.started_at, record.thread_seq))
        return None
    await deps.workspaces.save_turn(
        record.thread_id, run_id=record.run_id, snapshot=info.digest, agent_session_id=turn_session(turn, announced),
        messages=messages, workspace=turn.workspace, agent_kind=kind_of(record),
        writer=TranscriptWriter(record.run_id, epoch, record.started_at, record.thread_seq), tenant=record.tenant)
    await sbx.provider.mark_tree(sbx.handle, info.digest)
    log.info("run %s: workspace snapshot %s (%d files, %d bytes stored of %d)", record.run_id, info.digest[:12],
             info.files, info.bytes_stored, info.bytes_total)
    return info.digest
