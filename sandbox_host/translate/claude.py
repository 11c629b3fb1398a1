"""Claude Code ``stream-json`` → AG-UI (journal-formats.md §1; pitfalls §4).

Handles both ``--verbose`` output shapes, with and without ``--include-partial-messages``:

- One AG-UI message id per content block, ``<message.id>:<block index>`` (several blocks
  share one ``message.id``, pitfall 6; the index restarts per API message).
- With partial messages, ``stream_event`` deltas are translated and the consolidated
  ``assistant`` snapshot of a block that was streamed is ignored (no doubled text or tool
  calls, pitfall 5); tool calls are deduplicated by ``tool_use.id``; a snapshot block that
  was not streamed (deltas missing, or a block type we do not stream) is back-filled.
- Tool results are matched by ``tool_use_id`` in any order (pitfall 7); a result whose call
  was never seen gets a ``TOOL_CALL_START``/``END`` first. ``is_error`` goes to the
  result's ``metadata`` (``{"isError": true}``).
- Lines with ``parent_tool_use_id`` belong to the subagent started by that ``Task``/``Agent``
  call: ``SUBAGENT_STARTED`` before its first line, ``subagentRunId`` on its events,
  ``SUBAGENT_FINISHED`` (``SUBAGENT_ERROR`` when ``is_error``) when the parent's result for
  that call arrives (pitfall 8).
- Each ``system/init`` starts a step ``turn-N``; each ``result`` ends it with a
  ``CUSTOM claude.result`` (cost, usage, turns: the fields tests mask). The run's terminal
  is emitted at final EOF from the last ``result``: ``subtype == "success"`` and not
  ``is_error`` → ``RUN_FINISHED``; else ``RUN_ERROR`` (message: ``result``, or
  ``errors``, or the subtype; pitfall 1 and 9). ``result.result`` is never used as message
  text (pitfall 2).
- Unknown line types, ``system`` subtypes, ``rate_limit_event``, ``control_*`` and unknown
  content blocks become ``CUSTOM claude.<type>[.<subtype>]``.
"""
from __future__ import annotations

from typing import Any

from ag_ui.core import SubagentStartedEvent, TokenUsage

from sandbox_host.translate._base import Outcome, Translator, compact_json, int_field

# Tools whose calls run a subagent (renamed from Task to Agent in later CLIs).
_SUBAGENT_TOOLS = frozenset({"Task", "Agent"})
_RESULT_FIELDS = ("subtype", "is_error", "num_turns", "duration_ms", "duration_api_ms", "total_cost_usd",
                  "usage", "permission_denials", "stop_reason", "terminal_reason", "structured_output", "errors")


def _content_text(content: Any) -> str:
    """A tool result's content as text: the string, or its text blocks joined by newlines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts: list[str] = []
        for block in content:
            if isinstance(block, dict):
                if block.get("type") == "text":
                    parts.append(str(block.get("text", "")))
                else:
                    parts.append(f"[{block.get('type', 'content')}]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    if content is None:
        return ""
    return compact_json(content)


class _Block:
    """A content block being streamed (partial messages)."""

    __slots__ = ("kind", "ident", "snapshotted")

    def __init__(self, kind: str, ident: str) -> None:
        self.kind = kind  # "text" | "thinking" | "tool_use" | other
        self.ident = ident
        self.snapshotted = False


class ClaudeTranslator(Translator):
    """Claude Code ``--output-format stream-json --verbose`` journal translator."""

    format = "claude-stream-json"
    prefix = "claude"

    def __init__(self, run_id: str, thread_id: str) -> None:
        super().__init__(run_id, thread_id)
        self._tool_names: dict[str, str] = {}  # tool_use id -> name
        self._tool_owner: dict[str, str | None] = {}  # tool_use id -> subagent it ran in
        self._tool_input: dict[str, Any] = {}  # subagent-tool id -> input
        self._tools_seen: set[str] = set()
        self._block_count: dict[str, int] = {}  # message.id -> blocks seen (non-streamed)
        self._streamed: dict[str, list[_Block]] = {}  # message.id -> streamed blocks by index
        self._current: dict[str | None, str] = {}  # scope (parent_tool_use_id) -> message.id
        self._backfill = 0

    def _end_word(self) -> str:
        return "result line"

    # --- dispatch ---------------------------------------------------------------------------

    def _line(self, obj: dict[str, Any]) -> None:
        t = obj.get("type")
        if t == "stream_event":
            self._stream_event(obj)
        elif t == "assistant":
            self._assistant(obj)
        elif t == "user":
            self._user(obj)
        elif t == "system":
            self._system(obj)
        elif t == "result":
            self._result(obj)
        elif isinstance(t, str):
            self._unknown(t, obj, self._scope(obj))
        else:
            self._custom("journal.unknown_line", {"line": self.line_no, "value": obj})

    def _scope(self, obj: dict[str, Any]) -> str | None:
        """The subagent run id of a line (starting the subagent on its first line)."""
        parent = obj.get("parent_tool_use_id")
        if not isinstance(parent, str) or not parent:
            return None
        if parent in self._subagents:
            return parent
        if parent in self._done_subagents:
            return None  # a straggler after its result: attributed to the parent agent
        inp = self._tool_input.get(parent)
        inp = inp if isinstance(inp, dict) else {}
        name = inp.get("subagent_type") or self._tool_names.get(parent) or "subagent"
        description = inp.get("description")
        self._subagents[parent] = None
        self._emit(SubagentStartedEvent(
            subagent_run_id=parent, name=str(name),
            description=description if isinstance(description, str) else None,
            parent_subagent_run_id=self._tool_owner.get(parent),
            parent_tool_call_id=parent,
        ))
        return parent

    # --- system / result --------------------------------------------------------------------

    def _system(self, obj: dict[str, Any]) -> None:
        sub = obj.get("subtype")
        if sub == "init":
            self._close_all()
            self._start_step()
            self._custom("claude.init", {
                k: obj[k] for k in ("session_id", "model", "cwd", "claude_code_version", "permissionMode", "tools")
                if k in obj
            })
            return
        self._unknown(f"system.{sub}" if isinstance(sub, str) else "system", obj, self._scope(obj))

    def _result(self, obj: dict[str, Any]) -> None:
        self._close_all()
        for sid in list(self._subagents):
            self._subagent_end(sid, error="the turn ended before this subagent finished")
        subtype = obj.get("subtype")
        subtype = subtype if isinstance(subtype, str) else ""
        is_error = bool(obj.get("is_error"))
        text = obj.get("result")
        text = text if isinstance(text, str) else ""
        self._custom("claude.result", {k: obj[k] for k in _RESULT_FIELDS if k in obj})
        self._end_step()
        usage = self._usage(obj.get("usage"))
        if subtype == "success" and not is_error:
            self._outcome = Outcome(True, result=text or None, usage=usage)
        else:
            errors = obj.get("errors")
            joined = "; ".join(str(e) for e in errors) if isinstance(errors, list) else ""
            code = subtype if subtype.startswith("error") else "agent_error"
            self._outcome = Outcome(False, text or joined or subtype or "error", code, usage=usage)

    @staticmethod
    def _usage(raw: Any) -> TokenUsage | None:
        if not isinstance(raw, dict):
            return None
        def num(key: str) -> int | None:
            return int_field(raw, key)

        return TokenUsage(
            provider="anthropic",
            input_tokens=num("input_tokens"),
            output_tokens=num("output_tokens"),
            cached_input_tokens=num("cache_read_input_tokens"),
            cache_write_input_tokens=num("cache_creation_input_tokens"),
        )

    # --- assistant (consolidated) -------------------------------------------------------------

    def _assistant(self, obj: dict[str, Any]) -> None:
        msg = obj.get("message")
        if not isinstance(msg, dict):
            self._unknown("assistant", obj)
            return
        scope = self._scope(obj)
        mid = msg.get("id")
        mid = mid if isinstance(mid, str) and mid else self._next_id()
        streamed = self._streamed.get(mid)
        content = msg.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_use" and block.get("id") in self._tools_seen:
                if block.get("name") in _SUBAGENT_TOOLS:
                    self._tool_input[block["id"]] = block.get("input")  # streamed input was {}
                continue  # streamed already (tool_use.id is the dedupe key)
            if streamed is not None:
                match = next((b for b in streamed if b.kind == kind and not b.snapshotted), None)
                if match is not None:
                    match.snapshotted = True  # the snapshot of a streamed block: drop it
                    continue
                self._backfill += 1
                ident = f"{mid}:b{self._backfill}"
            else:
                n = self._block_count.get(mid, 0)
                self._block_count[mid] = n + 1
                ident = f"{mid}:{n}"
            self._whole_block(block, ident, mid, scope, obj)
        if isinstance(obj.get("error"), (str, dict)):
            self._custom("claude.assistant.error", {"error": obj["error"], "messageId": mid}, scope)

    def _whole_block(self, block: dict[str, Any], ident: str, mid: str, scope: str | None,
                     line: dict[str, Any]) -> None:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                self._text_block(ident, text, scope)
        elif kind == "thinking":
            text = block.get("thinking")
            if isinstance(text, str) and text:
                self._reasoning_block(ident, text, scope)
        elif kind == "redacted_thinking":
            pass  # encrypted, nothing to show
        elif kind == "tool_use":
            tid = block.get("id")
            tid = tid if isinstance(tid, str) and tid else self._next_id()
            self._remember_tool(tid, block, scope)
            self._tool_start(tid, self._tool_names[tid], scope, mid)
            self._tool_args(tid, compact_json(block.get("input", {})))
            self._tool_end(tid)
        else:
            self._unknown(f"content.{kind}", block, scope)

    def _remember_tool(self, tid: str, block: dict[str, Any], scope: str | None) -> None:
        name = block.get("name")
        self._tool_names[tid] = name if isinstance(name, str) and name else "unknown"
        self._tool_owner[tid] = scope
        self._tools_seen.add(tid)
        if name in _SUBAGENT_TOOLS:
            self._tool_input[tid] = block.get("input")

    # --- stream_event (partial messages) -------------------------------------------------------

    def _stream_event(self, obj: dict[str, Any]) -> None:
        ev = obj.get("event")
        if not isinstance(ev, dict):
            self._unknown("stream_event", obj)
            return
        scope = self._scope(obj)
        key = obj.get("parent_tool_use_id") or None
        et = ev.get("type")
        if et == "message_start":
            m = ev.get("message")
            mid = m.get("id") if isinstance(m, dict) else None
            mid = mid if isinstance(mid, str) and mid else self._next_id()
            self._current[key] = mid
            self._streamed.setdefault(mid, [])
            return
        mid = self._current.get(key)
        if mid is None:
            return  # deltas of a message whose start we never saw: its snapshot back-fills
        blocks = self._streamed[mid]
        if et == "content_block_start":
            idx = ev.get("index")
            cb = ev.get("content_block")
            if not isinstance(idx, int) or not isinstance(cb, dict):
                return
            kind = str(cb.get("type"))
            ident = f"{mid}:{idx}"
            if kind == "tool_use":
                tid = cb.get("id")
                if not isinstance(tid, str) or not tid or tid in self._tools_seen:
                    return
                ident = tid
                self._remember_tool(tid, {k: v for k, v in cb.items() if k != "input"}, scope)
                self._tool_start(tid, self._tool_names[tid], scope, mid)
            elif kind == "text":
                self._text_start(ident, scope)
                if isinstance(cb.get("text"), str) and cb["text"]:
                    self._text_delta(ident, cb["text"])
            elif kind == "thinking":
                self._reasoning_start(ident, scope)
                if isinstance(cb.get("thinking"), str) and cb["thinking"]:
                    self._reasoning_delta(ident, cb["thinking"])
            else:
                return  # not streamed: the assistant snapshot back-fills it
            while len(blocks) <= idx:
                blocks.append(_Block("", ""))
            blocks[idx] = _Block(kind, ident)
        elif et == "content_block_delta":
            block = self._block(blocks, ev.get("index"))
            delta = ev.get("delta")
            if block is None or not isinstance(delta, dict):
                return
            dt = delta.get("type")
            if dt == "text_delta" and block.kind == "text":
                text = delta.get("text")
                if isinstance(text, str) and text:
                    self._text_delta(block.ident, text)
            elif dt == "thinking_delta" and block.kind == "thinking":
                text = delta.get("thinking")
                if isinstance(text, str) and text:
                    self._reasoning_delta(block.ident, text)
            elif dt == "input_json_delta" and block.kind == "tool_use":
                part = delta.get("partial_json")
                if isinstance(part, str) and part:
                    self._tool_args(block.ident, part)
            # signature_delta, citations_delta and unknown delta types: ignored (§1.3)
        elif et == "content_block_stop":
            block = self._block(blocks, ev.get("index"))
            if block is not None:
                self._end_block(block)
        elif et == "message_stop":
            for block in blocks:
                self._end_block(block)
        elif et == "message_delta":
            pass  # stop_reason / usage: the result line carries the final figures
        else:
            self._unknown(f"stream_event.{et}", obj, scope)

    @staticmethod
    def _block(blocks: list[_Block], idx: Any) -> _Block | None:
        if isinstance(idx, int) and 0 <= idx < len(blocks) and blocks[idx].kind:
            return blocks[idx]
        return None

    def _end_block(self, block: _Block) -> None:
        if block.kind == "text":
            self._text_end(block.ident)
        elif block.kind == "thinking":
            self._reasoning_end(block.ident)
        elif block.kind == "tool_use":
            self._tool_end(block.ident)

    # --- user (tool results) -------------------------------------------------------------------

    def _user(self, obj: dict[str, Any]) -> None:
        msg = obj.get("message")
        content = msg.get("content") if isinstance(msg, dict) else None
        scope = self._scope(obj)
        if isinstance(content, str):
            self._custom("claude.user_message", {"text": content}, scope)
            return
        if not isinstance(content, list):
            self._unknown("user", obj, scope)
            return
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_result":
                self._tool_result_block(block, scope)
            elif kind == "text":
                self._custom("claude.user_message", {"text": block.get("text", "")}, scope)
            else:
                self._unknown(f"content.{kind}", block, scope)

    def _tool_result_block(self, block: dict[str, Any], scope: str | None) -> None:
        tid = block.get("tool_use_id")
        if not isinstance(tid, str) or not tid:
            self._unknown("content.tool_result", block, scope)
            return
        text = _content_text(block.get("content"))
        is_error = block.get("is_error") is True
        owner = self._tool_owner.get(tid, scope)
        if tid not in self._tools_seen:
            # A result without its call (journal started mid-stream): still a valid sequence.
            self._tools_seen.add(tid)
            self._tool_names[tid] = "unknown"
            self._tool_owner[tid] = owner
            self._tool_start(tid, "unknown", owner)
        self._tool_end(tid)
        if tid in self._subagents:
            self._subagent_end(tid, error=text if is_error else None)
        self._tool_result(tid, text, owner, {"isError": True} if is_error else None)


__all__ = ["ClaudeTranslator"]
