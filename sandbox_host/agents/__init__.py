"""Agent kinds (docs/design.md §5.3): a launch command + a journal format (+ its translator).

- ``replay``: a recorded journal written back with its pacing (the default; no API keys).
- ``claude-code``: ``claude -p --output-format stream-json --verbose [--include-partial-messages]``.
- ``codex``: ``codex exec --json``.

A host calls :func:`prepare_agent` on a fresh run and records ``launch.options`` in the
run record; a takeover host calls :func:`journal_format_for` on the recorded options, so it
translates with the same translator without re-reading anything.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from baton.agents import AGENT_KINDS, ClaudeCodeOptions, ReplayOptions, parse_agent_options
from baton.errors import InvalidArgument
from sandbox_host.agents import _claude, _codex, _replay
from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, CODEX_EXEC_JSON, JOURNAL_FORMATS, AgentLaunch, load_files

#: What an agent process relaunched in its run is told (its first user message), after its
#: predecessor died while the turn waited (sandbox_host/agent_resume.py; docs/hitl.md).
RESUME_PROMPT = "Continue where you left off."


def prepare_agent(
    kind: str,
    options: Mapping[str, Any],
    *,
    prompt: str = "",
    env: Mapping[str, str] | None = None,
    resume: str | None = None,
    fork: bool = False,
) -> AgentLaunch:
    """The launch of an agent kind with validated options.

    Reads no more than a replay journal's first 64 KiB (only when its format is not given,
    a read small enough to stay inline); the files to copy in are read at launch
    (:func:`load_files`).

    Args:
        kind: ``replay`` | ``claude-code`` | ``codex``.
        options: the agent's options (``AgentSpec.options_json`` decoded).
        prompt: the user's prompt (see :func:`prompt_from_messages`).
        env: where ``BATON_*`` settings are read (default ``os.environ``).
        resume: the agent session to resume (the previous turn's, see
            :func:`sandbox_host.agents.sessions.agent_session_id`); ignored by ``replay``.
        fork: go on under a new session id (``claude-code`` only); ignored by ``replay``.

    Raises:
        InvalidArgument: unknown kind or bad options (field ``agent.kind`` / ``agent.options.*``),
            a malformed ``resume`` (``agent.resume``), a fork codex cannot do or a fork
            without ``resume`` (``agent.fork``).
    """
    opts = parse_agent_options(kind, options, field="agent.options")
    if isinstance(opts, ReplayOptions):
        return _replay.prepare(opts, env=env)
    if isinstance(opts, ClaudeCodeOptions):
        return _claude.prepare(opts, prompt=prompt, resume=resume, fork=fork)
    return _codex.prepare(opts, prompt=prompt, resume=resume, fork=fork)


def journal_format_for(kind: str, options: Mapping[str, Any]) -> str:
    """The journal format of a run from its recorded agent kind and options.

    For ``replay`` the format recorded by :func:`prepare_agent` is used (detected again
    from the journal path only when a record predates it).

    Raises:
        InvalidArgument: unknown kind, or a replay whose format cannot be determined.
    """
    if kind == "claude-code":
        return CLAUDE_STREAM_JSON
    if kind == "codex":
        return CODEX_EXEC_JSON
    if kind == "replay":
        fmt = options.get("format")
        if fmt in JOURNAL_FORMATS:
            return str(fmt)
        path = _replay.resolve_journal(options.get("journal", ""))
        return _replay.detect_format(path, _replay.read_head(path))
    raise InvalidArgument("agent.kind", f"must be one of {', '.join(AGENT_KINDS)}")


def prompt_from_messages(messages: Iterable[Mapping[str, Any]]) -> str:
    """The prompt for a CLI agent: the text of the last ``user`` message of an AG-UI input.

    ``content`` may be a string or a list of parts; text parts are joined with newlines.
    Returns ``""`` when there is no user message.
    """
    last: Mapping[str, Any] | None = None
    for m in messages:
        if isinstance(m, Mapping) and m.get("role") == "user":
            last = m
    if last is None:
        return ""
    content = last.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return ""


__all__ = [
    "RESUME_PROMPT",
    "AGENT_KINDS", "AgentLaunch", "CLAUDE_STREAM_JSON", "CODEX_EXEC_JSON", "JOURNAL_FORMATS",
    "journal_format_for", "load_files", "prepare_agent", "prompt_from_messages",
]
