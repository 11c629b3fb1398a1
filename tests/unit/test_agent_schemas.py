"""The agent option schemas (baton.agents): one per kind, shared by the gateway and the host."""
from __future__ import annotations

import pathlib

import pytest

from baton.agents import (ClaudeCodeOptions, CodexOptions, ReplayOptions, parse_agent_options,
                          resolve_replay_journal)
from baton.errors import InvalidArgument
from gateway._http_input import check_chat_start
from gateway._service import check_agent
from sandbox_host.agents import prepare_agent

pytestmark = pytest.mark.unit

CORPUS = pathlib.Path(__file__).resolve().parents[2] / "corpus"


def refused(kind: str, options: object) -> InvalidArgument:
    with pytest.raises(InvalidArgument) as ei:
        parse_agent_options(kind, options, field="agent")
    return ei.value


def test_unknown_option_is_refused_by_name_and_its_value_never_quoted() -> None:
    err = refused("claude-code", {"apiKey": "sk-secret"})
    assert (err.field, err.problem) == ("agent.apiKey", "is not an option of the claude-code agent")
    assert "sk-secret" not in str(err)
    assert refused("codex", {"max_turns": 3}).field == "agent.max_turns"  # a claude option
    assert refused("shell", {}).field == "agent.kind"
    assert refused("codex", ["model"]).problem == "must be a JSON object"


@pytest.mark.parametrize("kind,options,field", [
    ("replay", {}, "agent.journal"),
    ("replay", {"journal": "x", "speed": "fast"}, "agent.speed"),
    ("replay", {"journal": "x", "speed": True}, "agent.speed"),
    ("replay", {"journal": "x", "speed": -1}, "agent.speed"),
    ("replay", {"journal": "x", "delay": float("inf")}, "agent.delay"),
    ("replay", {"journal": "x", "format": "ag-ui"}, "agent.format"),
    ("replay", {"journal": "a\x00b"}, "agent.journal"),
    ("claude-code", {"model": "--dangerously-skip-permissions"}, "agent.model"),
    ("claude-code", {"maxTurns": 0}, "agent.maxTurns"),
    ("claude-code", {"maxTurns": "3"}, "agent.maxTurns"),
    ("claude-code", {"permissionMode": "yolo"}, "agent.permissionMode"),
    ("claude-code", {"allowedTools": "Bash"}, "agent.allowedTools"),
    ("claude-code", {"allowedTools": ["Read", ""]}, "agent.allowedTools[1]"),
    ("claude-code", {"includePartialMessages": 1}, "agent.includePartialMessages"),
    ("codex", {"sandbox": "none"}, "agent.sandbox"),
    ("codex", {"profile": "-x"}, "agent.profile"),
])
def test_bad_values_name_their_field(kind: str, options: dict, field: str) -> None:
    err = refused(kind, options)
    assert err.field == field, err
    assert err.problem and "Value error" not in err.problem


def test_camel_and_snake_case_names_are_the_same_option() -> None:
    camel = parse_agent_options("claude-code", {"maxTurns": 3, "permissionMode": "plan",
                                                "includePartialMessages": False})
    snake = parse_agent_options("claude-code", {"max_turns": 3, "permission_mode": "plan",
                                                "partial_messages": False})  # a record's older name
    assert camel == snake == ClaudeCodeOptions(max_turns=3, permission_mode="plan", include_partial_messages=False)
    # What a record keeps parses back to the same options.
    for opts in (camel, CodexOptions(), ReplayOptions(journal="/j.jsonl", speed=0)):
        assert parse_agent_options(
            {ClaudeCodeOptions: "claude-code", CodexOptions: "codex", ReplayOptions: "replay"}[type(opts)],
            opts.to_record()) == opts


def test_what_the_gateway_accepts_is_what_the_host_runs(tmp_path: pathlib.Path) -> None:
    # Before one schema, the gateway accepted maxTurns and the host read max_turns: the
    # option was silently dropped. The gateway's options, sent on, now reach the command line.
    choice = check_agent({"kind": "claude-code", "model": "sonnet", "maxTurns": 3, "allowedTools": ["Read", "Edit"],
                          "appendSystemPrompt": "be brief"}, [tmp_path], "replay")
    launch = prepare_agent(choice.kind, choice.options, prompt="hi")
    assert launch.argv == ("claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--include-partial-messages",
                           "--model", "sonnet", "--max-turns", "3", "--allowedTools=Read,Edit",
                           "--append-system-prompt=be brief")
    codex = check_agent({"kind": "codex", "profile": "ci", "sandbox": "read-only"}, [tmp_path], "replay")
    assert prepare_agent(codex.kind, codex.options, prompt="hi").argv == (
        "codex", "exec", "--json", "--sandbox", "read-only", "--profile", "ci", "--skip-git-repo-check", "-")
    replay = check_agent({"kind": "replay", "journal": "claude-stream-json/partial-messages-bash-exit-128.jsonl", "speed": 10},
                         [CORPUS], "replay")
    assert replay.options["journal"] == str(CORPUS / "claude-stream-json" / "partial-messages-bash-exit-128.jsonl")
    launch = prepare_agent(replay.kind, replay.options, env={"BATON_REPLAY_DIRS": str(CORPUS)})
    assert launch.options["format"] == "claude-stream-json" and "--speed" in launch.argv


def test_replay_journal_must_resolve_inside_the_allowed_dirs(tmp_path: pathlib.Path) -> None:
    allowed, outside = tmp_path / "replay", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    (outside / "secret.jsonl").write_text("{}\n")
    (allowed / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (allowed / "ok.jsonl").write_text("{}\n")
    assert resolve_replay_journal("ok.jsonl", [allowed]) == str((allowed / "ok.jsonl").resolve())
    for journal in ["link.jsonl", str(outside / "secret.jsonl"), "../outside/secret.jsonl", "missing.jsonl", ""]:
        with pytest.raises(InvalidArgument) as ei:
            resolve_replay_journal(journal, [allowed], field="agent.journal")
        assert ei.value.field == "agent.journal"


def test_chat_body_errors_name_the_field(tmp_path: pathlib.Path) -> None:
    def start(body: dict) -> InvalidArgument:
        with pytest.raises(InvalidArgument) as ei:
            check_chat_start(body, {}, {}, replay_dirs=[tmp_path], default_agent="codex", max_messages=10)
        return ei.value

    base = {"runId": "r", "threadId": "t"}
    assert start({**base, "messages": [{"role": "user"}, {"content": "x"}]}).field == "messages[1].role"
    assert start({**base, "messages": "hi"}).field == "messages"
    assert start({**base, "threadId": 5}).field == "threadId"
    assert start({**base, "forwardedProps": {"detachOnDisconnect": "no"}}).field == "detachOnDisconnect"
    assert start({**base, "agent": {"kind": "codex", "cmd": "rm -rf /"}}).field == "agent.cmd"
    ok = check_chat_start({**base, "state": {}, "tools": [], "forwardedProps": {"detachOnDisconnect": False}},
                          {}, {}, replay_dirs=[tmp_path], default_agent="codex", max_messages=10)
    assert ok.cancel_on_disconnect and ok.agent.kind == "codex" and ok.messages == []


def _http_body_to_launch(agent: dict, tmp_path: pathlib.Path):  # type: ignore[no-untyped-def]
    """The whole path of an agent object: POST /api/chat body → the gateway's StartRunRequest
    (options_json) → the host's launch → the record's options → the launch a successor builds."""
    import json

    body = {"threadId": "t1", "messages": [{"id": "u1", "role": "user", "content": "hi"}], "agent": agent}
    cs = check_chat_start(body, {"x-run-id": "r1"}, {}, replay_dirs=[tmp_path], default_agent="replay",
                          max_messages=100)
    first = prepare_agent(cs.agent.kind, json.loads(cs.agent.to_json()), prompt="hi")
    recorded = json.loads(json.dumps(dict(first.options)))  # the record's AgentSpec.options_json
    again = prepare_agent(cs.agent.kind, recorded, prompt="hi")
    assert (again.argv, dict(again.env)) == (first.argv, dict(first.env))
    return first


def test_option_values_starting_with_a_dash_never_become_flags(tmp_path: pathlib.Path) -> None:
    # A value is one argv element with its option ("--opt=value"): a prompt that is a Markdown
    # list stays a prompt, and "--dangerously-skip-permissions" as a value is just text.
    hostile = "--dangerously-skip-permissions"
    launch = _http_body_to_launch({"kind": "claude-code", "allowedTools": [hostile, "Read"],
                                   "disallowedTools": ["-x"], "appendSystemPrompt": hostile}, tmp_path)
    assert hostile not in launch.argv and "-x" not in launch.argv
    assert launch.argv[-3:] == (f"--allowedTools={hostile},Read", "--disallowedTools=-x",
                                f"--append-system-prompt={hostile}")
    listed = _http_body_to_launch({"kind": "claude-code", "appendSystemPrompt": "- be brief\n- cite files"}, tmp_path)
    assert listed.argv[-1] == "--append-system-prompt=- be brief\n- cite files"
    # A name is refused instead (it has no reason to start with "-").
    with pytest.raises(InvalidArgument) as exc:
        _http_body_to_launch({"kind": "claude-code", "model": hostile}, tmp_path)
    assert exc.value.field == "agent.model"


def test_contract_from_the_http_body_to_argv_and_env(tmp_path: pathlib.Path) -> None:
    """Every option the HTTP API names reaches the agent's command line."""
    claude = _http_body_to_launch({"kind": "claude-code", "model": "sonnet", "maxTurns": 3, "permissionMode": "plan",
                                   "includePartialMessages": False, "allowedTools": ["Read"],
                                   "appendSystemPrompt": "be brief"}, tmp_path)
    assert claude.argv == ("claude", "-p", "--input-format", "stream-json", "--output-format", "stream-json", "--verbose", "--model", "sonnet",
                           "--max-turns", "3", "--permission-mode", "plan", "--allowedTools=Read",
                           "--append-system-prompt=be brief")
    assert "--include-partial-messages" not in claude.argv  # false means false
    # The host's own (snake_case) names are the same options, accepted at the edge too.
    snake = _http_body_to_launch({"kind": "claude-code", "max_turns": 3, "include_partial_messages": False}, tmp_path)
    assert "--include-partial-messages" not in snake.argv and ("--max-turns", "3") == snake.argv[-2:]
    codex = _http_body_to_launch({"kind": "codex", "profile": "ci", "model": "o4"}, tmp_path)
    assert codex.argv[:3] == ("codex", "exec", "--json") and "--profile" in codex.argv and "ci" in codex.argv
    # Unknown options are refused up front, naming the option.
    with pytest.raises(InvalidArgument) as ei:
        _http_body_to_launch({"kind": "claude-code", "maxTurnz": 3}, tmp_path)
    assert "maxTurnz" in f"{ei.value.field} {ei.value.problem}"


def test_the_agent_list_names_each_journal_once(tmp_path: pathlib.Path) -> None:
    # The same journal shipped in two corpus directories, and reached again through a link.
    from gateway._service._requests import agent_list

    journal = CORPUS / "claude-stream-json" / "partial-messages-bash-exit-128.jsonl"
    for name in ("a", "b"):
        (tmp_path / name / "claude-stream-json").mkdir(parents=True)
        (tmp_path / name / "claude-stream-json" / journal.name).write_bytes(journal.read_bytes())
    (tmp_path / "c").symlink_to(tmp_path / "a")
    dirs = [tmp_path / "a", tmp_path / "b", tmp_path / "c"]
    replays = [a["journal"] for a in agent_list(dirs) if a["kind"] == "replay"]
    assert replays == [f"claude-stream-json/{journal.name}"]
