"""A tool result goes after the assistant message holding its call (and the results before
it), found from where the call was added, however many messages came between; when that
message is gone (an activity replaced it) or the builder was resumed from a snapshot, the
rule's scan from the start answers the same."""
from __future__ import annotations

from typing import Any

import pytest

from baton.transcript import TranscriptBuilder

pytestmark = pytest.mark.unit


def _turn(i: int) -> list[dict[str, Any]]:
    return [{"type": "TEXT_MESSAGE_START", "messageId": f"m{i}", "role": "assistant"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"m{i}", "delta": f"turn {i}"},
            {"type": "TEXT_MESSAGE_END", "messageId": f"m{i}"},
            {"type": "TOOL_CALL_START", "toolCallId": f"c{i}", "toolCallName": "Read", "parentMessageId": f"m{i}"},
            {"type": "TOOL_CALL_END", "toolCallId": f"c{i}"}]


def _result(i: int) -> dict[str, Any]:
    return {"type": "TOOL_CALL_RESULT", "toolCallId": f"c{i}", "messageId": f"r{i}", "content": f"result {i}"}


def test_results_land_after_their_calls_even_far_back_and_after_a_resume() -> None:
    chunks = [c for i in range(50) for c in _turn(i)] + [_result(3), _result(0), _result(3 + 0)]
    chunks += [_result(i) for i in range(40, 50)]
    b = TranscriptBuilder()
    b.feed_all(chunks)
    ids = [m["id"] for m in b.messages()]
    assert ids[:4] == ["m0", "r0", "m1", "m2"] and ids[ids.index("m3") + 1] == "r3"
    assert ids[-2:] == ["m49", "r49"] and ids.count("r3") == 1
    # A builder resumed from those messages (a snapshot) places a later result the same way.
    _, produced = b.parts()
    resumed = TranscriptBuilder.resumed([], produced)
    resumed.feed(_result(7))
    b.feed(_result(7))
    assert resumed.messages() == b.messages() and [m["id"] for m in b.messages()].index("r7") == \
        [m["id"] for m in b.messages()].index("m7") + 1


def test_a_result_whose_calls_message_was_replaced_goes_last() -> None:
    b = TranscriptBuilder()
    b.feed_all(_turn(0) + _turn(1))
    # An activity snapshot with the id of the assistant message holding c0 replaces it.
    b.feed({"type": "ACTIVITY_SNAPSHOT", "messageId": "m0", "activityType": "note", "content": {}})
    b.feed(_result(0))
    assert [m["id"] for m in b.messages()] == ["m0", "m1", "r0"]
