"""A thread's session around one run: where the run starts, and what its turn leaves.

A thread is one workspace and one agent session across its runs (docs/design.md §4.3). A
``claude-code`` or ``codex`` run of a thread starts from the thread's head
(:class:`baton.workspaces.ThreadHead`): the workspace snapshot the previous turn left, and
the agent session to resume. Where it starts is decided once, when the run is created
(:func:`plan_turn`), and recorded on the run (``RunRecord.turn_json``), so a successor that
has to rebuild the sandbox starts from the same place.

Pure: no I/O. The tree transform (:func:`prepare_tree`) works on the tar a snapshot
restores, before the provider imports it:

- Claude Code keeps a session under ``~/.claude/projects/<the working directory with every
  non-alphanumeric character as '-'>/<id>.jsonl``. A thread's working directory is fixed per
  provider, but not across providers or hosts with other sandbox directories, so the
  session's project directory is moved to the name of this sandbox's working directory.
- ``codex exec`` has no non-interactive fork: the first run of a forked Codex thread copies
  the source session's rollout under a new id (:func:`~sandbox_host.agents.sessions.fork_codex_rollout`)
  and resumes the copy.
- A session to resume that the tree does not hold is refused before the launch
  (:class:`ResumeUnavailable`): an agent given an unknown id either refuses it or, for some
  Codex versions, starts a fresh session silently; a run must never do the latter.
"""
from __future__ import annotations

import io
import json
import posixpath
import tarfile
from dataclasses import dataclass, field
from typing import Any, Callable

from baton.errors import InvalidArgument, UnknownThread
from baton.workspaces import ThreadHead
from sandbox_host.agents.sessions import claude_project_dir_name, fork_codex_rollout

#: Agent kinds that keep a session across a thread's runs.
SESSION_KINDS = ("claude-code", "codex")


class ResumeUnavailable(Exception):
    """The thread's agent session is not in its workspace (``session_id``, ``detail``)."""

    def __init__(self, session_id: str, detail: str) -> None:
        super().__init__(f"agent session {session_id} cannot be resumed: {detail}")
        self.session_id = session_id
        self.detail = detail


@dataclass(frozen=True)
class TurnStart:
    """Where one run of a thread starts.

    Attributes:
        workspace: the thread's workspace spec (record form, never secrets; ``{}``: an
            empty workspace).
        snapshot: the snapshot to restore before the launch (``None``: build the workspace
            from ``workspace``, the thread's first run).
        resume: the agent session to resume (``None``: a fresh session).
        fork: Claude: resume ``resume`` under a new session id (``--fork-session``).
        fork_of: Codex: the session whose rollout is copied under ``resume`` first.
        lost: the thread's previous turn whose end could not be snapshotted (``{"run",
            "reason"}``; this run starts from the turn before it), else ``None``.
    """

    workspace: dict[str, Any] = field(default_factory=dict)
    snapshot: str | None = None
    resume: str | None = None
    fork: bool = False
    fork_of: str | None = None
    lost: dict[str, str] | None = None

    def to_json(self) -> str:
        return json.dumps({"workspace": self.workspace, "snapshot": self.snapshot, "resume": self.resume,
                           "fork": self.fork, "fork_of": self.fork_of, "lost": self.lost},
                          sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, raw: str) -> "TurnStart | None":
        """The turn start recorded on a run, ``None`` for a run that has none (``""``)."""
        if not raw:
            return None
        doc = json.loads(raw)
        return cls(workspace=dict(doc.get("workspace") or {}), snapshot=doc.get("snapshot"),
                   resume=doc.get("resume"), fork=bool(doc.get("fork")), fork_of=doc.get("fork_of"),
                   lost=doc.get("lost") if isinstance(doc.get("lost"), dict) else None)


def plan_turn(head: ThreadHead | None, *, thread_id: str, agent_kind: str, tenant: str,
              workspace: dict[str, Any] | None,
              new_session_id: Callable[[], str]) -> TurnStart:
    """Where a new run of a thread starts.

    Args:
        head: the thread's head (``None``: the thread's first run, or a thread whose head
            expired: it starts from the requested workspace).
        thread_id: the thread (for the error).
        agent_kind: the run's agent kind.
        tenant: the run's tenant.
        workspace: the workspace the request names (record form), ``None`` when none.
        new_session_id: makes the id of a forked Codex session (a UUID, as Codex's own).

    Returns:
        The :class:`TurnStart`.

    Raises:
        UnknownThread: the head belongs to another tenant (a thread is its first run's
            tenant's; a fork its source's).
        InvalidArgument: (field ``workspace``) the request names another workspace than
            the thread's.
    """
    if head is None:
        return TurnStart(workspace=dict(workspace or {}))
    if head.tenant != tenant:
        raise UnknownThread(thread_id)
    if workspace and workspace != head.workspace:
        raise InvalidArgument("workspace", "the thread keeps the workspace of its first run; "
                                           "fork the thread or start a new one for another workspace")
    resume = head.agent_session_id if head.agent_kind == agent_kind else None
    forked_first = head.forked_from is not None and not head.turns
    if resume is not None and forked_first:
        if agent_kind == "codex":
            return TurnStart(workspace=head.workspace, snapshot=head.snapshot, resume=new_session_id(),
                             fork_of=resume)
        return TurnStart(workspace=head.workspace, snapshot=head.snapshot, resume=resume, fork=True)
    return TurnStart(workspace=head.workspace, snapshot=head.snapshot, resume=resume, lost=head.lost)


def turn_session(turn: TurnStart, announced: str | None) -> str | None:
    """The agent session the thread's next run resumes after this one: the one the
    agent announced in its journal, else the one it resumed (never a fork's source)."""
    if announced:
        return announced
    return None if turn.fork else turn.resume


def prepare_tree(tar: bytes, *, agent_kind: str, workdir: str, turn: TurnStart) -> bytes:
    """The restored tree, made ready for this sandbox's agent (see the module docstring).

    Args:
        tar: the restored tree (members ``work/…`` and ``home/…``).
        agent_kind: ``claude-code`` or ``codex`` (others: the tar as it is).
        workdir: the sandbox's working directory, as the agent sees it.
        turn: the run's turn start.

    Returns:
        The tar to import.

    Raises:
        ResumeUnavailable: ``turn.resume`` (or a fork's source) is not in the tree.
    """
    if turn.resume is None or agent_kind not in SESSION_KINDS:
        return tar
    members = _read(tar)
    if agent_kind == "claude-code":
        members = _claude_to_workdir(members, workdir, turn.resume)
    elif turn.fork_of is not None:
        members = _codex_fork(members, turn.fork_of, turn.resume)
    elif _codex_rollout(members, turn.resume) is None:
        raise ResumeUnavailable(turn.resume, "no Codex rollout of it in the thread's workspace")
    return _write(members)


Member = tuple[tarfile.TarInfo, bytes | None]


def _read(tar: bytes) -> list[Member]:
    out: list[Member] = []
    with tarfile.open(fileobj=io.BytesIO(tar), mode="r:") as tf:
        for info in tf:
            data = None
            if info.isfile():
                f = tf.extractfile(info)
                data = f.read() if f is not None else b""
            out.append((info, data))
    return out


def _write(members: list[Member]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:", format=tarfile.PAX_FORMAT) as tf:
        for info, data in members:
            tf.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def _claude_to_workdir(members: list[Member], workdir: str, session_id: str) -> list[Member]:
    projects = "home/.claude/projects/"
    want = claude_project_dir_name(workdir)
    source: str | None = None
    for info, _ in members:
        name = info.name.rstrip("/")
        if name.startswith(projects) and posixpath.basename(name) == f"{session_id}.jsonl":
            source = posixpath.dirname(name)[len(projects):]
            if source == want:
                return members
    if source is None:
        raise ResumeUnavailable(session_id, "no Claude Code session file of it in the thread's workspace")
    old, new = projects + source, projects + want
    out: list[Member] = []
    for info, data in members:
        name = info.name.rstrip("/")
        if name == old or name.startswith(old + "/"):
            info = _renamed(info, new + name[len(old):])
        out.append((info, data))
    return out


def _codex_rollout(members: list[Member], session_id: str) -> Member | None:
    for info, data in members:
        name = info.name
        if (name.startswith("home/.codex/sessions/") and info.isfile()
                and posixpath.basename(name).startswith("rollout-") and name.endswith(f"-{session_id}.jsonl")):
            return info, data
    return None


def _codex_fork(members: list[Member], source: str, new_id: str) -> list[Member]:
    found = _codex_rollout(members, source)
    if found is None:
        raise ResumeUnavailable(source, "no Codex rollout of the forked session in the thread's workspace")
    if _codex_rollout(members, new_id) is not None:
        return members  # copied by an earlier attempt of this run
    info, data = found
    try:
        forked = fork_codex_rollout(data or b"", new_id)
    except ValueError as exc:
        raise ResumeUnavailable(source, f"its rollout cannot be forked: {exc}") from None
    # Same day directory and timestamp prefix as the source: only the id differs.
    base = posixpath.basename(info.name)
    name = posixpath.join(posixpath.dirname(info.name), base[: -len(f"-{source}.jsonl")] + f"-{new_id}.jsonl")
    copy = _renamed(info, name)
    copy.size = len(forked)
    return [*members, (copy, forked)]


def _renamed(info: tarfile.TarInfo, name: str) -> tarfile.TarInfo:
    new = tarfile.TarInfo(name)
    new.type, new.mode, new.mtime, new.size = info.type, info.mode, info.mtime, info.size
    new.linkname, new.uid, new.gid = info.linkname, info.uid, info.gid
    return new


__all__ = ["ResumeUnavailable", "SESSION_KINDS", "TurnStart", "plan_turn", "prepare_tree", "turn_session"]
