"""Translation fidelity beyond the goldens: what a cut, a second invocation or a
changed snapshot does, on real recordings of the corpus (tests/sandbox/test_golden.py pins
each journal's own facts; docs/translation.md documents the names and payloads)."""
from __future__ import annotations

import json
from typing import Any

from baton.agui import check_well_formed
from baton.transcript import build_transcript
from sandbox_host.translate import translate_bytes, translator_for
from tests.sandbox.conftest import CORPUS

Chunks = list[dict[str, Any]]
CODEX = CORPUS / "codex-exec-json"
CLAUDE = CORPUS / "claude-stream-json"


def _by_line(fmt: str, data: bytes) -> list[Chunks]:
    """The chunks each journal line completes, in order (what a follower appends)."""
    tr = translator_for(fmt, "r", "t")
    return [tr.start()] + [tr.feed(line) for line in data.split(b"\n")[:-1]] + [tr.finish(0)]


def _customs(ch: Chunks, name: str) -> list[Any]:
    return [c["value"] for c in ch if c["type"] == "CUSTOM" and c["name"] == name]


def test_takeover_at_any_line_of_the_new_journals_gives_the_uninterrupted_sequence() -> None:
    # A successor replays the journal from byte 0 and compares: the chunks completed by the
    # first k lines must be exactly the first chunks of the whole translation, for every k.
    for journal in [CODEX / "web-search-duplicate-ids-v0.157.jsonl", CODEX / "resume-three-invocations-v0.157.jsonl",
                    CLAUDE / "read-cap-autocompact-multi-turn-v2.1.285.jsonl"]:
        data = journal.read_bytes()
        full = translate_bytes(journal.parent.name, data, "r", "t")
        steps = _by_line(journal.parent.name, data)
        assert [c for step in steps for c in step] == full
        for k in range(len(steps)):
            prefix = [c for step in steps[:k] for c in step]
            assert full[: len(prefix)] == prefix


def test_web_search_that_never_completes_keeps_its_started_form() -> None:
    # Cut the real recording right after the first item.started: the search is emitted whole
    # at the end of the turn, with the arguments it had, and an abandoned result.
    lines = (CODEX / "web-search-duplicate-ids-v0.157.jsonl").read_bytes().split(b"\n")
    data = b"\n".join(lines[:3]) + b"\n"
    tr = translator_for("codex-exec-json", "r", "t")
    fed = [c for line in lines[:3] for c in tr.feed(line)]
    assert not [c for c in fed if c["type"].startswith("TOOL_CALL")]  # held: nothing yet
    ch = translate_bytes("codex-exec-json", data, "r", "t", exit_code=None)
    calls = [c for c in ch if c.get("toolCallId") == "r:item_2"]
    assert [c["type"] for c in calls] == ["TOOL_CALL_START", "TOOL_CALL_ARGS", "TOOL_CALL_END", "TOOL_CALL_RESULT"]
    assert json.loads(calls[1]["delta"]) == {"query": "", "action": {"type": "other"}}
    assert calls[3]["metadata"] == {"status": "abandoned"}
    assert check_well_formed(ch, require_terminal=True) == []


def test_a_second_invocation_with_the_same_command_ids_is_not_swallowed() -> None:
    # The real zsh recording twice in one journal, as `codex exec resume` appends it: the
    # second invocation's item_1/item_2/item_3 restart. Every command still has its call and
    # its result, under distinct ids; both agent messages of each invocation stay apart.
    data = (CODEX / "zsh-commands-and-file-change.jsonl").read_bytes() * 2
    ch = translate_bytes("codex-exec-json", data, "r", "t")
    starts = [c["toolCallId"] for c in ch if c["type"] == "TOOL_CALL_START"]
    results = [c["toolCallId"] for c in ch if c["type"] == "TOOL_CALL_RESULT"]
    assert starts == results == ["r:item_1", "r:item_2", "r:item_3", "r:s2:item_1", "r:s2:item_2", "r:s2:item_3"]
    texts = [m["content"] for m in build_transcript(ch, []) if m["role"] == "assistant" and m.get("content")]
    assert texts == ["I'll read both files, compare them, and create a summary.", "Found 2 files and created summary.txt."] * 2
    assert check_well_formed(ch, require_terminal=True) == []
    usage = _customs(ch, "turn.usage")
    # same thread id and the same running total again: this turn added nothing
    assert [u["usage"]["inputTokens"] for u in usage] == [54064, 0]


def test_bash_structured_result_keeps_stdout_stderr_and_interrupted() -> None:
    # The top-level tool_use_result of a Bash result, in the shape Claude Code 2.x writes it
    # (stdout/stderr/interrupted/isImage/noOutputExpected), next to the joined content.
    lines = [
        {"type": "system", "subtype": "init", "session_id": "s"},
        {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"command": "make"}}]}},
        {"type": "user", "message": {"role": "user", "content": [
            {"tool_use_id": "toolu_1", "type": "tool_result", "content": "built\nwarning: x", "is_error": False}]},
         "tool_use_result": {"stdout": "built", "stderr": "warning: x", "interrupted": False, "isImage": False,
                             "noOutputExpected": False}},
        {"type": "result", "subtype": "success", "is_error": False, "result": "ok", "total_cost_usd": 0.5,
         "usage": {"input_tokens": 3, "output_tokens": 4}},
    ]
    data = b"".join(json.dumps(o).encode() + b"\n" for o in lines)
    ch = translate_bytes("claude-stream-json", data, "r", "t")
    (res,) = [c for c in ch if c["type"] == "TOOL_CALL_RESULT"]
    assert res["content"] == "built\nwarning: x"
    assert res["metadata"] == {"toolUseResult": {"stdout": "built", "stderr": "warning: x", "interrupted": False,
                                                 "isImage": False, "noOutputExpected": False}}
    (tool_msg,) = [m for m in build_transcript(ch, []) if m["role"] == "tool"]
    assert tool_msg["metadata"]["toolUseResult"]["stderr"] == "warning: x"
    assert ch[-1]["usage"] == [{"provider": "anthropic", "inputTokens": 3, "outputTokens": 4}]
    assert ch[-1]["metadata"] == {"turns": 1, "costUsd": 0.5}


def test_a_huge_structured_result_keeps_its_scalars_and_fits_one_message() -> None:
    # 100 edits of 20k characters each: the structured form would be MiBs; it keeps the
    # top-level scalars and says what it left out, so the chunk still fits a log message.
    raw = {"filePath": "/w/a.py", "interrupted": False, "edits": [{"old": "x" * 20_000}] * 100}
    lines = [
        {"type": "assistant", "message": {"id": "msg_1", "role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "MultiEdit", "input": {}}]}},
        {"type": "user", "message": {"role": "user", "content": [
            {"tool_use_id": "toolu_1", "type": "tool_result", "content": "ok"}]}, "tool_use_result": raw},
    ]
    ch = translate_bytes("claude-stream-json", _dump(lines), "r", "t", exit_code=None)
    (res,) = [c for c in ch if c["type"] == "TOOL_CALL_RESULT"]
    meta = res["metadata"]["toolUseResult"]
    assert meta["filePath"] == "/w/a.py" and meta["interrupted"] is False
    assert meta["omitted"]["keys"] == ["edits"] and meta["omitted"]["bytes"] > 1_000_000
    assert len(json.dumps(res).encode()) < 1024 * 1024


def _partial() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (CLAUDE / "partial-messages-bash-exit-128.jsonl").read_bytes().splitlines()]


def _dump(objs: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(o, ensure_ascii=False).encode() + b"\n" for o in objs)


def test_streamed_deltas_that_differ_from_the_snapshot_are_reported() -> None:
    objs = _partial()
    assert not _customs(translate_bytes("claude-stream-json", _dump(objs), "r", "t"), "claude.stream_mismatch")
    # Drop one text delta of the final answer (a lost delta): the text shown lacks it, the
    # snapshot has it; the notice names the block and carries the snapshot's text.
    i = next(i for i, o in enumerate(objs) if o["type"] == "stream_event"
             and o["event"].get("delta", {}).get("type") == "text_delta"
             and "options" in o["event"]["delta"]["text"])
    lost = objs[i]["event"]["delta"]["text"]
    del objs[i]
    ch = translate_bytes("claude-stream-json", _dump(objs), "r", "t")
    (notice,) = _customs(ch, "claude.stream_mismatch")
    snapshot = next(b["text"] for o in objs if o["type"] == "assistant"
                    for b in o["message"]["content"] if b["type"] == "text" and lost in b["text"])
    assert notice == {"id": notice["id"], "kind": "text", "streamedChars": len(snapshot) - len(lost),
                      "snapshotChars": len(snapshot), "snapshot": snapshot}
    streamed = "".join(c["delta"] for c in ch if c.get("messageId") == notice["id"] and c["type"] == "TEXT_MESSAGE_CONTENT")
    assert lost not in streamed
    assert check_well_formed(ch, require_terminal=True) == []


def test_streamed_thinking_keeps_its_signature_and_each_message_its_stop_reason() -> None:
    objs = _partial()
    ch = translate_bytes("claude-stream-json", _dump(objs), "r", "t")
    signatures = [b["signature"] for o in objs if o["type"] == "assistant"
                  for b in o["message"]["content"] if b["type"] == "thinking"]
    assert [c["encryptedValue"] for c in ch if c["type"] == "REASONING_ENCRYPTED_VALUE"] == signatures
    stops = [(o["event"]["delta"]["stop_reason"]) for o in objs if o["type"] == "stream_event"
             and o["event"]["type"] == "message_delta"]
    assert [v["stopReason"] for v in _customs(ch, "claude.stop_reason")] == stops == ["tool_use", "end_turn"]


def test_local_command_output_in_a_user_line_is_a_named_notice() -> None:
    # The CLI's own slash-command output, as the 2.1.285 recording quotes it in
    # local_command_source, arriving as user text.
    line = {"type": "user", "message": {"role": "user", "content":
            "<local-command-stderr>Error: No messages to compact</local-command-stderr>"}}
    data = b'{"type":"system","subtype":"init","session_id":"s"}\n' + json.dumps(line).encode() + b"\n"
    ch = translate_bytes("claude-stream-json", data, "r", "t", exit_code=None)
    assert _customs(ch, "agent.local_command") == [{"stderr": "Error: No messages to compact"}]
    assert not _customs(ch, "claude.user_message")
