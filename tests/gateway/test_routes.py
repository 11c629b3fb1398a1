"""Record routes, presence, the takeover table, cancel, transcripts, metrics, and POST validation.

Records are made through the real coordinator; no sandbox host runs here (end-to-end tests
with hosts are in ``test_e2e.py``).
"""
from __future__ import annotations

import asyncio
import json
import os
import pathlib
from typing import Any

import httpx
import pytest

from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog, TranscriptStore
from baton.v1 import runs_pb2
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, metric, read_stream, run_chunks, write_run


async def new_record(cc: CoordinatorClient, tenant: str = "", **fields: Any) -> runs_pb2.RunRecord:
    rec, created = await cc.create_or_resume_run(runs_pb2.RunRecord(
        run_id=unique("run"), thread_id=unique("th"), tenant=tenant,
        agent=runs_pb2.AgentSpec(kind="replay"), detach_on_disconnect=True, **fields))
    assert created
    return rec


async def finish(cc: CoordinatorClient, rec: runs_pb2.RunRecord, status: int = runs_pb2.RUN_STATUS_COMPLETED) -> None:
    await cc.update_run(rec.run_id, runs_pb2.RunRecord(status=status, finished_at=1.0), paths=["status", "finished_at"])


async def metrics_text(http: httpx.AsyncClient, gw: Gateway) -> str:
    r = await http.get(f"{gw.url}/metrics")
    assert r.status_code == 200
    return r.text


# --- GET /api/runs, /api/chat/active -----------------------------------------------------


async def test_get_run_returns_the_public_record(gateway: Gateway, http: httpx.AsyncClient,
                                                 cc: CoordinatorClient) -> None:
    rec = await new_record(cc)
    r = await http.get(f"{gateway.url}/api/runs/{rec.run_id}")
    assert r.status_code == 200
    body = r.json()
    assert {k: body[k] for k in ("runId", "threadId", "status", "finishedAt", "error", "driverHost")} == {
        "runId": rec.run_id, "threadId": rec.thread_id, "status": "running", "finishedAt": None,
        "error": None, "driverHost": None}
    assert set(body) >= {"startedAt", "epoch", "detachedSince", "reapAt"}


async def test_get_unknown_run_is_404(gateway: Gateway, http: httpx.AsyncClient) -> None:
    r = await http.get(f"{gateway.url}/api/runs/{unique('nope')}")
    assert r.status_code == 404 and r.json()["reason"] == "UNKNOWN_RUN"


async def test_active_run_of_a_thread(gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    rec = await new_record(cc)
    r = await http.get(f"{gateway.url}/api/chat/active", params={"threadId": rec.thread_id})
    assert r.json() == {"runId": rec.run_id}
    await finish(cc, rec)
    r = await http.get(f"{gateway.url}/api/chat/active", params={"threadId": rec.thread_id})
    assert r.json() == {"runId": None}
    r = await http.get(f"{gateway.url}/api/chat/active")
    assert r.status_code == 400


# --- presence and the takeover table -----------------------------------------------------


async def test_reader_presence_detaches_the_run_when_the_last_reader_leaves(
        gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient, dlog: DeliveryLog) -> None:
    rec = await new_record(cc)
    session = await cc.open_session(ttl=2.0, owner="test-host")
    try:
        await cc.claim_run(rec.run_id, session, "test-host")  # a live driver: no takeover
        await write_run(dlog, rec.run_id, run_chunks(rec.run_id, rec.thread_id, ["x"])[:2], close=False)
        url = f"{gateway.url}/api/chat"
        got = await read_stream(http, "GET", url, params={"runId": rec.run_id, "offset": "-1"}, stop_after=1)
        assert len(got.events) == 1

        async def detached() -> bool:
            view = await cc.get_run(rec.run_id)
            return view.record.HasField("detached_since")
        await assert_eventually(detached)

        # A new reader clears it while connected.
        reader = asyncio.create_task(read_stream(http, "GET", url, params={"runId": rec.run_id, "offset": "-1"}))

        async def attached() -> bool:
            view = await cc.get_run(rec.run_id)
            return not view.record.HasField("detached_since")
        await assert_eventually(attached)
        reader.cancel()
        await asyncio.wait([reader])
        await assert_eventually(detached)
    finally:
        await session.close()


async def test_takeover_table_rows_without_a_live_host(gateway: Gateway, http: httpx.AsyncClient,
                                                       cc: CoordinatorClient, dlog: DeliveryLog) -> None:
    url = f"{gateway.url}/api/chat"
    # Row: no record → serve the log, drive nothing.
    lone = unique("run")
    await write_run(dlog, lone, run_chunks(lone, "t", ["a"]))
    got = await read_stream(http, "GET", url, params={"runId": lone, "offset": "-1"})
    assert got.ended and len(got.events) == 5
    # Row: record terminal → serve the whole log, drive nothing.
    done = await new_record(cc)
    await finish(cc, done)
    await write_run(dlog, done.run_id, run_chunks(done.run_id, done.thread_id, ["b"]))
    got = await read_stream(http, "GET", url, params={"runId": done.run_id, "offset": "-1"})
    assert got.ended and len(got.events) == 5
    # Row: another host holds the claim → serve and tail, drive nothing.
    held = await new_record(cc)
    session = await cc.open_session(ttl=2.0, owner="other-host")
    try:
        await cc.claim_run(held.run_id, session, "other-host")
        chunks = run_chunks(held.run_id, held.thread_id, ["c"])
        await write_run(dlog, held.run_id, chunks)
        got = await read_stream(http, "GET", url, params={"runId": held.run_id, "offset": "-1"})
        assert [c for _, c in got.events] == chunks
    finally:
        await session.close()
    # Row: running, no live claim → a takeover is attempted beside the response; with no
    # host to take it the response is still served whole.
    orphan = await new_record(cc)
    chunks = run_chunks(orphan.run_id, orphan.thread_id, ["d"])
    await write_run(dlog, orphan.run_id, chunks)
    got = await read_stream(http, "GET", url, params={"runId": orphan.run_id, "offset": "-1"})
    assert [c for _, c in got.events] == chunks and got.ended

    text = await metrics_text(http, gateway)
    assert metric(text, "baton_gateway_takeover_decisions_total", decision="no-record") == 1
    assert metric(text, "baton_gateway_takeover_decisions_total", decision="terminal") == 1
    assert metric(text, "baton_gateway_takeover_decisions_total", decision="claimed") == 1
    assert metric(text, "baton_gateway_takeover_decisions_total", decision="takeover") == 1

    async def no_host_outcome() -> bool:
        return metric(await metrics_text(http, gateway), "baton_gateway_takeovers_total",
                      outcome="NoHostAvailable") == 1
    await assert_eventually(no_host_outcome)


# --- cancel --------------------------------------------------------------------------------


async def test_cancel_sets_the_durable_flag_and_answers_202(gateway: Gateway, http: httpx.AsyncClient,
                                                            cc: CoordinatorClient) -> None:
    rec = await new_record(cc)
    r = await http.post(f"{gateway.url}/api/chat/cancel", json={"runId": rec.run_id})
    assert r.status_code == 202 and r.json() == {"runId": rec.run_id, "cancelRequested": True, "runKnown": True}
    view = await cc.get_run(rec.run_id)
    assert view.record.cancel_requested
    # By thread id: the thread's active run.
    rec2 = await new_record(cc)
    r = await http.post(f"{gateway.url}/api/chat/cancel", json={"threadId": rec2.thread_id})
    assert r.status_code == 202 and r.json()["runId"] == rec2.run_id


async def test_cancel_wait_times_out_with_504_when_nobody_finishes_it(
        gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    rec = await new_record(cc)
    r = await http.post(f"{gateway.url}/api/chat/cancel", params={"wait": "true", "timeout": "0.3"},
                        json={"runId": rec.run_id})
    assert r.status_code == 504 and r.json()["reason"] == "CANCEL_WAIT_TIMEOUT"


async def test_cancel_wait_on_a_terminal_run_answers_the_final_record(
        gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    rec = await new_record(cc)
    await finish(cc, rec, runs_pb2.RUN_STATUS_ABORTED)
    r = await http.post(f"{gateway.url}/api/chat/cancel?wait=true", json={"runId": rec.run_id})
    assert r.status_code == 200 and r.json()["status"] == "aborted"


async def test_cancel_of_a_run_not_started_says_so_at_once(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # The intent is kept for the run's start; the answer says the run is not known
    # (a mistyped id looks the same) and a wait does not wait on a run that may never come.
    loop = asyncio.get_running_loop()
    for params in ({}, {"wait": "true"}, {"wait": "true", "timeout": "60"}):
        run_id = unique("not-yet-")
        began = loop.time()
        r = await http.post(f"{gateway.url}/api/chat/cancel", params=params, json={"runId": run_id})
        assert r.status_code == 202, r.text
        assert r.json() == {"runId": run_id, "cancelRequested": True, "runKnown": False}
        assert loop.time() - began < 5, params
    # By thread: a thread nobody ran is an unknown thread, not an unknown run.
    thread_id = unique("no-such-thread-")
    r = await http.post(f"{gateway.url}/api/chat/cancel", json={"threadId": thread_id})
    assert r.status_code == 404 and r.json()["reason"] == "UNKNOWN_THREAD", r.text


@pytest.mark.parametrize("body,params,status", [
    ({"runId": "nope-" + "x" * 8}, {}, 202),  # kept for the run's start
    ({"threadId": "no-such-thread-x1"}, {}, 404),
    ({}, {}, 400),
    ({"runId": 5}, {}, 400),
    ({"runId": "r"}, {"wait": "true", "timeout": "-1"}, 400),
], ids=["run-not-started-yet", "thread-without-active-run", "neither", "not-a-string", "bad-timeout"])
async def test_cancel_bad_input(gateway: Gateway, http: httpx.AsyncClient, body: dict[str, Any],
                                params: dict[str, str], status: int) -> None:
    r = await http.post(f"{gateway.url}/api/chat/cancel", json=body, params=params)
    assert r.status_code == status, r.text


# --- transcripts and agents --------------------------------------------------------------


async def test_thread_messages_returns_the_saved_transcript(gateway: Gateway, http: httpx.AsyncClient,
                                                            dlog: DeliveryLog) -> None:
    thread = unique("th")
    msgs = [{"id": "u1", "role": "user", "content": "hi"}, {"id": "a1", "role": "assistant", "content": "<b>yo</b>"}]
    await TranscriptStore(dlog.nc, dlog.cfg).save(thread, msgs)
    r = await http.get(f"{gateway.url}/api/threads/{thread}/messages")
    assert r.status_code == 200 and r.json()["messages"] == msgs
    # The TanStack hydration probe: GET /api/chat?threadId → {messages, activeRun}, the
    # messages in @tanstack/ai-client's own UIMessage shape (parts).
    r = await http.get(f"{gateway.url}/api/chat", params={"threadId": thread})
    u1 = {"id": "u1", "role": "user", "parts": [{"type": "text", "content": "hi"}]}
    a1 = {"id": "a1", "role": "assistant", "parts": [{"type": "text", "content": "<b>yo</b>"}]}
    assert r.json() == {"messages": [u1, a1], "activeRun": None, "page": {"truncated": False}}
    # Paged as @tanstack/ai-client asks (history.pageSize): the newest first, then older by cursor.
    r = await http.get(f"{gateway.url}/api/chat", params={"threadId": thread, "limit": "1"})
    page = r.json()["page"]
    assert r.json()["messages"] == [a1] and page["truncated"] is True and page["cursor"]
    r = await http.get(f"{gateway.url}/api/chat", params={"threadId": thread, "limit": "1", "before": page["cursor"]})
    assert r.json()["messages"] == [u1] and r.json()["page"] == {"truncated": False}
    for bad in ({"limit": "x"}, {"limit": "1001"}, {"before": "bm9wZQ"}, {"before": "%%"}):
        r = await http.get(f"{gateway.url}/api/chat", params={"threadId": thread, **bad})
        assert r.status_code == 400 and r.json()["reason"] == "INVALID_ARGUMENT", (bad, r.text)


async def test_agents_lists_the_replay_corpus(gateway: Gateway, http: httpx.AsyncClient) -> None:
    r = await http.get(f"{gateway.url}/api/agents")
    body = r.json()
    assert {"kind": "replay", "journal": "claude-stream-json/hello.jsonl", "format": "claude-stream-json",
            "name": "replay: claude-stream-json/hello.jsonl"} in body["agents"]
    assert {a["kind"] for a in body["agents"]} == {"replay", "claude-code", "codex"}
    assert body["default"] == "replay"


async def test_metrics_exposes_runs_by_status_and_readers(gateway: Gateway, http: httpx.AsyncClient,
                                                          cc: CoordinatorClient) -> None:
    await new_record(cc)
    text = await metrics_text(http, gateway)
    assert metric(text, "baton_runs", status="running") >= 1
    assert "baton_gateway_readers 0.0" in text


# --- POST /api/chat validation (no host needed: refused before any host is asked) --------


def chat_body(**over: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"threadId": unique("th"), "runId": unique("run"),
                            "messages": [{"id": "u1", "role": "user", "content": "hi"}],
                            "agent": {"kind": "replay", "journal": "claude-stream-json/hello.jsonl", "speed": 10}}
    body.update(over)
    return body


def outside_symlink(replay_dir: pathlib.Path) -> str:
    link = replay_dir / "claude-stream-json" / "escape.jsonl"
    if not link.exists():
        os.symlink("/etc/hostname", link)
    return "claude-stream-json/escape.jsonl"


@pytest.mark.parametrize("mutate,status,reason", [
    (lambda b, d: b.pop("runId"), 400, "DURABLE_RUN_ID_REQUIRED"),
    (lambda b, d: b.update(runId="x" * 300), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(threadId="a\nb"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.pop("threadId"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(messages=[{"role": "user"}] * 501), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(messages="hi"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(agent={"kind": "shell"}), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(cmd="rm -rf /"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(journal="/etc/passwd"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(journal="../../../../etc/passwd"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(journal=outside_symlink(d)), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(speed=-1), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b["agent"].update(speed="fast"), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(agent={"kind": "claude-code", "apiKey": "sk-secret"}), 400, "INVALID_ARGUMENT"),
    (lambda b, d: b.update(detachOnDisconnect="no"), 400, "INVALID_ARGUMENT"),
], ids=["no-run-id", "long-run-id", "control-char-thread", "no-thread", "too-many-messages", "messages-not-list",
        "unknown-agent-kind", "unknown-agent-field", "journal-outside", "journal-traversal", "journal-symlink-out",
        "negative-speed", "speed-not-number", "unknown-claude-option", "detach-not-bool"])
async def test_start_bad_input_is_refused(gateway: Gateway, http: httpx.AsyncClient, replay_dir: pathlib.Path,
                                          mutate: Any, status: int, reason: str) -> None:
    body = chat_body()
    mutate(body, replay_dir)
    r = await http.post(f"{gateway.url}/api/chat", json=body)
    assert r.status_code == status, r.text
    assert r.json()["reason"] == reason
    assert "sk-secret" not in r.text
    assert (await http.get(f"{gateway.url}/healthz")).status_code == 200


async def test_start_run_id_precedence_header_then_query_then_body(gateway: Gateway, http: httpx.AsyncClient) -> None:
    # Refused for a bad id in the header even though the body's id is fine: the header wins.
    # (Too long for an id, valid in a header: a control character there is refused by the
    # HTTP parser itself, RFC 9110 §5.5, before the gateway sees the request.)
    r = await http.post(f"{gateway.url}/api/chat", json=chat_body(), headers={"X-Run-Id": "x" * 300})
    assert r.status_code == 400 and r.json()["field"] == "X-Run-Id"
    r = await http.post(f"{gateway.url}/api/chat", json=chat_body(), headers={"X-Run-Id": "a\x01b"})
    assert r.status_code == 400
    r = await http.post(f"{gateway.url}/api/chat?runId=a%01b", json=chat_body())
    assert r.status_code == 400 and r.json()["field"] == "runId"


async def test_start_body_not_json_or_too_large(make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(max_body_bytes=2048)
    r = await http.post(f"{gw.url}/api/chat", content=b"{nope", headers={"Content-Type": "application/json"})
    assert r.status_code == 400
    r = await http.post(f"{gw.url}/api/chat", content=b"[1,2]")
    assert r.status_code == 400
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * 4000}])).encode()
    r = await http.post(f"{gw.url}/api/chat", content=big)
    assert r.status_code == 413 and r.json()["reason"] == "BODY_TOO_LARGE"

    async def chunked():  # no Content-Length: the limit holds while reading
        for _ in range(4):
            yield b" " * 1024
    r = await http.post(f"{gw.url}/api/chat", content=chunked())
    assert r.status_code == 413


async def test_start_with_no_live_host_is_503(gateway: Gateway, http: httpx.AsyncClient,
                                              cc: CoordinatorClient) -> None:
    if await cc.list_hosts():
        pytest.skip("hosts are registered in this coordinator")
    r = await http.post(f"{gateway.url}/api/chat", json=chat_body())
    assert r.status_code == 503 and r.json()["reason"] == "NO_HOST_AVAILABLE"


# --- auth and tenancy ----------------------------------------------------------------------


async def test_auth_and_tenancy(make_gateway: Any, http: httpx.AsyncClient, cc: CoordinatorClient,
                                dlog: DeliveryLog) -> None:
    gw = await make_gateway(api_keys={"key-a": "tenant-a", "key-b": "tenant-b"})
    a = {"Authorization": "Bearer key-a"}
    b = {"Authorization": "Bearer key-b"}
    rec = await new_record(cc, tenant="tenant-a")
    # Running: its log open (a run whose log closed is no thread's active run).
    writer, _ = await write_run(dlog, rec.run_id, run_chunks(rec.run_id, rec.thread_id, ["secret"]), close=False)

    assert (await http.get(f"{gw.url}/healthz")).status_code == 200
    assert (await http.get(f"{gw.url}/readyz")).status_code == 200
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic key-a"}):
        r = await http.get(f"{gw.url}/api/runs/{rec.run_id}", headers=headers)
        assert r.status_code == 401 and "key-a" not in r.text
        assert r.headers["www-authenticate"] == "Bearer"
    assert (await http.get(f"{gw.url}/api/runs/{rec.run_id}", headers=a)).status_code == 200
    # Another tenant sees nothing of it: 404 everywhere, never the log.
    assert (await http.get(f"{gw.url}/api/runs/{rec.run_id}", headers=b)).status_code == 404
    r = await http.get(f"{gw.url}/api/chat", params={"runId": rec.run_id, "offset": "-1"}, headers=b)
    assert r.status_code == 404
    r = await http.post(f"{gw.url}/api/chat/cancel", json={"runId": rec.run_id}, headers=b)
    assert r.status_code == 404
    assert (await http.get(f"{gw.url}/api/chat/active", params={"threadId": rec.thread_id},
                           headers=b)).json() == {"runId": None}
    assert (await http.get(f"{gw.url}/api/threads/{rec.thread_id}/messages", headers=b)).status_code == 404
    r = await http.post(f"{gw.url}/api/chat", json=chat_body(threadId=rec.thread_id), headers=b)
    assert r.status_code == 404
    # The owner sees it, and reads it once it ended.
    assert (await http.get(f"{gw.url}/api/chat/active", params={"threadId": rec.thread_id},
                           headers=a)).json() == {"runId": rec.run_id}
    await writer.close("completed")
    got = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": rec.run_id, "offset": "-1"},
                            headers=a)
    assert got.ended and got.events[2][1]["delta"] == "secret"
