"""Joining a run from its latest snapshot (offset=snapshot, ?snapshot=1, gRPC from_snapshot):
the snapshot's events, then every chunk after the offset it covers, exactly once and
Last-Event-ID-resumable; with the stock AG-UI and TanStack clients across a snapshot boundary.

Chunks and snapshots are written by the real log writer to a real nats-server.
"""
from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.transcript import build_transcript
from tests.conftest import unique
from tests.gateway.conftest import Gateway, read_stream, write_run
from tests.gateway.test_node import need_node, run_node

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sdlog(dlog: DeliveryLog, log_cfg: LogConfig) -> DeliveryLog:
    """The gateway's log, written with snapshots due every 10 chunks or 1500 bytes (parts of 700 bytes)."""
    return DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500,
                                                    snapshot_part_bytes=700))


def turns(run_id: str, thread_id: str, n: int) -> list[dict[str, Any]]:
    """A run of ``n`` assistant turns (text, a tool call, its result), ended."""
    out: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id},
        {"type": "CUSTOM", "name": "run.accepted",
         "value": {"messages": [{"id": "u1", "role": "user", "content": "Read the files"}]}}]
    for i in range(n):
        m, t = f"{run_id}-m{i}", f"{run_id}-t{i}"
        out += [{"type": "TEXT_MESSAGE_START", "messageId": m, "role": "assistant"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": m, "delta": f"Reading file {i}. "},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": m, "delta": "Here it comes."},
                {"type": "TEXT_MESSAGE_END", "messageId": m},
                {"type": "TOOL_CALL_START", "toolCallId": t, "toolCallName": "Read", "parentMessageId": m},
                {"type": "TOOL_CALL_ARGS", "toolCallId": t, "delta": json.dumps({"path": f"/f{i}.py"})},
                {"type": "TOOL_CALL_END", "toolCallId": t},
                {"type": "TOOL_CALL_RESULT", "toolCallId": t, "messageId": f"{t}-r", "content": f"x = {i}\n" * 5}]
    return out + [{"type": "RUN_FINISHED", "threadId": thread_id, "runId": run_id}]


@pytest.mark.parametrize("ndjson", [False, True], ids=["sse", "ndjson"])
async def test_a_live_run_joined_from_its_snapshot_gets_the_snapshot_then_each_later_chunk_once(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog, ndjson: bool) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 8)
    w, offsets = await write_run(sdlog, run_id, chunks[:-4], close=False)  # mid-turn: the tail is open
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    k = offsets.index(str(snap.offset)) + 1
    assert 0 < k < len(offsets)
    url = f"{gateway.url}/api/chat"
    want = [(None, ev) for ev in snap.events[:-1]] + [(str(snap.offset), snap.events[-1])]
    want += list(zip(offsets[k:], chunks[k:-4]))
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", url, ndjson=ndjson, stop_after=len(want),
                                params={"runId": run_id, "offset": "snapshot"})
    assert got.events == want
    assert [ev["type"] for ev in snap.events] == ["RUN_STARTED", "MESSAGES_SNAPSHOT", "CUSTOM"]  # run.accepted
    assert snap.messages == build_transcript(chunks[:k])
    # The same through ?offset=-1&snapshot=1 (the opt-in of a client that always asks for -1).
    async with asyncio.timeout(30):
        opted = await read_stream(http, "GET", url, ndjson=ndjson, stop_after=len(want),
                                  params={"runId": run_id, "offset": "-1", "snapshot": "1"})
    assert opted.events == want
    # The run goes on: the rest arrives once, then the end.
    rest = await w.append(chunks[-4:])
    await w.close("completed")
    async with asyncio.timeout(30):
        whole = await read_stream(http, "GET", url, ndjson=ndjson, params={"runId": run_id, "offset": "snapshot"})
    final = (await latest_snapshot(sdlog.nc, sdlog.cfg, run_id))
    assert final is not None and final[0].offset == int(rest[-1])  # the final snapshot covers all
    assert whole.events == [(None, ev) for ev in final[0].events[:-1]] + [(rest[-1], final[0].events[-1])]
    assert [ev["type"] for ev in final[0].events][-1] == "RUN_FINISHED"
    assert whole.ended or ndjson


async def test_resume_after_the_snapshot_continues_after_it_and_inside_it_repeats_it(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 6)
    await write_run(sdlog, run_id, chunks[:-3], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    url = f"{gateway.url}/api/chat"
    n = len(snap.events)
    async with asyncio.timeout(30):
        # Cut inside the snapshot: no resume id yet, so the client joins again and gets it whole.
        cut = await read_stream(http, "GET", url, stop_after=n - 1, params={"runId": run_id, "offset": "snapshot"})
        assert all(i is None for i, _ in cut.events)
        again = await read_stream(http, "GET", url, stop_after=n, params={"runId": run_id, "offset": "snapshot"})
        assert [c for _, c in again.events] == list(snap.events)
        # Resumed with the snapshot's id: strictly the chunks after it (a plain offset resume).
        after = await read_stream(http, "GET", url, stop_after=2, params={"runId": run_id, "offset": "snapshot"},
                                  headers={"Last-Event-ID": str(snap.offset)})
        plain = await read_stream(http, "GET", url, stop_after=2, params={"runId": run_id, "offset": str(snap.offset)})
    assert after.events == plain.events and all(i is not None and int(i) > snap.offset for i, _ in after.events)


async def test_a_run_without_a_snapshot_is_joined_from_the_start(gateway: Gateway, http: httpx.AsyncClient,
                                                                  dlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 1)
    # Default thresholds, not closed (a close would write the final snapshot): none yet.
    _, offsets = await write_run(dlog, run_id, chunks, close=False)
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", stop_after=len(chunks),
                                params={"runId": run_id, "offset": "snapshot"})
    assert got.events == list(zip(offsets, chunks))


async def test_stock_clients_joined_from_a_snapshot_show_what_a_join_from_the_start_shows(
        gateway: Gateway, sdlog: DeliveryLog) -> None:
    """@ag-ui/client's HttpAgent and @tanstack/ai-client's joinRun (opted in with
    ``?snapshot=1``) across a snapshot boundary: the same messages as from the start, from far
    fewer chunks."""
    node = need_node("@ag-ui/client", "@tanstack/ai-client")
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 12)
    await write_run(sdlog, run_id, chunks)
    out = await run_node(node, "snapshot_join.mjs", {"BATON_GATEWAY_URL": gateway.url, "BATON_RUN_ID": run_id})
    user = {"id": "u1", "role": "user", "content": "Read the files"}
    # A join from the start replays what the run produced (the client holds its input, or
    # hydrates it); the snapshot replaces the client's messages, so it carries the input too.
    assert out["agui"]["snapshot"] == [user] + out["agui"]["full"]
    assert len(out["agui"]["full"]) == 12 * 2
    # TanStack builds the same parts; its snapshot path sets no createdAt and gives a
    # tool-result part the tool message's id (StreamProcessor.handleMessagesSnapshotEvent).
    def plain(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**{k: v for k, v in m.items() if k != "createdAt"},
                 "parts": [{k: v for k, v in p.items() if not (p["type"] == "tool-result" and k == "id")}
                           for p in m["parts"]]} for m in msgs]
    assert plain(out["tanstack"]["snapshot"]) == [{"id": "u1", "role": "user", "parts": [
        {"type": "text", "content": "Read the files"}]}] + plain(out["tanstack"]["full"])
    assert out["chunks"]["full"] == len(chunks) and out["chunks"]["snapshot"] == 4  # started, messages, run.accepted, finished


async def test_a_compacted_log_joined_from_the_start_says_so_then_gives_the_snapshot(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog) -> None:
    """Compaction keeps the final snapshot and the close; a join from the start gets the
    ``stream.compacted`` marker (no id), the snapshot and the end, never a silent gap; an offset
    inside what was dropped gets the gap."""
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 6)
    w, offsets = await write_run(sdlog, run_id, chunks, close=False)
    # Not closed: nothing to compact. Closed but younger than asked: neither.
    assert not await sdlog.compact(run_id, now=time.time(), older_than=0)
    await w.close("completed")
    assert not await sdlog.compact(run_id, now=time.time(), older_than=3600)
    assert await sdlog.compact(run_id, now=time.time() + 7200, older_than=3600)
    assert await sdlog.compact(run_id, now=time.time() + 7200, older_than=3600)  # idempotent
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None and final[0].offset == int(offsets[-1])
    async with sdlog.read(run_id, str(final[0].offset)) as r:
        assert [c async for c in r] == []
    url = f"{gateway.url}/api/chat"
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", url, params={"runId": run_id, "offset": "-1"})
        snap = await read_stream(http, "GET", url, params={"runId": run_id, "offset": "snapshot"})
        gap = await read_stream(http, "GET", url, params={"runId": run_id, "offset": offsets[3]})
    marker = {"type": "CUSTOM", "name": "stream.compacted", "value": {"snapshotOffset": offsets[-1]}}
    want = [(None, ev) for ev in final[0].events[:-1]] + [(offsets[-1], final[0].events[-1])]
    assert got.events == [(None, marker)] + want and got.ended
    assert snap.events == want and snap.ended
    assert [c["name"] for _, c in gap.events] == ["stream.gap"]
    # The stock client shows the run from it: the same messages as the snapshot holds.
    assert final[0].messages == build_transcript(chunks)
