"""The ``replay`` agent kind: a recorded journal written back with its original pacing.

Replay journals are read only from allowed directories (``BATON_REPLAY_DIRS``, colon-
separated; default: the repository's shipped ``corpus/``). The journal's bytes are copied
into the sandbox with the stdlib-only program :mod:`sandbox_host.agents.replay_agent`, which
the sandbox's ``python3`` runs.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
from typing import Any, Mapping

from baton import config
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
    """The real path of a replay journal inside an allowed directory.

    Args:
        journal: an absolute path, or a path relative to an allowed directory
            (``claude-stream-json/x.jsonl``).

    Raises:
        InvalidArgument: not a string, not found in any allowed directory, or outside them
            (symlinks and ``..`` are resolved before the check).
    """
    if not isinstance(journal, str) or not journal:
        raise InvalidArgument(_FIELD, "must name a recorded journal")
    allowed = replay_dirs(env)
    candidates = [journal] if os.path.isabs(journal) else [os.path.join(d, journal) for d in allowed]
    for cand in candidates:
        real = os.path.realpath(cand)
        inside = any(os.path.commonpath([real, d]) == d for d in allowed)
        if not inside:
            raise InvalidArgument(_FIELD, "is outside the allowed replay directories (BATON_REPLAY_DIRS)")
        if os.path.isfile(real):
            return real
    raise InvalidArgument(_FIELD, f"no such journal in the replay directories: {journal!r}")


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


def _number(options: Mapping[str, Any], key: str, default: float) -> float:
    raw = options.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw) or raw < 0:
        raise InvalidArgument(f"agent.options.{key}", "must be a non-negative number")
    return float(raw)


def prepare(options: Mapping[str, Any], *, prompt: str = "", env: Mapping[str, str] | None = None,
            python: str = "python3") -> AgentLaunch:
    """The launch of a replay agent.

    Args:
        options: ``journal`` (required), ``speed`` (pacing divisor, default 1; 0 = no
            waits), ``delay`` (seconds per line without a timestamp, default 0.05),
            ``max_gap`` (longest wait, default 5 s), ``format`` (optional override).
        prompt: ignored (a replay does not listen).
        env: environment to read ``BATON_REPLAY_DIRS`` from (default ``os.environ``).
        python: the sandbox's interpreter.

    Returns:
        The launch, with ``options`` recording the resolved journal path and format.

    Raises:
        InvalidArgument: bad options or a journal outside the allowed directories.
    """
    path = resolve_journal(options.get("journal", ""), env)
    with open(path, "rb") as f:
        content = f.read()
    speed = _number(options, "speed", 1.0)
    delay = _number(options, "delay", 0.05)
    max_gap = _number(options, "max_gap", 5.0)
    fmt = options.get("format") or detect_format(path, content[:65536])
    if fmt not in JOURNAL_FORMATS:
        raise InvalidArgument("agent.options.format", f"must be one of {', '.join(JOURNAL_FORMATS)}")
    with open(PROGRAM_PATH, "rb") as f:
        program = f.read()
    prog_rel = f"{SANDBOX_DIR}/replay_agent.py"
    journal_rel = f"{SANDBOX_DIR}/journal.jsonl"
    return AgentLaunch(
        kind="replay",
        argv=(python, prog_rel, "--journal", journal_rel, "--speed", repr(speed),
              "--delay", repr(delay), "--max-gap", repr(max_gap)),
        journal_format=fmt,
        options={"journal": path, "speed": speed, "delay": delay, "max_gap": max_gap, "format": fmt},
        files={prog_rel: (program, 0o755), journal_rel: (content, 0o644)},
    )
