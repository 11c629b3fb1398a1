"""What an agent kind produces: the files, command and journal format of one launch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

#: Journal formats known to :func:`sandbox_host.translate.translator_for`.
CLAUDE_STREAM_JSON = "claude-stream-json"
CODEX_EXEC_JSON = "codex-exec-json"
JOURNAL_FORMATS = (CLAUDE_STREAM_JSON, CODEX_EXEC_JSON)


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
        env: plain environment for the agent.
        required_secrets: secret names the agent needs (any one of each tuple entry's
            alternatives separated by ``|``); the host refuses to launch without them.
    """

    kind: str
    argv: tuple[str, ...]
    journal_format: str
    options: Mapping[str, Any]
    stdin: bytes | None = None
    files: Mapping[str, tuple[bytes, int]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    required_secrets: tuple[str, ...] = ()

    def missing_secrets(self, secrets: Mapping[str, str]) -> list[str]:
        """Names (``A|B`` alternatives) of required secrets that ``secrets`` lacks."""
        return [
            need for need in self.required_secrets
            if not any(secrets.get(name) for name in need.split("|"))
        ]
