"""Bad input on a coding session: each a clear error, and the thread as it was (docs/design.md §4.3).

A thread whose first turn built a git workspace and wrote a file is sent each bad input a
client can send: a workspace that cannot be built (an unknown ref, a clone that fails, a
tree over ``BATON_WORKSPACE_MAX_BYTES``), an unknown credential, a path outside the
allow-list. A thread keeps the workspace of its first run (later turns restore its
snapshot, they never build), so on the thread these are refused before the run exists: a
400 naming the field, no run record. On a fresh thread a build failure is a ``RUN_ERROR``
naming the step. Either way the thread's next normal turn still sees turn 1's file and the
agent's session (``recall``), and its saved transcript still starts with the earlier
messages. (A resume the agent refuses: tests/gateway/test_sessions.py.)
"""
from __future__ import annotations

import json
import pathlib
import uuid
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from baton.log import LogConfig
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, host_settings
from tests.sandbox.gitrepos import Repo, git, make_repo
from tests.sessions_support import Cluster, history, refused_turn, terminal, texts, turn

pytestmark = pytest.mark.timeout(180)

LIMIT = 200_000  # bytes: the small repository's tree and the agent's session fit, BIG does not


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, Repo, Repo]]:
    root = tmp_path_factory.mktemp("sesserr")
    allowed = root / "allowed"
    allowed.mkdir()
    repo, big = make_repo(allowed), make_repo(allowed, "big.git")
    work = root / "big-work"
    git("clone", "-q", str(big.bare), str(work))
    (work / "blob.bin").write_bytes(uuid.uuid4().bytes * (LIMIT // 16 + 1000))  # random: git cannot shrink it
    git("add", "blob.bin", cwd=work)
    git("commit", "-qm", "big", cwd=work)
    git("push", "-q", "origin", "main", cwd=work)
    yield root, repo, big


@pytest.fixture(scope="module")
async def cluster(repos: tuple[pathlib.Path, Repo, Repo], coordinator: Any, nats: Any, log_cfg: LogConfig,
                  replay_dir: pathlib.Path) -> AsyncIterator[Cluster]:
    root, repo, _ = repos
    creds = root / "creds.json"
    creds.write_text(json.dumps({"": {"ci": {"username": "ci-bot", "token": "tok-SECRET-1", "url": "https://git.example.com/"}}}))
    settings = {**host_settings(log_cfg, replay_dir, root), "BATON_WORKSPACE_DIRS": str(root / "allowed"),
                "BATON_WORKSPACE_OBJECTS": unique("ws-objects"), "BATON_WORKSPACE_HEADS": unique("ws-heads"),
                "BATON_WORKSPACE_MAX_BYTES": str(LIMIT), "BATON_GIT_CREDENTIALS_FILE": str(creds)}
    c = Cluster(root, repo, root / "allowed", coordinator, nats, settings)
    await c.add_host()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
def big(repos: tuple[pathlib.Path, Repo, Repo]) -> Repo:
    return repos[2]


@pytest.fixture
async def gw(cluster: Cluster, make_gateway: Any) -> Gateway:
    return await make_gateway(keepalive=0.5, workspace_dirs=(str(cluster.allowed.resolve()),))


class Thread:
    """A thread whose turn 1 built the module's repository and wrote ``kept.txt``."""

    def __init__(self, thread_id: str, workspace: dict[str, Any], messages: list[dict[str, Any]]) -> None:
        self.id, self.workspace, self.messages = thread_id, workspace, messages


@pytest.fixture
async def thread(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> Thread:
    thread_id = unique("thr-")
    ws = {"git": f"file://{cluster.repo.bare}", "ref": "main"}
    _, c1 = await turn(http, gw, thread_id, "claude-code", "write kept.txt turn one", ws)
    assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)
    return Thread(thread_id, ws, await history(http, gw, thread_id))


async def assert_intact(http: httpx.AsyncClient, gw: Gateway, thread: Thread) -> None:
    """The thread's next normal turn sees turn 1's file and session; its transcript kept."""
    assert await history(http, gw, thread.id) == thread.messages  # the refusal added nothing
    _, chunks = await turn(http, gw, thread.id, "claude-code", "recall\nrun cat kept.txt")
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    seen = texts(chunks)
    assert "turn one" in seen and "1. write kept.txt turn one" in seen, seen
    after = await history(http, gw, thread.id)
    assert after[:len(thread.messages)] == thread.messages and len(after) > len(thread.messages)


async def assert_refused(http: httpx.AsyncClient, gw: Gateway, thread: str, workspace: dict[str, Any],
                         field: str, words: str) -> None:
    """A 400 naming ``field`` and saying ``words``, and no run record."""
    run_id, resp = await refused_turn(http, gw, thread, "claude-code", "recall", workspace)
    assert resp.status_code == 400, resp.text
    body = resp.json()
    assert body["reason"] == "INVALID_ARGUMENT" and body["field"] == field, body
    assert words in body["error"], body
    assert (await http.get(f"{gw.url}/api/runs/{run_id}")).status_code == 404


def build(case: str, cluster: Cluster, big: Repo) -> tuple[dict[str, Any], str]:
    """The workspace of a build-failure case and the start of its ``RUN_ERROR`` message."""
    repo = f"file://{cluster.repo.bare}"
    return {
        "unknown-ref": ({"git": repo, "ref": "no-such-ref"},
                        "sandbox build failed at workspace: unknown ref 'no-such-ref'"),
        "failing-clone": ({"git": "http://127.0.0.1:9/nope.git"}, "sandbox build failed at workspace: git clone exit"),
        "over-the-limit": ({"git": f"file://{big.bare}"}, "sandbox build failed at workspace: over the size limit"),
    }[case]


@pytest.mark.parametrize("case", ["unknown-ref", "failing-clone", "over-the-limit"])
async def test_a_workspace_that_cannot_be_built(case: str, cluster: Cluster, big: Repo, thread: Thread,
                                                gw: Gateway, http: httpx.AsyncClient) -> None:
    workspace, words = build(case, cluster, big)

    # A fresh thread: the run exists and ends with a RUN_ERROR naming the build's step.
    fresh = unique("thr-")
    run_id, chunks = await turn(http, gw, fresh, "claude-code", "write never.txt x", workspace)
    end = terminal(chunks)
    assert end["type"] == "RUN_ERROR" and end["code"] == "sandbox_build_failed", end
    assert end["message"].startswith(words), end

    async def recorded() -> bool:
        view = (await http.get(f"{gw.url}/api/runs/{run_id}")).json()
        return bool(view["status"] == "failed" and view["error"]["message"].startswith(words))
    await assert_eventually(recorded, timeout=10)
    # Nothing of the failed build is kept: the fresh thread's next turn builds a good workspace.
    _, again = await turn(http, gw, fresh, "claude-code", "recall\nrun cat README.md", thread.workspace)
    assert terminal(again)["type"] == "RUN_FINISHED" and "hello" in texts(again)

    # The thread with a workspace: the same bad workspace is refused before the run exists
    # (the thread keeps its first run's workspace), and the thread is as it was.
    await assert_refused(http, gw, thread.id, workspace, "workspace", "keeps the workspace of its first run")
    await assert_intact(http, gw, thread)


async def test_an_unknown_credential(cluster: Cluster, thread: Thread, gw: Gateway, http: httpx.AsyncClient) -> None:
    # (A credential goes with an http(s) URL; the thread's own is a file:// one.)
    for target in (unique("thr-"), thread.id):
        await assert_refused(http, gw, target, {"git": "https://git.example.com/r.git", "credential": "nobody"},
                             "workspace.credential", "no git credential 'nobody' is configured")
    await assert_intact(http, gw, thread)


async def test_a_path_outside_the_allow_list(cluster: Cluster, thread: Thread, gw: Gateway, make_gateway: Any,
                                             http: httpx.AsyncClient) -> None:
    outside = cluster.tmp / "outside"
    outside.mkdir(exist_ok=True)
    (outside / "x.txt").write_text("x\n")
    # The gateway refuses; so does the host behind a gateway whose allow-list is wider
    # (the host checks again before the record exists: docs/design.md §5.1).
    lax = await make_gateway(keepalive=0.5, workspace_dirs=(str(cluster.tmp.resolve()),))
    words = "is not inside the allowed workspace directories (BATON_WORKSPACE_DIRS)"
    for target in (unique("thr-"), thread.id):
        await assert_refused(http, gw, target, {"dir": "/etc"}, "workspace.dir", words)
        await assert_refused(http, gw, target, {"dir": str(cluster.allowed / ".." / "outside")}, "workspace.dir", words)
        await assert_refused(http, lax, target, {"dir": str(outside)}, "workspace.dir", words)
    await assert_intact(http, gw, thread)


async def test_a_turn_that_outgrows_the_limit_is_named_by_the_next_turn(
        cluster: Cluster, thread: Thread, gw: Gateway, http: httpx.AsyncClient) -> None:
    """A turn's tree over the limit cannot be snapshotted, and its RUN_FINISHED is already in
    its log: the thread's next run starts from the turn before it and says so in its
    ``run.accepted`` (``previousTurnLost``), never silently."""
    grow, chunks = await turn(http, gw, thread.id, "claude-code",
                              f"run head -c {LIMIT + 50_000} /dev/urandom > huge.bin\nwrite note.txt grown")
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)

    _, after = await turn(http, gw, thread.id, "claude-code", "recall\nrun ls")
    accepted = next(c for c in after if c.get("name") == "run.accepted")
    lost = accepted["value"]["previousTurnLost"]
    assert lost["runId"] == grow and f"more than {LIMIT} bytes" in lost["reason"], lost
    seen = texts(after)
    assert "kept.txt" in seen and "huge.bin" not in seen and "note.txt" not in seen
    # The session is turn 1's: the lost turn's prompt is not in what the agent remembers.
    assert "write kept.txt" in seen and "huge.bin" not in seen.split("run ls")[0]
    # Once a turn is saved again, the notice is gone.
    _, again = await turn(http, gw, thread.id, "claude-code", "run ls")
    assert "previousTurnLost" not in next(c for c in again if c.get("name") == "run.accepted")["value"]
