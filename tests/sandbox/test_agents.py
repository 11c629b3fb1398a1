"""Agent kinds: replay (allowed dirs, format detection, pacing, byte-exact output) and the
claude-code / codex launch specs."""
from __future__ import annotations

import json

import asyncio
import pathlib
import subprocess
import sys
import time

import pytest

from sandbox_host.agents._claude import user_line

from baton.errors import InvalidArgument
from sandbox_host.agents import journal_format_for, load_files, prepare_agent, prompt_from_messages
from sandbox_host.agents._replay import PROGRAM_PATH, detect_format
from tests.sandbox.conftest import CLAUDE_FILES, CODEX_FILES, CORPUS


@pytest.mark.parametrize("path", CLAUDE_FILES + CODEX_FILES, ids=lambda p: p.name)
def test_replay_records_format_and_copies_journal(path: pathlib.Path) -> None:
    rel = f"{path.parent.name}/{path.name}"
    launch = prepare_agent("replay", {"journal": rel, "speed": 0})
    assert launch.journal_format == path.parent.name
    assert launch.options["format"] == path.parent.name and launch.options["journal"] == str(path)
    # The journal is copied in at launch (read then, once), not when the launch is prepared.
    assert launch.sources[".baton-replay/journal.jsonl"] == (str(path), 0o644)
    assert asyncio.run(load_files(launch))[".baton-replay/journal.jsonl"] == (path.read_bytes(), 0o644)
    assert journal_format_for("replay", launch.options) == path.parent.name
    # Detected from the first lines too, when the directory name does not tell.
    assert detect_format("/x/y.jsonl", path.read_bytes()[:65536]) == path.parent.name


def test_replay_refuses_journals_outside_allowed_dirs(tmp_path: pathlib.Path) -> None:
    outside = tmp_path / "x.jsonl"
    outside.write_bytes(b'{"type":"turn.started"}\n')
    for journal in [str(outside), "../pyproject.toml", "claude-stream-json/../../pyproject.toml", "", "nope.jsonl"]:
        with pytest.raises(InvalidArgument) as ei:
            prepare_agent("replay", {"journal": journal})
        assert ei.value.field == "agent.options.journal"
    link = CORPUS.parent / "tests" / "sandbox"  # not allowed by default
    with pytest.raises(InvalidArgument):
        prepare_agent("replay", {"journal": str(link / "conftest.py")})
    env = {"BATON_REPLAY_DIRS": str(tmp_path)}
    launch = prepare_agent("replay", {"journal": "x.jsonl"}, env=env)
    assert launch.journal_format == "codex-exec-json"
    with pytest.raises(InvalidArgument):  # the default corpus is no longer allowed
        prepare_agent("replay", {"journal": "codex-exec-json/" + CODEX_FILES[0].name}, env=env)
    with pytest.raises(InvalidArgument):
        prepare_agent("replay", {"journal": "x.jsonl", "speed": -1}, env=env)


@pytest.mark.servers  # starts processes: not a unit test
def test_replay_program_is_byte_exact_and_paced(tmp_path: pathlib.Path) -> None:
    journal = tmp_path / "j.jsonl"
    journal.write_bytes(b'{"a":1}\n{"timestamp":"2026-01-01T00:00:00.000Z"}\n'
                        b'{"timestamp":"2026-01-01T00:00:00.400Z"}\nfragment')
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, PROGRAM_PATH, "--journal", str(journal), "--speed", "2",
                          "--delay", "0.1"], capture_output=True, check=True).stdout
    elapsed = time.monotonic() - t0
    assert out == journal.read_bytes()
    # waits: 0 (first), 0.1/2 (no timestamp), 0.4/2 (timestamps), 0.1/2 (no timestamp)
    assert elapsed >= 0.3


def test_cli_agent_launch_specs() -> None:
    c = prepare_agent("claude-code", {"model": "sonnet", "max_turns": 3}, prompt="fix it")
    assert c.argv == ("claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose",
                      "--include-partial-messages", "--model", "sonnet", "--max-turns", "3")
    assert c.stdin == user_line("fix it") and c.interactive and c.journal_format == "claude-stream-json"
    assert json.loads(c.stdin) == {"type": "user", "message": {"role": "user", "content": "fix it"},
                                   "parent_tool_use_id": None, "session_id": ""}
    asking = prepare_agent("claude-code", {"approvals": True}, prompt="p")
    assert asking.argv[-2:] == ("--permission-prompt-tool", "stdio")
    assert c.missing_secrets({}) == ["ANTHROPIC_API_KEY|CLAUDE_CODE_OAUTH_TOKEN"]
    assert c.missing_secrets({"CLAUDE_CODE_OAUTH_TOKEN": "t"}) == []
    c2 = prepare_agent("claude-code", {"partial_messages": False}, prompt="p")
    assert "--include-partial-messages" not in c2.argv
    x = prepare_agent("codex", {}, prompt="do")
    assert x.argv == ("codex", "exec", "--json", "--sandbox", "workspace-write", "--skip-git-repo-check", "-")
    assert x.stdin == b"do" and x.journal_format == "codex-exec-json"
    assert x.missing_secrets({"OPENAI_API_KEY": "k"}) == []
    for kind, opts in [("claude-code", {"model": "--evil"}), ("codex", {"sandbox": "none"}), ("bogus", {})]:
        with pytest.raises(InvalidArgument):
            prepare_agent(kind, opts)
    assert journal_format_for("codex", {}) == "codex-exec-json"


def test_prompt_from_messages() -> None:
    msgs = [{"role": "user", "content": "first"}, {"role": "assistant", "content": "x"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image"}, {"type": "text", "text": "b"}]}]
    assert prompt_from_messages(msgs) == "a\nb"
    assert prompt_from_messages([]) == ""
