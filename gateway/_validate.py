"""Validation and limits for everything a client sends (DESIGN.md §6: bad input → a clear 4xx).

Nothing here talks to a server or reads a file's content: a replay journal path is resolved
(symlinks and ``..`` included) and checked to lie inside ``BATON_REPLAY_DIRS`` from its path
alone, so a request can never make the gateway or a host read an arbitrary file.
"""
from __future__ import annotations

import json
import math
import os
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from starlette.requests import Request

from baton import errors as e
from baton.ids import validate_id
from gateway._errors import BodyTooLarge

AGENT_KINDS = ("replay", "claude-code", "codex")

# Allowed option names per agent kind; anything else is refused, so a typo never silently
# changes what runs. Values are type-checked in `_check_option`.
AGENT_FIELDS: Mapping[str, frozenset[str]] = {
    "replay": frozenset({"kind", "journal", "speed", "delay", "max_gap", "format"}),
    "claude-code": frozenset({
        "kind", "model", "maxTurns", "permissionMode", "allowedTools", "disallowedTools",
        "includePartialMessages", "appendSystemPrompt",
    }),
    "codex": frozenset({"kind", "model", "sandbox", "profile"}),
}
REPLAY_FORMATS = ("claude-stream-json", "codex-exec-json")
REPLAY_NUMBERS: Mapping[str, float] = {"speed": 1000.0, "delay": 60.0, "max_gap": 3600.0}
MAX_OPTION_CHARS = 4096
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


def _opt_bool(value: Any, name: str, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise e.InvalidArgument(name, "must be true or false")
    return value


def run_id_from(headers: Mapping[str, str], query: Mapping[str, str], body: Mapping[str, Any]) -> str:
    """The run id: ``X-Run-Id`` header, else ``?runId``, else the body's ``runId`` (DESIGN.md §6).

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


def inside(path: pathlib.Path, dirs: Sequence[pathlib.Path]) -> bool:
    """Whether ``path`` (already resolved) lies inside one of ``dirs`` (resolved here)."""
    for d in dirs:
        root = os.path.realpath(d)
        try:
            if os.path.commonpath([root, str(path)]) == root:
                return True
        except ValueError:
            continue
    return False


def resolve_replay_journal(value: Any, dirs: Sequence[pathlib.Path]) -> str:
    """Resolve a replay journal path and check it lies inside an allowed directory.

    Args:
        value: the path the client sent: absolute, or relative to one of ``dirs``.
        dirs: the allowed replay directories (``BATON_REPLAY_DIRS``).

    Returns:
        The resolved absolute path (symlinks followed), for the host to read.

    Raises:
        InvalidArgument: not a string, outside every allowed directory (after resolving
            symlinks and ``..``), or not a regular file. The file's content is never read.
    """
    field_name = "agent.journal"
    if not isinstance(value, str) or not value or "\x00" in value or len(value) > 4096:
        raise e.InvalidArgument(field_name, "must be a non-empty path string")
    p = pathlib.Path(value)
    candidates = [p] if p.is_absolute() else [d / p for d in dirs]
    for c in candidates:
        real = pathlib.Path(os.path.realpath(c))
        if inside(real, dirs) and real.is_file():
            return str(real)
    raise e.InvalidArgument(
        field_name, "must name a journal file inside the allowed replay directories (BATON_REPLAY_DIRS)"
    )


def _check_option(kind: str, name: str, value: Any, dirs: Sequence[pathlib.Path]) -> Any:
    where = f"agent.{name}"
    if kind == "replay" and name == "journal":
        return resolve_replay_journal(value, dirs)
    if kind == "replay" and name in REPLAY_NUMBERS:
        # speed divides the journal's pacing (0 = no waits); delay is the wait per line
        # without a timestamp and max_gap caps every wait, both in seconds.
        top = REPLAY_NUMBERS[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value <= top:
            raise e.InvalidArgument(where, f"must be a number in [0, {top:g}]")
        return float(value)
    if kind == "replay" and name == "format":
        if value not in REPLAY_FORMATS:
            raise e.InvalidArgument(where, f"must be one of {', '.join(REPLAY_FORMATS)}")
        return value
    if name in ("maxTurns",):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
            raise e.InvalidArgument(where, "must be an integer in [1, 1000]")
        return value
    if name == "includePartialMessages":
        return _opt_bool(value, where, False)
    if name in ("allowedTools", "disallowedTools"):
        if not isinstance(value, list) or not all(isinstance(t, str) and 0 < len(t) <= 256 for t in value) \
                or len(value) > 256:
            raise e.InvalidArgument(where, "must be a list of tool names")
        return value
    if not isinstance(value, str) or len(value) > MAX_OPTION_CHARS or "\x00" in value:
        raise e.InvalidArgument(where, f"must be a string of at most {MAX_OPTION_CHARS} characters")
    return value


def list_replay_journals(dirs: Sequence[pathlib.Path]) -> list[pathlib.Path]:
    """Journal files in the replay directories (one level of subdirectories), sorted.

    Only files that resolve inside ``dirs`` are listed (a symlink out of them is not a
    journal we may read), as :func:`resolve_replay_journal` would accept them.
    """
    found: list[pathlib.Path] = []
    for d in dirs:
        if not d.is_dir():
            continue
        for pattern in ("*", "*/*"):
            for f in sorted(d.glob(pattern)):
                real = f.resolve()
                if f.name.endswith(JOURNAL_SUFFIXES) and real.is_file() and inside(real, dirs):
                    found.append(real)
    return found


def check_agent(agent: Any, dirs: Sequence[pathlib.Path], default_kind: str) -> AgentChoice:
    """Validate the request's ``agent`` object (or pick the configured default).

    Raises:
        InvalidArgument: unknown kind, unknown field, or a bad value.
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
    unknown = sorted(set(agent) - AGENT_FIELDS[kind])
    if unknown:
        raise e.InvalidArgument(f"agent.{unknown[0]}", f"is not an option of the {kind} agent")
    options = {k: _check_option(kind, k, v, dirs) for k, v in agent.items() if k != "kind"}
    if kind == "replay" and "journal" not in options:
        raise e.InvalidArgument("agent.journal", "is required for the replay agent")
    return AgentChoice(kind, options)


def check_messages(value: Any, max_messages: int) -> list[dict[str, Any]]:
    """The AG-UI messages: a list of at most ``max_messages`` objects with a string ``role``.

    Raises:
        InvalidArgument: otherwise.
    """
    if value is None:
        return []
    if not isinstance(value, list):
        raise e.InvalidArgument("messages", "must be a list")
    if len(value) > max_messages:
        raise e.InvalidArgument("messages", f"must hold at most {max_messages} messages")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise e.InvalidArgument(f"messages[{i}]", "must be an object with a string role")
    return value


def check_chat_start(
    body: Mapping[str, Any],
    headers: Mapping[str, str],
    query: Mapping[str, str],
    *,
    replay_dirs: Sequence[pathlib.Path],
    default_agent: str,
    max_messages: int,
) -> ChatStart:
    """Validate a ``POST /api/chat`` (AG-UI run input plus our options).

    Our options may sit at the top level or, as the TanStack client sends its ``body``
    option, under ``forwardedProps``; the top level wins.

    Raises:
        DurableRunIdRequired: no run id anywhere.
        InvalidArgument: any other bad input.
    """
    run_id = run_id_from(headers, query, body)
    thread_id = _opt_str(body, "threadId") or query.get("threadId")
    if not thread_id:
        raise e.InvalidArgument("threadId", "is required")
    validate_id(thread_id, "threadId")
    props = body.get("forwardedProps")
    if props is not None and not isinstance(props, dict):
        raise e.InvalidArgument("forwardedProps", "must be an object")
    props = props or {}

    def opt(name: str) -> Any:
        return body[name] if body.get(name) is not None else props.get(name)

    parent = _opt_str(body, "parentRunId") or ""
    if parent:
        validate_id(parent, "parentRunId")
    return ChatStart(
        run_id=run_id,
        thread_id=thread_id,
        messages=check_messages(body.get("messages"), max_messages),
        agent=check_agent(opt("agent"), replay_dirs, default_agent),
        cancel_on_disconnect=not _opt_bool(opt("detachOnDisconnect"), "detachOnDisconnect", True),
        interrupt_active=_opt_bool(opt("interruptActive"), "interruptActive", False),
        parent_run_id=parent,
    )
