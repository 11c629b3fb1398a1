"""Workspaces end to end: ``POST /api/chat`` (and gRPC ``StartRun``) with a ``workspace``,
through a real sandbox host subprocess building it with real git, to the agent's working
directory (a stand-in ``claude`` that reports what it sees) or a ``RUN_ERROR`` naming the
step. A credential is a name in the request; its token reaches git only, and appears in no
record, journal, error, ``.git/config`` or host log."""
from __future__ import annotations

import json
import os
import pathlib
import sys
import uuid
from typing import Any, AsyncIterator, Iterator

import grpc
import httpx
import pytest

from baton import errors as e
from baton.log import LogConfig
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.sandbox.gitrepos import GitHttpServer, Repo, git_http_server, make_repo

pytestmark = pytest.mark.timeout(120)

TOKEN = "ghp-SECRET-token-0123456789"
# A stand-in for the Claude Code CLI: one assistant message reporting its working directory,
# the files there, its HOME and whether the git credential reached it, as stream-json.
FAKE_CLAUDE = """#!{python}
import json, os, sys
sys.stdin.readline()  # the prompt: one stream-json user line (stdin stays open after it)
seen = {{"cwd": os.getcwd(), "files": sorted(os.listdir(".")), "home": os.environ.get("HOME"),
        "token": any("SECRET" in v for v in os.environ.values())}}
text = json.dumps(seen, sort_keys=True)
for line in (
    {{"type": "system", "subtype": "init", "session_id": "s1", "model": "m", "tools": [], "cwd": os.getcwd()}},
    {{"type": "assistant", "session_id": "s1", "parent_tool_use_id": None,
      "message": {{"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                  "content": [{{"type": "text", "text": text}}], "stop_reason": None,
                  "usage": {{"input_tokens": 1, "output_tokens": 1}}}}}},
    {{"type": "result", "subtype": "success", "is_error": False, "result": text, "session_id": "s1",
      "num_turns": 1, "duration_ms": 1, "total_cost_usd": 0.0, "usage": {{"input_tokens": 1, "output_tokens": 1}}}},
):
    print(json.dumps(line), flush=True)
"""


class Env:
    """What the module's host was started with."""

    def __init__(self, tmp: pathlib.Path, repo: Repo, big: Repo, server: GitHttpServer, allowed: pathlib.Path,
                 host: Any) -> None:
        self.tmp, self.repo, self.big, self.server, self.allowed, self.host = tmp, repo, big, server, allowed, host


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, Repo, Repo, GitHttpServer]]:
    root = tmp_path_factory.mktemp("ws")
    allowed = root / "allowed"
    allowed.mkdir()
    repo = make_repo(allowed)
    big = make_repo(allowed, "big.git")
    with git_http_server(allowed, "ci-bot", TOKEN) as server:
        yield root, repo, big, server


@pytest.fixture(scope="module")
async def env(repos: tuple[pathlib.Path, Repo, Repo, GitHttpServer], coordinator: Any, nats: Any,
              log_cfg: LogConfig, replay_dir: pathlib.Path) -> AsyncIterator[Env]:
    from baton_tools.testing.cluster import start_host

    root, repo, big, server = repos
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text(FAKE_CLAUDE.format(python=sys.executable))
    (bin_dir / "claude").chmod(0o755)
    # A big blob only the size limit cares about (random: git cannot compress it away).
    work = root / "big-work"
    from tests.sandbox.gitrepos import git
    git("clone", "-q", str(big.bare), str(work))
    (work / "blob.bin").write_bytes(uuid.uuid4().bytes * 20000)
    git("add", "blob.bin", cwd=work)
    git("commit", "-qm", "big", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    creds = root / "creds.json"
    creds.write_text(json.dumps({"": {"ci": {"username": "ci-bot", "token": TOKEN, "url": server.url("")},
                                      "wrong": {"username": "ci-bot", "token": "bad-SECRET-token-xyz",
                                                "url": server.url("")}}}))
    # start_host takes BATON_* settings; the rest of a host's environment is this process's.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        mp.setenv("ANTHROPIC_API_KEY", "test-key")
        h = await start_host(coordinator.address, nats.url, log_dir=root / "logs",
                             **host_settings(log_cfg, replay_dir, root),
                             BATON_WORKSPACE_DIRS=str(root / "allowed"), BATON_GIT_CREDENTIALS_FILE=str(creds),
                             BATON_WORKSPACE_MAX_BYTES="200000")
    try:
        yield Env(root, repo, big, server, root / "allowed", h)
    finally:
        await h.stop()


@pytest.fixture
async def gw(env: Env, make_gateway: Any) -> Gateway:
    return await make_gateway(keepalive=0.5, workspace_dirs=(str(env.allowed.resolve()),),
                              grpc_listen="127.0.0.1:0")


async def _chat(http: httpx.AsyncClient, gw: Gateway, workspace: Any, *, thread: str | None = None,
                run_id: str | None = None) -> tuple[str, Any]:
    run_id = run_id or unique("run-")
    body = {"threadId": thread or unique("thr-"), "messages": [{"id": "u1", "role": "user", "content": "look"}],
            "agent": {"kind": "claude-code"}}
    if workspace is not None:
        body["workspace"] = workspace
    got = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run_id}", json=body)
    if got.status != 200:  # say why (a refusal reads as JSON)
        got.events.append((None, (await http.post(f"{gw.url}/api/chat?runId={unique('run-')}", json=body)).json()))
    return run_id, got


def _seen(got: Any) -> dict[str, Any]:
    assert got.status == 200 and got.ended, got.events
    text = "".join(c.get("delta", "") for _, c in got.events if c["type"] == "TEXT_MESSAGE_CONTENT")
    assert got.events[-1][1]["type"] == "RUN_FINISHED", got.events[-1]
    return dict(json.loads(text))


def _run_error(got: Any) -> str:
    assert got.status == 200 and got.ended
    last = got.events[-1][1]
    assert last["type"] == "RUN_ERROR", last
    assert last["code"] == "sandbox_build_failed"
    return str(last["message"])


async def test_a_git_workspace_at_a_ref_is_the_agents_working_directory(env: Env, gw: Gateway,
                                                                        http: httpx.AsyncClient, cc: Any) -> None:
    thread = unique("thr-")
    run_id, got = await _chat(http, gw, {"git": str(env.repo.bare), "ref": "feature",
                                         "setup": ["touch SETUP_RAN"]}, thread=thread)
    seen = _seen(got)
    assert seen["files"] == [".git", "FEATURE", "README.md", "SETUP_RAN", "src"]
    assert seen["cwd"].endswith("/work") and seen["home"].endswith("/home")
    assert pathlib.Path(seen["cwd"]).parent == pathlib.Path(seen["home"]).parent  # the thread's directory
    record = (await cc.get_run(run_id)).record
    assert json.loads(record.workspace_json) == {"git": str(env.repo.bare.resolve()), "ref": "feature",
                                                 "setup": ["touch SETUP_RAN"]}

    # The thread's next turn (which names no workspace: the thread keeps its first) works in
    # the same directory, as the first one left it.
    _, again = await _chat(http, gw, None, thread=thread)
    assert _seen(again)["cwd"] == seen["cwd"]
    assert _seen(again)["files"] == [".git", "FEATURE", "README.md", "SETUP_RAN", "src"]


async def test_a_credential_is_used_and_never_shown(env: Env, gw: Gateway, http: httpx.AsyncClient,
                                                    cc: Any) -> None:
    run_id, got = await _chat(http, gw, {"git": env.server.url(), "ref": "main", "credential": "ci"})
    seen = _seen(got)
    assert "src" in seen["files"] and seen["token"] is False  # the agent never gets it
    assert any(a.startswith("Basic ") for a in env.server.authorizations)
    record = (await cc.get_run(run_id)).record
    assert json.loads(record.workspace_json)["credential"] == "ci"
    assert TOKEN not in str(record)
    config = (pathlib.Path(seen["cwd"]) / ".git" / "config").read_text()
    assert TOKEN not in config and "Basic" not in config

    # A credential the server refuses: the run fails naming the clone, and shows no token.
    _, failed = await _chat(http, gw, {"git": env.server.url(), "credential": "wrong"})
    message = _run_error(failed)
    assert "sandbox build failed at workspace: git clone exit 128" in message
    assert "bad-SECRET" not in message and TOKEN not in message

    for path in [*(env.tmp / "journals").rglob("*"), *(env.tmp / "logs").rglob("*")]:
        if path.is_file():
            text = path.read_bytes()
            assert TOKEN.encode() not in text and b"bad-SECRET" not in text, path


@pytest.mark.parametrize("workspace, words", [
    ({"git": "REPO", "ref": "no-such-ref"}, "sandbox build failed at workspace: unknown ref 'no-such-ref'"),
    ({"git": "http://127.0.0.1:9/gone.git"}, "sandbox build failed at workspace: git clone exit 128"),
    ({"git": "BIG"}, "sandbox build failed at workspace: over the size limit"),
    ({"git": "REPO", "setup": ["true", "echo nope >&2; exit 1"]}, "sandbox build failed at setup[1]: exit 1: nope"),
])
async def test_a_workspace_that_cannot_be_built_ends_the_run_naming_the_step(
        env: Env, gw: Gateway, http: httpx.AsyncClient, cc: Any, workspace: dict[str, Any], words: str) -> None:
    ws = {k: (str(env.repo.bare) if v == "REPO" else str(env.big.bare) if v == "BIG" else v)
          for k, v in workspace.items()}
    run_id, got = await _chat(http, gw, ws)
    assert _run_error(got).startswith(words)

    async def recorded() -> bool:  # the final status lands right after the log's close
        record = (await cc.get_run(run_id)).record
        assert record.error.code == "sandbox_build_failed" and record.error.message.startswith(words), record
        return True
    await assert_eventually(recorded, timeout=10)


@pytest.mark.parametrize("workspace, field", [
    ({"git": "https://example.com/r.git", "credential": "nobody"}, "workspace.credential"),
    ({"dir": "/etc"}, "workspace.dir"),
    ({"git": "https://example.com/r.git", "token": "x"}, "workspace.token"),
])
async def test_refused_before_anything_is_created(env: Env, gw: Gateway, http: httpx.AsyncClient, cc: Any,
                                                  workspace: dict[str, Any], field: str) -> None:
    run_id = unique("run-")
    body = {"threadId": unique("thr-"), "messages": [{"id": "u1", "role": "user", "content": "x"}],
            "agent": {"kind": "claude-code"}, "workspace": workspace}
    resp = await http.post(f"{gw.url}/api/chat?runId={run_id}", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["reason"] == "INVALID_ARGUMENT" and resp.json()["field"] == field
    with pytest.raises(e.UnknownRun):
        await cc.get_run(run_id)


async def test_a_dir_inside_the_allow_list_is_copied(env: Env, gw: Gateway, http: httpx.AsyncClient) -> None:
    src = env.allowed / "project"
    (src / "pkg").mkdir(parents=True, exist_ok=True)
    (src / "pkg" / "mod.py").write_text("x = 1\n")
    _, got = await _chat(http, gw, {"dir": str(src), "setup": ["test -f pkg/mod.py"]})
    assert _seen(got)["files"] == ["pkg"]


async def test_grpc_start_run_takes_the_workspace_message(env: Env, gw: Gateway, cc: Any) -> None:
    run_id = unique("run-")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}",
                                         options=[("grpc.enable_http_proxy", 0)]) as ch:
        stub = pbg.RunsStub(ch)
        req = pb.RunStartRequest(run_id=run_id, thread_id=unique("thr-"),
                                 messages_json=json.dumps([{"id": "u1", "role": "user", "content": "x"}]),
                                 workspace=pb.Workspace(git=str(env.repo.bare), ref="v1"))
        req.agent.kind = "claude-code"
        texts = []
        async for ev in stub.StartRun(req, timeout=60):
            for c in ev.chunks:
                chunk = json.loads(c.json)
                if chunk["type"] == "TEXT_MESSAGE_CONTENT":
                    texts.append(chunk["delta"])
        assert json.loads("".join(texts))["files"] == [".git", "README.md"]

        bad = pb.RunStartRequest(run_id=unique("run-"), thread_id=unique("thr-"), messages_json="[]",
                                 workspace=pb.Workspace(dir="/etc"))
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            async for _ in stub.StartRun(bad, timeout=30):
                pass
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "workspace.dir" in (refused.value.details() or "")
