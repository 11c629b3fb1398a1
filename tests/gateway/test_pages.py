"""The web pages: the chat at ``/`` and the operator view at ``/ops``, in a real
browser (Playwright + Debian chromium) against two real sandbox hosts, plus the read-only
endpoints they use (``/api/threads``, ``/api/threads/{id}/runs``, ``/api/ops/*``) with
auth and tenancy.

Screenshots (chat mid-run, finished, busy, cancelled, interrupted, failed, hostile, phone,
takeover; operator view) go to ``artifacts/browser/`` (gitignored; the path is printed).
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import shutil
import time
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
import pytest

from baton.coordinator_client import CoordinatorClient, Session
from baton.log import DeliveryLog, LogConfig
from baton.v1 import runs_pb2
from sandbox_host.machine import accepted_chunk
from tests.conftest import REPO, assert_eventually, require, unique
from tests.gateway.conftest import SLOW_TEXT, Gateway, GatewayFactory, claude_journal, host_settings
from tests.gateway.test_node import NODE_DIR, need_node
from tests.sandbox.gitrepos import make_repo
from tests.sessions_support import Cluster

ARTIFACTS = REPO / "artifacts" / "browser"
KEYS = {"key-a": "tenant-a", "key-b": "tenant-b"}
A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}

HOSTILE = [
    "<script>window.__xss = 1</script>",
    '<img src=x onerror="window.__xss = 2">',
    "![tracker](http://127.0.0.1:9/pixel.png) and [click me](javascript:window.__xss=3) and [ok](https://example.com/)",
    "**bold** `code` <b>not bold</b>\n\n```html\n<script>window.__xss = 4</script>\n```\n\n- item one\n- item two",
]


@pytest.fixture(scope="module")
def page_replay(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Journals the page tests replay: corpus journals (reasoning, tools, failures) and hand-made ones."""
    d = tmp_path_factory.mktemp("page-replay")
    (d / "claude-stream-json").mkdir()
    (d / "codex-exec-json").mkdir()
    corpus = REPO / "corpus"
    shutil.copy(corpus / "claude-stream-json" / "partial-messages-bash-exit-128.jsonl", d / "claude-stream-json" / "thinking.jsonl")
    shutil.copy(corpus / "claude-stream-json" / "result-error-max-turns-structured-output.jsonl",
                d / "claude-stream-json" / "max-turns.jsonl")
    shutil.copy(corpus / "codex-exec-json" / "turn-failed-invalid-request.jsonl", d / "codex-exec-json" / "turn-failed.jsonl")
    shutil.copy(corpus / "claude-stream-json" / "subagents-parallel-tools-v2.0.25.jsonl",
                d / "claude-stream-json" / "subagents.jsonl")
    (d / "claude-stream-json" / "slow.jsonl").write_text(claude_journal([f"part {i}. " for i in range(40)]))
    (d / "claude-stream-json" / "hello.jsonl").write_text(claude_journal(["hello from the replay"]))
    (d / "claude-stream-json" / "hostile.jsonl").write_text(claude_journal(HOSTILE))
    return d


@pytest.fixture(scope="module")
async def page_cluster(coordinator: Any, nats: Any, log_cfg: LogConfig, page_replay: pathlib.Path,
                       tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    """Two sandbox hosts on one machine (shared journal and sandbox dirs: either can take
    over), which play replay journals and run coding sessions with the stand-in CLIs on a
    local git repository (``cluster.repo``, inside ``BATON_WORKSPACE_DIRS``)."""
    tmp = tmp_path_factory.mktemp("page-hosts")
    allowed = tmp / "allowed"
    allowed.mkdir()
    # A longer lease than the default 2 s: the page tests share two cores with browsers.
    settings = {**host_settings(log_cfg, page_replay, tmp), "BATON_SESSION_TTL": "5",
                "BATON_WORKSPACE_DIRS": str(allowed), "BATON_WORKSPACE_OBJECTS": unique("ws-objects"),
                "BATON_WORKSPACE_HEADS": unique("ws-heads")}
    cluster = Cluster(tmp, make_repo(allowed), allowed, coordinator, nats, settings)
    try:
        for _ in range(2):
            await cluster.add_host()
        yield cluster
    finally:
        await cluster.stop()


@pytest.fixture(scope="module")
def two_hosts(page_cluster: Cluster) -> list[Any]:
    return page_cluster.hosts


@pytest.fixture
async def page_gateway(make_gateway: GatewayFactory, page_replay: pathlib.Path, page_cluster: Cluster,
                       cc: Any) -> Gateway:
    from baton.workspaces import WorkspaceConfig

    async def both_registered() -> bool:
        ids = {h.host_id for h in await cc.list_hosts()}
        return all(h.host_id in ids for h in page_cluster.hosts)
    await assert_eventually(both_registered, timeout=20)
    ws_cfg = WorkspaceConfig.from_env({k: v for k, v in page_cluster.settings.items() if k.startswith("BATON_WORKSPACE_")})
    return await make_gateway(keepalive=0.5, api_keys=KEYS, replay_dirs=(page_replay,),
                              workspace_dirs=(str(page_cluster.allowed.resolve()),), workspace_config=ws_cfg)


async def _run_to_end(http: httpx.AsyncClient, gw: Gateway, headers: dict[str, str], thread: str, journal: str) -> str:
    run = unique("run-")
    body = {"threadId": thread, "runId": run, "messages": [{"id": "u", "role": "user", "content": "hi"}],
            "agent": {"kind": "replay", "journal": journal, "speed": 0}}
    async with http.stream("POST", f"{gw.url}/api/chat", json=body, headers=headers, timeout=60) as resp:
        assert resp.status_code == 200
        async for _ in resp.aiter_bytes():
            pass

    async def terminal() -> bool:
        # The run's view is settled by its closed log; the listings read the record, whose
        # terminal status is the host's next write (docs/design.md: the one-write window).
        r = await http.get(f"{gw.url}/api/runs/{run}", headers=headers)
        listed = (await http.get(f"{gw.url}/api/threads/{thread}/runs", headers=headers)).json()["runs"]
        return bool(r.json()["status"] == "completed" and [x["status"] for x in listed] == ["completed"] * len(listed))
    await assert_eventually(terminal, timeout=10)
    return run


async def test_page_endpoints_answer_the_callers_tenant_only(page_gateway: Gateway, http: httpx.AsyncClient,
                                                             two_hosts: list[Any]) -> None:
    gw = page_gateway
    thread = unique("thread-")
    run = await _run_to_end(http, gw, A, thread, "claude-stream-json/hello.jsonl")

    threads = (await http.get(f"{gw.url}/api/threads", headers=A)).json()["threads"]
    mine = next(t for t in threads if t["threadId"] == thread)
    assert mine == {"threadId": thread, "runs": 1, "lastRunId": run, "status": "completed", "awaitingApproval": False, "startedAt": mine["startedAt"]}
    assert thread not in {t["threadId"] for t in (await http.get(f"{gw.url}/api/threads", headers=B)).json()["threads"]}
    assert (await http.get(f"{gw.url}/api/threads")).status_code == 401

    runs = (await http.get(f"{gw.url}/api/threads/{thread}/runs", headers=A)).json()
    assert [(r["runId"], r["status"]) for r in runs["runs"]] == [(run, "completed")]
    epoch = runs["runs"][0]["epoch"]  # 1, or more when a loaded machine cost a host its lease
    assert (await http.get(f"{gw.url}/api/threads/{thread}/runs", headers=B)).status_code == 404

    tl = (await http.get(f"{gw.url}/api/ops/timeline", params={"runId": run}, headers=A)).json()
    assert [f["epoch"] for f in tl["epochs"]] == list(range(1, epoch + 1))
    assert tl["close"]["status"] == "completed" and tl["close"]["at"] >= tl["epochs"][0]["at"] > 0
    log = (await http.get(f"{gw.url}/api/chat", params={"runId": run, "offset": "-1"}, headers=A)).text
    assert tl["chunks"] == log.count("\nid: ") + log.startswith("id: ")
    assert tl["run"]["runId"] == run and tl["run"]["status"] == "completed"
    assert (await http.get(f"{gw.url}/api/ops/timeline", params={"runId": run}, headers=B)).status_code == 404
    assert (await http.get(f"{gw.url}/api/ops/timeline", headers=A)).status_code == 400

    ov = (await http.get(f"{gw.url}/api/ops/overview", headers=A)).json()
    assert {h.host_id for h in two_hosts} <= {h["hostId"] for h in ov["hosts"]}
    assert all(h["capacity"] > 0 and h["load"] >= 0 for h in ov["hosts"])
    assert ov["runsByStatus"].get("completed", 0) >= 1
    ov_b = (await http.get(f"{gw.url}/api/ops/overview", headers=B)).json()
    assert run not in {r["runId"] for r in ov_b["live"] + ov_b["takeovers"] + ov_b["reaps"]}

    # A run nobody watches is detached: the overview says since when and when the reaper acts.
    detached = unique("run-")
    body = {"threadId": unique("thread-"), "runId": detached, "messages": [{"id": "u", "role": "user", "content": "go"}],
            "agent": {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1, "delay": 1}}
    async with http.stream("POST", f"{gw.url}/api/chat", json=body, headers=A, timeout=60) as resp:
        async for _ in resp.aiter_bytes():
            break  # the client leaves at once

    async def shown_detached() -> dict[str, Any]:
        live = (await http.get(f"{gw.url}/api/ops/overview", headers=A)).json()["live"]
        row = next(r for r in live if r["runId"] == detached)
        assert row["detachedSince"] and row["reapAt"] > row["detachedSince"]
        return row  # type: ignore[no-any-return]
    row = await assert_eventually(shown_detached, timeout=15)
    assert row["status"] == "running" and row["epoch"] == 1
    await http.post(f"{gw.url}/api/chat/cancel", json={"runId": detached}, params={"wait": "true"}, headers=A)

    icon = await http.get(f"{gw.url}/favicon.ico")
    assert icon.status_code == 200 and icon.headers["content-type"].startswith("image/svg+xml")
    ops = await http.get(f"{gw.url}/ops")
    assert ops.status_code == 200 and "Operator view" in ops.text


def need_browser() -> str:
    node = need_node("playwright-core")
    require(pathlib.Path("/usr/bin/chromium").exists(), "/usr/bin/chromium missing (apt-get install chromium)")
    return node


async def run_page_script(node: str, script: str, gw: Gateway, *, timeout: float,
                          on_line: Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]] | None = None,
                          env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a Playwright script; ``on_line`` answers its requests (JSON lines without ``ok``) on
    stdin: with the JSON of what it returns, or ``done``. ``env``: more of its environment."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {ARTIFACTS}")
    env = {**os.environ, "BATON_GATEWAY_URL": gw.url, "BATON_API_KEY": "key-a", "BATON_ARTIFACTS": str(ARTIFACTS),
           **(env or {})}
    proc = await asyncio.create_subprocess_exec(node, script, cwd=NODE_DIR, env=env, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert proc.stdout is not None and proc.stdin is not None and proc.stderr is not None
    result: dict[str, Any] | None = None
    out: list[str] = []

    async def read() -> None:
        nonlocal result
        assert proc.stdout is not None and proc.stdin is not None
        async for raw in proc.stdout:
            line = raw.decode()
            out.append(line)
            if not line.startswith("{"):
                continue
            msg = json.loads(line)
            if "ok" in msg:
                result = msg
            elif on_line is not None:
                reply = await on_line(msg)
                proc.stdin.write(json.dumps(reply).encode() + b"\n" if reply is not None else b"done\n")
                await proc.stdin.drain()

    try:
        async with asyncio.timeout(timeout):
            err = await asyncio.gather(read(), proc.stderr.read(), proc.wait())
    except TimeoutError:
        raise AssertionError(f"{script} timed out\nstdout: {''.join(out)[-3000:]}") from None
    finally:
        if proc.returncode is None:  # timed out, or an answer to the script failed: no browser left behind
            proc.kill()
            await proc.wait()
    stderr = err[1].decode()
    assert result is not None, f"no result from {script}\nstdout: {''.join(out)[-3000:]}\nstderr: {stderr[-3000:]}"
    assert proc.returncode == 0 and result["ok"], f"{script} failed: {json.dumps(result, indent=1)[:6000]}\n{stderr[-2000:]}"
    return result


class PausingHost:
    """Drives one run the way a sandbox host does when its agent pauses for the user
    (docs/design.md §5.5, the interrupt row), for the page's ``interrupted`` state.

    No shipped agent asks a human yet (no translator emits ``RUN_FINISHED`` with outcome
    ``interrupt``), so the test plays that host with the real pieces: a coordinator session
    and claim, the fenced delivery-log writer, then the host's finishing order (close the
    log ``interrupted``, write the status under the claim, release it).
    """

    def __init__(self, cc: CoordinatorClient, dlog: DeliveryLog) -> None:
        self.cc, self.dlog = cc, dlog
        self.session: Session | None = None

    async def __call__(self, msg: dict[str, Any]) -> None:
        run, thread, host = msg["runId"], msg["threadId"], msg["host"]
        mid = f"{run}-m1"
        if msg["hitl"] == "start":
            await self.cc.create_or_resume_run(runs_pb2.RunRecord(
                run_id=run, thread_id=thread, tenant=KEYS["key-a"], agent=runs_pb2.AgentSpec(kind="replay")))
            self.session = await self.cc.open_session(5.0, owner=host)
            self.epoch, _ = await self.cc.claim_run(run, self.session, host)
            self.writer = self.dlog.writer(run, self.epoch)
            await self.writer.fence()
            await self.writer.append([accepted_chunk(run, thread, "replay", [{"id": "u1", "role": "user",
                                                                              "content": msg["prompt"]}])], origin="host")
            await self.writer.append([{"type": "RUN_STARTED", "threadId": thread, "runId": run},
                                      {"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"},
                                      {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid,
                                       "delta": "I will delete the build directory."}])
            return
        assert self.session is not None
        await self.writer.append([{"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": " May I go ahead?"},
                                  {"type": "TEXT_MESSAGE_END", "messageId": mid},
                                  {"type": "RUN_FINISHED", "threadId": thread, "runId": run,
                                   "outcome": {"type": "interrupt", "interrupts": [{"id": f"{run}-i1"}]}}])
        finished_at = time.time()  # as a host: the same finish time in the close record and the record
        assert await self.writer.close("interrupted", finished_at=finished_at)
        await self.cc.update_run(run, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_INTERRUPTED, finished_at=finished_at),
                                 ["status", "finished_at"], epoch=self.epoch, session_id=self.session)
        assert await self.cc.release_claim(run, self.session, self.epoch)
        await self.session.close()

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_chat_page_reloads_tabs_busy_stop_failures_and_hostile_output(
        page_gateway: Gateway, cc: CoordinatorClient, dlog: DeliveryLog) -> None:
    node = need_browser()
    host = PausingHost(cc, dlog)
    try:
        result = await run_page_script(node, "page_chat.mjs", page_gateway, timeout=280, on_line=host)
    finally:
        await host.close()
    assert result["reload"]["beforeReload"] > 0
    assert result["stop"]["status"] == "aborted"
    assert result["esc"]["status"] == "aborted" and result["esc"]["cancels"] == 1
    assert result["interrupted"]["status"] == "interrupted"
    assert result["interrupted"]["shown"]["section"]["outcome"] == "Paused: the agent is waiting for input (interrupted)."
    assert result["failed"]["statusC"] == result["failed"]["statusD"] == "failed"
    assert result["xss"]["flag"] is None and result["xss"]["imgs"] == 0
    assert [pathlib.Path(p).name for p in result["screenshots"]] == [
        "chat-mid-run.png", "chat-finished.png", "chat-scrolled.png", "chat-busy.png", "chat-cancelled.png", "chat-interrupted.png",
        "chat-failed.png", "chat-hostile.png", "chat-phone.png"]


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_coding_session_repository_field_second_turn_and_fork(
        page_gateway: Gateway, page_cluster: Cluster, http: httpx.AsyncClient) -> None:
    """A claude-code thread on a repository from the page (stand-in CLI): the field, a refused
    workspace, a second turn in the same workspace, a fork at the first run and its turn."""
    node = need_browser()
    repo = f"file://{page_cluster.repo.bare}"
    result = await run_page_script(node, "page_session.mjs", page_gateway, timeout=280,
                                   env={"BATON_TEST_REPO": repo})
    s = result["session"]
    assert s["refused"].startswith("Not sent: workspace.dir: ") and "BATON_WORKSPACE_DIRS" in s["refused"]
    runs = (await http.get(f"{page_gateway.url}/api/threads/{s['thread']}/runs", headers=A)).json()
    assert [r["runId"] for r in runs["runs"]] == [s["run1"], s["run2"]]
    assert all(r["status"] == "completed" and r["agent"] == "claude-code" for r in runs["runs"])
    assert runs["workspace"]["git"] == runs["runs"][0]["workspace"]["git"] and runs["forkedFrom"] is None
    f = result["fork"]
    forked = (await http.get(f"{page_gateway.url}/api/threads/{f['thread']}/runs", headers=A)).json()
    assert [r["runId"] for r in forked["runs"]] == [f["run"]] and forked["runs"][0]["status"] == "completed"
    msgs = (await http.get(f"{page_gateway.url}/api/threads/{f['thread']}/messages", headers=A)).json()["messages"]
    users = [m["content"] for m in msgs if m["role"] == "user"]
    assert users == ["write hello.txt hi", "run cat hello.txt"]  # the fork's first turn, then its own
    # The fork started with the first turn's messages: everything before its own prompt.
    own = next(i for i, m in enumerate(msgs) if m["role"] == "user" and m["content"] == "run cat hello.txt")
    assert forked["forkedFrom"] == f["forkedFrom"] == {"threadId": s["thread"], "runId": s["run1"], "messages": own}
    assert [pathlib.Path(p).name for p in result["screenshots"]] == [
        "session-new.png", "session-refused.png", "session-second-turn.png", "session-forked.png",
        "session-fork-turn.png", "session-phone.png"]


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_approvals_are_answered_in_place_from_any_tab(
        page_gateway: Gateway, page_cluster: Cluster, http: httpx.AsyncClient) -> None:
    """A claude-code run whose stand-in asks before Bash: the card, a second tab, a reload,
    Approve, then a denial with a reason, two tabs answering at once, a message sent into the
    running turn; a busy thread's queue: two queued, one cancelled,
    the other runs next (docs/hitl.md)."""
    node = need_browser()
    result = await run_page_script(node, "page_approvals.mjs", page_gateway, timeout=280)
    a = result["approvals"]
    view = (await http.get(f"{page_gateway.url}/api/runs/{a['run1']}", headers=A)).json()
    assert view["status"] == "completed" and [(i["id"], i["decision"], i["answeredBy"]) for i in view["inputs"]] == [
        (a["approval"], "allow", "user")]
    denied = (await http.get(f"{page_gateway.url}/api/runs/{a['run2']}", headers=A)).json()["inputs"]
    assert [(i["decision"], i["message"]) for i in denied] == [("deny", "not today")]
    raced = (await http.get(f"{page_gateway.url}/api/runs/{result['raced']['run']}", headers=A)).json()["inputs"]
    assert [(i["decision"], i["answeredBy"]) for i in raced] == [(result["raced"]["decision"], "user")]  # one answer stored
    steered = (await http.get(f"{page_gateway.url}/api/threads/{a['thread']}/messages", headers=A)).json()["messages"]
    assert [m["content"] for m in steered if m["role"] == "user"][-1] == "say steered from the page"
    q = result["queue"]
    assert (await http.get(f"{page_gateway.url}/api/runs/{q['ran']}", headers=A)).json()["status"] == "completed"
    assert (await http.get(f"{page_gateway.url}/api/runs/{q['cancelled']}", headers=A)).status_code == 404
    assert [pathlib.Path(p).name for p in result["screenshots"]] == [
        "approval-pending.png", "approval-answered.png", "approval-denied.png", "approval-raced.png", "steered.png",
        "queue-two.png", "queue-ran.png"]


@pytest.mark.browser
@pytest.mark.timeout(200)
async def test_a_long_thread_opens_with_its_newest_runs_and_loads_older_ones_on_scroll(
        page_gateway: Gateway, cc: CoordinatorClient, dlog: DeliveryLog) -> None:
    """25 finished runs: the page shows the newest 10 first, then 10 and 5 more as the reader
    scrolls up, each run once, oldest at the top (tests/node/page_long_thread.mjs)."""
    from tests.gateway.conftest import write_run

    node = need_browser()
    thread, total = unique("long-"), 25
    # Recent start times: records stamped in 1970 are what the coordinator's retention removes.
    t0 = time.time() - 60
    for i in range(total):
        run_id = f"{thread}-r{i:02d}"
        await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run_id, thread_id=thread, tenant="tenant-a",
                                                         started_at=t0 + i))
        mid = f"{run_id}-m"
        await write_run(dlog, run_id, [
            {"type": "RUN_STARTED", "threadId": thread, "runId": run_id},
            accepted_chunk(run_id, thread, "replay", [{"id": f"{run_id}-u", "role": "user", "content": f"question {i}"}]),
            {"type": "TEXT_MESSAGE_START", "messageId": mid, "role": "assistant"},
            {"type": "TEXT_MESSAGE_CONTENT", "messageId": mid, "delta": f"answer {i}"},
            {"type": "TEXT_MESSAGE_END", "messageId": mid},
            {"type": "RUN_FINISHED", "threadId": thread, "runId": run_id}])
        await cc.update_run(run_id, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_COMPLETED,
                                                       finished_at=t0 + i + 0.5), ["status", "finished_at"])
    result = await run_page_script(node, "page_long_thread.mjs", page_gateway, timeout=180,
                                   env={"BATON_THREAD": thread, "BATON_RUNS": str(total)})
    assert result["pages"] == [10, 20, 25]


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_host_killed_mid_run_shows_one_takeover_marker_and_the_operator_view(
        page_gateway: Gateway, two_hosts: list[Any], http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    """Last in this module: it SIGKILLs one of the two hosts."""
    node = need_browser()
    killed: list[str] = []

    detached: list[str] = []

    async def answer(msg: dict[str, Any]) -> dict[str, Any] | None:
        if "kill" in msg:
            host = next(h for h in two_hosts if h.host_id == msg["host"])
            await host.kill()
            killed.append(host.host_id)
            return None
        if "reap" in msg:
            # One sweep, with a TTL that has just run out for this run (and for any run
            # detached before it: none of this module's others is).
            since = (await http.get(f"{page_gateway.url}/api/runs/{msg['reap']}", headers=A)).json()["detachedSince"]
            counts = await cc.reap(ttl=0.001, now=since + 0.001)
            assert counts["expired"] >= 1, counts
            return None
        # A run nobody watches, for the operator view's live table: its client leaves at once.
        run, thread = unique("run-"), unique("thread-")
        body = {"threadId": thread, "runId": run, "messages": [{"id": "u", "role": "user", "content": "go"}],
                "agent": {"kind": "replay", "journal": "claude-stream-json/slow.jsonl", "speed": 1, "delay": 1}}
        async with http.stream("POST", f"{page_gateway.url}/api/chat", json=body, headers=A, timeout=60) as resp:
            async for _ in resp.aiter_bytes():
                break
        detached.append(run)
        return {"runId": run, "threadId": thread}

    try:
        result = await run_page_script(node, "page_takeover.mjs", page_gateway, timeout=280, on_line=answer)
    finally:
        for run in detached:
            await http.post(f"{page_gateway.url}/api/chat/cancel", json={"runId": run}, params={"wait": "true"},
                            headers=A, timeout=30)
    assert result["ops"]["detached"]["runId"] == detached[0] and result["ops"]["reaped"][2] == "aborted"
    t = result["takeover"]
    assert killed == [t["from"]] and t["to"] != t["from"] and t["epoch"] == 2 and t["status"] == "completed"
    assert t["text"] == SLOW_TEXT
    assert t["shownText"] == SLOW_TEXT  # no part shown twice, none missing
