"""Transcript builder (pure)."""
from __future__ import annotations

from typing import Any

from baton.transcript import TranscriptBuilder, build_transcript

USER = [{"id": "u1", "role": "user", "content": "list files"}]


def sample() -> list[dict[str, Any]]:
    return [
        {"type": "RUN_STARTED", "threadId": "t", "runId": "r"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m1", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "Let me "},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m1", "delta": "look."},
        {"type": "TEXT_MESSAGE_END", "messageId": "m1"},
        {"type": "TOOL_CALL_START", "toolCallId": "c1", "toolCallName": "Bash", "parentMessageId": "msg_1"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": '{"command": '},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c1", "delta": '"ls"}'},
        {"type": "TOOL_CALL_END", "toolCallId": "c1"},
        {"type": "TOOL_CALL_START", "toolCallId": "c2", "toolCallName": "Read", "parentMessageId": "msg_1"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "c2", "delta": '{"path": "a"}'},
        {"type": "TOOL_CALL_END", "toolCallId": "c2"},
        {"type": "TOOL_CALL_RESULT", "messageId": "c2:result", "toolCallId": "c2", "content": "A", "role": "tool"},
        {"type": "TOOL_CALL_RESULT", "messageId": "c1:result", "toolCallId": "c1",
         "content": [{"type": "text", "text": "a\n"}, {"type": "text", "text": "b\n"}], "role": "tool"},
        {"type": "REASONING_START", "messageId": "th1"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m2", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m2", "delta": "Done."},
        {"type": "TEXT_MESSAGE_END", "messageId": "m2"},
        {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"},
    ]


EXPECTED = USER + [
    {"id": "m1", "role": "assistant", "content": "Let me look."},
    {"id": "msg_1", "role": "assistant", "toolCalls": [
        {"id": "c1", "type": "function", "function": {"name": "Bash", "arguments": '{"command": "ls"}'}},
        {"id": "c2", "type": "function", "function": {"name": "Read", "arguments": '{"path": "a"}'}},
    ]},
    {"id": "c2:result", "role": "tool", "content": "A", "toolCallId": "c2"},
    {"id": "c1:result", "role": "tool", "content": "a\nb\n", "toolCallId": "c1"},
    {"id": "m2", "role": "assistant", "content": "Done."},
]


def test_messages_user_first_then_assistant_tool_calls_and_results() -> None:
    assert build_transcript(sample(), USER) == EXPECTED


def test_input_messages_from_run_accepted_chunk() -> None:
    accepted = {"type": "CUSTOM", "name": "run.accepted", "value": {"messages": USER}}
    assert build_transcript([accepted, *sample()]) == EXPECTED


def test_takeover_split_inside_tool_args_gives_the_same_transcript() -> None:
    # The first host stored chunks [0, k); the successor's replay feeds all of them
    # (tagged stored) and then the suffix: the builder sees one continuous sequence.
    chunks = sample()
    for k in range(len(chunks) + 1):
        b = TranscriptBuilder(USER)
        b.feed_all(chunks[:k])
        b.feed_all(chunks[k:])
        assert b.messages() == EXPECTED


def test_deterministic_and_snapshots_are_copies() -> None:
    b = TranscriptBuilder(USER)
    b.feed_all(sample()[:8])
    snap = b.messages()
    snap[1]["content"] = "mutated"
    assert b.messages()[1]["content"] == "Let me look."
    assert build_transcript(sample(), USER) == build_transcript(sample(), USER)


def test_duplicate_tool_result_is_ignored() -> None:
    chunks = sample()
    dup = [c for c in chunks if c["type"] == "TOOL_CALL_RESULT"][:1]
    assert build_transcript(chunks + dup, USER) == EXPECTED
