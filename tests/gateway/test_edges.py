"""At the HTTP edge: unknown runs, offsets of a new run, the end of an EventSource, framing by URL."""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from baton import errors as e
from baton.client import GatewayClient
from baton.coordinator_client import CoordinatorClient
from baton.log import DeliveryLog
from baton.v1 import runs_pb2
from tests.conftest import assert_eventually, unique
from gateway._service import join_view_for
from tests.gateway.conftest import Gateway, metric, read_stream, run_chunks, wait_for_metric, write_run

JOINS_WAITING = "baton_gateway_joins_waiting_for_run"


@pytest.mark.parametrize("ndjson", [False, True], ids=["sse", "ndjson"])
async def test_join_of_an_unknown_run_answers_404(gateway: Gateway, http: httpx.AsyncClient, ndjson: bool) -> None:
    headers = {"Accept": "application/x-ndjson" if ndjson else "text/event-stream"}
    async with asyncio.timeout(15):
        resp = await http.get(f"{gateway.url}/api/chat", params={"runId": "no-such", "offset": "-1"},
                                               headers=headers)
    assert resp.status_code == 404
    assert resp.json()["reason"] == "UNKNOWN_RUN" and resp.json()["run_id"] == "no-such"


async def test_python_client_join_of_an_unknown_run_raises(gateway: Gateway) -> None:
    async with GatewayClient(gateway.url) as client:
        with pytest.raises(e.UnknownRun) as info:
            async with asyncio.timeout(15):
                await anext(aiter(client.join("no-such")))
    assert info.value.run_id == "no-such"


async def test_transcript_of_an_unknown_thread_answers_404(gateway: Gateway, http: httpx.AsyncClient) -> None:
    resp = await http.get(f"{gateway.url}/api/threads/no-such/messages")
    assert resp.status_code == 404 and resp.json()["reason"] == "UNKNOWN_THREAD"


async def test_a_run_created_during_the_join_wait_is_served(gateway: Gateway, http: httpx.AsyncClient,
                                                           dlog: DeliveryLog) -> None:
    """A client that minted the id may join before its POST landed: the join waits (bounded)."""
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["late", " but here"])
    join = asyncio.create_task(read_stream(http, "GET", f"{gateway.url}/api/chat",
                                           params={"runId": run_id, "offset": "-1"}))
    await wait_for_metric(http, gateway.url, JOINS_WAITING, 1)
    _, offsets = await write_run(dlog, run_id, chunks)
    async with asyncio.timeout(15):
        got = await join
    assert got.status == 200 and got.events == list(zip(offsets, chunks)) and got.ended
    assert metric((await http.get(f"{gateway.url}/metrics")).text, JOINS_WAITING) == 0


async def test_the_joins_waiting_gauge_falls_back_when_a_join_times_out_or_is_cancelled(
        gateway: Gateway, http: httpx.AsyncClient) -> None:
    st = gateway.app.state.gateway
    with pytest.raises(e.UnknownRun):
        await join_view_for(st, "", unique("run"), wait=0.2)
    assert metric((await http.get(f"{gateway.url}/metrics")).text, JOINS_WAITING) == 0
    waiting = asyncio.create_task(join_view_for(st, "", unique("run"), wait=60))
    await wait_for_metric(http, gateway.url, JOINS_WAITING, 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert metric((await http.get(f"{gateway.url}/metrics")).text, JOINS_WAITING) == 0


@pytest.mark.parametrize("ndjson", [False, True], ids=["sse", "ndjson"])
async def test_offset_before_a_new_runs_first_chunk_reads_from_the_start(
        gateway: Gateway, http: httpx.AsyncClient, dlog: DeliveryLog, ndjson: bool) -> None:
    """Offsets are stream-wide: ``offset=1`` predates a new run, and nothing of it was lost."""
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["a", "b"])
    _, offsets = await write_run(dlog, run_id, chunks)
    assert int(offsets[0]) > 2  # other runs wrote before: the stream's sequence 1 is not this run's
    async with asyncio.timeout(10):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", ndjson=ndjson,
                                                 params={"runId": run_id, "offset": "1"})
    assert got.events == list(zip(offsets, chunks))


async def test_reconnect_to_a_closed_log_at_its_last_offset_answers_204(gateway: Gateway, http: httpx.AsyncClient,
                                                                       dlog: DeliveryLog) -> None:
    """An EventSource stops reconnecting on 204; ``?offset=`` (not a reconnect) still gets ``: end``."""
    run_id = unique("run")
    _, offsets = await write_run(dlog, run_id, run_chunks(run_id, "t", ["x"]))
    url = f"{gateway.url}/api/chat"
    reconnect = await http.get(url, params={"runId": run_id}, headers={"Last-Event-ID": offsets[-1],
                                                                       "Accept": "text/event-stream"})
    assert reconnect.status_code == 204 and reconnect.content == b""
    earlier = await read_stream(http, "GET", url, params={"runId": run_id}, headers={"Last-Event-ID": offsets[-2]})
    assert earlier.status == 200 and earlier.events == [(offsets[-1], run_chunks(run_id, "t", ["x"])[-1])]
    joined = await read_stream(http, "GET", url, params={"runId": run_id, "offset": offsets[-1]})
    assert joined.status == 200 and joined.events == [] and joined.ended
    async with GatewayClient(gateway.url) as client:
        assert [ev async for ev in client.stream(run_id, offsets[-1])] == []


@pytest.mark.parametrize("fmt,accept,want", [
    ("ndjson", None, "application/x-ndjson"),
    ("ndjson", "text/event-stream", "application/x-ndjson"),
    ("sse", "application/x-ndjson", "text/event-stream"),
    (None, None, "text/event-stream"),
    (None, "application/x-ndjson", "application/x-ndjson"),
])
async def test_the_url_picks_the_framing(gateway: Gateway, http: httpx.AsyncClient, dlog: DeliveryLog,
                                         fmt: str | None, accept: str | None, want: str) -> None:
    run_id = unique("run")
    await write_run(dlog, run_id, run_chunks(run_id, "t", ["x"]))
    params: dict[str, Any] = {"runId": run_id, "offset": "-1"}
    if fmt:
        params["format"] = fmt
    resp = await http.get(f"{gateway.url}/api/chat", params=params, headers={"Accept": accept} if accept else {})
    assert resp.status_code == 200 and resp.headers["content-type"].startswith(want)
    bad = await http.get(f"{gateway.url}/api/chat", params={**params, "format": "xml"})
    assert bad.status_code == 400 and bad.json()["field"] == "format"


async def test_a_finished_run_whose_log_expired_gets_the_gap_at_once(host: Any, gateway: Gateway, http: httpx.AsyncClient,
                                                                     dlog: DeliveryLog, cc: CoordinatorClient) -> None:
    """A terminal run always wrote its close record, so an empty log means retention removed it:
    a join gets one ``stream.gap`` (``earliestOffset`` ``-1``) and ends, never a wait."""
    run_id, thread_id = unique("run"), unique("th")
    body = {"threadId": thread_id, "runId": run_id, "messages": [{"id": "u1", "role": "user", "content": "hi"}],
            "agent": {"kind": "replay", "journal": "claude-stream-json/hello.jsonl", "speed": 10}}
    async with asyncio.timeout(60):
        done = await read_stream(http, "POST", f"{gateway.url}/api/chat", json=body)
    assert done.status == 200 and done.ended
    offsets = [o for o, _ in done.events]

    async def finished() -> bool:  # retention only removes the logs of finished records
        return (await cc.get_run(run_id)).record.status == runs_pb2.RUN_STATUS_COMPLETED
    await assert_eventually(finished, timeout=30)
    await dlog.js.purge_stream(dlog.cfg.stream, subject=dlog.cfg.subject(run_id))
    for after in ("-1", offsets[3]):
        async with asyncio.timeout(15):
            got = await read_stream(http, "GET", f"{gateway.url}/api/chat",
                                                     params={"runId": run_id, "offset": after})
        assert got.status == 200  # and the stream ended: read_stream returned
        assert [c["name"] for _, c in got.events] == ["stream.gap"]
        assert got.events[0][1]["value"]["earliestOffset"] == "-1"

