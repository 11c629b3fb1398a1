"""AG-UI glue: event models → chunks, and a well-formedness check of chunk sequences.

A chunk is an AG-UI event as the JSON object a browser gets (camelCase keys), built from the
``ag_ui.core`` models (``ag-ui-protocol``); we never redefine event types.

:func:`check_well_formed` enforces the rules of the official TypeScript verifier
(``sdks/typescript/packages/client/src/verify/verify.ts`` in ag-ui-protocol/ag-ui, summarised
in journal-formats.md §3.3) plus a few that real producers break (§3.2): a closed tool call
id started again, ``RUN_FINISHED.runId`` differing from ``RUN_STARTED.runId``, snake_case
required fields.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ag_ui.core import BaseEvent, Event, EventType
from pydantic import TypeAdapter, ValidationError

_EVENT_ADAPTER: TypeAdapter[Any] = TypeAdapter(Event)
_TYPES = frozenset(t.value for t in EventType)


def event_to_chunk(event: BaseEvent) -> dict[str, Any]:
    """The chunk of an event: camelCase JSON object, ``None`` fields omitted."""
    return event.model_dump(by_alias=True, exclude_none=True, mode="json")


def chunk_to_event(chunk: Mapping[str, Any]) -> BaseEvent:
    """Parse a chunk back into its ``ag_ui.core`` model.

    Raises:
        pydantic.ValidationError: when the chunk is not a valid AG-UI event.
    """
    event: BaseEvent = _EVENT_ADAPTER.validate_python(dict(chunk))
    return event


@dataclass(frozen=True)
class Problem:
    """One violation in a chunk sequence.

    Attributes:
        index: position of the offending chunk (``len(chunks)`` for end-of-stream problems).
        code: stable name of the rule (e.g. ``after_run_error``, ``invalid_event``).
        message: for humans.
    """

    index: int
    code: str
    message: str


def check_well_formed(chunks: Iterable[Mapping[str, Any]], *, require_terminal: bool = False) -> list[Problem]:
    """Every well-formedness problem of a chunk sequence (empty list = well-formed).

    Rules (codes): ``invalid_event`` (not a valid AG-UI event: unknown type, missing or
    mistyped required field), ``first_not_run_started``, ``run_already_active``,
    ``after_run_error`` (anything after ``RUN_ERROR``), ``after_run_finished`` (anything but
    ``RUN_STARTED``/``RUN_ERROR`` after ``RUN_FINISHED``), ``run_id_mismatch``,
    ``thread_id_mismatch``, ``not_started`` (CONTENT/ARGS/END/STEP_FINISHED/REASONING_END/
    SUBAGENT_FINISHED without its open START), ``already_open`` (a START of an open id),
    ``tool_call_reused`` (a START of an id that was already closed in this run),
    ``open_at_finish`` (a message, reasoning, tool call, step or subagent open at
    ``RUN_FINISHED``), ``no_terminal`` (with ``require_terminal``: the stream does not end
    with exactly one ``RUN_FINISHED``/``RUN_ERROR``).

    Args:
        chunks: the sequence to check.
        require_terminal: also require one terminal event, last.
    """
    problems: list[Problem] = []
    seen_first = False
    active = False  # a run is in progress
    finished = False
    errored = False
    run_id: str | None = None
    thread_id: str | None = None
    open_: dict[str, set[str]] = {k: set() for k in ("text", "tool", "reasoning", "rmsg", "step", "subagent")}
    closed_tools: set[str] = set()
    terminals = 0
    last_terminal = -1
    n = 0

    def add(i: int, code: str, msg: str) -> None:
        problems.append(Problem(i, code, msg))

    starts = {
        "TEXT_MESSAGE_START": ("text", "messageId"),
        "TOOL_CALL_START": ("tool", "toolCallId"),
        "REASONING_START": ("reasoning", "messageId"),
        "REASONING_MESSAGE_START": ("rmsg", "messageId"),
        "STEP_STARTED": ("step", "stepName"),
        "SUBAGENT_STARTED": ("subagent", "subagentRunId"),
    }
    continues = {
        "TEXT_MESSAGE_CONTENT": ("text", "messageId", False),
        "TEXT_MESSAGE_END": ("text", "messageId", True),
        "TOOL_CALL_ARGS": ("tool", "toolCallId", False),
        "TOOL_CALL_END": ("tool", "toolCallId", True),
        "REASONING_MESSAGE_CONTENT": ("rmsg", "messageId", False),
        "REASONING_MESSAGE_END": ("rmsg", "messageId", True),
        "REASONING_END": ("reasoning", "messageId", True),
        "STEP_FINISHED": ("step", "stepName", True),
        "SUBAGENT_FINISHED": ("subagent", "subagentRunId", True),
        "SUBAGENT_ERROR": ("subagent", "subagentRunId", True),
    }

    for i, chunk in enumerate(chunks):
        n = i + 1
        t = chunk.get("type")
        if t not in _TYPES:
            add(i, "invalid_event", f"unknown event type {t!r}")
            continue
        try:
            event = chunk_to_event(chunk)
        except ValidationError as exc:
            missing = ", ".join(".".join(str(p) for p in e["loc"][1:]) or "?" for e in exc.errors())
            add(i, "invalid_event", f"{t}: invalid or missing {missing}")
        else:
            # The models also accept snake_case field names; the wire format is camelCase.
            absent = [
                f.alias for f in type(event).model_fields.values()
                if f.is_required() and f.alias and f.alias not in chunk
            ]
            if absent:
                add(i, "invalid_event", f"{t}: missing {', '.join(absent)} (the wire format is camelCase)")
        if errored:
            add(i, "after_run_error", f"{t} after RUN_ERROR (nothing may follow it)")
            continue
        if finished and t not in ("RUN_STARTED", "RUN_ERROR"):
            add(i, "after_run_finished", f"{t} after RUN_FINISHED (only RUN_STARTED or RUN_ERROR may follow)")
            continue
        if not seen_first:
            seen_first = True
            if t not in ("RUN_STARTED", "RUN_ERROR"):
                add(i, "first_not_run_started", f"first event is {t}, not RUN_STARTED")
        if t == "RUN_STARTED":
            if active:
                add(i, "run_already_active", "RUN_STARTED while a run is active")
            active, finished = True, False
            run_id, thread_id = chunk.get("runId"), chunk.get("threadId")
            for s in open_.values():
                s.clear()
            closed_tools.clear()
            continue
        if t in ("RUN_FINISHED", "RUN_ERROR"):
            terminals += 1
            last_terminal = i
            if t == "RUN_FINISHED":
                if run_id is not None and chunk.get("runId") != run_id:
                    add(i, "run_id_mismatch", f"RUN_FINISHED.runId {chunk.get('runId')!r} != RUN_STARTED.runId {run_id!r}")
                if thread_id is not None and chunk.get("threadId") != thread_id:
                    add(i, "thread_id_mismatch", f"RUN_FINISHED.threadId {chunk.get('threadId')!r} != {thread_id!r}")
                still = [f"{kind} {ident!r}" for kind, ids in open_.items() for ident in sorted(ids)]
                if still:
                    add(i, "open_at_finish", "RUN_FINISHED while open: " + ", ".join(still))
                finished = True
            else:
                errored = True
            active = False
            continue
        if t in starts:
            kind, key = starts[t]
            ident = chunk.get(key)
            if not isinstance(ident, str):
                continue  # reported as invalid_event
            if ident in open_[kind]:
                add(i, "already_open", f"{t} for {ident!r}, which is already open")
            elif kind == "tool" and ident in closed_tools:
                add(i, "tool_call_reused", f"TOOL_CALL_START for {ident!r}, which was already completed")
            open_[kind].add(ident)
            continue
        if t in continues:
            kind, key, closes = continues[t]
            ident = chunk.get(key)
            if not isinstance(ident, str):
                continue
            if ident not in open_[kind]:
                add(i, "not_started", f"{t} for {ident!r} without an open start")
            elif closes:
                open_[kind].discard(ident)
                if kind == "tool":
                    closed_tools.add(ident)
    if require_terminal and (terminals != 1 or last_terminal != n - 1):
        add(n, "no_terminal", f"expected exactly one terminal event, as the last; found {terminals}, "
                               f"last at {last_terminal} of {n}")
    return problems


__all__ = ["Problem", "check_well_formed", "chunk_to_event", "event_to_chunk"]
