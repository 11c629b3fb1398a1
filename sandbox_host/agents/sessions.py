"""Agent sessions across turns of a thread: ids, refused resumes, forking a Codex rollout.

A thread's next run launches its agent with the previous turn's agent session resumed
(``claude --resume <id>``, ``codex exec resume <id>``). This module is pure (bytes in,
values out) and holds what baton must know about the CLIs' sessions:

- :func:`agent_session_id`: the session id a journal line announces (Claude
  ``system/init.session_id``; Codex ``thread.started.thread_id``), to record for the next turn.
- :func:`resume_refused`: whether a resumed launch was refused, and why. Neither CLI may be
  allowed to answer in a fresh session silently: Claude (2.1.x) refuses an unknown id with
  a ``result`` line whose ``errors`` say ``No conversation found with session ID: <id>``, the
  same sentence on stderr and exit 1; Codex refuses an unknown UUID on stderr (``thread/resume
  failed: no rollout found for thread id <id>``, exit 1, nothing on stdout), but starts a
  *fresh* thread for an id that is not a UUID and names no thread (codex-rs/exec/src/lib.rs
  ``resolve_resume_thread_id``), as older releases did for any unknown id; so the id the
  journal announces is compared with the one asked for.
- :func:`fork_codex_rollout`: ``codex exec`` has no non-interactive fork (its subcommands are
  ``resume`` and ``review``), so baton forks a Codex session by copying its rollout under a
  new id and resuming the copy. The file name is :func:`codex_rollout_name`.
- :func:`claude_session_path`: where Claude keeps a session of a working directory.

Sources: docs/agents.md (the stand-ins) lists where each behaviour was taken from.
"""
from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any, Iterable

from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, CODEX_EXEC_JSON

#: Sentences the CLIs print when they do not have the session asked for (lower case).
CLAUDE_UNKNOWN_SESSION = ("no conversation found with session id", "--resume requires a valid session id")
CODEX_UNKNOWN_SESSION = ("no rollout found for thread id", "no rollout found for conversation id",
                         "no saved session found with id", "thread/resume failed")
_CLAUDE_DIR_CHAR = re.compile(r"[^a-zA-Z0-9]")


def _json_object(line: bytes) -> dict[str, Any] | None:
    if not line.strip().startswith(b"{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def agent_session_id(journal_format: str, line: bytes) -> str | None:
    """The agent session id one journal line announces, else ``None``.

    Args:
        journal_format: ``claude-stream-json`` | ``codex-exec-json``.
        line: one journal line (without its ``\\n``).

    Returns:
        Claude: ``session_id`` of a ``system``/``init`` line; Codex: ``thread_id`` of a
        ``thread.started`` line; ``None`` for any other line, non-JSON, or another format.
    """
    obj = _json_object(line)
    if obj is None:
        return None
    if journal_format == CLAUDE_STREAM_JSON and obj.get("type") == "system" and obj.get("subtype") == "init":
        sid = obj.get("session_id")
    elif journal_format == CODEX_EXEC_JSON and obj.get("type") == "thread.started":
        sid = obj.get("thread_id")
    else:
        return None
    return sid if isinstance(sid, str) and sid else None


def resume_refused(
    journal_format: str,
    journal_lines: Iterable[bytes],
    exit_code: int | None,
    stderr_tail: bytes | str,
    *,
    resume_id: str | None = None,
    fork: bool = False,
) -> str | None:
    """Why a resumed launch did not continue its session, or ``None`` when it did (or may).

    Args:
        journal_format: ``claude-stream-json`` | ``codex-exec-json``.
        journal_lines: the launch's journal lines (without ``\\n``; other lines, such as the
            exit sentinel, are ignored).
        exit_code: the agent's exit code (``None``: unknown or still running).
        stderr_tail: the end of the agent's stderr (a few KiB is enough).
        resume_id: the session the launch asked to resume; when given, a journal that
            announces another session (a fresh one) is a refusal too. Not checked for a
            fork (``fork=True``), whose new id differs by design.

    Returns:
        A one-line human reason naming the session, e.g. ``"claude has no session
        <id> to resume: No conversation found with session ID: <id>"``, or ``None``.
    """
    agent = "claude" if journal_format == CLAUDE_STREAM_JSON else "codex"
    markers = CLAUDE_UNKNOWN_SESSION if journal_format == CLAUDE_STREAM_JSON else CODEX_UNKNOWN_SESSION
    what = f"session {resume_id}" if resume_id else "the session"
    announced: str | None = None
    for line in journal_lines:
        if announced is None:
            announced = agent_session_id(journal_format, line)
        obj = _json_object(line) if journal_format == CLAUDE_STREAM_JSON else None
        if obj is not None and obj.get("type") == "result" and obj.get("is_error"):
            errors = obj.get("errors")
            texts = [str(e) for e in errors] if isinstance(errors, list) else []
            if isinstance(obj.get("result"), str):
                texts.append(obj["result"])
            for text in texts:
                if any(m in text.lower() for m in markers):
                    return f"{agent} has no {what} to resume: {_one_line(text)}"
    err = stderr_tail.decode("utf-8", "replace") if isinstance(stderr_tail, bytes) else stderr_tail
    if exit_code != 0:
        for text in err.splitlines():
            if any(m in text.lower() for m in markers):
                return f"{agent} has no {what} to resume: {_one_line(text)}"
    if resume_id and not fork and announced is not None and announced != resume_id:
        return f"{agent} started a fresh session {announced} instead of resuming {resume_id}"
    return None


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def claude_project_dir_name(cwd: str) -> str:
    """Claude Code's directory name for a working directory: every non-alphanumeric
    character of the absolute path as ``-`` (``/w/my_app`` → ``-w-my-app``)."""
    return _CLAUDE_DIR_CHAR.sub("-", cwd)


def claude_session_path(config_dir: str, cwd: str, session_id: str) -> str:
    """Where Claude Code keeps a session: ``<config_dir>/projects/<munged cwd>/<id>.jsonl``.

    ``config_dir`` is ``$CLAUDE_CONFIG_DIR``, by default ``$HOME/.claude``. A session is found
    only from the working directory it was made in, so a thread's turns must run in the
    same workspace path.
    """
    return f"{config_dir.rstrip('/')}/projects/{claude_project_dir_name(cwd)}/{session_id}.jsonl"


def codex_rollout_name(thread_id: str, started: datetime) -> str:
    """A Codex rollout's path below ``$CODEX_HOME``:
    ``sessions/YYYY/MM/DD/rollout-YYYY-MM-DDTHH-MM-SS-<id>.jsonl`` (``started`` in UTC)."""
    return (f"sessions/{started:%Y/%m/%d}/rollout-{started:%Y-%m-%dT%H-%M-%S}-{thread_id}.jsonl")


def fork_codex_rollout(rollout: bytes, new_id: str) -> bytes:
    """The rollout of a fork: ``rollout`` with its session id replaced by ``new_id``.

    Only ``session_meta`` lines change (``payload.id`` becomes ``new_id`` and
    ``payload.forked_from_id`` names the source, as Codex's own ``SessionMeta`` does for
    forks); every other byte is kept, so the history is the source's. Write the result to
    :func:`codex_rollout_name` of ``new_id`` and resume ``new_id``.

    Raises:
        ValueError: ``rollout`` has no ``session_meta`` line with an id.
    """
    out: list[bytes] = []
    old_id: str | None = None
    for line in rollout.split(b"\n"):
        obj = _json_object(line) if b'"session_meta"' in line else None
        if obj is not None and obj.get("type") == "session_meta":
            payload = obj.get("payload")
            if isinstance(payload, dict) and isinstance(payload.get("id"), str):
                if old_id is None:
                    old_id = payload["id"]
                if payload["id"] == old_id:
                    obj["payload"] = {**payload, "id": new_id, "forked_from_id": old_id}
                    line = json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        out.append(line)
    if old_id is None:
        raise ValueError("not a Codex rollout: no session_meta line with an id")
    return b"\n".join(out)


__all__ = ["agent_session_id", "claude_project_dir_name", "claude_session_path", "codex_rollout_name",
           "fork_codex_rollout", "resume_refused"]
