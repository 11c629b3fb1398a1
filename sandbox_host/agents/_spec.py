"""What an agent kind produces: the files, command and journal format of one launch."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Mapping

#: Journal formats known to :func:`sandbox_host.translate.translator_for` (defined with the
#: option schemas, which the gateway shares).
from baton.agents import CLAUDE_STREAM_JSON as CLAUDE_STREAM_JSON
from baton.agents import CODEX_EXEC_JSON as CODEX_EXEC_JSON
from baton.agents import JOURNAL_FORMATS as JOURNAL_FORMATS


@dataclass(frozen=True)
class AgentLaunch:
    """Everything a host needs to start an agent kind in a sandbox.

    Attributes:
        kind: the agent kind (``replay`` | ``claude-code`` | ``codex``).
        argv: the command line, run in the sandbox's workspace (relative paths are
            relative to it).
        journal_format: the translator to use for its journal.
        options: the resolved options to record in the run record's ``AgentSpec``, so a
            takeover host uses the same translator (never holds secrets).
        stdin: bytes for the agent's stdin (the prompt), or ``None``.
        files: ``path (relative to the workspace) -> (content, mode)`` to copy in first.
        sources: ``path (relative to the workspace) -> (host path, mode)``: host files to
            copy in first, read only when the agent is launched (:func:`load_files`), so
            preparing a launch (done on the start request, before any record exists) never
            reads a whole journal.
        env: plain environment for the agent.
        required_secrets: secret names the agent needs (any one of each tuple entry's
            alternatives separated by ``|``); the host refuses to launch without them.
        resume: the agent session this launch resumes (``--resume <id>`` /
            ``exec resume <id>``), or ``None`` for a fresh session; what
            :func:`sandbox_host.agents.sessions.resume_refused` checks the outcome against.
        fork: the resumed session goes on under a new id (Claude ``--fork-session``).
        interactive: the agent reads further input on stdin after ``stdin`` (tool-approval
            answers, steered messages: docs/hitl.md), from the sandbox's inbox.
    """

    kind: str
    argv: tuple[str, ...]
    journal_format: str
    options: Mapping[str, Any]
    stdin: bytes | None = None
    files: Mapping[str, tuple[bytes, int]] = field(default_factory=dict)
    sources: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    required_secrets: tuple[str, ...] = ()
    resume: str | None = None
    fork: bool = False
    interactive: bool = False

    def missing_secrets(self, secrets: Mapping[str, str]) -> list[str]:
        """Names (``A|B`` alternatives) of required secrets that ``secrets`` lacks."""
        return [
            need for need in self.required_secrets
            if not any(secrets.get(name) for name in need.split("|"))
        ]


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


async def load_files(launch: AgentLaunch) -> dict[str, tuple[bytes, int]]:
    """Every file to copy into the sandbox, ``sources`` read from the host's disk.

    The reads run in a worker thread (a replay journal can be megabytes).

    Returns:
        ``path (relative to the workspace) -> (content, mode)``.

    Raises:
        OSError: a source file could not be read.
    """
    out = dict(launch.files)
    for rel, (path, mode) in launch.sources.items():
        out[rel] = (await asyncio.to_thread(_read, path), mode)
    return out
