"""The ``codex`` agent kind: ``codex exec --json`` (journal-formats.md §2).

The prompt is read from stdin (``-`` as the prompt argument). A later turn resumes the
previous turn's thread: ``codex exec --json [options] resume <id> -``. Every option stays
before ``resume``: in the CLI's clap definition (codex-rs/exec/src/cli.rs) only some are
global (``--json``, ``--model``, ``--skip-git-repo-check``...), ``--sandbox`` and
``--profile`` are not, and an option of ``exec`` is accepted before its subcommand in every
release. ``codex exec`` cannot fork a thread (its subcommands are ``resume`` and ``review``):
baton forks by copying the rollout under a new id
(:func:`sandbox_host.agents.sessions.fork_codex_rollout`) and resuming the copy. Needs a sandbox image with
the ``codex`` CLI and the secret ``OPENAI_API_KEY`` (or ``CODEX_API_KEY``), env only.
Options: :class:`baton.agents.CodexOptions`.
"""
from __future__ import annotations

from baton.agents import CodexOptions
from baton.errors import InvalidArgument
from sandbox_host.agents._resume import check_resume
from sandbox_host.agents._spec import CODEX_EXEC_JSON, AgentLaunch


def prepare(options: CodexOptions, *, prompt: str, resume: str | None = None, fork: bool = False) -> AgentLaunch:
    """The launch of Codex (``options`` already validated by their schema).

    Args:
        options: the validated options.
        prompt: the user's prompt (stdin).
        resume: the Codex thread to resume (``resume <id>``), or ``None``.
        fork: refused: the CLI cannot fork (see the module docstring).

    Raises:
        InvalidArgument: a malformed ``resume`` id (field ``agent.resume``), or ``fork``
            (field ``agent.fork``).
    """
    check_resume(resume, fork)
    if fork:
        raise InvalidArgument("agent.fork", "codex exec cannot fork a thread: copy its rollout under a new id "
                              "(fork_codex_rollout) and resume the copy")
    argv = ["codex", "exec", "--json", "--sandbox", options.sandbox]
    if options.model is not None:
        argv += ["--model", options.model]
    if options.profile is not None:
        argv += ["--profile", options.profile]
    if options.skip_git_repo_check:
        argv.append("--skip-git-repo-check")
    if resume is not None:
        argv += ["resume", resume]
    argv.append("-")
    return AgentLaunch(
        kind="codex",
        argv=tuple(argv),
        journal_format=CODEX_EXEC_JSON,
        options=options.to_record(),
        stdin=prompt.encode("utf-8"),
        required_secrets=("OPENAI_API_KEY|CODEX_API_KEY",),
        resume=resume,
    )
