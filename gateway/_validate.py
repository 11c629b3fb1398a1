"""Validation and limits for everything a client sends (docs/design.md §6: bad input → a clear 4xx).

Nothing here talks to a server or reads a file's content: a replay journal path is resolved
(symlinks and ``..`` included) and checked to lie inside ``BATON_REPLAY_DIRS`` from its path
alone, so a request can never make the gateway or a host read an arbitrary file.
"""
from __future__ import annotations

import json
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel
from starlette.requests import Request

from baton import errors as e
from baton.agents import (AGENT_KINDS, JOURNAL_FORMATS, ReplayOptions, invalid_argument, is_inside,
                          parse_agent_options, resolve_replay_journal)
from baton.ids import validate_id
from baton.workspace_spec import WorkspaceSpec, parse_workspace
from gateway._errors import BodyTooLarge

__all__ = ["AGENT_KINDS", "REPLAY_FORMATS", "AgentChoice", "ChatStart", "check_agent", "check_chat_start",
           "check_offset", "list_replay_journals", "read_json_object", "run_id_from"]

#: The formats a replay journal may have (the ``/api/agents`` listing shows only these).
REPLAY_FORMATS = JOURNAL_FORMATS
_OFFSET = re.compile(r"^(-1|now|[0-9]{1,20})$")
JOURNAL_SUFFIXES = (".jsonl", ".ndjson")
# Deeper bodies are refused: nothing we accept nests this deep, and every later step (the
# host's JSON, protobuf, the transcript) recurses over the value.
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class AgentChoice:
    """A validated agent: its kind and the options the host receives (JSON object)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.options, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class ChatStart:
    """A validated ``POST /api/chat``."""

    run_id: str
    thread_id: str
    messages: list[dict[str, Any]]
    agent: AgentChoice
    #: ``detachOnDisconnect: false`` in the body (the TanStack transport's word); the wire
    #: field is the inverse, so that omitting it detaches.
    cancel_on_disconnect: bool
    interrupt_active: bool
    parent_run_id: str
    #: The run's workspace (:mod:`baton.workspace_spec`); ``None`` = an empty one.
    workspace: WorkspaceSpec | None = None


async def read_json_object(request: Request, max_bytes: int) -> dict[str, Any]:
    """Read the request body as a JSON object, refusing more than ``max_bytes`` bytes.

    The limit is enforced while reading (a lying or absent ``Content-Length`` does not help).

    Raises:
        BodyTooLarge: the body is larger than ``max_bytes``.
        InvalidArgument: the body is not a JSON object, or nests deeper than
            ``MAX_JSON_DEPTH`` levels.
    """
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise BodyTooLarge(max_bytes)
    buf = bytearray()
    async for part in request.stream():
        buf += part
        if len(buf) > max_bytes:
            raise BodyTooLarge(max_bytes)
    if not buf.strip():
        return {}
    try:
        value = json.loads(buf)
    except (ValueError, UnicodeDecodeError):
        raise e.InvalidArgument("body", "must be a JSON object") from None
    except RecursionError:
        # The decoder recurses per nesting level: a body within the size limit can exhaust it.
        raise e.InvalidArgument("body", f"must not nest deeper than {MAX_JSON_DEPTH} levels") from None
    if not isinstance(value, dict):
        raise e.InvalidArgument("body", "must be a JSON object")
    if _depth(value) > MAX_JSON_DEPTH:
        raise e.InvalidArgument("body", f"must not nest deeper than {MAX_JSON_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """Nesting depth of a decoded JSON value (iterative: the value may be deep)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            v = list(v.values())
        if isinstance(v, list):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in v)
    return deepest


def check_offset(value: str) -> str:
    """An offset from a client: ``-1``, ``now`` or a stream sequence.

    Raises:
        InvalidOffset: anything else.
    """
    if not _OFFSET.match(value):
        raise e.InvalidOffset(value[:64])
    return value


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise e.InvalidArgument(name, "must be a string")
    return value


def run_id_from(headers: Mapping[str, str], query: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The run id: ``X-Run-Id`` header, else ``?runId``, else the body's ``runId`` (docs/design.md §6).

    Raises:
        DurableRunIdRequired: none of the three carries one.
        InvalidArgument: the id breaks the id rules of :mod:`baton.ids`.
    """
    for source, value in (
        ("X-Run-Id", headers.get("x-run-id")),
        ("runId", query.get("runId")),
        ("runId", _opt_str(body, "runId")),
    ):
        if value:
            return validate_id(value, source)
    raise e.DurableRunIdRequired()


def list_replay_journals(dirs: Sequence[pathlib.Path]) -> list[pathlib.Path]:
    """Journal files in the replay directories (one level of subdirectories), sorted.

    Only files that resolve inside ``dirs`` are listed (a symlink out of them is not a
    journal we may read), as :func:`baton.agents.resolve_replay_journal` would accept them.
    """
    roots = [str(d.resolve()) for d in dirs]
    found: list[pathlib.Path] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for pattern in ("*", "*/*"):
            for f in sorted(d.glob(pattern)):
                real = f.resolve()
                if f.name.endswith(JOURNAL_SUFFIXES) and real.is_file() and is_inside(str(real), roots):
                    found.append(real)
    return found


def check_agent(agent: Any, dirs: Sequence[pathlib.Path], default_kind: str) -> AgentChoice:
    """Validate the request's ``agent`` object (or pick the configured default).

    The options are checked with the kind's schema from :mod:`baton.agents`, the one the
    host launches from; a replay journal is resolved inside ``dirs`` (path checks only).

    Raises:
        InvalidArgument: unknown kind, unknown option (named in the field, e.g.
            ``agent.cmd``), or a bad value.
    """
    if agent is None:
        if default_kind == "replay":
            journals = list_replay_journals(dirs)
            return AgentChoice("replay", {"journal": str(journals[0])} if journals else {})
        return AgentChoice(default_kind, {})
    if not isinstance(agent, dict):
        raise e.InvalidArgument("agent", "must be an object")
    kind = agent.get("kind")
    if kind not in AGENT_KINDS:
        raise e.InvalidArgument("agent.kind", f"must be one of {', '.join(AGENT_KINDS)}")
    options = parse_agent_options(kind, {k: v for k, v in agent.items() if k != "kind"}, field="agent")
    if isinstance(options, ReplayOptions):
        real = resolve_replay_journal(options.journal, dirs, field="agent.journal")
        options = options.model_copy(update={"journal": real})
    return AgentChoice(kind, options.to_record())


class _Message(BaseModel):
    """An AG-UI message as far as the gateway reads it: the host passes the rest through."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str


class _ChatBody(BaseModel):
    """The fields of a ``POST /api/chat`` body the gateway reads, by their AG-UI names.

    Not ``ag_ui.core.RunAgentInput`` itself: that requires ``runId`` in the body (we also
    take it from ``X-Run-Id`` or ``?runId``), ``messages`` and ``threadId``, and validates
    each message against its role's full schema (``id`` required), which would refuse the
    message shapes TanStack clients send and the host passes through untouched. Any other
    field (``state``, ``tools``, ``context``, ...) is allowed.
    """

    model_config = ConfigDict(extra="allow", strict=True, alias_generator=to_camel)
    run_id: str | None = None
    thread_id: str | None = None
    parent_run_id: str | None = None
    messages: list[_Message] | None = None
    forwarded_props: dict[str, Any] | None = None


class _ChatOptions(BaseModel):
    """Our options, at the top level or under ``forwardedProps`` (merged before this)."""

    model_config = ConfigDict(extra="ignore", strict=True, alias_generator=to_camel)
    agent: dict[str, Any] | None = None
    detach_on_disconnect: bool = Field(True, description="false: the client leaving cancels the run")
    interrupt_active: bool = False


def _validated(model: type[BaseModel], value: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid_argument(exc) from None


def check_chat_start(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    query: Mapping[str, str],
    *,
    replay_dirs: Sequence[pathlib.Path],
    default_agent: str,
    max_messages: int,
    workspace_dirs: Sequence[str] = (),
) -> ChatStart:
    """Validate a ``POST /api/chat`` (AG-UI run input plus our options).

    Our options may sit at the top level or, as the TanStack client sends its ``body``
    option, under ``forwardedProps``; the top level wins.

    Raises:
        DurableRunIdRequired: no run id anywhere.
        InvalidArgument: any other bad input, naming the field (``messages[3].role``).
    """
    parsed: _ChatBody = _validated(_ChatBody, body)
    run_id = run_id_from(headers, query, body)
    thread_id = parsed.thread_id or query.get("threadId")
    if not thread_id:
        raise e.InvalidArgument("threadId", "is required")
    validate_id(thread_id, "threadId")
    props = parsed.forwarded_props or {}
    merged = {name: body[name] if body.get(name) is not None else props.get(name)
              for name in ("agent", "detachOnDisconnect", "interruptActive", "workspace")}
    workspace = parse_workspace(merged.pop("workspace"), dirs=workspace_dirs)
    opts: _ChatOptions = _validated(_ChatOptions, {k: v for k, v in merged.items() if v is not None})
    messages: list[dict[str, Any]] = list(body.get("messages") or [])
    if len(messages) > max_messages:
        raise e.InvalidArgument("messages", f"must hold at most {max_messages} messages")
    try:
        # JSON may escape a lone surrogate ("\ud800"); UTF-8 cannot hold it, and the input
        # is stored as UTF-8 (run.accepted, the transcript).
        json.dumps(messages, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise e.InvalidArgument("messages", "must not contain a lone surrogate (\\ud800-\\udfff)") from None
    parent = parsed.parent_run_id or ""
    if parent:
        validate_id(parent, "parentRunId")
    return ChatStart(
        run_id=run_id,
        thread_id=thread_id,
        messages=messages,
        agent=check_agent(opts.agent, replay_dirs, default_agent),
        cancel_on_disconnect=not opts.detach_on_disconnect,
        interrupt_active=opts.interrupt_active,
        parent_run_id=parent,
        workspace=workspace,
    )
