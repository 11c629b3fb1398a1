"""Codex ``exec --json`` → AG-UI (journal-formats.md §2; pitfalls §4).

- Item ids (``item_N``) restart with every ``codex exec`` invocation (a resumed thread appends
  to the same journal), so AG-UI ids are scoped by our run and by invocation:
  ``<run_id>:<item id>`` in the first scope, ``<run_id>:s<N>:<item id>`` in the N-th
  (messages, reasoning, tool calls; ``…:result`` for results). A ``thread.started`` or
  ``turn.started`` that follows any item begins a new scope.
- ``agent_message``: text message; ``item.updated`` carries the cumulative text, so only
  the suffix beyond what was sent is emitted.
- ``command_execution`` → tool call ``shell`` (args ``{"command"}``) + result
  (``aggregated_output``; ``metadata`` ``{exitCode, status}``; ``exit_code: null`` on a
  completed item is reported as ``exitStatus: "unknown"``, pitfall 10). ``file_change`` →
  ``apply_patch`` (result: the status and one ``<kind> <path>`` line per change; ``metadata``
  ``{status, changes}``); ``mcp_tool_call`` → ``mcp__<server>__<tool>``; ``todo_list`` →
  ``ACTIVITY_SNAPSHOT``; ``error`` items → ``CUSTOM codex.warning``.
- ``web_search`` → ``web_search``, held until ``item.completed``: ``item.started`` carries an
  empty query and ``action.type: "other"``; the completed item carries the query,
  ``action.search`` and ``results[]``. The whole call (start, args, end, result) is emitted
  from the completed item, so its arguments are the most complete form and the output stays a
  function of the journal prefix. A search never completed gets its call from the started item
  and an ``abandoned`` result at the end of its turn.
- Usage: ``turn.completed.usage`` is the thread's running total (a resumed thread continues
  it); each turn's own figures (the difference to the thread's previous total) go out as
  ``CUSTOM turn.usage`` and the run's total is on the terminal.
- A top-level ``error`` is held until the next line: dropped when a ``turn.failed`` with the
  same message follows (one error, not two), else ``CUSTOM codex.warning`` (non-fatal
  retry notices, pitfall 9).
- ``turn.started`` starts a step ``turn-N``; ``turn.completed``/``turn.failed`` end it
  (``CUSTOM codex.turn_failed`` for a failure). The run's terminal is emitted at final EOF
  from the last turn: completed → ``RUN_FINISHED`` (the run's usage), failed → ``RUN_ERROR`` code
  ``turn_failed``, none → ``RUN_ERROR`` code ``incomplete_journal``; commands still in
  progress then get a result with status ``abandoned``.
- Duplicate ``"id"`` keys (``web_search`` items, §0.8): the first one wins. The first
  format version's ``item_type`` / ``assistant_message`` are adapted; the legacy
  ``{"id","msg"}`` protocol becomes ``CUSTOM codex.legacy_event``.
"""
from __future__ import annotations

import json
from typing import Any

from ag_ui.core import ActivitySnapshotEvent, TokenUsage

from sandbox_host.translate._base import (
    Outcome,
    Translator,
    bounded,
    compact_json,
    int_field,
    structured,
    sub_usage,
    usage_dict,
)


def _first_id_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k == "id" and k in out:
            continue
        out[k] = v
    return out


class CodexTranslator(Translator):
    """``codex exec --json`` journal translator."""

    format = "codex-exec-json"
    prefix = "codex"

    def __init__(self, run_id: str, thread_id: str) -> None:
        super().__init__(run_id, thread_id)
        self._sent: dict[str, str] = {}  # agent_message id -> text already emitted
        self._in_progress: dict[str, str] = {}  # tool call id -> item type (started, no result)
        self._pending_error: str | None = None
        self._completed: set[str] = set()  # tool call ids that got their result
        self._held: dict[str, dict[str, Any]] = {}  # web_search id -> started item (no chunk yet)
        self._scope = 1  # invocation scope of item ids
        self._scope_used = False  # an item was seen in this scope
        self._thread: str | None = None
        self._thread_total: dict[str | None, TokenUsage] = {}  # thread id -> last running total

    def _end_word(self) -> str:
        return "turn.completed or turn.failed line"

    def _parse(self, line: bytes) -> Any:
        if b'"web_search"' in line:
            return json.loads(line, object_pairs_hook=_first_id_wins)
        return json.loads(line)

    def _sid(self, item_id: Any) -> str:
        self._scope_used = True
        if not isinstance(item_id, str) or not item_id:
            return self._next_id()
        return f"{self.run_id}:{item_id}" if self._scope == 1 else f"{self.run_id}:s{self._scope}:{item_id}"

    def _new_scope(self) -> None:
        if self._scope_used:
            self._scope += 1
            self._scope_used = False

    # --- dispatch ---------------------------------------------------------------------------

    def _line(self, obj: dict[str, Any]) -> None:
        t = obj.get("type")
        pending, self._pending_error = self._pending_error, None
        if pending is not None:
            failed = obj.get("error") if t == "turn.failed" else None
            if not (isinstance(failed, dict) and failed.get("message") == pending):
                self._custom("codex.warning", {"message": pending})
        if t is None and "msg" in obj and "id" in obj:
            self._custom("codex.legacy_event", obj)
            return
        if t in ("thread.started", "turn.started"):
            # A new invocation or turn: the last one's outcome no longer ends the journal, so
            # a journal cut here is incomplete (docs/translation.md "Terminal").
            self._outcome = None
        if t == "thread.started":
            self._new_scope()
            tid = obj.get("thread_id")
            self._thread = tid if isinstance(tid, str) else None
            self._custom("codex.thread", {"threadId": tid})
        elif t == "turn.started":
            self._new_scope()
            self._close_all()
            self._start_step()
        elif t in ("item.started", "item.updated", "item.completed"):
            item = obj.get("item")
            if isinstance(item, dict):
                self._item(t.split(".")[1], item)
            else:
                self._unknown(str(t), obj)
        elif t == "turn.completed":
            self._end_turn(self._usage(obj.get("usage")))
            self._outcome = Outcome(True)
        elif t == "turn.failed":
            err = obj.get("error")
            message = err.get("message") if isinstance(err, dict) else None
            message = message if isinstance(message, str) else "turn failed"
            self._end_turn()
            self._custom("codex.turn_failed", {"turn": self._turn, "message": message})
            self._outcome = Outcome(False, message, "turn_failed")
        elif t == "error":
            message = obj.get("message")
            self._pending_error = message if isinstance(message, str) else compact_json(message)
        elif isinstance(t, str):
            self._unknown(t, obj)
        else:
            self._custom("journal.unknown_line", {"line": self.line_no, "value": obj})

    def _before_finish(self) -> None:
        if self._pending_error is not None:
            self._custom("codex.warning", {"message": self._pending_error})
            self._pending_error = None
        self._abandon()

    def _end_turn(self, usage: TokenUsage | None = None) -> None:
        self._abandon()
        self._close_all()
        if usage is not None:
            prev = self._thread_total.get(self._thread)
            own = sub_usage(usage, prev) if prev is not None else usage
            self._thread_total[self._thread] = usage
            # A total that went down is not a running total of this thread: take it as is.
            self._turn_usage(own if own is not None else usage, None, {"threadTotal": usage_dict(usage)})
        self._end_step()

    def _abandon(self) -> None:
        """Items started but never completed get a result saying so (pitfall 10)."""
        for ident, item in list(self._held.items()):
            self._web_search(ident, item)
        for tid in list(self._in_progress):
            self._in_progress.pop(tid)
            self._tool_end(tid)
            self._tool_result(tid, "", None, {"status": "abandoned"})

    @staticmethod
    def _usage(raw: Any) -> TokenUsage | None:
        if not isinstance(raw, dict):
            return None
        def num(key: str) -> int | None:
            return int_field(raw, key)

        return TokenUsage(
            provider="openai",
            input_tokens=num("input_tokens"),
            cached_input_tokens=num("cached_input_tokens"),
            output_tokens=num("output_tokens"),
            reasoning_tokens=num("reasoning_output_tokens"),
            cache_write_input_tokens=num("cache_write_input_tokens"),
        )

    # --- items ------------------------------------------------------------------------------

    def _item(self, phase: str, item: dict[str, Any]) -> None:
        kind = item.get("type", item.get("item_type"))
        if kind == "assistant_message":
            kind = "agent_message"
        ident = self._sid(item.get("id"))
        if kind == "agent_message":
            self._agent_message(phase, ident, item)
        elif kind == "reasoning":
            if phase == "completed":
                text = item.get("text")
                if isinstance(text, str) and text:
                    self._reasoning_block(ident, text, None)
        elif kind == "command_execution":
            self._tool_item(phase, ident, "shell", {"command": item.get("command")}, item,
                            lambda: self._command_result(item))
        elif kind == "file_change":
            self._tool_item(phase, ident, "apply_patch", {"changes": item.get("changes")}, item,
                            lambda: self._file_change_result(item))
        elif kind == "mcp_tool_call":
            name = f"mcp__{item.get('server', '')}__{item.get('tool', '')}"
            self._tool_item(phase, ident, name, item.get("arguments"), item, lambda: self._mcp_result(item))
        elif kind == "web_search":
            if ident in self._completed:
                return
            if phase != "completed":
                self._held[ident] = item  # the started/updated form: kept in case it never completes
                return
            self._held.pop(ident, None)
            self._web_search(ident, item)
        elif kind == "todo_list":
            items = item.get("items")
            self._emit(ActivitySnapshotEvent(message_id=ident, activity_type="todo_list",
                                             content={"items": items if isinstance(items, list) else []}))
        elif kind == "error":
            if phase == "completed":
                self._custom("codex.warning", {"message": item.get("message")})
        else:
            self._unknown(f"item.{kind}", {"phase": phase, "item": item})

    def _agent_message(self, phase: str, ident: str, item: dict[str, Any]) -> None:
        text = item.get("text")
        text = text if isinstance(text, str) else ""
        sent = self._sent.get(ident, "")
        self._text_start(ident, None)
        if text.startswith(sent) and len(text) > len(sent):
            self._text_delta(ident, text[len(sent):])
            self._sent[ident] = text
        if phase == "completed":
            self._text_end(ident)
            self._sent.pop(ident, None)

    def _tool_item(self, phase: str, ident: str, name: str, args: Any, item: dict[str, Any],
                   result: Any) -> None:
        if ident not in self._in_progress:
            if ident in self._completed:
                return  # a late update or second completion of a finished item
            self._tool_start(ident, name, None)
            self._tool_args(ident, args if isinstance(args, str) else compact_json(args))
            self._tool_end(ident)
            self._in_progress[ident] = name
        if phase == "completed":
            del self._in_progress[ident]
            self._completed.add(ident)
            content, meta = result()
            self._tool_result(ident, content, None, meta)

    def _web_search(self, ident: str, item: dict[str, Any]) -> None:
        """One whole web_search call from its most complete item (completed, or last seen)."""
        completed = ident not in self._held
        self._held.pop(ident, None)
        self._completed.add(ident)
        args = {k: item[k] for k in ("query", "action") if k in item}
        self._tool_start(ident, "web_search", None)
        self._tool_args(ident, compact_json(args))
        self._tool_end(ident)
        if not completed:
            self._tool_result(ident, "", None, {"status": "abandoned"})
            return
        meta = self._status_meta(item)
        meta.update(bounded(args))
        results = item.get("results")
        lines: list[str] = []
        if isinstance(item.get("query"), str) and item["query"]:
            lines.append(f"query: {item['query']}")
        if isinstance(results, list):
            meta["results"] = structured(results)
            for r in results:
                if not isinstance(r, dict):
                    continue
                head = " — ".join(str(r[k]) for k in ("title", "url") if isinstance(r.get(k), str) and r[k])
                lines.append(head or str(r.get("type", "result")))
                if isinstance(r.get("snippet"), str) and r["snippet"]:
                    lines.append(f"  {r['snippet']}")
        self._tool_result(ident, "\n".join(lines), None, meta)

    def _file_change_result(self, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        meta = self._status_meta(item)
        lines = [str(item.get("status", ""))]
        changes = item.get("changes")
        if isinstance(changes, list):
            meta["changes"] = structured(changes)
            for c in changes:
                if isinstance(c, dict):
                    lines.append(f"{c.get('kind', 'change')} {c.get('path', '')}")
        return "\n".join(lines), meta

    @staticmethod
    def _status_meta(item: dict[str, Any]) -> dict[str, Any]:
        status = item.get("status")
        meta: dict[str, Any] = {"status": status} if isinstance(status, str) else {}
        if status in ("failed", "declined"):
            meta["isError"] = True
        return meta

    def _command_result(self, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        meta = self._status_meta(item)
        code = item.get("exit_code")
        if isinstance(code, int) and not isinstance(code, bool):
            meta["exitCode"] = code
        else:
            meta["exitStatus"] = "unknown"
        out = item.get("aggregated_output")
        return (out if isinstance(out, str) else ""), meta

    def _mcp_result(self, item: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        meta = self._status_meta(item)
        err = item.get("error")
        if isinstance(err, dict) and err.get("message"):
            meta["isError"] = True
            return str(err["message"]), meta
        res = item.get("result")
        content = res.get("content") if isinstance(res, dict) else None
        if isinstance(content, list):
            parts = [str(c.get("text", "")) if isinstance(c, dict) and c.get("type") == "text"
                     else compact_json(c) for c in content]
            return "\n".join(parts), meta
        return ("" if res is None else compact_json(res)), meta


__all__ = ["CodexTranslator"]
