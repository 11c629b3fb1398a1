"""Agent options: one schema per agent kind, shared by the gateway and the sandbox host.

The gateway refuses a bad ``agent`` object at the edge with these models, and the host
builds the launch from the very same model, so an option the gateway accepts is one the
host understands (and the reverse). Unknown options are refused, naming the option, so a
typo never silently changes what runs.

Option names are accepted in the request's camelCase (``maxTurns``) and in snake_case
(``max_turns``, as recorded in a run record's ``AgentSpec.options_json``); the record keeps
:meth:`AgentOptions.to_record`, snake_case.

Pure: nothing here reads a file's content or talks to a server (the replay journal's path
is resolved with ``realpath``/``stat`` only, see :func:`resolve_replay_journal`).
"""
from __future__ import annotations

import os
from typing import Annotated, Any, Literal, Mapping, Sequence, Union

from pydantic import AfterValidator, AliasChoices, BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from baton.errors import InvalidArgument

AGENT_KINDS = ("replay", "claude-code", "codex")
CLAUDE_STREAM_JSON = "claude-stream-json"
CODEX_EXEC_JSON = "codex-exec-json"
#: The journal formats the replay agent plays (and the host translates).
JOURNAL_FORMATS = (CLAUDE_STREAM_JSON, CODEX_EXEC_JSON)
#: Longest free-text option (a prompt addition, a profile name), in characters.
MAX_OPTION_CHARS = 4096
MAX_PATH_CHARS = 4096
MAX_TOOLS = 256


def _text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _argument(value: str) -> str:
    # Passed on the agent's command line: a leading "-" would be read as a flag.
    if not value or value.startswith("-") or "\x00" in value:
        raise ValueError("must be a non-empty name not starting with '-'")
    return value


Text = Annotated[str, Field(max_length=MAX_OPTION_CHARS), AfterValidator(_text)]
Name = Annotated[str, Field(max_length=256), AfterValidator(_argument)]
ToolName = Annotated[str, Field(min_length=1, max_length=256), AfterValidator(_text)]


class AgentOptions(BaseModel):
    """Base of the per-kind option schemas (strict types, unknown options refused)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False,
                              alias_generator=to_camel, populate_by_name=True)

    def to_record(self) -> dict[str, Any]:
        """The options as recorded in the run record (snake_case, defaults filled in)."""
        return self.model_dump(exclude_none=True, mode="json")


class ReplayOptions(AgentOptions):
    """``replay``: a recorded journal written back with its pacing.

    Attributes:
        journal: path of the journal, absolute or relative to a replay directory
            (``BATON_REPLAY_DIRS``); resolved by :func:`resolve_replay_journal`.
        speed: pacing divisor (2 = twice as fast; 0 = no waits).
        delay: seconds waited before a line without a timestamp.
        max_gap: longest single wait, in seconds.
        format: the journal format; detected from the journal when absent.
    """

    journal: Annotated[str, Field(min_length=1, max_length=MAX_PATH_CHARS), AfterValidator(_text)]
    speed: Annotated[float, Field(ge=0, le=1000)] = 1.0
    delay: Annotated[float, Field(ge=0, le=60)] = 0.05
    max_gap: Annotated[float, Field(ge=0, le=3600)] = 5.0
    format: Literal["claude-stream-json", "codex-exec-json"] | None = None
    #: Seconds a tool approval the journal asks for waits for its answer before it counts
    #: as denied (default: the host's ``BATON_APPROVAL_TIMEOUT``).
    approval_timeout: Annotated[float, Field(gt=0, le=7 * 86400)] | None = None


class ClaudeCodeOptions(AgentOptions):
    """``claude-code``: ``claude -p --output-format stream-json --verbose``.

    Attributes:
        model: ``--model``.
        max_turns: ``--max-turns``.
        permission_mode: ``--permission-mode``.
        allowed_tools: ``--allowedTools=`` (joined with commas, one argument: a leading
            "-" is part of the value, never a flag).
        disallowed_tools: ``--disallowedTools=`` (likewise).
        include_partial_messages: ``--include-partial-messages`` (token deltas); also
            accepted as ``partial_messages``, its name in earlier records.
        append_system_prompt: ``--append-system-prompt=`` (one argument: a prompt may
            start with "-", a Markdown list).
        approvals: ask the run's users before a tool that needs permission
            (``--permission-prompt-tool stdio``: docs/hitl.md); false: such a tool is
            denied, as headless Claude Code does.
        approval_timeout: seconds an approval waits before it counts as denied.
    """

    model: Name | None = None
    max_turns: Annotated[int, Field(ge=1, le=1000)] | None = None
    permission_mode: Literal["default", "acceptEdits", "bypassPermissions", "plan"] | None = None
    allowed_tools: Annotated[list[ToolName], Field(max_length=MAX_TOOLS)] | None = None
    disallowed_tools: Annotated[list[ToolName], Field(max_length=MAX_TOOLS)] | None = None
    include_partial_messages: bool = Field(True, validation_alias=AliasChoices(
        "includePartialMessages", "include_partial_messages", "partial_messages"))
    append_system_prompt: Text | None = None
    approvals: bool = False
    #: Seconds a tool approval waits for its answer before it counts as denied (default:
    #: the host's ``BATON_APPROVAL_TIMEOUT``).
    approval_timeout: Annotated[float, Field(gt=0, le=7 * 86400)] | None = None


class CodexOptions(AgentOptions):
    """``codex``: ``codex exec --json``.

    Attributes:
        model: ``--model``.
        sandbox: Codex's own sandbox mode (``--sandbox``).
        profile: ``--profile`` (a profile of the sandbox's Codex configuration).
        skip_git_repo_check: ``--skip-git-repo-check`` (workspaces need not be git
            repositories).
    """

    model: Name | None = None
    sandbox: Literal["read-only", "workspace-write", "danger-full-access"] = "workspace-write"
    profile: Name | None = None
    skip_git_repo_check: bool = True


AnyAgentOptions = Union[ReplayOptions, ClaudeCodeOptions, CodexOptions]

SCHEMAS: Mapping[str, type[AgentOptions]] = {
    "replay": ReplayOptions,
    "claude-code": ClaudeCodeOptions,
    "codex": CodexOptions,
}


def invalid_argument(exc: ValidationError, prefix: str = "") -> InvalidArgument:
    """The first error of a pydantic validation as an :class:`InvalidArgument`.

    The field is ``prefix`` joined with the error's location (``agent.maxTurns``,
    ``messages[3].role``). The input value is never quoted (it may be a secret).
    """
    err = exc.errors(include_url=False, include_input=False)[0]
    field = prefix
    for part in err["loc"]:
        field = f"{field}[{part}]" if isinstance(part, int) else (f"{field}.{part}" if field else str(part))
    if err["type"] == "extra_forbidden":
        problem = "is not a known option"
    elif err["type"] == "missing":
        problem = "is required"
    else:
        problem = str(err["msg"]).removeprefix("Value error, ")
    return InvalidArgument(field or "body", problem)


def parse_agent_options(kind: str, options: Any, *, field: str = "agent.options") -> AnyAgentOptions:
    """Validate the options of an agent kind.

    Args:
        kind: ``replay`` | ``claude-code`` | ``codex``.
        options: the options object (decoded JSON).
        field: where the options sit in the caller's request, for errors.

    Returns:
        The kind's options model.

    Raises:
        InvalidArgument: unknown kind (field ``agent.kind``), options not an object, an
            unknown option (named in the field) or a bad value.
    """
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise InvalidArgument("agent.kind", f"must be one of {', '.join(AGENT_KINDS)}")
    if not isinstance(options, Mapping):
        raise InvalidArgument(field, "must be a JSON object")
    try:
        return schema.model_validate(dict(options))  # type: ignore[return-value]
    except ValidationError as exc:
        err = invalid_argument(exc, field)
        if exc.errors()[0]["type"] == "extra_forbidden":
            err = InvalidArgument(err.field, f"is not an option of the {kind} agent")
        raise err from None


def resolve_replay_journal(journal: str, dirs: Sequence[str | os.PathLike[str]], *,
                           field: str = "agent.options.journal") -> str:
    """The real path of a replay journal inside an allowed directory.

    Only the path is examined (``realpath`` and ``stat``): the file's content is never
    read, so a request can never make a service read a file outside ``dirs``.

    Args:
        journal: an absolute path, or a path relative to one of ``dirs``
            (``claude-stream-json/x.jsonl``).
        dirs: the allowed replay directories.
        field: the request field, for errors.

    Returns:
        The resolved absolute path (symlinks and ``..`` followed).

    Raises:
        InvalidArgument: empty, outside every allowed directory (after resolving), or not
            a regular file.
    """
    if not isinstance(journal, str) or not journal or "\x00" in journal or len(journal) > MAX_PATH_CHARS:
        raise InvalidArgument(field, "must name a recorded journal")
    roots = [os.path.realpath(d) for d in dirs]
    candidates = [journal] if os.path.isabs(journal) else [os.path.join(d, journal) for d in roots]
    for cand in candidates:
        real = os.path.realpath(cand)
        if is_inside(real, roots) and os.path.isfile(real):
            return real
    raise InvalidArgument(
        field, f"no such journal in the allowed replay directories (BATON_REPLAY_DIRS): {journal[:200]!r}")


def is_inside(real: str, roots: Sequence[str]) -> bool:
    """Whether ``real`` (a resolved path) lies inside one of ``roots`` (resolved paths)."""
    for root in roots:
        try:
            if os.path.commonpath([root, real]) == root:
                return True
        except ValueError:  # a relative and an absolute path: not inside
            continue
    return False
