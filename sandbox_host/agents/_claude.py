"""The ``claude-code`` agent kind: Claude Code's headless stream-json mode.

Command: ``claude -p --output-format stream-json --verbose [--include-partial-messages]``
(``--verbose`` is mandatory with ``-p`` + ``stream-json``, journal-formats.md §1), prompt on
stdin. Needs a sandbox image with the ``claude`` CLI and the secret ``ANTHROPIC_API_KEY``
(or ``CLAUDE_CODE_OAUTH_TOKEN``), passed as env only. Options:
:class:`baton.agents.ClaudeCodeOptions`.
"""
from __future__ import annotations

from baton.agents import ClaudeCodeOptions
from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, AgentLaunch


def prepare(options: ClaudeCodeOptions, *, prompt: str) -> AgentLaunch:
    """The launch of Claude Code (``options`` already validated by their schema)."""
    argv = ["claude", "-p", "--output-format", "stream-json", "--verbose"]
    if options.include_partial_messages:
        argv.append("--include-partial-messages")
    if options.model is not None:
        argv += ["--model", options.model]
    if options.max_turns is not None:
        argv += ["--max-turns", str(options.max_turns)]
    if options.permission_mode is not None:
        argv += ["--permission-mode", options.permission_mode]
    if options.allowed_tools:
        argv += ["--allowedTools", ",".join(options.allowed_tools)]
    if options.disallowed_tools:
        argv += ["--disallowedTools", ",".join(options.disallowed_tools)]
    if options.append_system_prompt is not None:
        argv += ["--append-system-prompt", options.append_system_prompt]
    return AgentLaunch(
        kind="claude-code",
        argv=tuple(argv),
        journal_format=CLAUDE_STREAM_JSON,
        options=options.to_record(),
        stdin=prompt.encode("utf-8"),
        required_secrets=("ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN",),
    )
