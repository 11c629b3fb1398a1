"""AG-UI messages → TanStack AI ``UIMessage``s (the hydration answer of ``GET /api/chat?threadId``). Pure.

``@tanstack/ai-client`` with ``persistence: true`` hydrates a chat from the server and
expects its own message shape, ``{id, role, parts: [...]}``, not AG-UI messages. The
conversion follows ``modelMessagesToUIMessages`` of ``@tanstack/ai`` (0.33): a user or
system message's text is one ``text`` part; an assistant message gives a ``text`` part
and one ``tool-call`` part per tool call (``state: input-complete``, ``input`` when the
arguments parse); a ``tool`` message becomes a ``tool-result`` part of the assistant
message that made the call (``state: complete``), and the call's part turns ``complete``
with its ``output``.

Reasoning (a ``reasoning`` message) becomes a ``thinking`` part where the client's own stream
processor puts it while the run streams, so a reload after the end shows what the user saw:
on the last assistant message of the turn (since the last user message) if there is one,
else on a new assistant message that the turn's next assistant message takes over (its
parts first, the next message's id), as ``TEXT_MESSAGE_START`` adopts the message that
reasoning opened.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

Message = dict[str, Any]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
    return ""


def _parsed(raw: str) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def to_ui_messages(messages: Sequence[Message]) -> list[Message]:
    """Convert AG-UI messages (``role``, ``content``, ``toolCalls``, ``toolCallId``) to UI messages.

    A ``reasoning`` message becomes a ``thinking`` part (see the module docstring).
    Messages of other roles (``activity``, ``developer``) carry nothing the chat shows
    after a reload and are left out.
    """
    out: list[Message] = []
    current: Message | None = None  # the assistant message tool results attach to
    turn: Message | None = None  # the turn's last assistant message (reasoning attaches to it)
    opened: Message | None = None  # an assistant message reasoning opened, for the next one to take
    for m in messages:
        role = m.get("role")
        mid = str(m.get("id") or f"msg-{len(out)}")
        if role == "reasoning":
            thought = _text(m.get("content"))
            if not thought:
                continue
            if turn is None:
                turn = opened = {"id": mid, "role": "assistant", "parts": []}
                out.append(turn)
            turn["parts"].append({"type": "thinking", "content": thought})
            current = turn
            continue
        if role == "tool":
            content = _text(m.get("content"))
            result = {"type": "tool-result", "toolCallId": m.get("toolCallId", ""), "content": content,
                      "state": "complete"}
            if current is None:
                current = {"id": mid, "role": "assistant", "parts": []}
                out.append(current)
            for p in current["parts"]:
                if p.get("type") == "tool-call" and p.get("id") == m.get("toolCallId"):
                    p["state"] = "complete"
                    output = _parsed(content)
                    p["output"] = output if output is not None else content
            current["parts"].append(result)
            continue
        if role not in ("user", "assistant", "system"):
            continue
        parts: list[dict[str, Any]] = []
        text = _text(m.get("content"))
        if text:
            parts.append({"type": "text", "content": text})
        for call in m.get("toolCalls") or () if role == "assistant" else ():
            fn = call.get("function") or {}
            args = fn.get("arguments", "")
            part: dict[str, Any] = {"type": "tool-call", "id": call.get("id", ""), "name": fn.get("name", ""),
                                    "arguments": args, "state": "input-complete"}
            parsed = _parsed(args) if isinstance(args, str) else None
            if parsed is not None:
                part["input"] = parsed
            parts.append(part)
        if role == "assistant" and opened is not None:
            ui, opened = opened, None
            ui["id"] = mid
            ui["parts"].extend(parts)
        else:
            ui = {"id": mid, "role": role, "parts": parts}
            out.append(ui)
        current = ui if role == "assistant" else None
        if role == "assistant":
            turn = ui
        elif role == "user":
            turn = opened = None
    return out
