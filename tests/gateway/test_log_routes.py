"""Serving delivery logs: join, resume after every offset, live tail, keep-alives, gaps, framing.

Chunks are written with the real log writer to a real nats-server; no host is involved.
"""
from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog, LogConfig
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import Gateway, read_stream, run_chunks, write_run


async def test_join_finished_run_from_start_gives_whole_log_then_closes(gateway: Gateway, http: httpx.AsyncClient,
                                                                        dlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = run_chunks(run_id, thread_id, ["Hel", "lo"])
    _, offsets = await write_run(dlog, run_id, chunks)

    async with asyncio.timeout(10):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id, "offset": "-1"})

    assert got.status == 200
    assert got.events == list(zip(offsets, chunks))
    assert got.ended
    assert got.headers["content-type"].startswith("text/event-stream")
    assert got.headers["cache-control"] == "no-cache, no-transform"
    assert got.headers["x-accel-buffering"] == "no"


@pytest.mark.parametrize("ndjson", [False, True], ids=["sse", "ndjson"])
async def test_resume_after_every_offset_gives_exactly_the_rest(gateway: Gateway, http: httpx.AsyncClient,
                                                                dlog: DeliveryLog, ndjson: bool) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = run_chunks(run_id, thread_id, ["a", "b", "c"])
    _, offsets = await write_run(dlog, run_id, chunks)
    url = f"{gateway.url}/api/chat"

    for k, offset in enumerate(offsets):
        # Reconnect style (Last-Event-ID) and join style (?offset) must agree.
        async with asyncio.timeout(10):
            by_header = await read_stream(
                http, "GET", url, ndjson=ndjson, params={"runId": run_id}, headers={"Last-Event-ID": offset})
        async with asyncio.timeout(10):
            by_query = await read_stream(
                http, "GET", url, ndjson=ndjson, params={"runId": run_id, "offset": offset})
        want = list(zip(offsets[k + 1:], chunks[k + 1:]))
        assert by_header.events == want, f"after offset #{k}"
        assert by_query.events == want, f"after offset #{k}"
    if ndjson:
        assert by_header.headers["content-type"].startswith("application/x-ndjson")


async def test_finished_run_joined_at_its_last_offset_closes_at_once(make_gateway: Any, http: httpx.AsyncClient,
                                                                     dlog: DeliveryLog) -> None:
    # A keep-alive far shorter than the read timeout: a keep-alive loop would show up as
    # comments (and never end, tripping the timeout).
    gw = await make_gateway(keepalive=0.05)
    run_id = unique("run")
    _, offsets = await write_run(dlog, run_id, run_chunks(run_id, "t", ["x"]))

    async with asyncio.timeout(5):
        got = await read_stream(
            http, "GET", f"{gw.url}/api/chat", params={"runId": run_id}, headers={"Last-Event-ID": offsets[-1]})

    # A reconnect (Last-Event-ID) to a closed log with nothing after it: 204, which stops
    # an EventSource from reconnecting.
    assert got.status == 204 and got.events == [] and got.keepalives == 0


async def test_last_event_id_wins_over_offset_query(gateway: Gateway, http: httpx.AsyncClient,
                                                    dlog: DeliveryLog) -> None:
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["1", "2"])
    _, offsets = await write_run(dlog, run_id, chunks)
    got = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id, "offset": "-1"},
                            headers={"Last-Event-ID": offsets[2]})
    assert [o for o, _ in got.events] == offsets[3:]


async def test_live_tail_delivers_appends_then_ends_at_close(gateway: Gateway, http: httpx.AsyncClient,
                                                             dlog: DeliveryLog) -> None:
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["one", "two"])
    w, first = await write_run(dlog, run_id, chunks[:2], close=False)

    reader = asyncio.create_task(read_stream(http, "GET", f"{gateway.url}/api/chat",
                                             params={"runId": run_id, "offset": "-1"}))
    await assert_eventually(lambda: gateway.state.metrics.readers._value.get() == 1)
    rest = await w.append(chunks[2:])
    await w.close("completed")
    async with asyncio.timeout(10):
        got = await reader

    assert got.events == list(zip(first + rest, chunks))
    assert got.ended


async def test_silent_run_keeps_the_connection_open_with_keepalives(make_gateway: Any, http: httpx.AsyncClient,
                                                                    dlog: DeliveryLog) -> None:
    gw = await make_gateway(keepalive=0.1)
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["late"])
    w, _ = await write_run(dlog, run_id, [], close=False)  # fenced, nothing said yet

    seen: list[str] = []

    async def read() -> list[str]:
        async with http.stream("GET", f"{gw.url}/api/chat", params={"runId": run_id, "offset": "-1"}) as resp:
            async for line in resp.aiter_lines():
                seen.append(line)
        return seen

    reader = asyncio.create_task(read())
    # Silent for longer than keep-alive x 4: the connection must still be open.
    await assert_eventually(lambda: seen.count(": keep-alive") >= 6, timeout=10)
    assert not reader.done()
    offsets = await w.append(chunks)
    await w.close("completed")
    async with asyncio.timeout(10):
        lines = await reader
    assert [ln[4:] for ln in lines if ln.startswith("id: ")] == offsets
    assert lines[-2:] == [": end", ""] or lines[-1] == ": end"


async def test_offset_older_than_retention_gets_one_gap_chunk_and_ends(
        make_gateway: Any, http: httpx.AsyncClient, nats: Any) -> None:
    name = unique("GWGAP").upper()
    cfg = LogConfig(stream=name, subject_prefix=f"{name.lower()}.runs", bucket=f"{name.lower()}-threads",
                    max_msgs_per_subject=3)
    async with await DeliveryLog.connect(nats.url, cfg) as small:
        await small.provision()
        gw = await make_gateway(log_config=cfg)
        run_id = unique("run")
        _, offsets = await write_run(small, run_id, run_chunks(run_id, "t", ["a", "b", "c", "d"]), close=False)

        async with asyncio.timeout(10):
            got = await read_stream(http, "GET", f"{gw.url}/api/chat",
                                                     params={"runId": run_id, "offset": offsets[0]})

        # Kept: the last 3 records of the subject (all chunks: the fence went first).
        assert got.events == [(None, {"type": "CUSTOM", "name": "stream.gap",
                                      "value": {"earliestOffset": offsets[-3]}})]
        assert not got.ended


@pytest.mark.parametrize("params,headers,reason", [
    ({"offset": "-1"}, {}, "DURABLE_RUN_ID_REQUIRED"),
    ({"runId": "r"}, {}, "INVALID_ARGUMENT"),
    ({"runId": "r", "offset": "abc"}, {}, "INVALID_OFFSET"),
    ({"runId": "r"}, {"Last-Event-ID": "12x"}, "INVALID_OFFSET"),
    ({"runId": "r" * 300, "offset": "-1"}, {}, "INVALID_ARGUMENT"),
    ({"runId": "bad\x07id", "offset": "-1"}, {}, "INVALID_ARGUMENT"),
], ids=["no-run-id", "no-offset", "bad-offset", "bad-last-event-id", "long-run-id", "control-char"])
async def test_join_bad_input_is_400_and_server_unharmed(gateway: Gateway, http: httpx.AsyncClient,
                                                         params: dict[str, str], headers: dict[str, str],
                                                         reason: str) -> None:
    r = await http.get(f"{gateway.url}/api/chat", params=params, headers=headers)
    assert r.status_code == 400
    assert r.json()["reason"] == reason
    if reason == "DURABLE_RUN_ID_REQUIRED":
        assert r.json()["error"] == ("a runId is required: send it as an X-Run-Id header or a ?runId query param")
    assert (await http.get(f"{gateway.url}/healthz")).status_code == 200


async def test_client_disconnect_ends_the_reader(gateway: Gateway, http: httpx.AsyncClient,
                                                 dlog: DeliveryLog) -> None:
    run_id = unique("run")
    chunks = run_chunks(run_id, "t", ["x"])
    await write_run(dlog, run_id, chunks[:2], close=False)
    got = await read_stream(http, "GET", f"{gateway.url}/api/chat", params={"runId": run_id, "offset": "-1"},
                            stop_after=2)
    assert [c for _, c in got.events] == chunks[:2]
    await assert_eventually(lambda: gateway.state.metrics.readers._value.get() == 0)
