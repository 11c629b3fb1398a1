"""The ``codex`` agent kind: ``codex exec --json`` (journal-formats.md §2).

The prompt is read from stdin (``-`` as the prompt argument). Needs a sandbox image with
the ``codex`` CLI and the secret ``OPENAI_API_KEY`` (or ``CODEX_API_KEY``), env only.
Options: :class:`baton.agents.CodexOptions`.
"""
from __future__ import annotations

from baton.agents import CodexOptions
from sandbox_host.agents._spec import CODEX_EXEC_JSON, AgentLaunch


def prepare(options: CodexOptions, *, prompt: str) -> AgentLaunch:
    """The launch of Codex (``options`` already validated by their schema)."""
    argv = ["codex", "exec", "--json", "--sandbox", options.sandbox]
    if options.model is not None:
        argv += ["--model", options.model]
    if options.profile is not None:
        argv += ["--profile", options.profile]
    if options.skip_git_repo_check:
        argv.append("--skip-git-repo-check")
    argv.append("-")
    return AgentLaunch(
        kind="codex",
        argv=tuple(argv),
        journal_format=CODEX_EXEC_JSON,
        options=options.to_record(),
        stdin=prompt.encode("utf-8"),
        required_secrets=("OPENAI_API_KEY|CODEX_API_KEY",),
    )
