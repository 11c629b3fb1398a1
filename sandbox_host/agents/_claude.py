"""The ``claude-code`` agent kind: Claude Code's headless stream-json mode.

Command: ``claude -p --output-format stream-json --verbose [--include-partial-messages]``
(``--verbose`` is mandatory with ``-p`` + ``stream-json``, journal-formats.md §1), prompt on
stdin. Needs a sandbox image with the ``claude`` CLI and the secret ``ANTHROPIC_API_KEY``
(or ``CLAUDE_CODE_OAUTH_TOKEN``), passed as env only.
"""
from __future__ import annotations

from typing import Any, Mapping

from baton.errors import InvalidArgument
from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, AgentLaunch

_PERMISSION_MODES = ("default", "acceptEdits", "bypassPermissions", "plan")


def prepare(options: Mapping[str, Any], *, prompt: str, env: Mapping[str, str] | None = None) -> AgentLaunch:
    """The launch of Claude Code.

    Args:
        options: ``partial_messages`` (bool, default true), ``model`` (str),
            ``max_turns`` (int), ``permission_mode`` (one of Claude's modes).
        prompt: the user's prompt, fed on stdin.
        env: unused (kept for a uniform signature).

    Raises:
        InvalidArgument: for a malformed option.
    """
    argv = ["claude", "-p", "--output-format", "stream-json", "--verbose"]
    partial = options.get("partial_messages", True)
    if not isinstance(partial, bool):
        raise InvalidArgument("agent.options.partial_messages", "must be a boolean")
    if partial:
        argv.append("--include-partial-messages")
    model = options.get("model")
    if model is not None:
        if not isinstance(model, str) or not model or model.startswith("-"):
            raise InvalidArgument("agent.options.model", "must be a model name")
        argv += ["--model", model]
    turns = options.get("max_turns")
    if turns is not None:
        if isinstance(turns, bool) or not isinstance(turns, int) or turns < 1:
            raise InvalidArgument("agent.options.max_turns", "must be a positive integer")
        argv += ["--max-turns", str(turns)]
    mode = options.get("permission_mode")
    if mode is not None:
        if mode not in _PERMISSION_MODES:
            raise InvalidArgument("agent.options.permission_mode", f"must be one of {', '.join(_PERMISSION_MODES)}")
        argv += ["--permission-mode", mode]
    return AgentLaunch(
        kind="claude-code",
        argv=tuple(argv),
        journal_format=CLAUDE_STREAM_JSON,
        options=dict(options),
        stdin=prompt.encode("utf-8"),
        required_secrets=("ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN",),
    )
