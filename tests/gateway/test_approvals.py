"""Tool approvals end to end (docs/hitl.md): a claude-code run asks before it runs a command,
its user answers from any tab, reload or gateway, and the answer reaches the agent exactly
once, also after the host that asked was SIGKILLed; nobody answering counts as a denial.

Real hosts (subprocesses) run the real claude-code launch (stream-json control protocol)
against the stand-in ``claude`` (``baton_tools/standins``; no model is reachable here),
which asks for Bash and Write as Claude Code does in its default permission mode. What is
checked is what a user checks: the chunks in the log (the request, then the answer, then
the tool's output, each once), the run's view (awaiting approval), the files the command
wrote, the saved transcript.
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
import signal
from typing import Any, AsyncIterator, Callable, Iterator

import httpx
import grpc
import pytest

from baton.log import LogConfig
from baton.sse import Comment, aiter_sse
from tests.conftest import assert_eventually, process_state, unique
from tests.gateway.conftest import Gateway, host_settings, read_stream
from tests.sandbox.gitrepos import Repo, make_repo
from tests.sessions_support import Cluster, driver_of, terminal, texts

pytestmark = pytest.mark.timeout(240)

Chunk = dict[str, Any]


@pytest.fixture(scope="module")
def repo_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[pathlib.Path, Repo]]:
    root = tmp_path_factory.mktemp("approvals")
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
    _HOST_LOG_DIRS[:] = [root / "logs"]
    try:
        yield c
    finally:
        await c.stop()


KEYS = {"key-alpha": "alpha", "key-beta": "beta"}


@pytest.fixture
async def gw(cluster: Cluster, make_gateway: Any) -> Gateway:
    return await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0", api_keys=KEYS)


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    """The user's client (tenant alpha)."""
    async with httpx.AsyncClient(trust_env=False, timeout=60, headers={"Authorization": "Bearer key-alpha"}) as c:
        yield c


def body(thread: str, prompt: str, **agent: Any) -> dict[str, Any]:
    return {"threadId": thread, "agent": {"kind": "claude-code", "approvals": True, **agent},
            "messages": [{"id": unique("u"), "role": "user", "content": prompt}]}


AUTH = {"Authorization": "Bearer key-alpha"}


async def read_until(url: str, method: str, until: Callable[[Chunk], bool], **kw: Any) -> list[Chunk]:
    """Read an SSE response until a chunk matches ``until`` (then disconnect, as a closed
    tab does) or the log ends."""
    chunks: list[Chunk] = []
    async with httpx.AsyncClient(trust_env=False, timeout=60, headers=AUTH) as own:
        async with own.stream(method, url, **kw) as resp:
            assert resp.status_code == 200, (await resp.aread())
            async for item in aiter_sse(resp.aiter_bytes()):
                if isinstance(item, Comment):
                    if item.text == "end":
                        break
                    continue
                chunk = json.loads(item.data)
                chunks.append(chunk)
                if until(chunk):
                    break
    return chunks


def is_ask(c: Chunk) -> bool:
    return c["type"] == "CUSTOM" and c.get("name") == "approval-requested"


def approvals_in(chunks: list[Chunk]) -> list[str]:
    return [c["value"]["approval"]["id"] for c in chunks if is_ask(c)]


def answers_in(chunks: list[Chunk]) -> list[dict[str, Any]]:
    return [c["content"] for c in chunks
            if c["type"] == "ACTIVITY_SNAPSHOT" and c.get("activityType") == "approval_answer"]


def results_in(chunks: list[Chunk]) -> list[Chunk]:
    return [c for c in chunks if c["type"] == "TOOL_CALL_RESULT"]


#: Where this module's cluster's hosts log (set by its fixture): a run that never ends shows
#: what its hosts said of it.
_HOST_LOG_DIRS: list[pathlib.Path] = []
#: Seconds a run's whole log may take to end (every run here ends in seconds; the test's own
#: timeout is longer, so a hang fails with the run's record and its hosts' lines).
WHOLE_LOG_TIMEOUT = 150.0


async def whole_log(http: httpx.AsyncClient, gw: Gateway, run_id: str) -> list[Chunk]:
    try:
        async with asyncio.timeout(WHOLE_LOG_TIMEOUT):
            got = await read_stream(http, "GET", f"{gw.url}/api/chat?runId={run_id}&offset=-1")
    except TimeoutError:
        record = (await http.get(f"{gw.url}/api/runs/{run_id}")).text
        lines = [f"{p.name}: {line}" for d in _HOST_LOG_DIRS for p in sorted(d.glob("*.log"))
                 for line in p.read_text(errors="replace").splitlines() if run_id in line]
        pytest.fail(f"run {run_id} did not end in {WHOLE_LOG_TIMEOUT:.0f} s; its record: {record}\n"
                    "its hosts' lines:\n" + "\n".join(lines[-60:]))
    assert got.status == 200 and got.ended, got
    return [c for _, c in got.events]


async def ask(gw: Gateway, prompt: str, **agent: Any) -> tuple[str, str, str]:
    """Start a run whose agent asks, read until it asks, leave: ``(thread, run id, approval id)``."""
    thread, run_id = unique("hitl-thr-"), unique("run-")
    seen = await read_until(f"{gw.url}/api/chat?runId={run_id}", "POST", is_ask, json=body(thread, prompt, **agent))
    [approval] = approvals_in(seen)
    return thread, run_id, approval


async def view(http: httpx.AsyncClient, gw: Gateway, run_id: str) -> dict[str, Any]:
    r = await http.get(f"{gw.url}/api/runs/{run_id}")
    assert r.status_code == 200, r.text
    return dict(r.json())


async def answer(http: httpx.AsyncClient, gw: Gateway, run_id: str, approval: str, approved: bool,
                 message: str | None = None) -> httpx.Response:
    payload: dict[str, Any] = {"approved": approved}
    if message is not None:
        payload["message"] = message
    return await http.post(f"{gw.url}/api/runs/{run_id}/approvals/{approval}", json=payload)


def in_order_once(chunks: list[Chunk], approval: str, tool_call: str) -> tuple[int, int, int]:
    """Positions of the request, the answer and the tool's result, each present once."""
    asks = [i for i, c in enumerate(chunks) if is_ask(c) and c["value"]["approval"]["id"] == approval]
    answers = [i for i, c in enumerate(chunks) if c["type"] == "ACTIVITY_SNAPSHOT"
               and c.get("activityType") == "approval_answer" and c["content"]["approvalId"] == approval]
    results = [i for i, c in enumerate(chunks) if c["type"] == "TOOL_CALL_RESULT" and c["toolCallId"] == tool_call]
    assert len(asks) == len(answers) == len(results) == 1, (asks, answers, results)
    assert asks[0] < answers[0] < results[0]
    return asks[0], answers[0], results[0]


async def test_approve_after_a_reload(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread, run_id, approval = await ask(gw, "run echo approved > a.txt && cat a.txt\nsay done")
    v = await view(http, gw, run_id)
    assert v["status"] == "running" and v["awaitingApproval"] is True
    [pending] = [i for i in v["inputs"] if i["id"] == approval]
    assert pending["kind"] == "approval" and pending["state"] == "pending" and pending["toolName"] == "Bash"
    assert pending["input"]["command"] == "echo approved > a.txt && cat a.txt"
    assert pending["expiresAt"] > pending["requestedAt"]

    # A reload reads the log from the start: the request is there (once), the run waits.
    again = await read_until(f"{gw.url}/api/chat?runId={run_id}&offset=-1", "GET", is_ask)
    assert approvals_in(again) == [approval] and not results_in(again)
    assert (await view(http, gw, run_id))["awaitingApproval"] is True

    r = await answer(http, gw, run_id, approval, True)
    assert r.status_code == 200, r.text
    assert r.json()["approval"]["decision"] == "allow" and r.json()["approval"]["answeredBy"] == "user"

    chunks = await whole_log(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    tool_call = pending["toolCallId"]
    in_order_once(chunks, approval, tool_call)
    assert [c["content"] for c in results_in(chunks)] == ["approved"]
    assert answers_in(chunks) == [{"approvalId": approval, "toolCallId": tool_call, "approved": True}]
    done = await view(http, gw, run_id)
    assert done["status"] == "completed" and done["awaitingApproval"] is False

    # A second answer: 409 with the first; the saved transcript shows request and answer in place.
    late = await answer(http, gw, run_id, approval, False)
    assert late.status_code == 409 and late.json()["reason"] in ("APPROVAL_ALREADY_ANSWERED", "RUN_ENDED")
    saved = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    kinds = [(m["role"], (m.get("activityType") or "")) for m in saved]
    asked_at = kinds.index(("activity", "approval"))
    answered_at = kinds.index(("activity", "approval_answer"))
    call_at = next(i for i, m in enumerate(saved) if m["role"] == "assistant" and m.get("toolCalls"))
    # The request and its answer follow the call they gate, in the order they happened (the
    # tool's result sits with its call, where AG-UI's client puts it).
    assert call_at < asked_at < answered_at, kinds
    assert saved[asked_at]["content"]["toolCallId"] == saved[answered_at]["content"]["toolCallId"] == tool_call


async def test_two_tabs_answer_at_once_one_wins(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo raced > r.txt && cat r.txt")
    first, second = await asyncio.gather(answer(http, gw, run_id, approval, True),
                                         answer(http, gw, run_id, approval, False, "no"))
    assert sorted([first.status_code, second.status_code]) == [200, 409], (first.text, second.text)
    won, lost = (first, second) if first.status_code == 200 else (second, first)
    assert lost.json()["reason"] == "APPROVAL_ALREADY_ANSWERED"
    assert lost.json()["approval"] == won.json()["approval"]
    chunks = await whole_log(http, gw, run_id)
    [got] = answers_in(chunks)
    assert got["approved"] is won.json()["approval"]["approved"]
    assert terminal(chunks)["type"] == "RUN_FINISHED"


async def test_a_denial_reaches_the_agent_and_nothing_runs(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo never > n.txt && cat n.txt\nrun test -e n.txt && echo present || echo absent")
    r = await answer(http, gw, run_id, approval, False, "not on this repo")
    assert r.status_code == 200 and r.json()["approval"]["approved"] is False
    # The second command asks too: allow it, and it finds no file.
    seen = await read_until(f"{gw.url}/api/chat?runId={run_id}&offset=-1", "GET",
                            lambda c: is_ask(c) and c["value"]["approval"]["id"] != approval)
    second = [a for a in approvals_in(seen) if a != approval][0]
    assert (await answer(http, gw, run_id, second, True)).status_code == 200
    chunks = await whole_log(http, gw, run_id)
    results = results_in(chunks)
    assert [(c["content"], bool(c.get("metadata", {}).get("isError") or c.get("isError"))) for c in results][0] == (
        "not on this repo", True)
    assert results[1]["content"] == "absent"
    assert answers_in(chunks)[0] == {"approvalId": approval, "toolCallId": results[0]["toolCallId"],
                                     "approved": False, "message": "not on this repo"}


async def test_nobody_answers_it_expires_as_a_denial(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo late > l.txt && cat l.txt", approval_timeout=1.5)
    chunks = await whole_log(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_FINISHED"
    [got] = answers_in(chunks)
    assert got["approved"] is False and "expired" in got["message"]
    assert results_in(chunks)[0]["content"] == got["message"]
    late = await answer(http, gw, run_id, approval, True)
    assert late.status_code == 409
    stored = (await view(http, gw, run_id))["inputs"][0]
    assert stored["answeredBy"] == "expired" and stored["approved"] is False


async def test_the_successor_delivers_after_the_asking_host_dies(cluster: Cluster, gw: Gateway,
                                                                 http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo survived > s.txt && cat s.txt\nsay after")
    before = await view(http, gw, run_id)
    await cluster.kill(await driver_of(http, gw, run_id))
    try:
        # The answer is stored while nobody drives the run; a reader's join brings a successor,
        # which replays the journal: the request stays pending (a replayed ask does not deny).
        r = await answer(http, gw, run_id, approval, True)
        assert r.status_code == 200, r.text
        chunks = await whole_log(http, gw, run_id)
        after = await view(http, gw, run_id)
        assert after["epoch"] > before["epoch"]
        assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
        tool_call = before["inputs"][0]["toolCallId"]
        in_order_once(chunks, approval, tool_call)
        assert [c["content"] for c in results_in(chunks)] == ["survived"]
    finally:
        await cluster.add_host()


async def test_a_host_death_before_anyone_answers_keeps_the_run_waiting(cluster: Cluster, gw: Gateway,
                                                                         http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo waited > w.txt && cat w.txt")
    before = await view(http, gw, run_id)
    await cluster.kill(await driver_of(http, gw, run_id))
    try:
        # A join brings a successor; it replays the ask and the run keeps waiting for its user.
        replayed = await read_until(f"{gw.url}/api/chat?runId={run_id}&offset=-1", "GET", is_ask)
        assert approvals_in(replayed) == [approval]

        async def taken_over() -> bool:
            v = await view(http, gw, run_id)
            return bool(v["claimed"] and v["epoch"] > before["epoch"])
        from tests.conftest import assert_eventually
        await assert_eventually(taken_over, timeout=30)
        v = await view(http, gw, run_id)
        assert v["status"] == "running" and v["awaitingApproval"] is True
        assert (await answer(http, gw, run_id, approval, True)).status_code == 200
        chunks = await whole_log(http, gw, run_id)
        in_order_once(chunks, approval, before["inputs"][0]["toolCallId"])
        assert [c["content"] for c in results_in(chunks)] == ["waited"]
    finally:
        await cluster.add_host()


async def test_steer_a_running_turn(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    thread, run_id = unique("hitl-thr-"), unique("run-")
    started = await read_until(f"{gw.url}/api/chat?runId={run_id}", "POST",
                               lambda c: c["type"] == "TEXT_MESSAGE_CONTENT",
                               json={**body(thread, "say working\nsleep 2\nsay first part"),
                                     "agent": {"kind": "claude-code"}})
    assert started
    r = await http.post(f"{gw.url}/api/runs/{run_id}/messages",
                        json={"content": "say also this, from the steer", "id": "steer-1"})
    assert r.status_code == 202 and r.json() == {"runId": run_id, "inputId": "steer-1"}
    again = await http.post(f"{gw.url}/api/runs/{run_id}/messages",
                            json={"content": "say also this, from the steer", "id": "steer-1"})
    assert again.status_code == 202  # a retry: delivered once
    chunks = await whole_log(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_FINISHED"
    users = [c for c in chunks if c["type"] == "TEXT_MESSAGE_START" and c.get("role") == "user"]
    assert [u["messageId"] for u in users] == ["input:steer-1"]
    text = texts(chunks)
    assert text.index("working") < text.index("say also this, from the steer") < text.index("also this, from the steer\n")
    saved = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"][-1] == "say also this, from the steer"
    ended = await http.post(f"{gw.url}/api/runs/{run_id}/messages", json={"content": "too late"})
    assert ended.status_code == 409 and ended.json()["reason"] == "RUN_ENDED"


async def test_bad_answers_get_clear_errors(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo x")
    url = f"{gw.url}/api/runs/{run_id}/approvals"
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"Authorization": "Bearer key-beta"}) as beta:
        other = await beta.post(f"{url}/{approval}", json={"approved": True})
        assert other.status_code == 404 and other.json()["reason"] == "APPROVAL_NOT_FOUND"
        assert (await beta.get(f"{gw.url}/api/runs/{run_id}")).status_code == 404
        steer = await beta.post(f"{gw.url}/api/runs/{run_id}/messages", json={"content": "hi"})
        assert steer.status_code == 404
    unknown = await http.post(f"{url}/req-unknown", json={"approved": True})
    assert unknown.status_code == 404 and unknown.json()["reason"] == "APPROVAL_NOT_FOUND"
    no_run = await http.post(f"{gw.url}/api/runs/{unique('nope-')}/approvals/{approval}", json={"approved": True})
    assert no_run.status_code == 404
    for bad in ({}, {"approved": "yes"}, {"approved": False, "updatedInput": {"command": "x"}},
                {"approved": True, "message": 5}, {"approved": True, "updatedInput": [1]}):
        r = await http.post(f"{url}/{approval}", json=bad)
        assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", (bad, r.text)
    assert (await http.post(f"{url}/bad%20id", json={"approved": True})).status_code == 400
    steer_url = f"{gw.url}/api/runs/{run_id}/messages"
    for bad in ({"content": "half a pair \ud800"}, {"content": "\x01" * 20000},  # 120 KB once escaped
                {"content": "x" * (64 * 1024 + 1)}):
        # As a browser's JSON.stringify sends it (a lone surrogate as a \u escape).
        r = await http.post(steer_url, content=json.dumps(bad), headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", (len(bad["content"]), r.text)
    r = await http.post(f"{url}/{approval}", content=json.dumps({"approved": False, "message": "no \udfff"}),
                        headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", r.text
    # A field the request does not take (the gRPC spelling, a typo) is refused, naming it:
    # dropped, it would approve the unedited command.
    r = await http.post(f"{url}/{approval}", json={"approved": True, "updated_input": {"command": "echo edited"}})
    assert r.status_code == 400 and r.json()["field"] == "updated_input", r.text
    r = await http.post(f"{gw.url}/api/runs/{run_id}/messages", json={"content": "hi", "role": "user"})
    assert r.status_code == 400 and r.json()["field"] == "role", r.text
    r = await http.post(f"{gw.url}/api/chat/cancel", json={"runId": run_id, "reason": "user"})
    assert r.status_code == 400 and r.json()["field"] == "reason", r.text
    # Numbers JSON has not (Python's parser takes them; stored, they broke every view of the run).
    for number in ("NaN", "Infinity", "-Infinity", "1e999"):
        r = await http.post(f"{url}/{approval}", content='{"approved": true, "updatedInput": {"command": "echo x", '
                            f'"n": {number}}}}}', headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", (number, r.text)
    from baton.v1 import runs_service_pb2 as rpb, runs_service_pb2_grpc as rpbg
    async with grpc.aio.insecure_channel(f"127.0.0.1:{gw.state.grpc_port}") as ch:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await rpbg.RunsStub(ch).AnswerApproval(rpb.ApprovalAnswerRequest(
                run_id=run_id, approval_id=approval, approved=True, updated_input_json='{"n": NaN}'),
                metadata=[("authorization", "Bearer key-alpha")])
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, refused.value
    taken = await http.post(steer_url, json={"content": "hi", "id": approval})  # one id space
    assert taken.status_code == 409 and taken.json()["reason"] == "INPUT_ID_TAKEN", taken.text
    assert [i["kind"] for i in (await view(http, gw, run_id))["inputs"]] == ["approval"]
    # None of that answered it: the run still waits, and the user's answer goes through.
    assert (await view(http, gw, run_id))["awaitingApproval"] is True
    assert (await answer(http, gw, run_id, approval, True)).status_code == 200
    assert terminal(await whole_log(http, gw, run_id))["type"] == "RUN_FINISHED"


async def test_grpc_answers_the_same_approval(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    from baton import errors as e
    from baton.grpc_client import RunsClient

    _, run_id, approval = await ask(gw, "run echo over grpc && echo again")
    async with RunsClient(f"127.0.0.1:{gw.state.grpc_port}", api_key="key-alpha") as runs:
        info = await runs.get_run(run_id)
        assert info.awaiting_approval and [i.id for i in info.inputs] == [approval]
        stored = await runs.answer_approval(run_id, approval, True, updated_input={"command": "echo changed"})
        assert stored.decision == "allow" and stored.state == "answered"
        with pytest.raises(e.ApprovalAlreadyAnswered) as info2:
            await runs.answer_approval(run_id, approval, False)
        assert json.loads(info2.value.approval)["decision"] == "allow"
        with pytest.raises(e.ApprovalNotFound):
            await runs.answer_approval(run_id, "req-none", True)
    chunks = await whole_log(http, gw, run_id)
    assert [c["content"] for c in results_in(chunks)] == ["changed"]  # the answer's input ran


# --- a second message to a busy thread (multitask) -----------------------------------------

def chat(thread: str, prompt: str, multitask: str | None = None) -> dict[str, Any]:
    b: dict[str, Any] = {"threadId": thread, "agent": {"kind": "claude-code"},
                         "messages": [{"id": unique("u"), "role": "user", "content": prompt}]}
    if multitask is not None:
        b["multitask"] = multitask
    return b


async def start_busy(gw: Gateway, prompt: str) -> tuple[str, str]:
    """A thread whose first run is working (read until its first text, then left)."""
    thread, run_id = unique("mt-thr-"), unique("run-")
    await read_until(f"{gw.url}/api/chat?runId={run_id}", "POST", lambda c: c["type"] == "TEXT_MESSAGE_CONTENT",
                     json=chat(thread, prompt))
    return thread, run_id


async def test_three_queued_runs_start_in_order_in_the_same_session(cluster: Cluster, gw: Gateway,
                                                                    http: httpx.AsyncClient) -> None:
    thread, first = await start_busy(gw, "say first\nsleep 2\nrun echo one >> log.txt")
    queued = []
    for n in range(1, 4):
        run_id = unique(f"q{n}-")
        prompt = "recall" if n == 3 else f"run echo {n + 1} >> log.txt"
        r = await http.post(f"{gw.url}/api/chat?runId={run_id}", json=chat(thread, prompt, "enqueue"))
        assert r.status_code == 202, r.text
        assert r.json() == {"runId": run_id, "threadId": thread, "status": "queued", "position": n}
        queued.append(run_id)
    again = await http.post(f"{gw.url}/api/chat?runId={queued[0]}", json=chat(thread, "x", "enqueue"))
    assert again.status_code == 202 and again.json()["position"] == 1  # a retried POST queues nothing twice
    listed = (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"]
    assert [(q["runId"], q["position"]) for q in listed] == [(queued[0], 1), (queued[1], 2), (queued[2], 3)]
    assert (await view(http, gw, queued[1]))["status"] == "queued"

    last = await whole_log_when_started(http, gw, queued[2])
    assert terminal(last)["type"] == "RUN_FINISHED"
    # The last turn's agent remembers every earlier turn of the thread, in order.
    assert "1. say first" in texts(last) and "3. run echo 3 >> log.txt" in texts(last)
    starts = [(await view(http, gw, r))["startedAt"] for r in [first, *queued]]
    assert starts == sorted(starts)
    saved = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    users = [m["content"] for m in saved if m["role"] == "user"]
    assert users == ["say first\nsleep 2\nrun echo one >> log.txt", "run echo 2 >> log.txt",
                     "run echo 3 >> log.txt", "recall"]
    assert (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"] == []


async def whole_log_when_started(http: httpx.AsyncClient, gw: Gateway, run_id: str, timeout: float = 60) -> list[Chunk]:
    """The run's whole log once it was dispatched from its queue."""
    from tests.conftest import assert_eventually

    async def started() -> bool:
        return (await http.get(f"{gw.url}/api/runs/{run_id}")).json().get("status") != "queued"
    await assert_eventually(started, timeout=timeout)
    return await whole_log(http, gw, run_id)


async def test_interrupt_cancels_the_active_run_and_streams_the_new_one(cluster: Cluster, gw: Gateway,
                                                                        http: httpx.AsyncClient) -> None:
    thread, first = await start_busy(gw, "say working\nsleep 30\nsay never")
    run_id = unique("run-")
    got = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={run_id}",
                            json=chat(thread, "say instead", "interrupt"))
    assert got.status == 200 and got.ended
    chunks = [c for _, c in got.events]
    assert terminal(chunks)["type"] == "RUN_FINISHED" and "instead" in texts(chunks)
    old = await view(http, gw, first)
    assert old["status"] == "aborted"
    saved = (await http.get(f"{gw.url}/api/threads/{thread}/messages")).json()["messages"]
    assert [m["content"] for m in saved if m["role"] == "user"][-1] == "say instead"


async def test_a_queued_run_id_names_that_run_whatever_a_later_start_asks(cluster: Cluster, gw: Gateway,
                                                                       http: httpx.AsyncClient) -> None:
    thread, first = await start_busy(gw, "say working\nsleep 3\nsay done")
    run_id = unique("q-")
    url = f"{gw.url}/api/chat?runId={run_id}"
    assert (await http.post(url, json=chat(thread, "say queued", "enqueue"))).status_code == 202
    # A plain start (multitask reject) with that id is a retry of the queued run, not a second run.
    again = await http.post(url, json=chat(thread, "say queued"))
    assert again.status_code == 202 and again.json()["status"] == "queued", again.text
    elsewhere = await http.post(url, json=chat(unique("other-thr-"), "say elsewhere"))
    assert elsewhere.status_code == 400 and "runId" in elsewhere.text
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"Authorization": "Bearer key-beta"}) as beta:
        taken = await beta.post(url, json=chat(unique("beta-thr-"), "say mine"))
        assert taken.status_code == 404 and taken.json()["reason"] == "UNKNOWN_RUN", taken.text
    chunks = await whole_log_when_started(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_FINISHED" and "queued" in texts(chunks)
    assert (await view(http, gw, run_id))["threadId"] == thread


async def test_a_retried_interrupt_stops_the_active_run_its_first_attempt_did_not(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway._service import _queue

    thread, first = await start_busy(gw, "say working\nsleep 30\nsay never")
    run_id = unique("run-")
    url = f"{gw.url}/api/chat?runId={run_id}"
    real = _queue._interrupt

    async def gone(st: Any, active_run_id: str) -> None:
        raise RuntimeError("the gateway stopped between queueing and cancelling")
    monkeypatch.setattr(_queue, "_interrupt", gone)
    assert (await http.post(url, json=chat(thread, "say instead", "interrupt"))).status_code == 500
    assert (await view(http, gw, first))["status"] == "running"  # queued, nothing cancelled
    monkeypatch.setattr(_queue, "_interrupt", real)
    got = await read_stream(http, "POST", url, json=chat(thread, "say instead", "interrupt"))  # the client's retry
    assert got.status == 200 and got.ended
    chunks = [c for _, c in got.events]
    assert terminal(chunks)["type"] == "RUN_FINISHED" and "instead" in texts(chunks)
    assert (await view(http, gw, first))["status"] == "aborted"


async def test_steer_through_chat_and_cancel_a_queued_run(cluster: Cluster, gw: Gateway,
                                                          http: httpx.AsyncClient) -> None:
    thread, first = await start_busy(gw, "say working\nsleep 2\nsay done")
    r = await http.post(f"{gw.url}/api/chat?runId=steer-{unique()}", json=chat(thread, "say steered in", "steer"))
    assert r.status_code == 202 and r.json()["runId"] == first and r.json()["status"] == "steered"
    queued = unique("q-") + "/x"  # a "/" in a run id: its DELETE is the queue's, never the thread's
    assert (await http.post(f"{gw.url}/api/chat", params={"runId": queued},
                            json=chat(thread, "say no", "enqueue"))).status_code == 202
    async with httpx.AsyncClient(trust_env=False, timeout=30, headers={"Authorization": "Bearer key-beta"}) as beta:
        assert (await beta.delete(f"{gw.url}/api/threads/{thread}/queue/{queued}")).status_code == 404
        # ... and so is its URL-encoded form ("%2F" reaches the router as "/").
        encoded = queued.replace("/", "%2F")
        assert (await beta.delete(f"{gw.url}/api/threads/{thread}/queue/{encoded}")).status_code == 404
        assert (await beta.get(f"{gw.url}/api/runs/{queued}")).status_code == 404
    assert [q["runId"] for q in (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"]] == [queued]
    gone = await http.delete(f"{gw.url}/api/threads/{thread}/queue/{queued.replace('/', '%2F')}")
    assert gone.status_code == 200 and gone.json() == {"removed": True}
    assert (await http.delete(f"{gw.url}/api/threads/{thread}/queue/{queued}")).status_code == 404
    chunks = await whole_log(http, gw, first)
    assert "steered in" in texts(chunks)
    busy = await http.post(f"{gw.url}/api/chat?runId={unique('r-')}", json=chat(thread, "x", "bogus"))
    assert busy.status_code == 400 and "multitask" in busy.text
    # The cancelled run never starts: once the thread is idle (a dispatcher would have started
    # a queued run then) and its queue empty, it has no record.
    from tests.conftest import assert_eventually

    async def idle_and_empty() -> bool:
        active = (await http.get(f"{gw.url}/api/chat/active?threadId={thread}")).json()["runId"]
        queue = (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"]
        return active is None and queue == []
    await assert_eventually(idle_and_empty, timeout=30)
    assert (await http.get(f"{gw.url}/api/runs/{queued}")).status_code == 404
    idle = await read_stream(http, "POST", f"{gw.url}/api/chat?runId={unique('r-')}",
                             json=chat(thread, "say idle now", "enqueue"))
    # An idle thread starts the run at once, whatever the strategy (read to its end: no run
    # of this module outlives it, for a later module's hosts to take over).
    assert idle.status == 200 and idle.ended and "idle now" in texts([c for _, c in idle.events])


async def test_grpc_queue_and_start_notice(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    from baton import errors as e
    from baton.grpc_client import RunsClient

    thread, first = await start_busy(gw, "say working\nsleep 2\nsay done")
    async with RunsClient(f"127.0.0.1:{gw.state.grpc_port}", api_key="key-alpha") as runs:
        run_id = unique("g-")
        stream = runs.start(run_id, thread, [{"id": "u1", "role": "user", "content": "say queued over grpc"}],
                            agent={"kind": "claude-code"}, multitask="enqueue")
        got = [c async for c in stream]
        assert "queued over grpc" in "".join(c.event.get("delta", "") for c in got)
        assert stream.status == "completed"
        assert await runs.list_queue(thread) == []
        with pytest.raises(e.UnknownRun):
            await runs.cancel_queued(thread, run_id)


async def test_a_cancel_while_it_waits_ends_the_run_and_its_approval(cluster: Cluster, gw: Gateway,
                                                                      http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo never > c.txt")
    r = await http.post(f"{gw.url}/api/chat/cancel?wait=true", json={"runId": run_id})
    assert r.status_code == 200 and r.json()["status"] == "aborted", r.text
    v = await view(http, gw, run_id)
    assert v["awaitingApproval"] is False and v["inputs"][0]["state"] == "pending"
    late = await answer(http, gw, run_id, approval, True)
    assert late.status_code == 409 and late.json()["reason"] == "RUN_ENDED"
    chunks = await whole_log(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_ERROR" and answers_in(chunks) == [] and results_in(chunks) == []


@pytest.mark.node
async def test_tanstack_client_sees_the_approval_once_and_its_own_answer_does_not_reach_the_run(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    """A stock ``@tanstack/ai-client`` ChatClient: its processor turns the request into its
    approval state and emits its approval event, each once; answered through baton's
    endpoint, its stream goes on to the result and it sends nothing more. Its own
    ``addToolApprovalResponse`` answers only in the client: the run still waits, and once the
    run ends the client posts a continuation, a new run that asks again (docs/hitl.md)."""
    from tests.gateway.test_node import need_node, run_node

    node = need_node("@tanstack/ai-client")
    result = await run_node(node, "tanstack_approvals.mjs", {"BATON_GATEWAY_URL": gw.url, "BATON_API_KEY": "key-alpha"},
                            timeout=180)
    asked = result["asked"]
    assert asked["name"] == "Bash" and asked["state"] == "approval-requested"
    assert result["answer"]["body"]["approval"]["id"] == asked["approval"]["id"]
    seen = result["seen"]
    assert seen["askChunks"] == 1
    assert [(e["approvalId"], e["toolName"], e["input"]["command"]) for e in seen["approvalEvents"]] == [
        (asked["approval"]["id"], "Bash", "echo from tanstack")]
    assert seen["partStates"].count("approval-requested") == 1 and seen["partStates"][-1] == "complete"
    assert result["toolResults"] == ["from tanstack"] and len(result["posts1"]) == 1
    chunks = await whole_log(http, gw, result["runId"])
    assert approvals_in(chunks) == [asked["approval"]["id"]]
    assert terminal(chunks)["type"] == "RUN_FINISHED"

    own = result["ownAnswer"]
    assert own["partState"] == "approval-responded"  # the client shows it answered ...
    assert own["awaitingApproval"] is True and own["inputs"] == [{"state": "pending", "decision": None}]  # ... baton not
    assert own["postsWhileWaiting"] == 1 and own["answer"] == 200 and own["first"] == {"status": "completed",
                                                                                       "inputs": ["allow"]}
    first, cont = own["posts"]
    assert cont["runId"] == own["continuation"]["runId"] != first["runId"] and cont["messages"] == 3
    assert own["continuation"]["asked"] == ["echo own answer"]  # the same command, asked again
    stopped = await view(http, gw, own["continuation"]["runId"])
    assert stopped["status"] == "aborted"


async def test_a_queued_run_outlives_the_gateway_that_queued_it(cluster: Cluster, gw: Gateway, make_gateway: Any,
                                                                http: httpx.AsyncClient) -> None:
    first_gw = await make_gateway(keepalive=0.5, api_keys=KEYS)
    thread, first = await start_busy(first_gw, "say working\nsleep 2\nsay done")
    queued = unique("q-")
    r = await http.post(f"{first_gw.url}/api/chat?runId={queued}", json=chat(thread, "say after the gateway", "enqueue"))
    assert r.status_code == 202
    await first_gw.stop()  # its dispatcher is gone with it: another gateway's starts the run
    chunks = await whole_log_when_started(http, gw, queued)
    assert terminal(chunks)["type"] == "RUN_FINISHED" and "after the gateway" in texts(chunks)


async def test_a_steered_message_outlives_the_host_that_drove_the_run(cluster: Cluster, gw: Gateway,
                                                                      http: httpx.AsyncClient) -> None:
    thread, run_id = await start_busy(gw, "say working\nsleep 4\nsay done")
    await cluster.kill(await driver_of(http, gw, run_id))
    try:
        r = await http.post(f"{gw.url}/api/runs/{run_id}/messages", json={"content": "say steered while it was down",
                                                                          "id": "steer-down"})
        assert r.status_code == 202
        chunks = await whole_log(http, gw, run_id)  # the join brings a successor, which delivers it
        assert terminal(chunks)["type"] == "RUN_FINISHED"
        users = [c["messageId"] for c in chunks if c["type"] == "TEXT_MESSAGE_START" and c.get("role") == "user"]
        assert users == ["input:steer-down"]
        said: dict[str, str] = {}
        for c in chunks:
            if c["type"] == "TEXT_MESSAGE_CONTENT" and not c["messageId"].startswith("input:"):
                said[c["messageId"]] = said.get(c["messageId"], "") + c["delta"]
        assert list(said.values()).count("steered while it was down") == 1  # the agent took it once
    finally:
        await cluster.add_host()


def agent_pids(run_id: str) -> list[int]:
    """The run's agent processes (the stand-in ``claude`` writing to its journal)."""
    from baton.ids import file_stem

    journal = f"{file_stem(run_id)}.ndjson"
    pids = []
    for proc in pathlib.Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            out = os.readlink(proc / "fd" / "1")
            cmd = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if out.endswith(journal) and b"claude" in cmd:
            pids.append(int(proc.name))
    return pids


async def kill_agent(run_id: str) -> None:
    """SIGKILL the run's agent process and return once it is dead (gone, or a zombie): a
    signal is delivered after ``kill`` returns, and an answer relayed before the death is an
    answer the process may have acted on (docs/hitl.md "A resumed agent")."""
    pids = await assert_eventually(lambda: agent_pids(run_id), timeout=30)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)

    await assert_eventually(lambda: all(process_state(p) in ("", "Z", "X") for p in pids), timeout=30)


def resumed_once(chunks: list[Chunk], approval: str) -> None:
    """The relaunched process asked again for the same call: one request, one repeat."""
    assert approvals_in(chunks) == [approval]
    again = [c["value"] for c in chunks if c["type"] == "CUSTOM" and c.get("name") == "approval.reasked"]
    assert [a["approvalId"] for a in again] == [approval]
    assert len([c for c in chunks if c["type"] == "CUSTOM" and c.get("name") == "claude.init"]) == 2


async def answer_until_done(http: httpx.AsyncClient, gw: Gateway, run_id: str, approved: bool) -> list[str]:
    """As a user would: answer every approval the run asks for until it ends; their ids."""
    answered: list[str] = []

    async def ended() -> bool:
        v = await view(http, gw, run_id)
        for i in v["inputs"]:
            if i["kind"] == "approval" and i["state"] == "pending" and i["id"] not in answered:
                r = await answer(http, gw, run_id, i["id"], approved)
                assert r.status_code in (200, 409), r.text
                answered.append(i["id"])
        return v["status"] not in ("running", "queued")
    await assert_eventually(ended, timeout=90, interval=0.1)
    return answered


async def test_an_agent_killed_just_after_its_allow_is_asked_again_never_run_twice(
        cluster: Cluster, gw: Gateway, http: httpx.AsyncClient) -> None:
    # The command appends at once, then takes a while: the agent is killed after it ran part of
    # the call and before it wrote the call's result.
    name = f"{unique('twice-')}.txt"
    _, run_id, approval = await ask(gw, f"run echo ran >> {name} && sleep 3 && cat {name}")
    assert (await answer(http, gw, run_id, approval, True)).status_code == 200
    # Until the relay passed the allow to the agent's stdin (its answer activity in the log).
    async with asyncio.timeout(30):
        await read_until(f"{gw.url}/api/chat?runId={run_id}&offset=-1", "GET", lambda c: bool(answers_in([c])))
    [written] = await assert_eventually(lambda: list(cluster.tmp.rglob(name)), timeout=30)
    for pid in agent_pids(run_id):
        os.kill(pid, signal.SIGKILL)
    # The resumed process asks again: a new approval (the allow is not given twice unasked);
    # the user denies it.
    again = await answer_until_done(http, gw, run_id, False)
    chunks = await whole_log(http, gw, run_id)
    [notice] = [c["value"] for c in chunks if c["type"] == "CUSTOM" and c.get("name") == "approval.asked_again"]
    assert notice["previousApprovalId"] == approval and notice["mayHaveRun"] is True
    assert again == [notice["approvalId"]] and approvals_in(chunks) == [approval, notice["approvalId"]]
    assert not [c for c in chunks if c["type"] == "CUSTOM" and c.get("name") == "approval.redelivered"]
    assert written.read_text() == "ran\n"  # once
    assert terminal(chunks)["type"] == "RUN_FINISHED"


async def test_the_agent_process_dies_while_it_waits_and_is_resumed(cluster: Cluster, gw: Gateway,
                                                                    http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo resumed >> r.txt && cat r.txt")
    tool_call = (await view(http, gw, run_id))["inputs"][0]["toolCallId"]
    await kill_agent(run_id)
    r = await answer(http, gw, run_id, approval, True)
    assert r.status_code == 200, r.text
    chunks = await whole_log(http, gw, run_id)
    assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
    resumed_once(chunks, approval)
    in_order_once(chunks, approval, tool_call)  # the answer reached the new process once
    assert [c["content"] for c in results_in(chunks)] == ["resumed"]  # the command ran once
    assert (await view(http, gw, run_id))["status"] == "completed"


async def test_the_host_and_the_agent_process_die_and_the_successor_resumes_it(cluster: Cluster, gw: Gateway,
                                                                              http: httpx.AsyncClient) -> None:
    _, run_id, approval = await ask(gw, "run echo both >> b.txt && cat b.txt")
    before = await view(http, gw, run_id)
    await cluster.kill(await driver_of(http, gw, run_id))
    try:
        await kill_agent(run_id)
        r = await answer(http, gw, run_id, approval, True)
        assert r.status_code == 200, r.text
        chunks = await whole_log(http, gw, run_id)
        assert (await view(http, gw, run_id))["epoch"] > before["epoch"]
        assert terminal(chunks)["type"] == "RUN_FINISHED", terminal(chunks)
        resumed_once(chunks, approval)
        in_order_once(chunks, approval, before["inputs"][0]["toolCallId"])
        assert [c["content"] for c in results_in(chunks)] == ["both"]
    finally:
        await cluster.add_host()


async def test_a_full_queue_refuses_the_next_run(cluster: Cluster, gw: Gateway, http: httpx.AsyncClient,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway._service import _queue

    monkeypatch.setattr(_queue, "MAX_QUEUED_RUNS", 2)  # the gateway runs in this process
    thread, first = await start_busy(gw, "say working\nsleep 3\nsay done")
    queued = [unique("qf-") for _ in range(2)]
    for run_id in queued:
        r = await http.post(f"{gw.url}/api/chat", params={"runId": run_id}, json=chat(thread, "say later", "enqueue"))
        assert r.status_code == 202, r.text
    over = await http.post(f"{gw.url}/api/chat", params={"runId": unique("qf-")},
                           json=chat(thread, "say one too many", "enqueue"))
    assert over.status_code == 429 and over.json()["reason"] == "QUEUE_FULL" and over.json()["limit"] == "2"
    listed = (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"]
    assert [q["runId"] for q in listed] == queued
    for run_id in queued:
        assert (await http.delete(f"{gw.url}/api/threads/{thread}/queue/{run_id}")).status_code == 200
    assert terminal(await whole_log(http, gw, first))["type"] == "RUN_FINISHED"


async def test_deleting_a_thread_drops_its_queued_runs(cluster: Cluster, make_gateway: Any,
                                                       http: httpx.AsyncClient) -> None:
    """A run still queued when its thread is deleted never starts on the deleted thread."""
    gw = await make_gateway(keepalive=0.5, grpc_listen="127.0.0.1:0", api_keys=KEYS)
    # This gateway's dispatcher is stopped (it runs in this process), so the queued run waits
    # while the thread goes idle: the moment a delete may come in.
    [dispatcher] = [t for t in asyncio.all_tasks() if t.get_name() == "queue-dispatcher"
                    and t.get_coro() is not None and not t.done()][-1:]
    dispatcher.cancel()
    thread, first = await start_busy(gw, "say working\nsleep 1\nsay done")
    queued = unique("qd-")
    r = await http.post(f"{gw.url}/api/chat", params={"runId": queued}, json=chat(thread, "say later", "enqueue"))
    assert r.status_code == 202, r.text
    assert terminal(await whole_log(http, gw, first))["type"] == "RUN_FINISHED"

    async def deleted() -> bool:
        return (await http.delete(f"{gw.url}/api/threads/{thread}")).status_code == 204
    await assert_eventually(deleted, timeout=30)  # once the finished run's record settled
    assert (await http.get(f"{gw.url}/api/threads/{thread}/queue")).json()["queue"] == []
    assert (await http.get(f"{gw.url}/api/runs/{queued}")).status_code == 404
