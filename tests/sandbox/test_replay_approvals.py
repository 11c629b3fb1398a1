"""The replay agent plays a recorded tool approval (docs/hitl.md): it writes the recorded
``control_request``, waits for the answer on stdin, and on a denial writes an error result in
place of the recorded one."""
from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from sandbox_host.agents._replay import PROGRAM_PATH
from sandbox_host.run_inputs import answer_payload

pytestmark = pytest.mark.servers  # runs the replay agent

TOOL = "toolu_01abc"
RECORDED = [
    {"type": "system", "subtype": "init", "session_id": "s1"},
    {"type": "assistant", "message": {"role": "assistant", "content": [
        {"type": "tool_use", "id": TOOL, "name": "Bash", "input": {"command": "rm -rf build"}}]}},
    {"type": "control_request", "request_id": "req-7", "request": {
        "subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "rm -rf build"}, "tool_use_id": TOOL}},
    {"type": "baton_input", "id": "req-7", "input": {"recorded": True}},
    {"type": "user", "message": {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": TOOL, "content": "removed"}]}},
    {"type": "result", "subtype": "success", "is_error": False},
]


def play(tmp_path: pathlib.Path, stdin: bytes) -> list[dict[str, object]]:
    journal = tmp_path / "j.jsonl"
    journal.write_text("".join(json.dumps(o) + "\n" for o in RECORDED))
    out = subprocess.run([sys.executable, PROGRAM_PATH, "--journal", str(journal), "--speed", "0"],
                         input=stdin, capture_output=True, timeout=20, check=True)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_allow_goes_on_as_recorded(tmp_path: pathlib.Path) -> None:
    lines = play(tmp_path, b'{"type":"user"}\n' + answer_payload("req-7", "allow", "", None) + b"\n")
    assert lines == [o for o in RECORDED if o["type"] != "baton_input"]


def test_deny_writes_an_error_result_instead(tmp_path: pathlib.Path) -> None:
    lines = play(tmp_path, answer_payload("req-7", "deny", "not in prod", None) + b"\n")
    results = [o for o in lines if o["type"] == "user"]
    assert len(results) == 1
    block = results[0]["message"]["content"][0]  # type: ignore[index]
    assert block == {"type": "tool_result", "tool_use_id": TOOL, "content": "not in prod", "is_error": True}
    assert lines[-1]["type"] == "result" and lines.index(results[0]) == 3


def test_no_answer_before_end_of_input_is_a_denial(tmp_path: pathlib.Path) -> None:
    lines = play(tmp_path, answer_payload("req-other", "allow", "", None) + b"\n")
    block = [o for o in lines if o["type"] == "user"][0]["message"]["content"][0]  # type: ignore[index]
    assert block["is_error"] is True and block["content"] == "no answer"
