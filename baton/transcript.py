"""Transcript builder: AG-UI chunks → AG-UI messages (docs/design.md §4.2, §5.5). Pure.

The saved transcript of a thread is the run's input messages (the AG-UI run input, which
carries the conversation so far and the new user message) followed by what the run
produced: assistant messages (text and ``toolCalls``) and tool results as ``role: "tool"``
messages, in the order the chunks created them.

After a takeover the driver feeds the builder the replayed chunks tagged ``stored`` **and**
``new``, so the transcript equals that of the same run without a restart, including a tool
call whose arguments were split between deltas on either side of the takeover.

Message shapes follow ``ag_ui.core`` (``AssistantMessage``, ``ToolMessage``, ``ToolCall``)
dumped with camelCase aliases. Grouping of tool calls follows the AG-UI TypeScript client's
default event application: a ``TOOL_CALL_START`` joins the last message when its
``parentMessageId`` names it, otherwise it opens a new assistant message whose id is the
``parentMessageId`` (or the tool call id).

Chunks that carry no conversation content (run lifecycle, steps, reasoning, state, raw,
custom) are ignored, except ``CUSTOM run.accepted`` whose ``value.messages`` supplies the
input messages when the builder was created without them.
"""
from __future__ import annotations

import copy
import json
from typing import Any, Iterable, Sequence

from baton.runs import RUN_ACCEPTED

Chunk = dict[str, Any]
Message = dict[str, Any]



def _content_text(content: Any) -> str:
    """A tool result's content as text (multimodal parts: their text parts joined)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        return "".join(parts)
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


class TranscriptBuilder:
    """Accumulates a run's messages from its chunks.

    Args:
        input_messages: the run input's messages (AG-UI message dicts); ``None`` to take
            them from a ``CUSTOM run.accepted`` chunk's ``value.messages`` when one is fed.

    Deterministic: the same input and chunk sequence always give the same messages.
    """

    def __init__(self, input_messages: Sequence[Message] | None = None) -> None:
        self._input: list[Message] | None = (
            [copy.deepcopy(m) for m in input_messages] if input_messages is not None else None
        )
        self._out: list[Message] = []
        self._by_id: dict[str, Message] = {}
        self._tool_calls: dict[str, dict[str, Any]] = {}
        self._fed = 0

    @property
    def fed(self) -> int:
        """How many chunks were fed."""
        return self._fed

    def feed_all(self, chunks: Iterable[Chunk]) -> None:
        """Feed several chunks in order."""
        for c in chunks:
            self.feed(c)

    def feed(self, chunk: Chunk) -> None:
        """Apply one chunk. Unknown or malformed chunks are ignored (never raise)."""
        self._fed += 1
        t = chunk.get("type")
        if t == "CUSTOM":
            if chunk.get("name") == RUN_ACCEPTED and self._input is None:
                value = chunk.get("value")
                msgs = value.get("messages") if isinstance(value, dict) else None
                if isinstance(msgs, list):
                    self._input = [copy.deepcopy(m) for m in msgs if isinstance(m, dict)]
            return
        if t in ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CHUNK"):
            mid = chunk.get("messageId")
            if not isinstance(mid, str):
                return
            msg = self._by_id.get(mid)
            if msg is None:
                msg = {"id": mid, "role": chunk.get("role") or "assistant", "content": ""}
                if chunk.get("name"):
                    msg["name"] = chunk["name"]
                self._add(msg, chunk)
            if t == "TEXT_MESSAGE_CHUNK" and isinstance(chunk.get("delta"), str):
                msg["content"] = (msg.get("content") or "") + chunk["delta"]
            return
        if t == "TEXT_MESSAGE_CONTENT":
            msg = self._by_id.get(chunk.get("messageId", ""))
            if msg is not None and isinstance(chunk.get("delta"), str):
                msg["content"] = (msg.get("content") or "") + chunk["delta"]
            return
        if t in ("TOOL_CALL_START", "TOOL_CALL_CHUNK"):
            tcid = chunk.get("toolCallId")
            if not isinstance(tcid, str):
                return
            call = self._tool_calls.get(tcid)
            if call is None:
                if t == "TOOL_CALL_CHUNK" and not chunk.get("toolCallName"):
                    return
                call = {"id": tcid, "type": "function",
                        "function": {"name": chunk.get("toolCallName", ""), "arguments": ""}}
                self._tool_calls[tcid] = call
                parent = chunk.get("parentMessageId")
                last = self._out[-1] if self._out else None
                if parent and last is not None and last.get("id") == parent and last.get("role") == "assistant":
                    last.setdefault("toolCalls", []).append(call)
                else:
                    msg = {"id": parent or tcid, "role": "assistant", "toolCalls": [call]}
                    if msg["id"] in self._by_id:
                        # Same parent id reused after other messages: keep ids unique.
                        msg["id"] = f"{msg['id']}:{tcid}"
                    self._add(msg, chunk)
            if t == "TOOL_CALL_CHUNK" and isinstance(chunk.get("delta"), str):
                call["function"]["arguments"] += chunk["delta"]
            return
        if t == "TOOL_CALL_ARGS":
            call = self._tool_calls.get(chunk.get("toolCallId", ""))
            if call is not None and isinstance(chunk.get("delta"), str):
                call["function"]["arguments"] += chunk["delta"]
            return
        if t == "TOOL_CALL_RESULT":
            tcid = chunk.get("toolCallId")
            mid = chunk.get("messageId") or f"{tcid}:result"
            if not isinstance(tcid, str) or mid in self._by_id:
                return
            msg = {"id": mid, "role": "tool", "content": _content_text(chunk.get("content", "")),
                   "toolCallId": tcid}
            self._add(msg, chunk)
            return

    def _add(self, msg: Message, chunk: Chunk) -> None:
        if chunk.get("subagentRunId"):
            msg["subagentRunId"] = chunk["subagentRunId"]
        self._out.append(msg)
        self._by_id[msg["id"]] = msg

    def messages(self) -> list[Message]:
        """The transcript so far: input messages, then the run's messages (deep copies).

        Assistant messages with no text keep no ``content`` key only when they carry tool
        calls; an empty text message is kept with ``content: ""``.
        """
        out = [copy.deepcopy(m) for m in (self._input or [])]
        for m in self._out:
            c = copy.deepcopy(m)
            if c.get("role") == "assistant" and c.get("content") == "" and c.get("toolCalls"):
                del c["content"]
            out.append(c)
        return out


def build_transcript(chunks: Iterable[Chunk], input_messages: Sequence[Message] | None = None) -> list[Message]:
    """The transcript of a whole chunk sequence (convenience over :class:`TranscriptBuilder`)."""
    b = TranscriptBuilder(input_messages)
    b.feed_all(chunks)
    return b.messages()
