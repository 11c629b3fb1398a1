"""The ``codex`` agent kind: ``codex exec --json`` (journal-formats.md §2).

The prompt is read from stdin (``-`` as the prompt argument). Needs a sandbox image with
the ``codex`` CLI and the secret ``OPENAI_API_KEY`` (or ``CODEX_API_KEY``), env only.
"""
from __future__ import annotations

from typing import Any, Mapping

from baton.errors import InvalidArgument
from sandbox_host.agents._spec import CODEX_EXEC_JSON, AgentLaunch

_SANDBOX_MODES = ("read-only", "workspace-write", "danger-full-access")


def prepare(options: Mapping[str, Any], *, prompt: str, env: Mapping[str, str] | None = None) -> AgentLaunch:
    """The launch of Codex.

    Args:
        options: ``model`` (str), ``sandbox`` (Codex's own sandbox mode, default
            ``workspace-write``), ``skip_git_repo_check`` (bool, default true: workspaces
            need not be git repositories).
        prompt: the user's prompt, fed on stdin.
        env: unused.

    Raises:
        InvalidArgument: for a malformed option.
    """
    argv = ["codex", "exec", "--json"]
    mode = options.get("sandbox", "workspace-write")
    if mode not in _SANDBOX_MODES:
        raise InvalidArgument("agent.options.sandbox", f"must be one of {', '.join(_SANDBOX_MODES)}")
    argv += ["--sandbox", mode]
    model = options.get("model")
    if model is not None:
        if not isinstance(model, str) or not model or model.startswith("-"):
            raise InvalidArgument("agent.options.model", "must be a model name")
        argv += ["--model", model]
    skip = options.get("skip_git_repo_check", True)
    if not isinstance(skip, bool):
        raise InvalidArgument("agent.options.skip_git_repo_check", "must be a boolean")
    if skip:
        argv.append("--skip-git-repo-check")
    argv.append("-")
    return AgentLaunch(
        kind="codex",
        argv=tuple(argv),
        journal_format=CODEX_EXEC_JSON,
        options=dict(options),
        stdin=prompt.encode("utf-8"),
        required_secrets=("OPENAI_API_KEY|CODEX_API_KEY",),
    )
