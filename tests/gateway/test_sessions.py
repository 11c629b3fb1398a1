"""Coding sessions end to end: a thread is one workspace and one agent session across its
turns and hosts (docs/design.md §4.3).

Real hosts (subprocesses) run the real ``claude-code`` and ``codex`` launch code against the
stand-in CLIs (``baton_tools/standins``: no model is reachable here), which keep their
session stores where the real CLIs do and refuse an unknown ``--resume`` as they do. Turn 2
runs after the host that drove turn 1 was SIGKILLed; turn 3 after that host's sandbox
directory is gone too, so its workspace and the agent's session come back from the
snapshot in JetStream's Object Store. What is checked is what a user would check: the files
the agent sees (its ``run cat`` output), the prompts it remembers (``recall``), the saved
transcript.
"""
from __future__ import annotations

import pathlib
import shutil
from typing import Any, AsyncIterator, Iterator

import httpx
import pytest

from baton.ids import file_stem
from baton.log import LogConfig
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.sandbox.gitrepos import Repo, make_repo
from tests.sessions_support import Cluster, chat_body, driver_of, history, terminal, texts, turn

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, Repo]]:
    root = tmp_path_factory.mktemp("sessions")
    allowed = root / "allowed"
    allowed.mkdir()
    yield root, make_repo(allowed)


@pytest.fixture(scope="module")
async def cluster(repo_dir: tuple[pathlib.Path, Repo], coordinator: Any, nats: Any, log_cfg: LogConfig,
                  replay_dir: pathlib.Path) -> AsyncIterator[Cluster]:
    root, repo = repo_dir
    settings = {**host_settings(log_cfg, replay_dir, root), "BATON_WORKSPACE_DIRS": str(root / "allowed"),
                "BATON_WORKSPACE_OBJECTS": unique("ws-objects"), "BATON_WORKSPACE_HEADS": unique("ws-heads")}
    c = Cluster(root, repo, root / "allowed", coordinator, nats, settings)
    await c.add_host()
    await c.add_host()
    try:
        yield c
    finally:
        await c.stop()


@pytest.fixture
async def gw(cluster: Cluster, make_gateway: Any) -> Gateway:
    from baton.workspaces import WorkspaceConfig

    ws_cfg = WorkspaceConfig.from_env({k: v for k, v in cluster.settings.items() if k.startswith("BATON_WORKSPACE_")})
    return await make_gateway(keepalive=0.5, workspace_dirs=(str(cluster.allowed.resolve()),), workspace_config=ws_cfg)


@pytest.mark.parametrize("kind", ["claude-code", "codex"])
async def test_three_turns_across_hosts_and_a_lost_sandbox_directory(
        kind: str, cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread = unique(f"{kind}-thr-")
    ws = {"git": f"file://{cluster.repo.bare}", "ref": "main"}

    run1, c1 = await turn(http, gw, thread, kind, "write notes.txt turn one\nrun cat README.md", ws)
    assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)
    assert "hello" in texts(c1)  # the repository's README, cloned at main

    # The host that drove turn 1 dies; a fresh host takes its place.
    await cluster.kill(await driver_of(http, gw, run1))
    await cluster.add_host()

    run2, c2 = await turn(http, gw, thread, kind, "recall\nrun cat notes.txt\nappend notes.txt turn two")
    assert terminal(c2)["type"] == "RUN_FINISHED", terminal(c2)
    seen2 = texts(c2)
    assert "turn one" in seen2  # turn 1's file
    assert "write notes.txt turn one" in seen2  # turn 1's prompt, remembered: the session resumed

    # Every host's sandbox directory goes (thread directories included): turn 3 starts from
    # the snapshot alone, on whichever host it lands.
    await cluster.kill(await driver_of(http, gw, run2))
    shutil.rmtree(cluster.tmp / "sandboxes", ignore_errors=True)
    await cluster.add_host()

    run3, c3 = await turn(http, gw, thread, kind, "recall\nrun cat notes.txt src/app.py")
    assert terminal(c3)["type"] == "RUN_FINISHED", terminal(c3)
    seen3 = texts(c3)
    assert "turn one" in seen3 and "turn two" in seen3 and "print('app')" in seen3
    assert "write notes.txt turn one" in seen3 and "append notes.txt turn two" in seen3

    msgs = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert len(users) == 3 and users[0].startswith("write notes.txt")


async def test_a_refused_resume_fails_clearly_and_keeps_the_thread(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread = unique("refuse-thr-")
    ws = {"git": f"file://{cluster.repo.bare}"}
    run1, c1 = await turn(http, gw, thread, "claude-code", "write kept.txt still here", ws)
    assert terminal(c1)["type"] == "RUN_FINISHED"
    before = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]

    # The agent's session store loses the session (in the warm thread directory on this
    # machine, which the next turn uses as it is): the agent refuses the resume, and says so.
    sessions = list((cluster.tmp / "sandboxes" / "threads" / file_stem(thread)).glob("home/.claude/projects/*/*.jsonl"))
    assert sessions
    for path in sessions:
        path.unlink()
    run2, c2 = await turn(http, gw, thread, "claude-code", "recall")
    end = terminal(c2)
    assert end["type"] == "RUN_ERROR"
    assert "No conversation found with session ID" in end["message"]
    assert "recall" not in texts(c2)  # never a silent fresh session

    # The thread's earlier workspace and transcript are intact: the next turn, restored from
    # the snapshot (the refused turn left the warm directory unmarked), has both.
    run3, c3 = await turn(http, gw, thread, "claude-code", "recall\nrun cat kept.txt")
    assert terminal(c3)["type"] == "RUN_FINISHED", terminal(c3)
    assert "still here" in texts(c3) and "write kept.txt still here" in texts(c3)
    after = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    assert after[:len(before)] == before



async def test_a_turn_taken_over_mid_run_still_ends_with_its_workspace_snapshotted(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread = unique("takeover-thr-")
    run1, c1 = await turn(http, gw, thread, "claude-code", "write a.txt one", {"git": f"file://{cluster.repo.bare}"})
    assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)

    # Turn 2 sleeps before its write; its client reads the start, then leaves (detached).
    run2 = unique("run-")
    body = chat_body(thread, "claude-code", "sleep 4\nwrite b.txt two", await history(http, gw, thread))
    first = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run2}", json=body, stop_after=2)
    assert first.status == 200 and len(first.events) == 2
    # Its driving host dies mid-run (the agent lives on, detached); another host is alive
    # (and one more starts), so the coordinator's failover hands the run to a live host.
    victim = await driver_of(http, gw, run2)
    await cluster.kill(victim)
    await cluster.add_host()

    got = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": run2, "offset": "-1"})
    assert got.status == 200 and got.ended
    offsets = [o for o, _ in got.events]
    assert len(set(offsets)) == len(offsets)  # exactly once
    assert got.events[:2] == first.events
    chunks = [c for _, c in got.events]
    assert [c["type"] for c in chunks].count("RUN_STARTED") == 1
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    assert chunks[-1]["type"] == "RUN_FINISHED"

    async def completed_elsewhere() -> bool:
        view = (await http.get(f"{gw.url}/api/runs/{run2}")).json()
        return bool(view["status"] == "completed" and view["driverHost"] != victim and view["epoch"] == 2)
    await assert_eventually(completed_elsewhere, timeout=20)

    # Turn 3 has no warm directory anywhere: it starts from the snapshot alone, which must be
    # the one the successor took at turn 2's end.
    shutil.rmtree(cluster.tmp / "sandboxes", ignore_errors=True)
    run3, c3 = await turn(http, gw, thread, "claude-code", "recall\nrun cat a.txt b.txt")
    assert terminal(c3)["type"] == "RUN_FINISHED", terminal(c3)
    seen = texts(c3)
    assert "one\ntwo" in seen, seen
    assert "write a.txt one" in seen and "sleep 4" in seen  # the session, both prompts remembered


async def test_a_turn_whose_sandbox_is_lost_mid_run_fails_and_the_next_starts_from_the_last_snapshot(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient, cc: Any) -> None:
    import json as _json
    import os
    import signal

    thread = unique("lost-thr-")
    _, c1 = await turn(http, gw, thread, "claude-code", "write a.txt one", {"git": f"file://{cluster.repo.bare}"})
    assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)

    # Turn 2's sandbox is lost mid-run: its agent's process group killed, its directory gone.
    run2 = unique("run-")
    body = chat_body(thread, "claude-code", "write b.txt two\nsleep 30", await history(http, gw, thread))
    first = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run2}", json=body, stop_after=3)
    assert first.status == 200
    async def launched() -> bool:
        inst = await cc.get_sandbox(run2)
        return bool(_json.loads(inst.handle_json)["data"].get("pgid"))
    await assert_eventually(launched, timeout=20)
    handle = _json.loads((await cc.get_sandbox(run2)).handle_json)
    # Frozen first, so nothing of the agent writes while its disk goes; then killed.
    pgid = int(handle["data"]["pgid"])
    os.killpg(pgid, signal.SIGSTOP)
    shutil.rmtree(pathlib.Path(handle["workdir"]).parent, ignore_errors=True)
    os.killpg(pgid, signal.SIGKILL)

    got = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": run2, "offset": "-1"})
    assert got.ended and terminal([c for _, c in got.events])["type"] == "RUN_ERROR"  # it fails, clearly

    # The next turn starts from turn 1's snapshot, and says turn 2 could not be kept.
    _, c3 = await turn(http, gw, thread, "claude-code", "recall\nrun ls")
    assert terminal(c3)["type"] == "RUN_FINISHED", terminal(c3)
    seen = texts(c3)
    assert "a.txt" in seen and "b.txt" not in seen.split("run ls")[-1], seen
    accepted = next(c for c in c3 if c.get("name") == "run.accepted")["value"]
    assert accepted["previousTurnLost"]["runId"] == run2, accepted


async def test_a_fork_continues_independently_of_its_source(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    for kind in ("claude-code", "codex"):
        src = unique(f"src-{kind}-")
        ws = {"git": f"file://{cluster.repo.bare}"}
        run1, c1 = await turn(http, gw, src, kind, "write story.txt once upon a time", ws)
        assert terminal(c1)["type"] == "RUN_FINISHED", terminal(c1)
        run2, c2 = await turn(http, gw, src, kind, "append story.txt the end")
        assert terminal(c2)["type"] == "RUN_FINISHED", terminal(c2)
        source_msgs = (await http.get(f"{gw.url}/api/threads/{src}/messages")).json()["messages"]

        # Fork at run 1: the fork's workspace and agent session are run 1's, its transcript
        # the source's up to run 1.
        fork = unique(f"fork-{kind}-")
        resp = await http.post(f"{gw.url}/api/threads/{src}/fork", json={"runId": run1, "newThreadId": fork})
        assert resp.status_code == 201, resp.text
        assert resp.json()["forkedFrom"] == {"threadId": src, "runId": run1}
        forked_msgs = (await http.get(f"{gw.url}/api/threads/{fork}/messages")).json()["messages"]
        assert forked_msgs == source_msgs[:resp.json()["messages"]] and len(forked_msgs) < len(source_msgs)
        assert [m["role"] for m in forked_msgs] [0] == "user"

        _, f1 = await turn(http, gw, fork, kind, "recall\nrun cat story.txt\nappend story.txt a twist")
        assert terminal(f1)["type"] == "RUN_FINISHED", terminal(f1)
        seen = texts(f1)
        assert "once upon a time" in seen and "the end" not in seen.split("Previous prompts")[0].split("recall")[-1]
        assert "write story.txt once upon a time" in seen  # the source's session, up to run 1
        assert "append story.txt the end" not in seen  # not the source's later turn

        # The source goes on as if nothing happened.
        _, s3 = await turn(http, gw, src, kind, "recall\nrun cat story.txt")
        assert terminal(s3)["type"] == "RUN_FINISHED", terminal(s3)
        seen_src = texts(s3)
        assert "the end" in seen_src and "a twist" not in seen_src
        assert "recall\nrun cat story.txt\nappend story.txt a twist" not in seen_src

        # And the fork keeps its own line.
        _, f2 = await turn(http, gw, fork, kind, "run cat story.txt")
        assert "a twist" in texts(f2) and "the end" not in texts(f2)

    # Bad forks: an unknown run, a taken thread id, a run that left no workspace.
    assert (await http.post(f"{gw.url}/api/threads/{src}/fork", json={"runId": "nope"})).status_code == 404
    taken = await http.post(f"{gw.url}/api/threads/{src}/fork", json={"runId": run1, "newThreadId": fork})
    assert taken.status_code == 409 and taken.json()["reason"] == "THREAD_EXISTS"


async def test_deleting_a_thread_deletes_its_workspace_and_transcript(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread = unique("del-thr-")
    run1, c1 = await turn(http, gw, thread, "claude-code", "write gone.txt soon", {"git": f"file://{cluster.repo.bare}"})
    assert terminal(c1)["type"] == "RUN_FINISHED"
    assert (await http.delete(f"{gw.url}/api/threads/{thread}")).status_code == 204
    # The transcript is gone; a fork of it has nothing to start from; the next run starts afresh.
    msgs = await http.get(f"{gw.url}/api/threads/{thread}/messages")
    assert msgs.status_code == 200 and msgs.json()["messages"] == []
    assert (await http.post(f"{gw.url}/api/threads/{thread}/fork", json={"runId": run1})).status_code == 400
    _, c2 = await turn(http, gw, thread, "claude-code", "run ls")
    assert terminal(c2)["type"] == "RUN_FINISHED"
    assert "gone.txt" not in texts(c2)
    assert (await http.delete(f"{gw.url}/api/threads/{unique('never-')}")).status_code == 404
