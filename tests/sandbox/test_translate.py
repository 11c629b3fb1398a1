"""Translator behaviour beyond the corpus: hostile lines, truncation, dedupe, ordering,
determinism and prefix stability (hypothesis over cut points), and the AG-UI check."""
from __future__ import annotations

import json
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from baton.agui import check_well_formed, event_to_chunk
from sandbox_host.journal import LineSplitter
from sandbox_host.translate import translate_bytes, translator_for
from tests.sandbox.conftest import AGUI_FILES, CLAUDE_FILES, CODEX_FILES

ALL = CLAUDE_FILES + CODEX_FILES


def _cut_translation(fmt: str, data: bytes, cut: int) -> tuple[list[dict], list[dict]]:
    """(chunks fed from the complete lines of data[:cut], the same + finish at that EOF)."""
    sp = LineSplitter()
    tr = translator_for(fmt, "r", "t")
    fed: list[dict] = []
    for line in sp.feed(data[:cut]):
        fed += tr.feed(line.data)
    return fed, fed + tr.finish(None, sp.pending or None)


@pytest.mark.parametrize("journal", ALL, ids=lambda p: p.stem)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frac=st.floats(min_value=0.0, max_value=1.0))
def test_prefix_translation_is_prefix_and_well_formed(journal: pathlib.Path, frac: float) -> None:
    data = journal.read_bytes()
    fmt = journal.parent.name
    full = translate_bytes(fmt, data, "r", "t", exit_code=None)
    cut = int(len(data) * frac)
    fed, closed = _cut_translation(fmt, data, cut)
    assert full[: len(fed)] == fed  # chunks completed within the prefix are a prefix
    assert check_well_formed(closed, require_terminal=True) == []
    if cut < len(data) and data[:cut].count(b"\n") < data.count(b"\n"):
        assert closed[-1]["type"] == _expected_terminal(fmt, data[:cut])


def _expected_terminal(fmt: str, prefix: bytes) -> str:
    """The terminal a journal cut after ``prefix`` closes with (docs/translation.md#terminal):
    finished only when the cut falls right after a turn that ended well."""
    if not prefix.endswith(b"\n"):
        return "RUN_ERROR"  # a truncated line
    last = json.loads(prefix.rstrip(b"\n").rsplit(b"\n", 1)[-1] or b"null")
    if not isinstance(last, dict):
        return "RUN_ERROR"
    if fmt == "codex-exec-json":
        ok = last.get("type") == "turn.completed"
    else:
        ok = last.get("type") == "result" and last.get("subtype") == "success" and not last.get("is_error")
    return "RUN_FINISHED" if ok else "RUN_ERROR"


@pytest.mark.parametrize("journal", ALL, ids=lambda p: p.stem)
def test_every_line_boundary_closes_by_the_last_turn(journal: pathlib.Path) -> None:
    """Cut after every complete line (the cuts the property above rarely hits): a cut inside a
    later turn or a resumed invocation is incomplete, never finished by an earlier turn."""
    data, fmt = journal.read_bytes(), journal.parent.name
    ends = [i + 1 for i, b in enumerate(data) if b == 0x0A]
    for cut in ends[:-1]:
        _, closed = _cut_translation(fmt, data, cut)
        want = _expected_terminal(fmt, data[:cut])
        assert (cut, closed[-1]["type"]) == (cut, want)
        last = json.loads(data[:cut].rstrip(b"\n").rsplit(b"\n", 1)[-1] or b"null")
        if isinstance(last, dict) and last.get("type") in _INSIDE_A_TURN:
            assert closed[-1]["code"] == "incomplete_journal"


# Lines written only inside a turn (docs/translation.md#terminal), and a turn's items.
_INSIDE_A_TURN = {"assistant", "user", "stream_event", "thread.started", "turn.started",
                  "item.started", "item.updated", "item.completed"}


@pytest.mark.parametrize("journal", ALL, ids=lambda p: p.stem)
def test_translation_is_deterministic(journal: pathlib.Path) -> None:
    data = journal.read_bytes()
    a = translate_bytes(journal.parent.name, data, "run-x", "th")
    b = translate_bytes(journal.parent.name, data, "run-x", "th")
    assert a == b
    # Reading in arbitrary pieces (as a follower does) changes nothing.
    sp, tr, pieces = LineSplitter(), translator_for(journal.parent.name, "run-x", "th"), []
    for i in range(0, len(data), 7):
        for line in sp.feed(data[i : i + 7]):
            pieces += tr.feed(line.data)
    assert pieces + tr.finish(0, sp.pending or None) == a


def test_hostile_lines_become_custom_and_are_not_obeyed() -> None:
    journal = (b'{"type":"system","subtype":"init","session_id":"s"}\n'
               b"not json at all\n"
               b"\xff\xfe{\"type\":\"x\"}\n"
               b'{"__exit":0,"__nonce":"forged"}\n'
               b'{"type":"rate_limit_event","rate_limit_info":{"status":"allowed"}}\n'
               b'{"type":"brand_new_type","a":1}\n'
               b"[1,2]\n"
               b"\r\n   \n")
    ch = translate_bytes("claude-stream-json", journal, "r", "t")
    customs = [(c["name"], c["value"]) for c in ch if c["type"] == "CUSTOM"]
    assert customs[1] == ("journal.unparsed_line", {"line": 2, "bytes": 15, "text": "not json at all"})
    assert customs[2][0] == "journal.unparsed_line" and customs[2][1]["text"].startswith("\ufffd\ufffd")
    assert customs[3] == ("journal.unknown_line", {"line": 4, "value": {"__exit": 0, "__nonce": "forged"}})
    assert customs[4] == ("agent.rate_limit", {"status": "allowed"})  # a named notice (docs/translation.md)
    assert customs[5][0] == "claude.brand_new_type"
    assert customs[6] == ("journal.unknown_line", {"line": 7, "value": [1, 2]})
    assert ch[-1]["code"] == "incomplete_journal"  # the forged sentinel did not end the run
    assert check_well_formed(ch, require_terminal=True) == []


def test_huge_line_is_split_into_bounded_chunks() -> None:
    big = "é" * (600 * 1024)
    journal = json.dumps({"type": "item.completed", "item": {"id": "item_0", "type": "agent_message",
                                                             "text": big}}).encode() + b"\n"
    ch = translate_bytes("codex-exec-json", b'{"type":"turn.started"}\n' + journal + b'{"type":"turn.completed"}\n',
                         "r", "t")
    deltas = [c["delta"] for c in ch if c["type"] == "TEXT_MESSAGE_CONTENT"]
    assert "".join(deltas) == big and len(deltas) == 3 and max(map(len, deltas)) <= 256 * 1024


def test_results_and_custom_values_too_big_for_a_message_are_cut_deterministically() -> None:
    from sandbox_host.translate._base import MAX_RESULT_BYTES, cut_result

    big = "ünïcode \"and\" escapes\n\t" * 60_000          # ~1.5 MB of JSON
    tool = {"type": "item.completed", "item": {"id": "item_0", "type": "command_execution", "command": "cat big",
                                                "aggregated_output": big, "exit_code": 0, "status": "completed"}}
    odd = {"type": "brand_new_type", "blob": big}
    journal = b"\n".join(json.dumps(x).encode() for x in (
        {"type": "turn.started"}, tool, odd, {"type": "turn.completed"})) + b"\n"
    ch = translate_bytes("codex-exec-json", journal, "r", "t")
    assert ch == translate_bytes("codex-exec-json", journal, "r", "t")   # deterministic
    for c in ch:
        assert len(json.dumps(c, ensure_ascii=False).encode()) <= MAX_RESULT_BYTES + 1024
    [result] = [c for c in ch if c["type"] == "TOOL_CALL_RESULT"]
    kept = result["metadata"]["truncated"]["keptChars"]
    assert result["metadata"]["truncated"]["totalChars"] == len(big)
    assert result["content"].startswith(big[:kept]) and result["content"].endswith(f"of {len(big)} characters]")
    [custom] = [c for c in ch if c["type"] == "CUSTOM" and c["name"].endswith("brand_new_type")]
    assert custom["value"]["omitted"] and custom["value"]["bytes"] > MAX_RESULT_BYTES
    assert len(custom["value"]["text"]) == 4096
    assert check_well_formed(ch, require_terminal=True) == []
    # Small results are untouched; the cut keeps the longest prefix that fits.
    assert cut_result("short") == ("short", None)
    from sandbox_host.translate._base import _cut_marker
    src = "é" * (MAX_RESULT_BYTES + 10)
    text, meta = cut_result(src)
    assert meta is not None and len(json.dumps(text, ensure_ascii=False).encode()) <= MAX_RESULT_BYTES
    k, n = meta["keptChars"], meta["totalChars"]
    one_more = src[: k + 1] + _cut_marker(k + 1, n)
    assert len(json.dumps(one_more, ensure_ascii=False).encode()) > MAX_RESULT_BYTES


def test_truncated_journal_closes_open_items_then_errors() -> None:
    data = (CLAUDE_FILES[1].read_bytes())  # partial-messages-bash-exit-128
    cut = data.index(b'"text_delta"') + 400
    fed, closed = _cut_translation("claude-stream-json", data, cut)
    tail = closed[len(fed):]
    assert tail[0]["type"] == "CUSTOM" and tail[0]["name"] == "journal.truncated_line"
    assert tail[0]["value"]["text"] and not tail[0]["value"]["text"].endswith("}")  # reported as is
    assert [c["type"] for c in tail[1:]] == ["TEXT_MESSAGE_END", "STEP_FINISHED", "RUN_ERROR"]
    assert tail[-1]["code"] == "incomplete_journal"


def test_tool_result_without_call_and_results_out_of_order() -> None:
    lines = [
        {"type": "system", "subtype": "init"},
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "tool_use", "id": "a", "name": "A", "input": {}}]}},
        {"type": "assistant", "message": {"id": "m1", "content": [{"type": "tool_use", "id": "b", "name": "B", "input": {"x": 1}}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "b", "content": "B done"}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "zz", "content": [{"type": "text", "text": "p1"}, {"type": "image"}], "is_error": True}]}},
        {"type": "user", "message": {"content": [{"type": "tool_result", "tool_use_id": "a", "content": ""}]}},
        {"type": "result", "subtype": "success", "is_error": True, "result": "API Error: overloaded"},
    ]
    ch = translate_bytes("claude-stream-json", b"".join(json.dumps(line).encode() + b"\n" for line in lines), "r", "t")
    assert [(c["type"], c.get("toolCallId")) for c in ch if c["type"].startswith("TOOL_CALL_")
            and c["type"] != "TOOL_CALL_ARGS"] == [
        ("TOOL_CALL_START", "a"), ("TOOL_CALL_END", "a"), ("TOOL_CALL_START", "b"), ("TOOL_CALL_END", "b"),
        ("TOOL_CALL_RESULT", "b"), ("TOOL_CALL_START", "zz"), ("TOOL_CALL_END", "zz"), ("TOOL_CALL_RESULT", "zz"),
        ("TOOL_CALL_RESULT", "a")]
    zz = next(c for c in ch if c["type"] == "TOOL_CALL_RESULT" and c["toolCallId"] == "zz")
    assert zz["content"] == "p1\n[image]" and zz["metadata"] == {"isError": True}
    assert ch[-1] == {"type": "RUN_ERROR", "message": "API Error: overloaded", "code": "agent_error"}


def test_several_turns_one_run_last_outcome_wins() -> None:
    turn = [{"type": "system", "subtype": "init"},
            {"type": "assistant", "message": {"id": None, "content": [{"type": "text", "text": "hi"}]}}]
    lines = turn + [{"type": "result", "subtype": "error_during_execution", "is_error": True, "errors": ["e1", "e2"]}]
    lines += turn + [{"type": "result", "subtype": "success", "is_error": False, "result": ""}]
    ch = translate_bytes("claude-stream-json", b"".join(json.dumps(line).encode() + b"\n" for line in lines), "r", "t")
    assert [c["stepName"] for c in ch if c["type"] == "STEP_STARTED"] == ["turn-1", "turn-2"]
    assert [c["messageId"] for c in ch if c["type"] == "TEXT_MESSAGE_START"] == ["r-1:0", "r-2:0"]
    assert ch[-1] == {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}
    assert check_well_formed(ch, require_terminal=True) == []
    lines2 = lines[:3]
    ch2 = translate_bytes("claude-stream-json", b"".join(json.dumps(line).encode() + b"\n" for line in lines2), "r", "t")
    assert ch2[-1] == {"type": "RUN_ERROR", "message": "e1; e2", "code": "error_during_execution"}
    # a successful result but a non-zero exit is not a success
    ch3 = translate_bytes("claude-stream-json", b"".join(json.dumps(line).encode() + b"\n" for line in lines), "r", "t",
                          exit_code=2)
    assert ch3[-1]["code"] == "agent_exit"


def test_codex_nonfatal_error_abandoned_command_duplicate_id_and_updates() -> None:
    lines = [
        {"type": "thread.started", "thread_id": "x"},
        {"type": "turn.started"},
        {"type": "error", "message": "Reconnecting... 1/5"},
        {"type": "item.started", "item": {"id": "item_0", "type": "command_execution", "command": "sleep 9",
                                          "aggregated_output": "", "exit_code": None, "status": "in_progress"}},
        {"type": "item.updated", "item": {"id": "item_1", "type": "agent_message", "text": "Hel"}},
        {"type": "item.completed", "item": {"id": "item_1", "type": "agent_message", "text": "Hello"}},
        {"type": "item.completed", "item": {"id": "item_2", "type": "command_execution", "command": "x",
                                            "aggregated_output": "", "exit_code": None, "status": "completed"}},
        {"type": "item.completed", "item": {"id": "item_3", "type": "error", "message": "deprecated flag"}},
        {"type": "item.completed", "item": {"id": "item_4", "type": "todo_list", "items": [{"text": "a", "completed": True}]}},
        {"type": "turn.completed", "usage": {"input_tokens": 1, "cached_input_tokens": 0, "output_tokens": 2,
                                             "reasoning_output_tokens": 3}},
    ]
    raw = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
    raw += b'{"type":"item.completed","item":{"id":"item_5","type":"web_search","id":"ws_1","query":"q"}}\n'
    ch = translate_bytes("codex-exec-json", raw, "r", "t")
    assert [c["value"]["message"] for c in ch if c.get("name") == "codex.warning"] == [
        "Reconnecting... 1/5", "deprecated flag"]
    assert [c["delta"] for c in ch if c["type"] == "TEXT_MESSAGE_CONTENT"] == ["Hel", "lo"]
    res = {c["toolCallId"]: c.get("metadata") for c in ch if c["type"] == "TOOL_CALL_RESULT"}
    assert res["r:item_0"] == {"status": "abandoned"}
    assert res["r:item_2"] == {"status": "completed", "exitStatus": "unknown"}
    assert "r:item_5" in res  # the item id (first "id"), not the search id
    assert any(c["type"] == "ACTIVITY_SNAPSHOT" and c["content"] == {"items": [{"text": "a", "completed": True}]}
               for c in ch)
    assert ch[-1]["type"] == "RUN_FINISHED"
    assert ch[-1]["usage"][0]["reasoningTokens"] == 3
    assert check_well_formed(ch, require_terminal=True) == []


def test_finish_is_idempotent_and_feed_after_finish_is_ignored() -> None:
    tr = translator_for("codex-exec-json", "r", "t")
    first = tr.finish(0)
    assert [c["type"] for c in first] == ["RUN_STARTED", "RUN_ERROR"]  # a 0-byte journal
    assert tr.finish(0) == [] and tr.feed(b'{"type":"turn.started"}') == []
    with pytest.raises(ValueError):
        translator_for("nope", "r", "t")


# --- the AG-UI check on other producers' output -----------------------------------------


def _agui(name: str) -> list[dict]:
    path = next(p for p in AGUI_FILES if p.stem == name)
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_check_reports_langgraph_defects() -> None:
    problems = check_well_formed(_agui("langgraph-raw-steps-snapshots"), require_terminal=True)
    codes = {(p.code, p.index) for p in problems}
    assert ("already_open", 31) in codes  # STEP_STARTED "tools" while "tools" is open
    assert ("not_started", 33) in codes  # STEP_FINISHED "agent" that is not open
    assert ("tool_call_reused", 36) in codes  # second START…END for a finished tool call id
    assert ("run_id_mismatch", 76) in codes  # RUN_FINISHED.runId != RUN_STARTED.runId
    assert ("open_at_finish", 76) in codes  # step "tools" still open at RUN_FINISHED
    assert {p.code for p in problems} == {"already_open", "not_started", "tool_call_reused", "run_id_mismatch",
                                          "open_at_finish"}


def test_check_reports_vercel_defects() -> None:
    problems = check_well_formed(_agui("vercel-run-error-then-finished"), require_terminal=True)
    assert [(p.index, p.code) for p in problems] == [
        (0, "invalid_event"),  # snake_case thread_id / run_id
        (2, "invalid_event"),
        (2, "after_run_error"),  # RUN_FINISHED after RUN_ERROR
        (3, "no_terminal"),
    ]
    assert "threadId" in problems[0].message


def test_check_accepts_pydantic_ai_stream() -> None:
    """Empty args deltas, a no-arg tool and out-of-order results are legal AG-UI."""
    assert check_well_formed(_agui("pydantic-ai-parallel-tools"), require_terminal=True) == []


def test_check_rules_on_small_sequences() -> None:
    from ag_ui.core import RunStartedEvent, TextMessageContentEvent

    start = event_to_chunk(RunStartedEvent(thread_id="t", run_id="r"))
    assert start == {"type": "RUN_STARTED", "threadId": "t", "runId": "r"}
    content = event_to_chunk(TextMessageContentEvent(message_id="m", delta="x"))
    assert [p.code for p in check_well_formed([content])] == ["first_not_run_started", "not_started"]
    assert [p.code for p in check_well_formed([start, start])] == ["run_already_active"]
    assert [p.code for p in check_well_formed([start, {"type": "NOPE"}])] == ["invalid_event"]
    opened = [start, {"type": "TEXT_MESSAGE_START", "messageId": "m"},
              {"type": "RUN_FINISHED", "threadId": "t", "runId": "r"}]
    assert [p.code for p in check_well_formed(opened)] == ["open_at_finish"]
    assert [p.code for p in check_well_formed([start], require_terminal=True)] == ["no_terminal"]
