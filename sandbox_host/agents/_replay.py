"""The ``replay`` agent kind: a recorded journal written back with its original pacing.

Replay journals are read only from allowed directories (``BATON_REPLAY_DIRS``, colon-
separated; default: the repository's shipped ``corpus/``). The journal's bytes are copied
into the sandbox with the stdlib-only program :mod:`sandbox_host.agents.replay_agent`, which
the sandbox's ``python3`` runs.
"""
from __future__ import annotations

import json
import os
import pathlib
from typing import Mapping

from baton import config
from baton.agents import ReplayOptions, resolve_replay_journal
from baton.errors import InvalidArgument
from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, CODEX_EXEC_JSON, JOURNAL_FORMATS, AgentLaunch

#: The shipped corpus (repository root ``corpus/``).
DEFAULT_REPLAY_DIR = str(pathlib.Path(__file__).resolve().parents[2] / "corpus")
PROGRAM_PATH = str(pathlib.Path(__file__).with_name("replay_agent.py"))
#: Where the program and the journal copy go, relative to the workspace.
SANDBOX_DIR = ".baton-replay"
_CLAUDE_TYPES = frozenset({"system", "assistant", "user", "stream_event", "result", "rate_limit_event"})
_FIELD = "agent.options.journal"


def replay_dirs(env: Mapping[str, str] | None = None) -> list[str]:
    """The allowed replay directories (real paths), from ``BATON_REPLAY_DIRS`` or the default."""
    raw = config.get("BATON_REPLAY_DIRS", env)
    dirs = [d for d in raw.split(":") if d] or [DEFAULT_REPLAY_DIR]
    return [os.path.realpath(d) for d in dirs]


def resolve_journal(journal: str, env: Mapping[str, str] | None = None) -> str:
    """The real path of a replay journal inside an allowed directory (path checks only).

    Args:
        journal: an absolute path, or a path relative to an allowed directory
            (``claude-stream-json/x.jsonl``).

    Raises:
        InvalidArgument: not found in any allowed directory, or outside them (symlinks
            and ``..`` are resolved before the check).
    """
    return resolve_replay_journal(journal, replay_dirs(env), field=_FIELD)


def read_head(path: str) -> bytes:
    """The first 64 KiB of a journal: enough for :func:`detect_format` (a small read)."""
    with open(path, "rb") as f:
        return f.read(65536)


def detect_format(path: str, head: bytes) -> str:
    """The journal format, from the directory name or else the first JSON lines.

    Raises:
        InvalidArgument: when neither tells.
    """
    parent = os.path.basename(os.path.dirname(path))
    if parent in JOURNAL_FORMATS:
        return parent
    for line in head.split(b"\n")[:20]:
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        t = obj.get("type") if isinstance(obj, dict) else None
        if not isinstance(t, str):
            continue
        if t in _CLAUDE_TYPES:
            return CLAUDE_STREAM_JSON
        if t.split(".")[0] in ("thread", "turn", "item") or t == "error":
            return CODEX_EXEC_JSON
    raise InvalidArgument(_FIELD, "journal format not recognised (claude-stream-json or codex-exec-json)")


def prepare(options: ReplayOptions, *, env: Mapping[str, str] | None = None,
            python: str = "python3") -> AgentLaunch:
    """The launch of a replay agent (``options`` already validated by their schema).

    Only the journal's path is checked here, and its first 64 KiB read when the format
    must be detected (the recorded options name it, so a second preparation of the same
    run reads nothing); the journal itself is copied in at launch (``AgentLaunch.sources``,
    read in a worker thread), once.

    Args:
        options: see :class:`baton.agents.ReplayOptions`.
        env: environment to read ``BATON_REPLAY_DIRS`` from (default ``os.environ``).
        python: the sandbox's interpreter.

    Returns:
        The launch, with ``options`` recording the resolved journal path and format.

    Raises:
        InvalidArgument: a journal outside the allowed directories, or of unknown format.
    """
    path = resolve_journal(options.journal, env)
    fmt = options.format or detect_format(path, read_head(path))
    resolved = options.model_copy(update={"journal": path, "format": fmt})
    prog_rel = f"{SANDBOX_DIR}/replay_agent.py"
    journal_rel = f"{SANDBOX_DIR}/journal.jsonl"
    return AgentLaunch(
        kind="replay",
        argv=(python, prog_rel, "--journal", journal_rel, "--speed", repr(resolved.speed),
              "--delay", repr(resolved.delay), "--max-gap", repr(resolved.max_gap)),
        journal_format=fmt,
        options=resolved.to_record(),
        sources={prog_rel: (PROGRAM_PATH, 0o755), journal_rel: (path, 0o644)},
        # A recorded tool approval waits for its answer on stdin (docs/hitl.md).
        interactive=True,
    )
