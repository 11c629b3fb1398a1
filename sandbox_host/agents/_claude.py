"""The ``claude-code`` agent kind: Claude Code's headless stream-json mode.

Command: ``claude -p --input-format stream-json --output-format stream-json --verbose
[--include-partial-messages] [--permission-prompt-tool stdio]`` (``--verbose`` is mandatory
with ``-p`` + ``stream-json``, journal-formats.md §1). The prompt is the first user message
on stdin; stdin stays open (the sandbox's inbox, docs/hitl.md), so the CLI can ask for a
tool's permission over its stream-json control protocol (a ``control_request``
``can_use_tool`` on stdout, answered by a ``control_response`` on stdin) and take a user
message into its running turn. The host closes stdin after the turn's ``result``. A later turn resumes the previous turn's session: ``--resume <id>`` (the same id
goes on), plus ``--fork-session`` to go on under a new id and leave the source as it was.
Needs a sandbox image with the ``claude`` CLI and the secret ``ANTHROPIC_API_KEY``
(or ``CLAUDE_CODE_OAUTH_TOKEN``), passed as env only. Options:
:class:`baton.agents.ClaudeCodeOptions`.
"""
from __future__ import annotations

import json

from baton.agents import ClaudeCodeOptions
from sandbox_host.agents._resume import check_resume
from sandbox_host.agents._spec import CLAUDE_STREAM_JSON, AgentLaunch


def user_line(text: str) -> bytes:
    """One user message in the CLI's stream-json input (a JSON line)."""
    return (json.dumps({"type": "user", "message": {"role": "user", "content": text},
                        "parent_tool_use_id": None, "session_id": ""},
                       ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def prepare(options: ClaudeCodeOptions, *, prompt: str, resume: str | None = None, fork: bool = False) -> AgentLaunch:
    """The launch of Claude Code (``options`` already validated by their schema).

    Args:
        options: the validated options.
        prompt: the user's prompt (stdin).
        resume: the Claude session to resume (``--resume <id>``), or ``None``.
        fork: continue the resumed session under a new id (``--fork-session``).

    Raises:
        InvalidArgument: a malformed ``resume`` id, or ``fork`` without ``resume``.
    """
    check_resume(resume, fork)
    argv = ["claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose"]
    if options.include_partial_messages:
        argv.append("--include-partial-messages")
    if options.model is not None:
        argv += ["--model", options.model]
    if options.max_turns is not None:
        argv += ["--max-turns", str(options.max_turns)]
    if options.permission_mode is not None:
        argv += ["--permission-mode", options.permission_mode]
    # Free text and tool patterns go as one "--option=value" element: a value starting with
    # "-" (a prompt that is a Markdown list, "- be brief") stays the option's value, never a
    # flag of its own, and legitimate values need no refusal ("model" is a name: refused).
    if options.allowed_tools:
        argv.append("--allowedTools=" + ",".join(options.allowed_tools))
    if options.disallowed_tools:
        argv.append("--disallowedTools=" + ",".join(options.disallowed_tools))
    if options.append_system_prompt is not None:
        argv.append("--append-system-prompt=" + options.append_system_prompt)
    if options.approvals:
        argv += ["--permission-prompt-tool", "stdio"]
    if resume is not None:
        argv += ["--resume", resume]
        if fork:
            argv.append("--fork-session")
    return AgentLaunch(
        kind="claude-code",
        argv=tuple(argv),
        journal_format=CLAUDE_STREAM_JSON,
        options=options.to_record(),
        stdin=user_line(prompt),
        interactive=True,
        required_secrets=("ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN",),
        resume=resume,
        fork=fork,
    )
