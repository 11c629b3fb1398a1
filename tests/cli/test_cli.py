"""The `baton` command as a user runs it: help, up / page / a run / down, restart, errors."""
from __future__ import annotations

import json
import pathlib
import signal
import subprocess

import httpx
import pytest
from typer.main import get_command
from typer.testing import CliRunner

from baton.sse import Event, SSEParser
from baton_tools.cli import app
from baton_tools.testing.servers import free_port
from tests.cli.conftest import baton_argv, cli_env, cluster_json, pid_alive, processes_mentioning, run_cli
from tests.conftest import REPO, assert_eventually

JOURNAL = "codex-exec-json/command-with-stderr-noise-v0.46.jsonl"


def _all_commands() -> list[list[str]]:
    root = get_command(app)
    out: list[list[str]] = []
    for name, cmd in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        if subs:
            out += [[name, sub] for sub in subs]
        else:
            out.append([name])
    return out


def test_the_issue_commands_exist() -> None:
    names = {" ".join(c) for c in _all_commands()}
    assert {"up", "down", "demo", "runs", "tail", "cancel", "reap", "hosts", "drain", "undrain"} <= names


@pytest.mark.parametrize("command", _all_commands(), ids=lambda c: " ".join(c))
def test_every_command_has_help_with_examples(command: list[str]) -> None:
    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Examples" in result.output
    assert f"baton {' '.join(command)}" in result.output


@pytest.mark.servers
def test_down_without_a_cluster_says_so(tmp_path: pathlib.Path) -> None:
    out = run_cli("down", "--data-dir", str(tmp_path))
    assert out.returncode == 1
    assert "no cluster" in out.stderr and "baton up" in out.stderr


@pytest.mark.servers
def test_health_fails_on_a_dead_address() -> None:
    out = run_cli("health", "grpc", "127.0.0.1:1", "--timeout", "0.5")
    assert out.returncode == 1 and "not serving" in out.stderr


def _sse_chunks(text: str) -> list[tuple[str | None, dict]]:
    return [(ev.id, json.loads(ev.data)) for ev in SSEParser().feed(text) if isinstance(ev, Event)]


async def _up(data_dir: pathlib.Path) -> tuple[subprocess.Popen[bytes], dict]:
    data_dir.mkdir(parents=True, exist_ok=True)
    out = data_dir.parent / "baton-up.out"
    with open(out, "ab") as log:
        proc = subprocess.Popen(
            baton_argv("up", "--hosts", "2", "--port", "0", "--data-dir", str(data_dir)),
            env=cli_env(BATON_DETACHED_RUN_TTL="1234"), cwd=str(REPO), stdout=log, stderr=subprocess.STDOUT,
        )

    def ready() -> dict | None:
        assert proc.poll() is None, out.read_text(errors="replace")
        return cluster_json(data_dir)

    info = await assert_eventually(ready, timeout=60, interval=0.1)
    return proc, info


def _assert_nothing_left(data_dir: pathlib.Path, info: dict) -> None:
    for c in info["components"]:
        assert not pid_alive(c["pid"]), c
    assert processes_mentioning(str(data_dir)) == []


@pytest.mark.servers
@pytest.mark.timeout(180)
async def test_up_page_run_down_and_restart_keeps_the_runs(tmp_path: pathlib.Path) -> None:
    data_dir = tmp_path / "cluster"
    proc, info = await _up(data_dir)
    try:
        names = [c["name"] for c in info["components"]]
        assert names == ["etcd", "nats", "coordinator", "host-1", "host-2", "gateway"]
        assert [c["host_id"] for c in info["components"] if c["name"].startswith("host-")] == ["host-1", "host-2"]
        # Every baton component inherits the caller's BATON_* environment.
        for c in info["components"][2:]:
            environ = pathlib.Path(f"/proc/{c['pid']}/environ").read_bytes().split(b"\0")
            assert b"BATON_DETACHED_RUN_TTL=1234" in environ, c["name"]
        url = info["url"]
        with httpx.Client(trust_env=False, timeout=30) as http:
            page = http.get(f"{url}/")
            assert page.status_code == 200 and "text/html" in page.headers["content-type"]
            # A run through the page's API: POST /api/chat streams the log until it closes.
            body = {"threadId": "cli-thread", "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                    "agent": {"kind": "replay", "journal": JOURNAL, "speed": 100}}
            resp = http.post(f"{url}/api/chat", json=body, headers={"X-Run-Id": "cli-run"})
            assert resp.status_code == 200, resp.text
            chunks = [c for _, c in _sse_chunks(resp.text)]
            types = [c["type"] for c in chunks]
            assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
            assert types[1] == "CUSTOM" and chunks[1]["name"] == "run.accepted"
            assert any(c.get("delta") for c in chunks if c["type"] == "TEXT_MESSAGE_CONTENT")
            rec = http.get(f"{url}/api/runs/cli-run").json()
            assert rec["status"] == "completed" and rec["threadId"] == "cli-thread"
            transcript = http.get(f"{url}/api/threads/cli-thread/messages").json()["messages"]
            assert transcript[0]["content"] == "hi" and transcript[-1]["role"] == "assistant"

        # A slow run, left by its reader, cancelled from the CLI.
        with httpx.Client(trust_env=False, timeout=30) as http:
            slow = {"threadId": "cli-cancel-thread", "messages": [{"id": "u2", "role": "user", "content": "long"}],
                    "agent": {"kind": "replay", "journal": "claude-stream-json/partial-messages-parallel-bash-denied.jsonl",
                              "speed": 0.05}}
            with http.stream("POST", f"{url}/api/chat", json=slow, headers={"X-Run-Id": "cli-cancel"}) as resp:
                assert resp.status_code == 200
                next(resp.iter_lines())
        cancelled = run_cli("cancel", "cli-cancel", "--data-dir", str(data_dir))
        assert cancelled.returncode == 0, cancelled.stderr
        final = json.loads(cancelled.stdout)
        assert final["status"] == "aborted" and final["runId"] == "cli-cancel"
        assert final["confirmation"]["sandboxDestroyed"] is True

        reaped = run_cli("reap", "--data-dir", str(data_dir))
        assert reaped.returncode == 0, reaped.stderr
        assert "outcome" in reaped.stdout

        runs = run_cli("runs", "--thread", "cli-thread", "--data-dir", str(data_dir), "--json")
        assert runs.returncode == 0, runs.stderr
        (listed,) = [json.loads(line) for line in runs.stdout.splitlines()]
        # The HTTP API's words (GET /api/runs/{runId}), times in ISO 8601.
        assert listed["runId"] == "cli-run" and listed["status"] == "completed" and listed["agent"] == "replay"
        assert listed["startedAt"].endswith("+00:00") and listed["takeover"] is None
        table = run_cli("runs", "--thread", "cli-thread", "--data-dir", str(data_dir), COLUMNS="80")
        assert table.returncode == 0, table.stderr
        # Piped (80 columns: rich's width without a terminal): one line per run, every
        # column whole.
        (row,) = [line for line in table.stdout.splitlines() if "cli-run" in line]
        assert ["cli-run", "cli-thread", "completed", "replay"] == row.replace("│", " ").split()[:4], row
        assert len(row) > 80 and table.stdout.rstrip().endswith("1 run(s)")

        tail = run_cli("tail", "cli-run", "--data-dir", str(data_dir), "--json")
        assert tail.returncode == 0, tail.stderr
        assert [json.loads(line)["chunk"] for line in tail.stdout.splitlines()] == chunks
        plain = run_cli("tail", "cli-run", "--data-dir", str(data_dir))
        assert plain.returncode == 0, plain.stderr
        # One line per chunk, its log offset first, no markup tags printed as text.
        assert len(plain.stdout.splitlines()) == len(chunks)
        assert "[dim]" not in plain.stdout and plain.stdout.split()[0].isdigit()

        down = run_cli("down", "--data-dir", str(data_dir))
        assert down.returncode == 0, down.stderr
        assert proc.wait(30) == 0
        _assert_nothing_left(data_dir, info)
        # Nothing runs there now: a command says so instead of only "connection refused" at
        # the default address.
        gone = run_cli("runs", "--data-dir", str(data_dir), BATON_COORDINATOR=f"127.0.0.1:{free_port()}")
        assert gone.returncode == 1
        assert f"no cluster running in {data_dir}" in " ".join(gone.stderr.split())
        printed = (tmp_path / "baton-up.out").read_text()
        assert f"ready: open {url}" in printed
        assert f"gRPC API (baton.v1.Runs): 127.0.0.1:{info['ports']['gateway-grpc']}" in printed
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)

    # Same data directory: the run, its log and its transcript are still there.
    proc, info2 = await _up(data_dir)
    try:
        with httpx.Client(trust_env=False, timeout=30) as http:
            rec = http.get(f"{info2['url']}/api/runs/cli-run").json()
            assert rec["status"] == "completed"
            again = _sse_chunks(http.get(f"{info2['url']}/api/chat", params={"runId": "cli-run", "offset": "-1"}).text)
            assert [c for _, c in again] == chunks
            assert http.get(f"{info2['url']}/api/threads/cli-thread/messages").json()["messages"] == transcript
        # Ctrl-C stops it as cleanly as `baton down`.
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        _assert_nothing_left(data_dir, info2)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.servers
def test_up_refuses_a_busy_port_and_starts_nothing(tmp_path: pathlib.Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        out = run_cli("up", "--port", str(port), "--data-dir", str(tmp_path / "c"), timeout=60)
    assert out.returncode == 1
    assert f"port {port} is in use" in out.stderr
    assert processes_mentioning(str(tmp_path / "c")) == []
