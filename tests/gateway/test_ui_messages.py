"""The TanStack hydration shape (gateway/_ui_messages.py): reasoning lands where
@tanstack/ai-client's stream processor puts it live, so a reload after the end shows the
chat the user saw (tests/node/react_chat.mjs checks it against the real client)."""
from __future__ import annotations

from typing import Any

from gateway._ui_messages import to_ui_messages


def user(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "user", "content": text}


def said(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "assistant", "content": text}


def thought(mid: str, text: str) -> dict[str, Any]:
    return {"id": mid, "role": "reasoning", "content": text}


def text(content: str) -> dict[str, str]:
    return {"type": "text", "content": content}


def thinking(content: str) -> dict[str, str]:
    return {"type": "thinking", "content": content}


def test_reasoning_first_is_taken_over_by_the_turns_next_assistant_message() -> None:
    got = to_ui_messages([user("u1", "go"), thought("r1", "Let me think."), said("m0", "part 0. "), said("m1", "part 1. ")])
    assert got == [
        {"id": "u1", "role": "user", "parts": [text("go")]},
        {"id": "m0", "role": "assistant", "parts": [thinking("Let me think."), text("part 0. ")]},
        {"id": "m1", "role": "assistant", "parts": [text("part 1. ")]},
    ]


def test_reasoning_after_text_joins_the_turns_last_assistant_message() -> None:
    got = to_ui_messages([user("u1", "go"), said("m0", "a"), thought("r1", "hmm"), said("m1", "b")])
    assert [m["parts"] for m in got[1:]] == [[text("a"), thinking("hmm")], [text("b")]]


def test_reasoning_never_crosses_a_user_message_and_empty_reasoning_is_left_out() -> None:
    got = to_ui_messages([user("u1", "go"), said("m0", "a"), user("u2", "again"), thought("r1", ""),
                          thought("r2", "t"), user("u3", "more"), said("m1", "b")])
    assert got == [
        {"id": "u1", "role": "user", "parts": [text("go")]},
        {"id": "m0", "role": "assistant", "parts": [text("a")]},
        {"id": "u2", "role": "user", "parts": [text("again")]},
        {"id": "r2", "role": "assistant", "parts": [thinking("t")]},  # no assistant message followed it
        {"id": "u3", "role": "user", "parts": [text("more")]},
        {"id": "m1", "role": "assistant", "parts": [text("b")]},
    ]


def test_reasoning_then_a_tool_call_and_its_result_share_one_message() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"cmd": "ls"}'}}
    got = to_ui_messages([user("u1", "go"), thought("r1", "plan"), {"id": "c1", "role": "assistant", "toolCalls": [call]},
                          {"id": "t1", "role": "tool", "toolCallId": "c1", "content": "a.txt"}])
    assert got[1] == {"id": "c1", "role": "assistant", "parts": [
        thinking("plan"),
        {"type": "tool-call", "id": "c1", "name": "Bash", "arguments": '{"cmd": "ls"}', "state": "complete",
         "input": {"cmd": "ls"}, "output": "a.txt"},
        {"type": "tool-result", "toolCallId": "c1", "content": "a.txt", "state": "complete"},
    ]}
