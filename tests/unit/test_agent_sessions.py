"""Agent sessions (sandbox_host/agents/sessions.py) and the resume argv of the CLI kinds.

Pure: real corpus lines, the stand-ins' refusals captured once into ``data/standins/``
(``tests/sandbox/test_standins.py`` checks the stand-ins still print them), and the real
CLIs' refusal texts as reported against the binaries.
"""
from __future__ import annotations

import json
import pathlib
from datetime import datetime, timezone

import pytest

from sandbox_host.agents._claude import user_line

from baton.errors import InvalidArgument
from sandbox_host.agents import prepare_agent
from sandbox_host.agents.sessions import (
    agent_session_id,
    claude_project_dir_name,
    claude_session_path,
    codex_rollout_name,
    fork_codex_rollout,
    resume_refused,
)

pytestmark = pytest.mark.unit

REPO = pathlib.Path(__file__).resolve().parents[2]
CORPUS = REPO / "corpus"
DATA = pathlib.Path(__file__).with_name("data") / "standins"
CLAUDE = "claude-stream-json"
CODEX = "codex-exec-json"


def lines(path: pathlib.Path) -> list[bytes]:
    return [ln for ln in path.read_bytes().split(b"\n") if ln]


def test_session_id_of_real_journals() -> None:
    claude = lines(CORPUS / CLAUDE / "partial-messages-bash-exit-128.jsonl")
    assert agent_session_id(CLAUDE, claude[0]) == "3c655f56-b968-4973-a723-c2370e328b4e"
    assert [agent_session_id(CLAUDE, ln) for ln in claude[1:]] == [None] * (len(claude) - 1)  # result has it too
    codex = lines(CORPUS / CODEX / "resume-three-invocations-v0.157.jsonl")
    ids = [agent_session_id(CODEX, ln) for ln in codex]
    assert ids[0] == ids[4] == ids[8] == "0199f000-0419-7000-8000-00000000c0de"
    assert ids.count(None) == len(codex) - 3
    # Every multi-turn Claude journal announces its session at each turn's init.
    multi = lines(CORPUS / CLAUDE / "read-cap-autocompact-multi-turn-v2.1.285.jsonl")
    assert len({agent_session_id(CLAUDE, ln) for ln in multi} - {None}) == 1
    # Formats do not mix; garbage is no id.
    assert agent_session_id(CODEX, claude[0]) is None and agent_session_id(CLAUDE, codex[0]) is None
    for junk in [b"", b"not json", b"[1]", b'{"type":"system","subtype":"init","session_id":7}',
                 b'{"__exit":0,"__nonce":"ab"}']:
        assert agent_session_id(CLAUDE, junk) is None and agent_session_id(CODEX, junk) is None


def test_claude_refusal_captured_from_the_standin() -> None:
    sid = "3f2b8c1e-7d4a-4c55-9b1e-2a6f0c9d8e71"
    out = lines(DATA / "claude-unknown-resume.stdout")
    err = (DATA / "claude-unknown-resume.stderr").read_bytes()
    reason = resume_refused(CLAUDE, out, 1, err, resume_id=sid)
    assert reason == f"claude has no session {sid} to resume: No conversation found with session ID: {sid}"
    # From the result line alone (stderr lost), and from stderr alone (no result line).
    assert resume_refused(CLAUDE, out, 1, b"") == reason.replace(f"session {sid}", "the session")
    assert resume_refused(CLAUDE, [], 1, err, resume_id=sid) == reason
    # A successful exit does not make stderr a refusal (a tool may print anything there).
    assert resume_refused(CLAUDE, [], 0, err) is None


def test_claude_refusal_as_the_real_cli_prints_it() -> None:
    # claude 2.1.258 (reported against the binary): no `result` key, the sentence in `errors`.
    sid = "35814092-99b2-4a66-99e1-1dc2cbd7fc10"
    line = json.dumps({"type": "result", "subtype": "error_during_execution", "is_error": True, "num_turns": 0,
                       "session_id": sid, "total_cost_usd": 0,
                       "errors": [f"No conversation found with session ID: {sid}"]}).encode()
    assert resume_refused(CLAUDE, [line], 1, b"", resume_id=sid) is not None
    # Newer CLIs refuse a value that is no id before looking.
    err = b'Error: --resume requires a valid session ID or session title when used with --print.\n'
    assert resume_refused(CLAUDE, [], 1, err, resume_id="x") is not None


def test_claude_resumed_or_forked_is_not_refused() -> None:
    journal = lines(CORPUS / CLAUDE / "partial-messages-bash-exit-128.jsonl")
    sid = "3c655f56-b968-4973-a723-c2370e328b4e"
    assert resume_refused(CLAUDE, journal, 0, b"", resume_id=sid) is None
    assert resume_refused(CLAUDE, journal, 0, b"", resume_id="0" * 8 + sid[8:], fork=True) is None
    # An error result for another reason is the run's failure, not a refused resume.
    failed = lines(CORPUS / CLAUDE / "result-error-max-turns-structured-output.jsonl")
    assert resume_refused(CLAUDE, failed, 1, b"boom", resume_id=agent_session_id(CLAUDE, failed[0])) is None
    # A fresh session where a resume was asked for is never silent.
    other = "11111111-2222-4333-8444-555555555555"
    assert resume_refused(CLAUDE, journal, 0, b"", resume_id=other) == (
        f"claude started a fresh session {sid} instead of resuming {other}")


def test_codex_refusals() -> None:
    wanted = "0199f000-0419-7000-8000-00000000c0de"
    err = (DATA / "codex-unknown-resume.stderr").read_bytes()
    assert (DATA / "codex-unknown-resume.stdout").read_bytes() == b""
    assert resume_refused(CODEX, [], 1, err, resume_id=wanted) == (
        f"codex has no session {wanted} to resume: Error: thread/resume: thread/resume failed: "
        f"no rollout found for thread id {wanted} (code -32600)")
    # codex-cli 0.132 as captured by its users: the stdin notice precedes the error.
    real = (b"Reading prompt from stdin...\nError: thread/resume: thread/resume failed: no rollout found for "
            b"thread id 00000000-0000-0000-0000-000000000000 (code -32600)\n")
    assert "no rollout found" in (resume_refused(CODEX, [], 1, real) or "")
    # The interactive CLI's wording, should exec ever print it.
    assert resume_refused(CODEX, [], 1, "ERROR: No saved session found with ID x.") is not None
    # A name that matches no thread: the CLI starts a fresh thread and exits 0.
    fresh = lines(DATA / "codex-unknown-name.stdout")
    announced = agent_session_id(CODEX, fresh[0])
    assert announced and announced != "my-old-thread"
    assert resume_refused(CODEX, fresh, 0, b"", resume_id="my-old-thread") == (
        f"codex started a fresh session {announced} instead of resuming my-old-thread")
    resumed = lines(CORPUS / CODEX / "resume-three-invocations-v0.157.jsonl")[4:8]
    assert resume_refused(CODEX, resumed, 0, b"", resume_id=wanted) is None


def test_fork_codex_rollout_replaces_only_the_session_id() -> None:
    old, new = "0199f000-0419-7000-8000-00000000c0de", "0199f111-0419-7000-8000-0000000f0123"
    meta = {"timestamp": "2025-10-29T00:59:38.317Z", "type": "session_meta",
            "payload": {"id": old, "timestamp": "2025-10-29T00:59:38.308Z", "cwd": "/w",
                        "originator": "codex_exec", "cli_version": "0.46.0", "instructions": None}}
    rest = (b'{"timestamp":"t","type":"event_msg","payload":{"type":"user_message","message":"mentions ' +
            old.encode() + b' \xc3\xa9"}}\n')
    rollout = json.dumps(meta, separators=(",", ":")).encode() + b"\n" + rest
    forked = fork_codex_rollout(rollout, new)
    first, tail = forked.split(b"\n", 1)
    assert tail == rest  # the history is byte for byte the source's
    got = json.loads(first)
    assert got["payload"] == {**meta["payload"], "id": new, "forked_from_id": old}  # type: ignore[dict-item]
    assert got["timestamp"] == meta["timestamp"]
    with pytest.raises(ValueError):
        fork_codex_rollout(rest, new)


def test_session_paths() -> None:
    assert claude_project_dir_name("/private/tmp/my_app.v2") == "-private-tmp-my-app-v2"
    assert claude_session_path("/home/u/.claude/", "/w/x", "abc") == "/home/u/.claude/projects/-w-x/abc.jsonl"
    started = datetime(2025, 10, 29, 0, 59, 38, tzinfo=timezone.utc)
    assert codex_rollout_name("id-1", started) == "sessions/2025/10/29/rollout-2025-10-29T00-59-38-id-1.jsonl"


def test_resume_argv_of_the_cli_kinds() -> None:
    sid = "3c655f56-b968-4973-a723-c2370e328b4e"
    c = prepare_agent("claude-code", {"model": "sonnet"}, prompt="p", resume=sid)
    assert c.argv == ("claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--include-partial-messages",
                      "--model", "sonnet", "--resume", sid)
    assert c.resume == sid and not c.fork and c.stdin == user_line("p")
    f = prepare_agent("claude-code", {}, prompt="p", resume=sid, fork=True)
    assert f.argv[-3:] == ("--resume", sid, "--fork-session") and f.fork
    x = prepare_agent("codex", {"model": "gpt-5", "profile": "ci"}, prompt="do", resume=sid)
    # Every option of `exec` before the subcommand (--sandbox and --profile are not global).
    assert x.argv == ("codex", "exec", "--json", "--sandbox", "workspace-write", "--model", "gpt-5",
                      "--profile", "ci", "--skip-git-repo-check", "resume", sid, "-")
    assert x.resume == sid
    # Defaults: the argv every caller had before.
    assert prepare_agent("codex", {}, prompt="do").argv[-2:] == ("--skip-git-repo-check", "-")
    assert "--resume" not in prepare_agent("claude-code", {}, prompt="p").argv
    replay = prepare_agent("replay", {"journal": f"{CLAUDE}/partial-messages-bash-exit-128.jsonl"},
                           resume=sid, fork=True)
    assert replay.resume is None and "--resume" not in replay.argv
    for kind, resume, fork, field in [("codex", sid, True, "agent.fork"), ("claude-code", None, True, "agent.fork"),
                                      ("claude-code", "--evil", False, "agent.resume"),
                                      ("codex", "a b", False, "agent.resume"), ("codex", "", False, "agent.resume")]:
        with pytest.raises(InvalidArgument) as ei:
            prepare_agent(kind, {}, prompt="p", resume=resume, fork=fork)
        assert ei.value.field == field
