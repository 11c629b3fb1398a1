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
  ``CUSTOM claude.result`` (cost, usage, turns: the fields tests mask) and a ``CUSTOM
  turn.usage`` (that turn's tokens: ``result.usage`` is per turn; that turn's cost:
  ``total_cost_usd`` is the process's running total, so the difference to the previous
  ``result`` unless ``result_index`` is 0 or the total went down). The run's terminal
  is emitted at final EOF from the last ``result``: ``subtype == "success"`` and not
  ``is_error`` → ``RUN_FINISHED``; else ``RUN_ERROR`` (message: ``result``, or
  ``errors``, or the subtype; pitfall 1 and 9). ``result.result`` is never used as message
  text (pitfall 2).
- Tool results keep the structured ``tool_use_result`` of the ``user`` line (Bash
  ``stdout``/``stderr``/``interrupted``, Read's ``file`` with ``truncatedByTokenCap``…) as
  ``metadata.toolUseResult`` (strings cut at 16 KiB: the full text is the ``content``; Read's
  ``file.content`` becomes ``file.contentChars``).
- Thinking: a block's ``signature`` (and a ``redacted_thinking`` block's ``data``) goes out as
  ``REASONING_ENCRYPTED_VALUE`` (subtype ``message``) for that reasoning message; a
  signature-only block (``"thinking": ""``) is an empty reasoning message carrying it.
- A message's ``stop_reason`` (from ``message_delta`` or a snapshot) → ``CUSTOM
  claude.stop_reason``, once per message. With partial messages, a streamed block whose
  deltas differ from its snapshot → ``CUSTOM claude.stream_mismatch`` (the snapshot's text).
- Named notices (docs/translation.md): ``system/status`` and ``system/compact_boundary`` →
  ``agent.compaction``; a compaction summary (user text after a boundary, or marked
  ``isCompactSummary``) → ``agent.compaction_summary``; ``rate_limit_event`` →
  ``agent.rate_limit``; local commands (``local_command_*`` fields, ``<local-command-stdout>``
  user text) → ``agent.local_command``; ``system/thinking_tokens`` → ``claude.thinking_tokens``.
- Other line types, ``system`` subtypes, ``control_*`` and unknown content blocks become
  ``CUSTOM claude.<type>[.<subtype>]``.
"""
from __future__ import annotations

import json
import re
from typing import Any

from ag_ui.core import SubagentStartedEvent, TokenUsage

from sandbox_host.translate._base import Outcome, Translator, bounded, compact_json, int_field, structured

# Tools whose calls run a subagent (renamed from Task to Agent in later CLIs).
_SUBAGENT_TOOLS = frozenset({"Task", "Agent"})
_LOCAL_OUTPUT = re.compile(r"<local-command-(stdout|stderr)>(.*?)</local-command-\1>", re.DOTALL)
_RESULT_FIELDS = ("subtype", "is_error", "num_turns", "duration_ms", "duration_api_ms", "total_cost_usd",
                  "usage", "permission_denials", "stop_reason", "terminal_reason", "structured_output", "errors")
_TURN_LINES = frozenset({"stream_event", "assistant", "user"})  # lines only a turn in progress writes


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


def _structured(result: dict[str, Any]) -> Any:
    """A tool's ``tool_use_result`` for ``metadata``: bounded; Read's ``file.content`` (the
    result's ``content`` again) replaced by its length ``file.contentChars``."""
    f = result.get("file")
    if isinstance(f, dict) and isinstance(f.get("content"), str):
        f = {k: v for k, v in f.items() if k != "content"} | {"contentChars": len(f["content"])}
        result = {**result, "file": f}
    return structured(result)


class _Block:
    """A content block being streamed (partial messages)."""

    __slots__ = ("kind", "ident", "snapshotted", "parts", "signature", "snapshot", "stopped", "scope")

    def __init__(self, kind: str, ident: str, scope: str | None = None) -> None:
        self.kind = kind  # "text" | "thinking" | "tool_use" | other
        self.ident = ident
        self.scope = scope
        self.snapshotted = False
        self.parts: list[str] = []  # the streamed deltas (compared with the snapshot)
        self.signature = ""
        self.snapshot: Any = None  # the snapshot's text / thinking / input, once seen
        self.stopped = False

    def streamed(self) -> Any:
        """What the deltas say the block holds (tool input parsed; ``None`` if unparsable)."""
        text = "".join(self.parts)
        if self.kind != "tool_use":
            return text
        try:
            return json.loads(text) if text else {}
        except ValueError:
            return None


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
        self._tool_blocks: dict[str, _Block] = {}  # streamed tool_use id -> its block
        self._stopped_messages: set[str] = set()  # message ids whose stop_reason was reported
        self._cost_seen: float | None = None  # last result's total_cost_usd (a running total)
        self._after_boundary = False  # a compact_boundary was seen, its summary not yet

    def _end_word(self) -> str:
        return "result line"

    # --- dispatch ---------------------------------------------------------------------------

    def _line(self, obj: dict[str, Any]) -> None:
        t = obj.get("type")
        if t in _TURN_LINES or (t == "system" and obj.get("subtype") == "init"):
            # A turn (or a resumed process) began after a result: that result no longer ends
            # the journal, so a journal cut here is incomplete (docs/translation.md "Terminal").
            self._outcome = None
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
        elif t == "control_request" and self._ask(obj):
            pass
        elif t == "rate_limit_event":
            info = obj.get("rate_limit_info")
            self._custom("agent.rate_limit", info if isinstance(info, dict) else {}, self._scope(obj))
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
            self._agent_starts += 1
            self._close_all()
            self._start_step()
            self._custom("claude.init", {
                k: obj[k] for k in ("session_id", "model", "cwd", "claude_code_version", "permissionMode", "tools")
                if k in obj
            })
            return
        scope = self._scope(obj)
        if sub == "status":
            if obj.get("status") == "compacting":
                self._custom("agent.compaction", {"phase": "started"}, scope)
                return
            if "compact_result" in obj:
                value: dict[str, Any] = {"phase": "finished", "result": obj.get("compact_result")}
                if obj.get("compact_error") is not None:
                    value["error"] = obj.get("compact_error")
                self._custom("agent.compaction", value, scope)
                return
        elif sub == "compact_boundary":
            meta = obj.get("compact_metadata")
            meta = meta if isinstance(meta, dict) else {}
            names = {"trigger": "trigger", "pre_tokens": "preTokens", "post_tokens": "postTokens",
                     "duration_ms": "durationMs"}
            value = {"phase": "boundary", **{names[k]: meta[k] for k in names if k in meta}}
            self._after_boundary = True
            self._custom("agent.compaction", value, scope)
            return
        elif sub == "thinking_tokens":
            self._custom("claude.thinking_tokens", {
                "estimatedTokens": obj.get("estimated_tokens"), "delta": obj.get("estimated_tokens_delta")}, scope)
            return
        self._unknown(f"system.{sub}" if isinstance(sub, str) else "system", obj, scope)

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
        self._turn_usage(self._usage(obj.get("usage")), self._turn_cost(obj))
        self._end_step()
        if subtype == "success" and not is_error:
            self._outcome = Outcome(True, result=text or None)
        else:
            errors = obj.get("errors")
            joined = "; ".join(str(e) for e in errors) if isinstance(errors, list) else ""
            code = subtype if subtype.startswith("error") else "agent_error"
            self._outcome = Outcome(False, text or joined or subtype or "error", code)

    def _turn_cost(self, obj: dict[str, Any]) -> float | None:
        """This turn's cost: ``total_cost_usd`` runs over the CLI process's turns."""
        total = obj.get("total_cost_usd")
        if not isinstance(total, (int, float)) or isinstance(total, bool):
            return None
        prev, self._cost_seen = self._cost_seen, float(total)
        fresh = obj.get("result_index") == 0 or prev is None or total < prev  # a new process
        return float(total) if fresh else float(total) - (prev or 0.0)

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
        self._local_command(obj, scope)
        content = msg.get("content")
        for block in content if isinstance(content, list) else []:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_use" and block.get("id") in self._tools_seen:
                if block.get("name") in _SUBAGENT_TOOLS:
                    self._tool_input[block["id"]] = block.get("input")  # streamed input was {}
                sb = self._tool_blocks.pop(block["id"], None)
                if sb is not None:
                    self._snapshot_of(sb, block.get("input", {}))
                continue  # streamed already (tool_use.id is the dedupe key)
            if streamed is not None:
                match = next((b for b in streamed if b.kind == kind and not b.snapshotted), None)
                if match is not None:
                    match.snapshotted = True  # the snapshot of a streamed block: drop it
                    self._snapshot_of(match, block.get("thinking" if kind == "thinking" else "text"))
                    continue
                self._backfill += 1
                ident = f"{mid}:b{self._backfill}"
            else:
                n = self._block_count.get(mid, 0)
                self._block_count[mid] = n + 1
                ident = f"{mid}:{n}"
            self._whole_block(block, ident, mid, scope, obj)
        self._stop_reason(mid, msg.get("stop_reason"), msg.get("stop_sequence"), scope)
        if isinstance(obj.get("error"), (str, dict)):
            self._custom("claude.assistant.error", {"error": obj["error"], "messageId": mid}, scope)

    def _stop_reason(self, mid: str, reason: Any, sequence: Any, scope: str | None) -> None:
        if isinstance(reason, str) and reason and mid not in self._stopped_messages:
            self._stopped_messages.add(mid)
            value = {"messageId": mid, "stopReason": reason}
            if isinstance(sequence, str):
                value["stopSequence"] = sequence
            self._custom("claude.stop_reason", value, scope)

    def _local_command(self, obj: dict[str, Any], scope: str | None) -> None:
        """A slash command the CLI ran itself (``local_command_*`` fields of a synthetic line)."""
        run = obj.get("local_command_run")
        if not isinstance(run, dict):
            return
        value: dict[str, Any] = {k: run[k] for k in ("command", "args") if k in run}
        outcome = obj.get("local_command_outcome")
        if isinstance(outcome, dict) and "kind" in outcome:
            value["outcome"] = outcome["kind"]
        source = obj.get("local_command_source")
        if isinstance(source, str):
            for stream, text in _LOCAL_OUTPUT.findall(source):
                value[stream] = bounded(text)
        self._custom("agent.local_command", value, scope)

    def _snapshot_of(self, block: _Block, value: Any) -> None:
        """Record a streamed block's snapshot; compare once the block's deltas are complete."""
        block.snapshot = value
        if block.stopped:
            self._compare(block)

    def _compare(self, block: _Block) -> None:
        streamed = block.streamed()
        if block.snapshot is None or streamed == block.snapshot:
            return
        snap = block.snapshot if isinstance(block.snapshot, str) else compact_json(block.snapshot)
        got = streamed if isinstance(streamed, str) else compact_json(streamed)
        self._custom("claude.stream_mismatch", {
            "id": block.ident, "kind": block.kind, "streamedChars": len(got), "snapshotChars": len(snap),
            "snapshot": bounded(snap),
        }, block.scope)

    def _whole_block(self, block: dict[str, Any], ident: str, mid: str, scope: str | None,
                     line: dict[str, Any]) -> None:
        kind = block.get("type")
        if kind == "text":
            text = block.get("text")
            if isinstance(text, str) and text:
                self._text_block(ident, text, scope)
        elif kind == "thinking":
            text = block.get("thinking")
            sig = block.get("signature")
            if (isinstance(text, str) and text) or (isinstance(sig, str) and sig):
                self._reasoning_block(ident, text if isinstance(text, str) else "", scope,
                                      sig if isinstance(sig, str) else None)
        elif kind == "redacted_thinking":
            data = block.get("data")
            if isinstance(data, str) and data:  # encrypted: an empty reasoning message carrying it
                self._reasoning_block(ident, "", scope, data)
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
            blocks[idx] = _Block(kind, ident, scope)
            if kind == "tool_use":
                self._tool_blocks[ident] = blocks[idx]
            elif isinstance(cb.get(kind), str) and cb[kind]:
                blocks[idx].parts.append(cb[kind])
        elif et == "content_block_delta":
            block = self._block(blocks, ev.get("index"))
            delta = ev.get("delta")
            if block is None or not isinstance(delta, dict):
                return
            dt = delta.get("type")
            if dt == "text_delta" and block.kind == "text":
                text = delta.get("text")
                if isinstance(text, str) and text:
                    block.parts.append(text)
                    self._text_delta(block.ident, text)
            elif dt == "thinking_delta" and block.kind == "thinking":
                text = delta.get("thinking")
                if isinstance(text, str) and text:
                    block.parts.append(text)
                    self._reasoning_delta(block.ident, text)
            elif dt == "input_json_delta" and block.kind == "tool_use":
                part = delta.get("partial_json")
                if isinstance(part, str) and part:
                    block.parts.append(part)
                    self._tool_args(block.ident, part)
            elif dt == "signature_delta" and block.kind == "thinking":
                sig = delta.get("signature")
                if isinstance(sig, str):
                    block.signature += sig
            # citations_delta and unknown delta types: ignored (§1.3)
        elif et == "content_block_stop":
            block = self._block(blocks, ev.get("index"))
            if block is not None:
                self._end_block(block)
        elif et == "message_stop":
            for block in blocks:
                self._end_block(block)
        elif et == "message_delta":
            # usage: the result line carries the turn's figures; the stop reason is reported.
            d = ev.get("delta")
            if isinstance(d, dict):
                self._stop_reason(mid, d.get("stop_reason"), d.get("stop_sequence"), scope)
        else:
            self._unknown(f"stream_event.{et}", obj, scope)

    @staticmethod
    def _block(blocks: list[_Block], idx: Any) -> _Block | None:
        if isinstance(idx, int) and 0 <= idx < len(blocks) and blocks[idx].kind:
            return blocks[idx]
        return None

    def _end_block(self, block: _Block) -> None:
        if block.stopped:
            return
        block.stopped = True
        if block.kind == "text":
            self._text_end(block.ident)
        elif block.kind == "thinking":
            self._reasoning_end(block.ident)
            self._reasoning_encrypted(block.ident, block.signature, block.scope)
        elif block.kind == "tool_use":
            self._tool_end(block.ident)
        if block.snapshot is not None:
            self._compare(block)

    # --- user (tool results) -------------------------------------------------------------------

    def _user(self, obj: dict[str, Any]) -> None:
        msg = obj.get("message")
        content = msg.get("content") if isinstance(msg, dict) else None
        scope = self._scope(obj)
        if isinstance(content, str):
            self._user_text(content, obj, scope)
            return
        if not isinstance(content, list):
            self._unknown("user", obj, scope)
            return
        # The line's tool_use_result describes its tool result when there is exactly one.
        results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
        raw_result = obj.get("tool_use_result") if len(results) == 1 else None
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "tool_result":
                self._tool_result_block(block, scope, raw_result)
            elif kind == "text":
                self._user_text(str(block.get("text", "")), obj, scope)
            else:
                self._unknown(f"content.{kind}", block, scope)

    def _user_text(self, text: str, obj: dict[str, Any], scope: str | None) -> None:
        """A user line with text: a compaction summary, local-command output, or a message."""
        if obj.get("isCompactSummary") is True or (self._after_boundary and obj.get("isSynthetic") is True):
            self._after_boundary = False
            self._custom("agent.compaction_summary", {"text": text}, scope)
            return
        found = _LOCAL_OUTPUT.findall(text)
        if found and text.lstrip().startswith("<local-command-"):
            self._custom("agent.local_command", {stream: bounded(out) for stream, out in found}, scope)
            return
        self._custom("claude.user_message", {"text": text}, scope)

    def _tool_result_block(self, block: dict[str, Any], scope: str | None, raw_result: Any = None) -> None:
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
        meta: dict[str, Any] = {"isError": True} if is_error else {}
        if isinstance(raw_result, dict):  # a string tool_use_result repeats the content: not kept
            meta["toolUseResult"] = _structured(raw_result)
        self._tool_result(tid, text, owner, meta or None)


__all__ = ["ClaudeTranslator"]
