"""The hydration's pure parts: the fold of a thread's runs as @tanstack/ai-client builds it
(:mod:`gateway._ui_stream`; checked against the client itself in
tests/gateway/test_hydration_live.py) and the newest-first pages (:mod:`gateway._paging`)."""
from __future__ import annotations

from typing import Any

import pytest

from baton.errors import InvalidArgument
from gateway._paging import check_cursor, check_limit, cursor_of, window
from gateway._ui_stream import UIStreamFolder, accepted_input, prompt_messages, thread_messages
from sandbox_host.translate import translate_bytes
from tests.conftest import REPO

CORPUS = REPO / "corpus"


def _fold(kind: str, name: str) -> list[dict[str, Any]]:
    chunks = translate_bytes(kind, (CORPUS / kind / name).read_bytes(), "run-1", "thread-1")
    f = UIStreamFolder([{"id": "u1", "role": "user", "parts": [{"type": "text", "content": "go"}]}])
    f.fold_run("run-1", chunks)
    return f.messages


def test_a_subagent_run_is_three_messages_and_one_steps_reasoning_is_one_part() -> None:
    sub = _fold("claude-stream-json", "subagents-parallel-tools-v2.0.25.jsonl")
    assert [m["role"] for m in sub] == ["user", "assistant", "assistant", "assistant"]
    assert [p["type"] for p in sub[1]["parts"]][:3] == ["text", "tool-call", "tool-call"]
    bash = _fold("claude-stream-json", "partial-messages-bash-exit-128.jsonl")
    thinking = [p for p in bash[1]["parts"] if p["type"] == "thinking"]
    assert [len(p["content"]) for p in thinking] == [512] and thinking[0]["stepId"] == "turn-1"
    assert [p["type"] for p in bash[1]["parts"]] == ["thinking", "text", "tool-call", "tool-result"]


def test_text_after_tools_is_a_new_part_and_reasoning_first_takes_the_text_id() -> None:
    f = UIStreamFolder()
    f.fold_run("r", [
        {"type": "RUN_STARTED", "runId": "r"},
        {"type": "REASONING_MESSAGE_CONTENT", "messageId": "x", "delta": "hm"},
        {"type": "TEXT_MESSAGE_START", "messageId": "m0", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m0", "delta": "a"},
        {"type": "TOOL_CALL_START", "toolCallId": "t", "toolCallName": "Bash", "parentMessageId": "elsewhere"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "t", "delta": "{\"x\":1}"},
        {"type": "TOOL_CALL_RESULT", "toolCallId": "t", "content": "[1]"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m0", "delta": "b"},
        {"type": "RUN_FINISHED", "runId": "r"},
    ])
    assert f.messages == [{"id": "m0", "role": "assistant", "parts": [
        {"type": "thinking", "content": "hm", "stepId": "x"},
        {"type": "text", "content": "a"},
        {"type": "tool-call", "id": "t", "name": "Bash", "arguments": "{\"x\":1}", "state": "input-complete",
         "output": [1], "input": {"x": 1}},
        {"type": "tool-result", "toolCallId": "t", "content": "[1]", "state": "complete"},
        {"type": "text", "content": "b"}]}]


def test_a_run_error_without_content_is_an_empty_message_with_a_stable_id() -> None:
    f = UIStreamFolder()
    f.fold_run("r9", [{"type": "RUN_STARTED", "runId": "r9"}, {"type": "RUN_ERROR", "message": "no"}])
    assert f.messages == [{"id": "r9:1", "role": "assistant", "parts": []}]


def test_a_threads_prompts_and_a_log_without_its_start() -> None:
    accepted = {"type": "CUSTOM", "name": "run.accepted", "value": {"messages": [
        {"id": "s", "role": "system", "content": "be brief"}, {"id": "u1", "role": "user", "content": "hi"}]}}
    assert accepted_input([{"type": "RUN_STARTED"}, accepted]) == accepted["value"]["messages"]
    assert accepted_input([{"type": "RUN_STARTED"}, {"type": "TEXT_MESSAGE_START"}]) is None
    later = [{"id": "u1", "role": "user", "content": "hi"}, {"id": "a", "role": "assistant", "content": "yo"},
             {"id": "u2", "role": "user", "parts": [{"type": "text", "content": "more"}]}]
    assert prompt_messages(later, first=False) == [{"id": "u2", "role": "user", "parts": [{"type": "text", "content": "more"}]}]
    assert [m["id"] for m in prompt_messages(later, first=True)] == ["u1", "a", "u2"]
    run = [{"type": "RUN_STARTED", "runId": "r"}, accepted, {"type": "TEXT_MESSAGE_START", "messageId": "m"},
           {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "yo"}, {"type": "RUN_FINISHED", "runId": "r"}]
    got = thread_messages([("r", run)], active_input=later)
    assert got is not None and [m["id"] for m in got] == ["s", "u1", "m", "u2"]
    assert thread_messages([("r", run[2:])]) is None


def test_pages_newest_first_by_cursor() -> None:
    msgs = [{"id": f"m{i}"} for i in range(5)]
    first = window(msgs, 2, None)
    assert first.messages == msgs[3:] and first.start == 3 and first.cursor == cursor_of(3, "m3")
    second = window(msgs, 2, first.cursor)
    assert second.messages == msgs[1:3] and second.start == 1
    last = window(msgs, 2, second.cursor)
    assert last.messages == msgs[:1] and last.cursor == "" and last.start == 0
    assert window(msgs, 0, None) == (msgs, "", 0)
    assert check_limit(None) == check_limit("") == 0 and check_limit("7") == 7
    for bad_limit in ("x", "-1", "1001", 1001):
        with pytest.raises(InvalidArgument):
            check_limit(bad_limit)
    for bad in ("garbage!", cursor_of(9, "m9"), cursor_of(1, "other"), "WyJhIiwiYiJd"):
        with pytest.raises(InvalidArgument):
            window(msgs, 2, bad)
    assert check_cursor(None) is None and check_cursor(first.cursor) == (3, "m3")
