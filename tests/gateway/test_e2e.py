"""End to end: gateway + real coordinator + real sandbox host(s) running the replay agent."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from baton import errors as e
from baton.client import GatewayClient, StreamEvent
from baton.coordinator_client import CoordinatorClient
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import SLOW_TEXT, CuttableProxy, Gateway, read_stream

SLOW = "claude-stream-json/slow.jsonl"


def replay_body(thread: str, run: str, journal: str = "claude-stream-json/hello.jsonl", **agent: Any) -> dict[str, Any]:
    return {"threadId": thread, "runId": run, "messages": [{"id": "u1", "role": "user", "content": "go"}],
            "agent": {"kind": "replay", "journal": journal, "speed": agent.pop("speed", 0), **agent}}


def text_of(events: list[tuple[str | None, dict[str, Any]]]) -> str:
    return "".join(c["delta"] for _, c in events if c["type"] == "TEXT_MESSAGE_CONTENT")


async def wait_status(cc: CoordinatorClient, run_id: str, status: int, timeout: float = 30) -> None:
    async def check() -> bool:
        return (await cc.get_run(run_id)).record.status == status
    await assert_eventually(check, timeout=timeout)


async def test_post_chat_streams_the_run_from_the_start_and_saves_the_transcript(
        host: Any, gateway: Gateway, http: httpx.AsyncClient) -> None:
    thread, run = unique("th"), unique("run")
    async with asyncio.timeout(60):
        got = await read_stream(http, "POST", f"{gateway.url}/api/chat", json=replay_body(thread, run),
                                                 headers={"X-Run-Id": run})
    assert got.status == 200 and got.ended
    assert got.headers["content-encoding"] == "gzip"  # httpx admits gzip, as browsers do
    types = [c["type"] for _, c in got.events]
    assert types[0] == "RUN_STARTED" and types[-1] == "RUN_FINISHED"
    assert types[1] == "CUSTOM" and got.events[1][1]["name"] == "run.accepted"
    assert text_of(got.events) == "hello from the replay"
    # The log joined afterwards is exactly what the POST streamed.
    joined = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run, "offset": "-1"})
    assert joined.events == got.events
    r = (await http.get(f"{gateway.url}/api/runs/{run}")).json()
    assert r["status"] == "completed" and r["threadId"] == thread and r["epoch"] >= 1

    async def saved() -> list[Any]:
        msgs = (await http.get(f"{gateway.url}/api/threads/{thread}/messages")).json()["messages"]
        return [m for m in msgs if m.get("role") == "assistant"]
    assistant = await assert_eventually(saved)
    assert "hello from the replay" in str(assistant)


async def test_client_leaving_detaches_and_the_run_goes_on(host: Any, gateway: Gateway, http: httpx.AsyncClient,
                                                           cc: CoordinatorClient) -> None:
    thread, run = unique("th"), unique("run")
    first = await read_stream(http, "POST", f"{gateway.url}/api/chat", stop_after=3,
                              json=replay_body(thread, run, SLOW, speed=1, delay=0.02))
    assert len(first.events) == 3
    await wait_status(cc, run, 3)  # RUN_STATUS_COMPLETED: nobody was watching, it finished anyway
    full = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run, "offset": "-1"})
    assert full.events[:3] == first.events
    assert text_of(full.events) == SLOW_TEXT


async def test_busy_thread_is_409_then_cancel_wait_confirms(host: Any, gateway: Gateway, http: httpx.AsyncClient,
                                                            cc: CoordinatorClient) -> None:
    thread, run1, run2 = unique("th"), unique("run"), unique("run")
    await read_stream(http, "POST", f"{gateway.url}/api/chat", stop_after=2,
                      json=replay_body(thread, run1, SLOW, speed=1, delay=0.3))
    r = await http.post(f"{gateway.url}/api/chat", json=replay_body(thread, run2), headers={"X-Run-Id": run2})
    assert r.status_code == 409
    assert r.json()["activeRunId"] == run1 and r.json()["error"]
    assert (await http.get(f"{gateway.url}/api/chat/active", params={"threadId": thread})).json() == {"runId": run1}

    r = await http.post(f"{gateway.url}/api/chat/cancel", params={"wait": "true", "timeout": "30"},
                        json={"threadId": thread}, timeout=40)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["runId"] == run1 and body["status"] == "aborted" and body["finishedAt"]
    assert body["confirmation"] is not None
    log = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run1, "offset": "-1"})
    assert log.events[-1][1]["type"] == "RUN_ERROR" and log.events[-1][1].get("code") == "cancelled"
    assert log.ended


async def test_detach_on_disconnect_false_cancels_when_the_client_leaves(
        host: Any, gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient) -> None:
    thread, run = unique("th"), unique("run")
    body = replay_body(thread, run, SLOW, speed=1, delay=0.3)
    body["detachOnDisconnect"] = False
    got = await read_stream(http, "POST", f"{gateway.url}/api/chat", json=body, stop_after=2)
    assert len(got.events) == 2
    assert (await cc.get_run(run)).record.cancel_on_disconnect   # the record carries the policy
    try:
        await wait_status(cc, run, 5)  # RUN_STATUS_ABORTED
    except TimeoutError:
        raise AssertionError(f"not aborted: {await cc.get_run(run)}\n{host.log_text()[-4000:]}") from None


async def test_post_resent_with_last_event_id_resumes_and_starts_nothing(
        host: Any, gateway: Gateway, http: httpx.AsyncClient) -> None:
    thread, run = unique("th"), unique("run")
    body = replay_body(thread, run)
    full = await read_stream(http, "POST", f"{gateway.url}/api/chat", json=body, headers={"X-Run-Id": run})
    offsets = [o for o, _ in full.events]
    again = await read_stream(http, "POST", f"{gateway.url}/api/chat", json=body,
                              headers={"X-Run-Id": run, "Last-Event-ID": offsets[3]})
    assert again.events == full.events[4:] and again.ended


async def test_python_client_reconnects_after_a_drop_and_gets_each_chunk_once(
        host: Any, gateway: Gateway) -> None:
    port = int(gateway.url.rsplit(":", 1)[1])
    proxy = await CuttableProxy(port).start()
    try:
        thread, run = unique("th"), unique("run")
        seen: list[StreamEvent] = []
        async with GatewayClient(proxy.url, reconnect_delay=0.05) as gw:
            async for ev in gw.start(run, thread, [{"id": "u", "role": "user", "content": "go"}],
                                     agent={"kind": "replay", "journal": SLOW, "speed": 1, "delay": 0.03}):
                seen.append(ev)
                if len(seen) in (5, 40):
                    proxy.cut()
            joined = [ev async for ev in gw.join(run)]
            nd = [ev async for ev in gw.join(run, ndjson=True)]
            view = await gw.get_run(run)
        assert proxy.connections >= 3
        assert seen == joined == nd
        assert len({ev.offset for ev in seen}) == len(seen)
        assert "".join(ev.chunk.get("delta", "") for ev in seen if ev.chunk["type"] == "TEXT_MESSAGE_CONTENT") == SLOW_TEXT
        assert view["status"] == "completed"
    finally:
        await proxy.close()


async def test_python_client_errors_are_domain_exceptions(host: Any, gateway: Gateway, http: httpx.AsyncClient) -> None:
    thread, run1 = unique("th"), unique("run")
    await read_stream(http, "POST", f"{gateway.url}/api/chat", stop_after=1,
                      json=replay_body(thread, run1, SLOW, speed=1, delay=0.3))
    async with GatewayClient(gateway.url) as gw:
        with pytest.raises(e.ThreadBusy) as busy:
            async for _ in gw.start(unique("run"), thread, []):
                pass
        assert busy.value.active_run_id == run1
        with pytest.raises(e.UnknownRun):
            await gw.get_run(unique("nope"))
        with pytest.raises(e.InvalidArgument):
            async for _ in gw.start("bad\x01id", thread, []):
                pass
        assert await gw.active_run(thread) == run1
        final = await gw.cancel(thread_id=thread, wait=True, timeout=30)
        assert final["status"] == "aborted"


async def test_silent_agent_keeps_the_connection_open(host: Any, make_gateway: Any, http: httpx.AsyncClient) -> None:
    gw = await make_gateway(keepalive=0.2)
    thread, run = unique("th"), unique("run")
    async with asyncio.timeout(30):
        got = await read_stream(http, "POST", f"{gw.url}/api/chat",
                                                 json=replay_body(thread, run, "claude-stream-json/silent.jsonl",
                                                                  speed=1, delay=0.01))
    # 1.5 s without a chunk is more than keep-alive x 4 (0.8 s): comments kept it open.
    assert got.keepalives >= 4
    assert got.ended and text_of(got.events) == "before the silenceafter the silence"


async def test_next_message_right_after_the_end_waits_for_the_previous_runs_status(
        host: Any, gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient, dlog: Any) -> None:
    """A host closes a run's log before it writes the terminal status; a client that read to
    the end and at once sends the thread's next message gets that run, not 409 THREAD_BUSY."""
    from baton.v1 import runs_pb2
    from tests.gateway.conftest import run_chunks, write_run

    thread, first, second = unique("th"), unique("run"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=first, thread_id=thread,
                                                     status=runs_pb2.RUN_STATUS_RUNNING, started_at=1.0),
                                  interrupt_active=False)
    await write_run(dlog, first, run_chunks(first, thread, ["done"]), close=True)

    async def status_lands_late() -> None:
        # The finishing host's status write, one write after its close: it lands only once the
        # start is seen waiting for it (before the fix, the start answered 409 at once).
        async def waiting() -> bool:
            metrics = (await http.get(f"{gateway.url}/metrics")).text
            return "baton_gateway_starts_waiting_for_finish 1.0" in metrics
        await assert_eventually(waiting, timeout=30)
        await cc.update_run(first, runs_pb2.RunRecord(status=runs_pb2.RUN_STATUS_COMPLETED, finished_at=2.0),
                            paths=["status", "finished_at"])

    late = asyncio.create_task(status_lands_late())
    try:
        async with asyncio.timeout(60):
            got = await read_stream(http, "POST", f"{gateway.url}/api/chat",
                                                     json=replay_body(thread, second), headers={"X-Run-Id": second})
    finally:
        await late
    assert got.status == 200 and got.ended
    assert text_of(got.events) == "hello from the replay"


async def test_next_message_after_a_closed_log_whose_status_never_lands_is_refused_busy(
        host: Any, gateway: Gateway, http: httpx.AsyncClient, cc: CoordinatorClient, dlog: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for the previous run's status is bounded: past it, 409 THREAD_BUSY naming that
    run, and the start is no longer counted as waiting."""
    from baton.v1 import runs_pb2
    from gateway._service import _start
    from tests.gateway.conftest import metric, run_chunks, write_run

    monkeypatch.setattr(_start, "FINISHING_WAIT", 0.5)
    thread, first, second = unique("th"), unique("run"), unique("run")
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=first, thread_id=thread,
                                                     status=runs_pb2.RUN_STATUS_RUNNING, started_at=1.0),
                                  interrupt_active=False)
    await write_run(dlog, first, run_chunks(first, thread, ["done"]), close=True)
    resp = await http.post(f"{gateway.url}/api/chat", json=replay_body(thread, second),
                           headers={"X-Run-Id": second}, timeout=60)
    assert resp.status_code == 409 and resp.json()["reason"] == "THREAD_BUSY"
    assert resp.json()["activeRunId"] == first
    assert metric((await http.get(f"{gateway.url}/metrics")).text, "baton_gateway_starts_waiting_for_finish") == 0
    assert (await cc.get_run(first)).record.status == runs_pb2.RUN_STATUS_RUNNING
