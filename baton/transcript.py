"""Transcript builder: AG-UI chunks → AG-UI messages (docs/design.md §4.2, §5.5). Pure.

The saved transcript of a thread is the run's input messages (the AG-UI run input, which
carries the conversation so far and the new user message) followed by what the run
produced: assistant messages (text and ``toolCalls``) and tool results as ``role: "tool"``
messages, in the order the chunks created them.

After a takeover the driver feeds the builder the replayed chunks tagged ``stored`` **and**
``new``, so the transcript equals that of the same run without a restart, including a tool
call whose arguments were split between deltas on either side of the takeover.

Message shapes follow ``ag_ui.core`` (``AssistantMessage``, ``ReasoningMessage``,
``ToolMessage``, ``ActivityMessage``, ``ToolCall``) dumped with camelCase aliases, and the
messages are assembled the way the AG-UI TypeScript client's default event application
(``defaultApplyEvents`` of ``@ag-ui/client``, which ``HttpAgent`` runs) assembles them from the
same chunks, so a client's view and the saved transcript agree (tests/sandbox/test_agui_node.py
compares them on every corpus journal):

- ``TEXT_MESSAGE_START`` / ``REASONING_MESSAGE_START`` open a message (role ``assistant`` /
  ``reasoning``) with ``content: ""``; their ``CONTENT`` chunks append to it.
- ``TOOL_CALL_START`` joins the assistant message whose id is its ``parentMessageId``
  wherever it is; it opens a new assistant message (no ``content`` key) with that id, or with
  the tool call id when there is no parent or the id names a non-assistant message.
- ``TOOL_CALL_RESULT`` becomes a ``role: "tool"`` message placed after the assistant message
  holding the call (and the tool messages already after it), else at the end.
- ``REASONING_ENCRYPTED_VALUE`` sets ``encryptedValue`` on the message (or tool call) it names.
- ``ACTIVITY_SNAPSHOT`` adds or replaces a ``role: "activity"`` message.
- A chunk's ``metadata`` is merged (shallowly) into the message or tool call it applies to.
- Subagents: a message opened by a chunk with ``subagentRunId`` carries it; a tool call that
  joins an existing message does not change that message's owner.

Chunks that carry no conversation content (run lifecycle, steps, reasoning spans, state, raw,
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


def _merge_metadata(target: dict[str, Any], chunk: Chunk) -> None:
    """``target.metadata = {**target.metadata, **chunk.metadata}`` (AG-UI ``mergeMetadata``)."""
    meta = chunk.get("metadata")
    if isinstance(meta, dict):
        target["metadata"] = {**(target.get("metadata") or {}), **copy.deepcopy(meta)}


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
        # The message each tool call was added to (found again from the end for its result,
        # not by a scan from the start: a long run holds tens of thousands of messages).
        self._call_owner: dict[str, Message] = {}
        self._fed = 0

    @property
    def fed(self) -> int:
        """How many chunks were fed."""
        return self._fed

    @property
    def count(self) -> int:
        """How many messages the transcript holds now (input and produced; no copy)."""
        return len(self._input or []) + len(self._out)

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
        if t in ("TEXT_MESSAGE_START", "TEXT_MESSAGE_CHUNK", "REASONING_MESSAGE_START", "REASONING_MESSAGE_CHUNK"):
            mid = chunk.get("messageId")
            if not isinstance(mid, str):
                return
            reasoning = t.startswith("REASONING")
            msg = self._by_id.get(mid)
            if msg is None:
                role = "reasoning" if reasoning else (chunk.get("role") or "assistant")
                msg = {"id": mid, "role": role, "content": ""}
                if chunk.get("name") and not reasoning:
                    msg["name"] = chunk["name"]
                self._add(msg, chunk)
            if t.endswith("_CHUNK") and isinstance(chunk.get("delta"), str):
                msg["content"] = (msg.get("content") or "") + chunk["delta"]
            _merge_metadata(msg, chunk)
            return
        if t in ("TEXT_MESSAGE_CONTENT", "REASONING_MESSAGE_CONTENT"):
            msg = self._by_id.get(chunk.get("messageId", ""))
            if msg is not None and msg.get("role") != "activity" and isinstance(chunk.get("delta"), str):
                msg["content"] = (msg.get("content") or "") + chunk["delta"]
                _merge_metadata(msg, chunk)
            return
        if t in ("TEXT_MESSAGE_END", "REASONING_MESSAGE_END"):
            msg = self._by_id.get(chunk.get("messageId", ""))
            if msg is not None and msg.get("role") != "activity":
                _merge_metadata(msg, chunk)
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
                owner = self._owner(chunk.get("parentMessageId"), tcid, chunk)
                owner.setdefault("toolCalls", []).append(call)
                self._call_owner[tcid] = owner
            if t == "TOOL_CALL_CHUNK" and isinstance(chunk.get("delta"), str):
                call["function"]["arguments"] += chunk["delta"]
            _merge_metadata(call, chunk)
            return
        if t in ("TOOL_CALL_ARGS", "TOOL_CALL_END"):
            call = self._tool_calls.get(chunk.get("toolCallId", ""))
            if call is not None:
                if t == "TOOL_CALL_ARGS" and isinstance(chunk.get("delta"), str):
                    call["function"]["arguments"] += chunk["delta"]
                _merge_metadata(call, chunk)
            return
        if t == "TOOL_CALL_RESULT":
            tcid = chunk.get("toolCallId")
            mid = chunk.get("messageId") or f"{tcid}:result"
            if not isinstance(tcid, str) or mid in self._by_id:
                return
            msg = {"id": mid, "role": "tool", "content": _content_text(chunk.get("content", "")),
                   "toolCallId": tcid}
            if chunk.get("subagentRunId"):
                msg["subagentRunId"] = chunk["subagentRunId"]
            _merge_metadata(msg, chunk)
            at = self._call_at(tcid)
            if at is None:
                self._out.append(msg)
            else:
                at += 1
                while at < len(self._out) and self._out[at].get("role") == "tool":
                    at += 1
                self._out.insert(at, msg)
            self._by_id[mid] = msg
            return
        if t == "REASONING_ENCRYPTED_VALUE":
            entity, value = chunk.get("entityId"), chunk.get("encryptedValue")
            if not isinstance(entity, str) or not isinstance(value, str):
                return
            target = self._tool_calls.get(entity) if chunk.get("subtype") == "tool-call" else self._by_id.get(entity)
            if target is not None and target.get("role") != "activity":
                target["encryptedValue"] = value
            return
        if t == "ACTIVITY_SNAPSHOT":
            mid = chunk.get("messageId")
            if not isinstance(mid, str):
                return
            msg = {"id": mid, "role": "activity", "activityType": chunk.get("activityType"),
                   "content": copy.deepcopy(chunk.get("content"))}
            if chunk.get("subagentRunId"):
                msg["subagentRunId"] = chunk["subagentRunId"]
            old = self._by_id.get(mid)
            if old is None:
                self._out.append(msg)
            elif chunk.get("replace", True) is not False:
                if old.get("metadata") is not None and old.get("role") == "activity":
                    msg["metadata"] = old["metadata"]
                self._out[self._out.index(old)] = msg
            else:
                return
            self._by_id[mid] = msg
            _merge_metadata(msg, chunk)
            return

    def _call_at(self, tcid: str) -> int | None:
        """Where in the produced messages the first assistant message holding tool call ``tcid``
        is (``None``: none). A call is added to one message only (its first start), so the
        message it was added to is that one while it is still there; it is looked for from the
        end, where a result's call usually is. Otherwise (replaced, or a resumed builder's
        call) the rule's own scan from the start answers."""
        owner = self._call_owner.get(tcid)
        if owner is not None:
            out = self._out
            for i in range(len(out) - 1, -1, -1):
                if out[i] is owner:
                    return i
        return next((i for i, m in enumerate(self._out) if m.get("role") == "assistant"
                     and any(c.get("id") == tcid for c in m.get("toolCalls", []))), None)

    def _owner(self, parent: Any, tcid: str, chunk: Chunk) -> Message:
        """The assistant message a new tool call joins (the AG-UI client's rule)."""
        if isinstance(parent, str) and parent:
            found = self._by_id.get(parent)
            if found is not None and found.get("role") == "assistant":
                return found
            msg: Message = {"id": tcid if found is not None else parent, "role": "assistant"}
        else:
            msg = {"id": tcid, "role": "assistant"}
        self._add(msg, chunk)
        return msg

    def _add(self, msg: Message, chunk: Chunk) -> None:
        if chunk.get("subagentRunId"):
            msg["subagentRunId"] = chunk["subagentRunId"]
        self._out.append(msg)
        self._by_id[msg["id"]] = msg

    @classmethod
    def resumed(cls, input_messages: Sequence[Message], produced: Sequence[Message]) -> "TranscriptBuilder":
        """A builder in the state it had after producing ``produced`` (a snapshot's messages,
        baton.log.snapshot): every produced message and tool call is found by id again, so
        feeding the chunks after it gives what feeding the whole log would have."""
        b = cls(input_messages)
        b._out = [copy.deepcopy(m) for m in produced]
        for m in b._out:
            b._by_id[m["id"]] = m
            for call in m.get("toolCalls") or []:
                if isinstance(call, dict) and isinstance(call.get("id"), str):
                    b._tool_calls[call["id"]] = call
        return b

    def parts(self) -> tuple[list[Message], list[Message]]:
        """``(input messages, produced messages)``, deep copies (:meth:`messages` is their sum)."""
        return [copy.deepcopy(m) for m in (self._input or [])], [copy.deepcopy(m) for m in self._out]

    def messages(self) -> list[Message]:
        """The transcript so far: input messages, then the run's messages (deep copies).

        An assistant message opened by a tool call has no ``content`` key; a text message
        keeps its ``content`` (``""`` when empty), as in the AG-UI client.
        """
        return [copy.deepcopy(m) for m in (self._input or [])] + [copy.deepcopy(m) for m in self._out]


def build_transcript(chunks: Iterable[Chunk], input_messages: Sequence[Message] | None = None) -> list[Message]:
    """The transcript of a whole chunk sequence (convenience over :class:`TranscriptBuilder`)."""
    b = TranscriptBuilder(input_messages)
    b.feed_all(chunks)
    return b.messages()
