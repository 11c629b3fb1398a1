"""The run service's requests: what a client asks for, once its edge (HTTP JSON, gRPC proto)
parsed it, and the checks every edge shares (docs/design.md §6: bad input → a clear 4xx).

An edge turns its own format into these frozen dataclasses and nothing else: the HTTP edge
in :mod:`gateway._http_input`, the gRPC edge in :mod:`gateway._grpc_input`. The rules both
share (id rules, message limits, agent options, offsets) are checked here, once.

Nothing here talks to a server or reads a file's content: a replay journal path is resolved
(symlinks and ``..`` included) and checked to lie inside ``BATON_REPLAY_DIRS`` from its path
alone, so a request can never make the gateway or a host read an arbitrary file.

Adding a field to the start request (one place per layer): a field of :class:`StartRequest`
(with a default) checked in :func:`start_request`; each edge's parser passes it
(``gateway._http_input.check_chat_start``, ``gateway._grpc_input.start_request_of``); the
host request is built from it in ``gateway._service._start.host_request``.
"""
from __future__ import annotations

import json
import math
import pathlib
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from baton import errors as e
from baton.agents import (AGENT_KINDS, JOURNAL_FORMATS, ReplayOptions, invalid_argument, is_inside,
                          parse_agent_options, resolve_replay_journal)
from baton.ids import validate_id
from baton.workspace_spec import WorkspaceSpec, parse_workspace

__all__ = ["AGENT_KINDS", "MAX_CANCEL_WAIT", "MAX_JSON_DEPTH", "REPLAY_FORMATS", "AgentChoice", "CancelRequest",
           "JoinRequest", "ListRunsRequest", "StartLimits", "StartRequest", "agent_list", "cancel_request",
           "check_agent", "check_cancel_timeout", "check_offset", "json_depth", "list_replay_journals",
           "start_request"]

#: The formats a replay journal may have (the agent listing shows only these).
REPLAY_FORMATS = JOURNAL_FORMATS
_OFFSET = re.compile(r"^(-1|now|snapshot|[0-9]{1,20})$")
JOURNAL_SUFFIXES = (".jsonl", ".ndjson")
# Deeper input is refused: nothing we accept nests this deep, and every later step (the
# host's JSON, protobuf, the transcript) recurses over the value.
MAX_JSON_DEPTH = 64
#: Longest wait a cancel with ``wait`` may ask for, in seconds.
MAX_CANCEL_WAIT = 300.0


@dataclass(frozen=True)
class AgentChoice:
    """A validated agent: its kind and the options the host receives (JSON object)."""

    kind: str
    options: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(self.options, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class StartLimits:
    """What a start request is checked against (from the gateway settings)."""

    replay_dirs: Sequence[pathlib.Path]
    default_agent: str
    max_messages: int
    #: Resolved directories a workspace ``dir`` (or local git repository) may name.
    workspace_dirs: Sequence[str] = ()


@dataclass(frozen=True)
class StartRequest:
    """A checked start (``POST /api/chat``, ``Runs.StartRun``): build it with :func:`start_request`."""

    run_id: str
    thread_id: str
    messages: list[dict[str, Any]]
    agent: AgentChoice
    #: The client leaving cancels the run (HTTP ``detachOnDisconnect: false``); default: detach.
    cancel_on_disconnect: bool = False
    interrupt_active: bool = False
    parent_run_id: str = ""
    #: The thread's workspace (its first run names it; ``None``: none named).
    workspace: WorkspaceSpec | None = None
    #: A busy thread: ``reject`` | ``enqueue`` | ``interrupt`` | ``steer`` (docs/hitl.md).
    multitask: str = "reject"


@dataclass(frozen=True)
class JoinRequest:
    """A join of a run's log strictly after ``after`` (``-1``, ``now``, ``snapshot`` or a stream
    sequence). ``keep_ttl`` > 0: also keep the run that many seconds should it be detached
    (as a keep-alive, :mod:`gateway._service._keep`). ``messages``: a join from the snapshot
    gets only its newest that many messages (0: all; ignored by other joins, so a reconnect
    that keeps it resumes as usual)."""

    run_id: str
    after: str = "-1"
    keep_ttl: float = 0.0
    messages: int = 0


@dataclass(frozen=True)
class CancelRequest:
    """A cancel of ``run_id``, else of ``thread_id``'s active run; ``wait``: until terminal,
    at most ``timeout`` seconds."""

    run_id: str | None
    thread_id: str | None
    wait: bool
    timeout: float


@dataclass(frozen=True)
class ListRunsRequest:
    """A page of runs (of ``thread_id``, else every run the caller may see)."""

    thread_id: str | None
    page_size: int
    page_token: str


class _Message(BaseModel):
    """An AG-UI message as far as the gateway reads it: the host passes the rest through."""

    model_config = ConfigDict(extra="allow", strict=True)
    role: str


_MESSAGES: TypeAdapter[list[_Message]] = TypeAdapter(list[_Message])


def start_request(*, run_id: str, thread_id: str | None, messages: Any, agent: Any, limits: StartLimits,
                  cancel_on_disconnect: bool = False, interrupt_active: bool = False,
                  parent_run_id: str = "", workspace: Any = None, multitask: Any = None) -> StartRequest:
    """The checks every start shares, whatever its edge.

    Args:
        run_id: the run id (an edge refuses a missing one with ``DurableRunIdRequired``).
        thread_id: the thread id (required).
        messages: the decoded AG-UI messages (``None``: none).
        agent: the decoded agent object (``{"kind", ...options}``) or ``None`` (the default).
        workspace: the decoded workspace object (:mod:`baton.workspace_spec`) or ``None``.

    Raises:
        InvalidArgument: naming the field (``threadId``, ``messages[3].role``, ``agent.cmd``).
    """
    validate_id(run_id, "runId")
    if not thread_id:
        raise e.InvalidArgument("threadId", "is required")
    validate_id(thread_id, "threadId")
    if messages is not None:
        try:
            _MESSAGES.validate_python(messages, strict=True)
        except ValidationError as exc:
            raise invalid_argument(exc, "messages") from None
    msgs: list[dict[str, Any]] = list(messages or [])
    if len(msgs) > limits.max_messages:
        raise e.InvalidArgument("messages", f"must hold at most {limits.max_messages} messages")
    try:
        # JSON may escape a lone surrogate ("\ud800"); UTF-8 cannot hold it, and the input
        # is stored as UTF-8 (run.accepted, the transcript).
        json.dumps(msgs, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise e.InvalidArgument("messages", "must not contain a lone surrogate (\\ud800-\\udfff)") from None
    if parent_run_id:
        validate_id(parent_run_id, "parentRunId")
    return StartRequest(
        run_id=run_id,
        thread_id=thread_id,
        messages=msgs,
        agent=check_agent(agent, limits.replay_dirs, limits.default_agent),
        cancel_on_disconnect=cancel_on_disconnect,
        interrupt_active=interrupt_active,
        parent_run_id=parent_run_id,
        workspace=parse_workspace(workspace, dirs=limits.workspace_dirs),
        multitask=check_multitask(multitask),
    )


#: The choices for a message to a busy thread (docs/hitl.md; LangGraph's double-texting names).
MULTITASK = ("reject", "enqueue", "interrupt", "steer")


def check_multitask(value: Any) -> str:
    """The strategy named by ``value`` (``None`` or ``""``: ``reject``).

    Raises:
        InvalidArgument: not one of :data:`MULTITASK`.
    """
    if value is None or value == "":
        return "reject"
    if value not in MULTITASK:
        raise e.InvalidArgument("multitask", f"must be one of {', '.join(MULTITASK)}")
    return str(value)


def json_depth(value: Any) -> int:
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
    """An offset from a client: ``-1``, ``now``, ``snapshot`` (the latest snapshot, then the
    chunks after it: a join only) or a stream sequence.

    Raises:
        InvalidOffset: anything else.
    """
    if not _OFFSET.match(value):
        raise e.InvalidOffset(value[:64])
    return value


def check_cancel_timeout(raw: float | None, default: float) -> float:
    """The seconds a cancel with ``wait`` waits: ``raw`` in (0, MAX_CANCEL_WAIT], or ``default``.

    Raises:
        InvalidArgument: out of range or not finite.
    """
    if raw is None:
        return default
    if not math.isfinite(raw) or not 0 < raw <= MAX_CANCEL_WAIT:
        raise e.InvalidArgument("timeout", f"must be in (0, {MAX_CANCEL_WAIT:g}] seconds")
    return raw


def cancel_request(run_id: str | None, thread_id: str | None, *, wait: bool, timeout: float | None,
                   default_timeout: float) -> CancelRequest:
    """A checked cancel.

    Raises:
        InvalidArgument: a bad id or timeout.
    """
    if run_id:
        validate_id(run_id, "runId")
    elif thread_id:
        validate_id(thread_id, "threadId")
    return CancelRequest(run_id or None, thread_id or None, wait, check_cancel_timeout(timeout, default_timeout))


def list_replay_journals(dirs: Sequence[pathlib.Path]) -> list[pathlib.Path]:
    """Journal files in the replay directories (one level of subdirectories), sorted, each
    once (directories that overlap, or links to one file, list it once).

    Only files that resolve inside ``dirs`` are listed (a symlink out of them is not a
    journal we may read), as :func:`baton.agents.resolve_replay_journal` would accept them.
    """
    roots = [str(d.resolve()) for d in dirs]
    found: dict[pathlib.Path, None] = {}  # each file once, however many dirs or links reach it
    for d in dirs:
        if not d.is_dir():
            continue
        for pattern in ("*", "*/*"):
            for f in sorted(d.glob(pattern)):
                real = f.resolve()
                if f.name.endswith(JOURNAL_SUFFIXES) and real.is_file() and is_inside(str(real), roots):
                    found.setdefault(real)
    return list(found)


def check_agent(agent: Any, dirs: Sequence[pathlib.Path], default_kind: str) -> AgentChoice:
    """Validate the request's agent object (or pick the configured default).

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


def agent_list(dirs: Sequence[pathlib.Path]) -> list[dict[str, str]]:
    """The agents a client may pick: replay journals, then the other kinds."""
    items: list[dict[str, str]] = []
    for path in list_replay_journals(dirs):
        fmt = path.parent.name if path.parent.name in REPLAY_FORMATS else None
        if fmt is None:
            continue  # not a journal format the replay agent plays (e.g. recorded AG-UI streams)
        rel = next((str(path.relative_to(d.resolve())) for d in dirs if path.is_relative_to(d.resolve())), path.name)
        if any(i["journal"] == rel for i in items):
            continue  # the same journal shipped in two corpus directories: the first one's plays
        items.append({"kind": "replay", "journal": rel, "format": fmt, "name": f"replay: {rel}"})
    items += [{"kind": k, "name": k} for k in AGENT_KINDS if k != "replay"]
    return items
