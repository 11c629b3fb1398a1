"""What every journal translator shares: framing, open-item bookkeeping, the terminal.

A translator is a pure state machine over journal lines (journal-formats.md §0): the same
lines in the same order give the same chunks on any host at any time. Ids come from journal
data or from ``<run_id>-<n>`` (a run-scoped counter), never from the clock or randomness.

Output contract (docs/design.md §5.3, docs/internals.md): ``RUN_STARTED`` (our run and thread id)
first; exactly one terminal, emitted by :meth:`Translator.finish` at final EOF from the
last turn's outcome (so a journal with several turns is one run with one step per turn);
nothing open at ``RUN_FINISHED``; nothing after the terminal. Non-JSON lines become
``CUSTOM journal.unparsed_line``; a trailing fragment becomes ``CUSTOM
journal.truncated_line`` followed by ``RUN_ERROR`` code ``incomplete_journal``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ag_ui.core import (
    BaseEvent,
    ReasoningEncryptedValueEvent,
    ReasoningEndEvent,
    ReasoningMessageEndEvent,
    ReasoningMessageStartEvent,
    ReasoningStartEvent,
    RunErrorEvent,
    RunFinishedEvent,
    RunStartedEvent,
    StepFinishedEvent,
    StepStartedEvent,
    SubagentErrorEvent,
    SubagentFinishedEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    TokenUsage,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from baton.agui import event_to_chunk
from sandbox_host.translate._inputs import asked_again_chunk, ask_chunks, input_chunks, reask_chunk

Chunk = dict[str, Any]
#: Longest delta in one CONTENT/ARGS chunk (characters): one journal line can hold MiBs
#: (a Write of a big file), a delivery-log message should not.
MAX_DELTA = 256 * 1024
#: Largest TOOL_CALL_RESULT content kept, in bytes of its JSON string. One delivery-log message
#: holds one chunk and NATS refuses messages over ``max_payload`` (1 MiB by default); Read
#: results over 1 MiB are reported in the wild (journal-formats.md §0.2). A fixed number, not
#: the server's setting, so every host cuts a result the same way and a replay aligns.
MAX_RESULT_BYTES = 512 * 1024
#: Characters of an unparsed or truncated line quoted in its CUSTOM chunk.
QUOTE_LIMIT = 4096
INCOMPLETE = "incomplete_journal"
#: Characters of one string kept in a structured tool result (``metadata``): the full text is
#: the result's ``content`` already; the structured form is for fields a UI shows apart.
STRUCT_STRING_LIMIT = 16 * 1024
_USAGE_FIELDS = ("input_tokens", "output_tokens", "total_tokens", "reasoning_tokens", "cached_input_tokens",
                 "cache_write_input_tokens")


@dataclass
class Outcome:
    """How the last turn ended (the terminal is emitted from it at final EOF)."""

    ok: bool
    message: str = ""
    code: str = ""
    result: Any = None


def int_field(obj: dict[str, Any], key: str) -> int | None:
    """``obj[key]`` when it is an integer (not a bool), else ``None`` (usage counters)."""
    v = obj.get(key)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def add_usage(a: TokenUsage | None, b: TokenUsage) -> TokenUsage:
    """Field-wise sum of two usages (a field absent from both stays absent)."""
    if a is None:
        return b
    vals: dict[str, int | None] = {}
    for f in _USAGE_FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        vals[f] = None if x is None and y is None else (x or 0) + (y or 0)
    return TokenUsage(provider=b.provider or a.provider, **vals)  # type: ignore[arg-type]


def sub_usage(cur: TokenUsage, prev: TokenUsage) -> TokenUsage | None:
    """``cur - prev`` field-wise when no field went down (a running total), else ``None``."""
    vals: dict[str, int | None] = {}
    for f in _USAGE_FIELDS:
        x, y = getattr(cur, f), getattr(prev, f)
        if x is not None and y is not None and x < y:
            return None
        vals[f] = None if x is None else x - (y or 0)
    return TokenUsage(provider=cur.provider, **vals)  # type: ignore[arg-type]


def usage_dict(usage: TokenUsage) -> dict[str, Any]:
    """A usage as its chunk form (camelCase, absent fields omitted)."""
    return usage.model_dump(by_alias=True, exclude_none=True, mode="json")


def bounded(value: Any, depth: int = 0) -> Any:
    """A copy of structured tool-result data small enough for one delivery-log message.

    Strings over :data:`STRUCT_STRING_LIMIT` characters are cut and marked
    (``"…[baton: cut to N of M characters]"``); nesting deeper than 4 levels and lists over
    100 items are summarised. Pure and deterministic, like :func:`cut_result`.
    """
    if isinstance(value, str):
        if len(value) <= STRUCT_STRING_LIMIT:
            return value
        return value[:STRUCT_STRING_LIMIT] + f"…[baton: cut to {STRUCT_STRING_LIMIT} of {len(value)} characters]"
    if isinstance(value, dict):
        if depth >= 4:
            return {"omitted": "nested too deep", "keys": len(value)}
        return {str(k): bounded(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        if depth >= 4:
            return {"omitted": "nested too deep", "items": len(value)}
        head = [bounded(v, depth + 1) for v in value[:100]]
        return head + ([{"omitted": f"{len(value) - 100} more items"}] if len(value) > 100 else [])
    return value


#: Largest structured form (JSON bytes) kept in one result's metadata, beside a content of up
#: to :data:`MAX_RESULT_BYTES`: together they stay under one delivery-log message.
STRUCT_LIMIT = 64 * 1024


def structured(value: Any) -> Any:
    """:func:`bounded`, and when its JSON is still over :data:`STRUCT_LIMIT` bytes, only the
    top-level scalars (numbers, booleans, strings up to 256 characters) and an ``omitted``
    note (``{"bytes": n, "keys": [...]}``). Pure and deterministic."""
    value = bounded(value)
    size = len(compact_json(value).encode())
    if size <= STRUCT_LIMIT:
        return value
    if not isinstance(value, dict):
        return {"omitted": {"bytes": size}}
    kept = {k: v for k, v in value.items()
            if isinstance(v, (bool, int, float)) or (isinstance(v, str) and len(v) <= 256)}
    return {**kept, "omitted": {"bytes": size, "keys": sorted(k for k in value if k not in kept)}}


def compact_json(value: Any) -> str:
    """JSON as the CLIs write it: no spaces, non-ASCII kept (journal-formats.md §1.2)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def quote(data: bytes) -> str:
    """A bounded, always-decodable quote of raw journal bytes."""
    return data[:QUOTE_LIMIT].decode("utf-8", "replace")


def _json_size(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode())


def _cut_marker(kept: int, total: int) -> str:
    return f"\n[baton: tool result cut to {kept} of {total} characters]"


def cut_result(content: str) -> tuple[str, dict[str, int] | None]:
    """Fit a tool result into one delivery-log message (pure, deterministic).

    Args:
        content: the result text.

    Returns:
        ``(content, None)`` when its JSON string is at most :data:`MAX_RESULT_BYTES`; else
        the longest prefix that fits together with a marker naming the cut, and
        ``{"keptChars": k, "totalChars": n}`` for the event's metadata.
    """
    if _json_size(content) <= MAX_RESULT_BYTES:
        return content, None
    total = len(content)
    lo, hi = 0, min(total, MAX_RESULT_BYTES)  # a character is at least one byte
    while lo < hi:  # the longest prefix whose text + marker fits
        mid = (lo + hi + 1) // 2
        if _json_size(content[:mid] + _cut_marker(mid, total)) <= MAX_RESULT_BYTES:
            lo = mid
        else:
            hi = mid - 1
    return content[:lo] + _cut_marker(lo, total), {"keptChars": lo, "totalChars": total}


class Translator:
    """Base of the journal → AG-UI translators.

    Args:
        run_id: our run id (``RUN_STARTED.runId``, and the prefix of generated ids).
        thread_id: our thread id.
    """

    #: journal format name, e.g. ``claude-stream-json``.
    format: str = ""
    #: prefix of CUSTOM names for this format's own line types (``claude``, ``codex``).
    prefix: str = ""

    def __init__(self, run_id: str, thread_id: str) -> None:
        self.run_id = run_id
        self.thread_id = thread_id
        self.line_no = 0
        self._out: list[Chunk] = []
        self._started = False
        self._ended = False
        self._n = 0
        self._turn = 0
        self._step: str | None = None
        # id -> subagent run id (or None) of open items, in opening order.
        self._text: dict[str, str | None] = {}
        self._reasoning: dict[str, str | None] = {}
        self._tools: dict[str, str | None] = {}
        self._subagents: dict[str, None] = {}
        self._done_subagents: set[str] = set()
        self._outcome: Outcome | None = None
        self._run_usage: TokenUsage | None = None  # sum of the turns' usage
        self._run_cost: float | None = None  # sum of the turns' cost (USD)
        self._usage_turns = 0
        self._approval_tools: dict[str, str | None] = {}  # approval (request) id -> tool call id
        self._approval_of: dict[str, str] = {}  # a re-ask's request id -> the approval it repeats
        self._answered: dict[str, bool] = {}  # approvals whose answer activity was emitted -> approved
        # approval id -> (tool call id, tool name, input JSON, agent start it was asked in)
        self._asked: dict[str, tuple[str | None, str, str, int]] = {}
        self._tool_results: set[str] = set()  # tool call ids with a result
        self._agent_starts = 0  # agent processes (or turns) begun: a journal's ``init`` lines

    # --- public contract ------------------------------------------------------------------

    def start(self) -> list[Chunk]:
        """The run's opening chunk (``RUN_STARTED``), before any journal line.

        It depends on the run and thread ids alone, so a fresh start appends it (origin
        ``journal``) before the sandbox exists — the log then opens with ``RUN_STARTED`` as
        the AG-UI verifier demands, ahead of the host's ``run.accepted`` — and a replay on
        another host reproduces it at the same position. Idempotent: ``[]`` once started.
        """
        if self._ended:
            return []
        self._out = []
        self._ensure_started()
        return self._take()

    def feed(self, line: bytes) -> list[Chunk]:
        """Translate one complete journal line (without its ``\\n``; ``\\r`` is stripped).

        Returns:
            The chunks this line completes (possibly none). Never raises on bad input:
            non-JSON lines and unknown line types become ``CUSTOM`` chunks.
        """
        if self._ended:
            return []
        self.line_no += 1
        self._out = []
        self._ensure_started()
        line = line.strip()
        if line:
            try:
                obj = self._parse(line)
            except ValueError:  # includes UnicodeDecodeError (invalid UTF-8)
                self._unparsed(line)
            else:
                if isinstance(obj, dict):
                    if obj.get("type") == "baton_input":
                        for chunk in input_chunks(obj, self._approval_tools.get, self._approval_of, self._answered):
                            self._emit_chunk(chunk)
                    else:
                        self._line(obj)
                else:
                    self._custom("journal.unknown_line", {"line": self.line_no, "value": obj})
        return self._take()

    def feed_oversized(self, head: bytes, size: int) -> list[Chunk]:
        """Report one journal line too long to be held (``sandbox_host.journal.MAX_LINE_BYTES``)
        in place of translating it: ``CUSTOM journal.oversized_line`` with its line number,
        its ``size`` in bytes and a quote of its ``head``. What the line would have been
        (a message, a tool result) is missing from the run, as a line the agent never wrote.

        Returns:
            The chunks (possibly ``RUN_STARTED`` first); ``[]`` after the end.
        """
        if self._ended:
            return []
        self.line_no += 1
        self._out = []
        self._ensure_started()
        self._custom("journal.oversized_line", {"line": self.line_no, "bytes": size, "text": quote(head)})
        return self._take()

    def finish(self, exit_code: int | None, trailing_fragment: bytes | None = None,
               fragment_size: int | None = None) -> list[Chunk]:
        """Close the run at final EOF.

        Args:
            exit_code: the agent's exit status from the sentinel, ``None`` when unknown
                (the journal ended without one: the wrapper was killed).
            trailing_fragment: bytes after the last ``\\n`` (reported, never parsed; of one
                too long to hold, its head).
            fragment_size: the fragment's length in bytes (``None``: ``len(trailing_fragment)``).

        Returns:
            The closing chunks, ending with exactly one ``RUN_FINISHED`` or ``RUN_ERROR``;
            ``[]`` when called again.
        """
        if self._ended:
            return []
        self._out = []
        self._ensure_started()
        self._before_finish()
        outcome = self._outcome
        if trailing_fragment:
            size = len(trailing_fragment) if fragment_size is None else fragment_size
            self._custom("journal.truncated_line", {
                "line": self.line_no + 1, "bytes": size, "text": quote(trailing_fragment),
            })
            outcome = Outcome(False, f"journal ends with a truncated line ({size} bytes)", INCOMPLETE)
        elif outcome is None:
            outcome = Outcome(False, f"journal ended without a {self._end_word()}"
                              + ("" if exit_code is None else f" (agent exit code {exit_code})"), INCOMPLETE)
        elif outcome.ok and exit_code not in (None, 0):
            outcome = Outcome(False, f"agent exited with code {exit_code}", "agent_exit")
        self._close_all(abandoned=True)
        self._end_step()
        # The run's totals over every turn (docs/translation.md "Usage"); each turn's own
        # figures went out as CUSTOM turn.usage.
        usage = [self._run_usage] if self._run_usage is not None else None
        meta: dict[str, Any] = {}
        if self._usage_turns:
            meta["turns"] = self._usage_turns
        if self._run_cost is not None:
            meta["costUsd"] = round(self._run_cost, 9)
        if outcome.ok:
            self._emit(RunFinishedEvent(
                thread_id=self.thread_id, run_id=self.run_id, result=outcome.result, usage=usage,
                metadata=meta or None,
            ))
        else:
            self._emit(RunErrorEvent(
                message=outcome.message or outcome.code, code=outcome.code, usage=usage, metadata=meta or None,
            ))
        self._ended = True
        return self._take()

    # --- for subclasses -------------------------------------------------------------------

    def _line(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _parse(self, line: bytes) -> Any:
        return json.loads(line)

    def _before_finish(self) -> None:
        """Flush anything held back before the run is closed."""

    def _end_word(self) -> str:
        return "terminal line"

    def _ask(self, obj: dict[str, Any]) -> bool:
        """Emit the chunks of a tool-approval ``control_request`` (``False``: not one)."""
        chunks = ask_chunks(obj)
        if chunks is None:
            return False
        value = chunks[0]["value"]
        rid, tcid = value["approval"]["id"], value["toolCallId"]
        raw = value.get("requestId", rid)  # the agent's own request id (rid: derived from it)
        self._approval_tools[rid] = tcid
        if raw != rid:
            self._approval_of[raw] = rid
        repeated = self._repeated_ask(rid, tcid, value["toolName"], compact_json(value["input"]))
        if repeated is not None and self._answered.get(repeated):
            # Its predecessor was allowed the call and may have run it before it died (the
            # result not written yet): never allowed twice unasked. A new approval.
            self._emit_chunk(asked_again_chunk(rid, repeated, tcid))
            repeated = None
        if repeated is not None:
            # A resumed agent process asks again for a call its predecessor asked for and
            # never ran: the same approval (docs/hitl.md "A resumed agent").
            self._approval_of[raw] = repeated
            self._emit_chunk(reask_chunk(repeated, raw, tcid))
            return True
        self._asked[rid] = (tcid, value["toolName"], compact_json(value["input"]), self._agent_starts)
        for chunk in chunks:
            self._emit_chunk(chunk)
        return True

    def _repeated_ask(self, rid: str, tcid: str | None, name: str, inp: str) -> str | None:
        """The approval an ask repeats: one asked earlier for the same tool call, or (a
        resumed process gives the call a new id) for the same tool and input, asked before
        the latest agent start, whose call never got a result. ``None``: a new approval."""
        if rid in self._asked:
            return None
        latest_first = list(reversed(self._asked.items()))
        for aid, (t, n, i, start) in latest_first:
            if t is not None and t == tcid:
                return aid
        for aid, (t, n, i, start) in latest_first:
            if n == name and i == inp and start < self._agent_starts and (t is None or t not in self._tool_results):
                return aid
        return None

    def _next_id(self) -> str:
        self._n += 1
        return f"{self.run_id}-{self._n}"

    def _emit(self, event: BaseEvent) -> None:
        self._emit_chunk(event_to_chunk(event))

    def _emit_chunk(self, chunk: Chunk) -> None:
        if chunk["type"] == "CUSTOM":
            # A journal line the translator passes on as data (an unknown type, say) can be
            # MiBs; one delivery-log message cannot. Deterministic, like cut_result.
            raw = compact_json(chunk.get("value"))
            size = len(raw.encode())
            if size > MAX_RESULT_BYTES:
                chunk["value"] = {"omitted": "larger than one delivery-log message", "bytes": size,
                                  "text": raw[:QUOTE_LIMIT]}
        self._out.append(chunk)

    def _take(self) -> list[Chunk]:
        out, self._out = self._out, []
        return out

    def _ensure_started(self) -> None:
        if not self._started:
            self._started = True
            self._emit(RunStartedEvent(thread_id=self.thread_id, run_id=self.run_id))

    def _delta(self, kind: str, key: str, ident: str, delta: str, sub: str | None) -> None:
        """A CONTENT/ARGS chunk, built as its event would dump (the most frequent chunks;
        ``delta`` is a non-empty str, so no validation is lost)."""
        chunk: Chunk = {"type": kind}
        if sub is not None:
            chunk["subagentRunId"] = sub
        chunk[key] = ident
        chunk["delta"] = delta
        self._out.append(chunk)

    def _custom(self, name: str, value: Any, subagent: str | None = None) -> None:
        # The chunk CustomEvent(...) dumps to, built directly: CUSTOM is the most frequent
        # chunk of a Claude journal and its value is parsed JSON already (same keys, same order).
        chunk: Chunk = {"type": "CUSTOM"}
        if subagent is not None:
            chunk["subagentRunId"] = subagent
        chunk["name"] = name
        if value is not None:
            chunk["value"] = value
        self._emit_chunk(chunk)

    def _unparsed(self, line: bytes) -> None:
        self._custom("journal.unparsed_line", {"line": self.line_no, "bytes": len(line), "text": quote(line)})

    def _turn_usage(self, usage: TokenUsage | None, cost: float | None, extra: dict[str, Any] | None = None) -> None:
        """Report one turn's usage (``CUSTOM turn.usage``) and add it to the run's totals."""
        if usage is None and cost is None:
            return
        value: dict[str, Any] = {"turn": self._turn}
        if usage is not None:
            value["usage"] = usage_dict(usage)
            self._run_usage = add_usage(self._run_usage, usage)
        if cost is not None:
            value["costUsd"] = round(cost, 9)
            self._run_cost = (self._run_cost or 0.0) + cost
        if extra:
            value.update(extra)
        self._usage_turns += 1
        self._custom("turn.usage", value)

    def _unknown(self, name: str, obj: Any, subagent: str | None = None) -> None:
        self._custom(f"{self.prefix}.{name}", obj, subagent)

    # steps: one per turn
    def _start_step(self) -> None:
        self._end_step()
        self._turn += 1
        self._step = f"turn-{self._turn}"
        self._emit(StepStartedEvent(step_name=self._step))

    def _end_step(self) -> None:
        if self._step is not None:
            self._emit(StepFinishedEvent(step_name=self._step))
            self._step = None

    # text messages
    def _text_start(self, mid: str, subagent: str | None) -> None:
        if mid not in self._text:
            self._text[mid] = subagent
            self._emit(TextMessageStartEvent(message_id=mid, role="assistant", subagent_run_id=subagent))

    def _text_delta(self, mid: str, delta: str) -> None:
        sub = self._text.get(mid)
        for i in range(0, len(delta), MAX_DELTA):
            self._delta("TEXT_MESSAGE_CONTENT", "messageId", mid, delta[i : i + MAX_DELTA], sub)

    def _text_end(self, mid: str) -> None:
        if mid in self._text:
            sub = self._text.pop(mid)
            self._emit(TextMessageEndEvent(message_id=mid, subagent_run_id=sub))

    def _text_block(self, mid: str, text: str, subagent: str | None) -> None:
        self._text_start(mid, subagent)
        self._text_delta(mid, text)
        self._text_end(mid)

    # reasoning
    def _reasoning_start(self, mid: str, subagent: str | None) -> None:
        if mid not in self._reasoning:
            self._reasoning[mid] = subagent
            self._emit(ReasoningStartEvent(message_id=mid, subagent_run_id=subagent))
            self._emit(ReasoningMessageStartEvent(message_id=mid, role="reasoning", subagent_run_id=subagent))

    def _reasoning_delta(self, mid: str, delta: str) -> None:
        sub = self._reasoning.get(mid)
        for i in range(0, len(delta), MAX_DELTA):
            self._delta("REASONING_MESSAGE_CONTENT", "messageId", mid, delta[i : i + MAX_DELTA], sub)

    def _reasoning_end(self, mid: str) -> None:
        if mid in self._reasoning:
            sub = self._reasoning.pop(mid)
            self._emit(ReasoningMessageEndEvent(message_id=mid, subagent_run_id=sub))
            self._emit(ReasoningEndEvent(message_id=mid, subagent_run_id=sub))

    def _reasoning_block(self, mid: str, text: str, subagent: str | None, encrypted: str | None = None) -> None:
        self._reasoning_start(mid, subagent)
        self._reasoning_delta(mid, text)
        self._reasoning_end(mid)
        self._reasoning_encrypted(mid, encrypted, subagent)

    def _reasoning_encrypted(self, mid: str, value: str | None, subagent: str | None) -> None:
        """The opaque form of a reasoning message (a signature, redacted thinking)."""
        if isinstance(value, str) and value and len(value) <= MAX_DELTA:
            self._emit(ReasoningEncryptedValueEvent(subtype="message", entity_id=mid, encrypted_value=value,
                                                    subagent_run_id=subagent))

    # tool calls
    def _tool_start(self, tid: str, name: str, subagent: str | None, parent_message: str | None = None) -> None:
        if tid not in self._tools:
            self._tools[tid] = subagent
            self._emit(ToolCallStartEvent(tool_call_id=tid, tool_call_name=name, parent_message_id=parent_message,
                                          subagent_run_id=subagent))

    def _tool_args(self, tid: str, delta: str) -> None:
        sub = self._tools.get(tid)
        for i in range(0, len(delta), MAX_DELTA):
            self._delta("TOOL_CALL_ARGS", "toolCallId", tid, delta[i : i + MAX_DELTA], sub)

    def _tool_end(self, tid: str) -> None:
        if tid in self._tools:
            sub = self._tools.pop(tid)
            self._emit(ToolCallEndEvent(tool_call_id=tid, subagent_run_id=sub))

    def _tool_result(self, tid: str, content: str, subagent: str | None, metadata: dict[str, Any] | None) -> None:
        self._tool_results.add(tid)
        content, cut = cut_result(content)
        if cut is not None:
            metadata = {**(metadata or {}), "truncated": cut}
        self._emit(ToolCallResultEvent(message_id=f"{tid}:result", tool_call_id=tid, content=content, role="tool",
                                       subagent_run_id=subagent, metadata=metadata or None))

    # subagents
    def _subagent_end(self, sid: str, error: str | None = None) -> None:
        if sid not in self._subagents:
            return
        self._close_all(subagent=sid)
        del self._subagents[sid]
        self._done_subagents.add(sid)
        if error is None:
            self._emit(SubagentFinishedEvent(subagent_run_id=sid))
        else:
            self._emit(SubagentErrorEvent(subagent_run_id=sid, message=error))

    def _close_all(self, *, subagent: str | None = None, abandoned: bool = False) -> None:
        """End open messages, reasoning and tool calls (of one subagent, or all of them).

        With ``abandoned`` (final EOF), open subagents end with ``SUBAGENT_ERROR`` too.
        """
        everything = subagent is None
        for mid, sub in list(self._reasoning.items()):
            if everything or sub == subagent:
                self._reasoning_end(mid)
        for mid, sub in list(self._text.items()):
            if everything or sub == subagent:
                self._text_end(mid)
        for tid, sub in list(self._tools.items()):
            if everything or sub == subagent:
                self._tool_end(tid)
        if everything and abandoned:
            for sid in list(self._subagents):
                self._subagent_end(sid, error="the journal ended before this subagent finished")
