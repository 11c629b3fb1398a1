"""A join from a snapshot's newest messages (``offset=snapshot&messages=N``, gRPC
``snapshot_messages``) and the route that pages the run's older messages
(``GET /api/runs/{id}/messages``): the newest N messages, an explicit ``snapshot.window``
event naming what was left out, then every chunk after the snapshot once; the pages put
together equal the whole snapshot. Chunks and snapshots are written by the real log writer
to a real nats-server.
"""
from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.log.snapshot import KEPT, Snapshot, encode, kept_kind
from gateway._kept import KeptIndex, served
from tests.conftest import unique
from tests.gateway.conftest import Gateway, read_stream, write_run
from tests.gateway.test_snapshot_join import turns

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def sdlog(dlog: DeliveryLog, log_cfg: LogConfig) -> DeliveryLog:
    """The gateway's log, written with snapshots due every 10 chunks or 1500 bytes (parts of 700 bytes)."""
    return DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500,
                                                    snapshot_part_bytes=700))


def noisy_turns(run_id: str, thread_id: str, n: int) -> list[dict[str, Any]]:
    """:func:`turns` with an agent's notices before each turn (init, per-turn usage, result, a
    subagent over two turns, a name the fold does not know), as a long Claude run has them."""
    plain = turns(run_id, thread_id, n)
    out, per = plain[:2], 8
    for i in range(n):
        out += [{"type": "CUSTOM", "name": "claude.init", "value": {"model": f"model-{i}"}},
                {"type": "CUSTOM", "name": "turn.usage", "value": {"turn": i, "inputTokens": 10 * i}}]
        if i == 2:
            out.append({"type": "SUBAGENT_STARTED", "subagentRunId": f"sa-{run_id}", "name": "Explore"})
        if i == 4:
            out.append({"type": "SUBAGENT_FINISHED", "subagentRunId": f"sa-{run_id}"})
        if i == 1:
            out.append({"type": "CUSTOM", "name": "some.future.notice", "value": {"i": i}})
        out += plain[2 + per * i:2 + per * (i + 1)]
        out.append({"type": "CUSTOM", "name": "claude.result", "value": {"num_turns": i + 1}})
    return out + plain[2 + per * n:]


def window_of(snap: Snapshot, newest: int) -> list[tuple[str | None, dict[str, Any]]]:
    """What a join with ``messages=newest`` must send for ``snap`` (before the chunks after it)."""
    msgs = snap.messages
    first = max(0, len(msgs) - newest)
    # Of the kept chunks, those the fold serves (gateway/_kept.py, checked by its unit tests).
    kept = [ev for ev in snap.events if ev["type"] in KEPT]
    assert snap.kept_at is not None and len(snap.kept_at) == len(kept)
    flags = served(KeptIndex(0, snap.kept_at, tuple(kept_kind(ev) for ev in kept)), first) if first else [True] * len(kept)
    dropped = [id(ev) for ev, ok in zip(kept, flags) if not ok]
    events: list[dict[str, Any]] = []
    for ev in snap.events:
        if ev["type"] == "MESSAGES_SNAPSHOT":
            events.append({"type": "CUSTOM", "name": "snapshot.window", "value": {
                "messagesOmitted": first, "cursor": None, "totalMessages": len(msgs),
                "inputMessages": snap.input_count, "snapshotOffset": str(snap.offset),
                "eventsOmitted": len(dropped)}})
            events.append({"type": "MESSAGES_SNAPSHOT", "messages": msgs[first:]})
        elif id(ev) not in dropped:
            events.append(ev)
    return [(None, ev) for ev in events[:-1]] + [(str(snap.offset), events[-1])]


async def test_a_join_from_the_newest_messages_says_what_it_left_out_and_the_pages_give_the_rest(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = noisy_turns(run_id, thread_id, 12)
    w, offsets = await write_run(sdlog, run_id, chunks[:-5], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    assert b'"msgEnds"' in encode(snap).split(b"\n", 1)[0]  # the head says where each message ends
    k = offsets.index(str(snap.offset)) + 1
    url = f"{gateway.url}/api/chat"
    want = window_of(snap, 5) + list(zip(offsets[k:], chunks[k:-5]))
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", url, stop_after=len(want),
                                params={"runId": run_id, "offset": "snapshot", "messages": "5"})
    window = got.events[1][1]["value"]
    assert window["messagesOmitted"] == len(snap.messages) - 5 > 0 and window["cursor"]
    assert window["eventsOmitted"] > 0  # the older turns' notices: their state, not each one
    want[1][1]["value"]["cursor"] = window["cursor"]
    assert got.events == want
    # The same through ?offset=-1&snapshot=1&messages=5 (TanStack's joinRun keeps the URL's parameters).
    async with asyncio.timeout(30):
        opted = await read_stream(http, "GET", url, stop_after=len(want),
                                  params={"runId": run_id, "offset": "-1", "snapshot": "1", "messages": "5"})
    assert opted.events == want
    # A reconnect keeps messages=5 in its URL: with Last-Event-ID it is a plain resume.
    async with asyncio.timeout(30):
        resumed = await read_stream(http, "GET", url, stop_after=len(offsets) - k,
                                    params={"runId": run_id, "messages": "5"},
                                    headers={"Last-Event-ID": str(snap.offset)})
    assert 0 < len(offsets) - k and resumed.events == list(zip(offsets[k:], chunks[k:-5]))

    # Older messages, page by page from the cursor, until none is left: the whole snapshot.
    # The run goes on meanwhile (a later snapshot): a cursor's older messages do not change.
    await w.append(chunks[-5:])
    await w.close("completed")
    older: list[dict[str, Any]] = []
    cursor, pages = window["cursor"], 0
    while cursor:
        r = await http.get(f"{gateway.url}/api/runs/{run_id}/messages", params={"before": cursor, "limit": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["messages"]) <= 4 and body["firstIndex"] == max(0, window["messagesOmitted"] - 4 * (pages + 1))
        older = body["messages"] + older
        cursor, pages = body["nextCursor"], pages + 1
    assert older + snap.messages[-5:] == snap.messages
    # The newest page without a cursor: the final snapshot's last messages.
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    r = await http.get(f"{gateway.url}/api/runs/{run_id}/messages", params={"limit": 3})
    assert r.json()["messages"] == final[0].messages[-3:] and r.json()["total"] == len(final[0].messages)
    assert r.json()["snapshotOffset"] == str(final[0].offset)


async def test_a_window_as_large_as_the_snapshot_leaves_nothing_out_and_bad_pages_are_refused(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog, dlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 3)
    await write_run(sdlog, run_id, chunks)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    url = f"{gateway.url}/api/chat"
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", url, params={"runId": run_id, "offset": "snapshot", "messages": "1000"})
    assert got.events == window_of(snap, 1000) and got.ended
    # Bad input: a clear 400 naming the field, nothing read.
    for params, field in (({"messages": "0x"}, "messages"), ({"messages": "1001"}, "messages")):
        r = await http.get(url, params={"runId": run_id, "offset": "snapshot", **params})
        assert r.status_code == 400 and r.json()["field"] == field
    pages = f"{gateway.url}/api/runs/{run_id}/messages"
    for params, field in (({"limit": "-1"}, "limit"), ({"before": "not-a-cursor"}, "before")):
        r = await http.get(pages, params=params)
        assert r.status_code == 400 and r.json()["field"] == field, r.text
    # A cursor of another run's messages is refused, not answered with the wrong window.
    other = unique("run")
    await write_run(sdlog, other, turns(other, thread_id, 3))
    async with asyncio.timeout(30):
        cut = await read_stream(http, "GET", url, params={"runId": other, "offset": "snapshot", "messages": "2"})
    cursor = cut.events[1][1]["value"]["cursor"]
    r = await http.get(pages, params={"before": cursor})
    assert r.status_code == 400 and r.json()["field"] == "before"
    # A run without a snapshot: no messages (its joins are from the start); unknown run: 404.
    bare = unique("run")
    await write_run(dlog, bare, turns(bare, thread_id, 1), close=False)
    r = await http.get(f"{gateway.url}/api/runs/{bare}/messages")
    assert r.status_code == 200 and r.json() == {"runId": bare, "total": 0, "firstIndex": 0, "nextCursor": None,
                                                 "snapshotOffset": None, "messages": []}
    r = await http.get(f"{gateway.url}/api/runs/{unique('nope')}/messages")
    assert r.status_code == 404 and r.json()["reason"] == "UNKNOWN_RUN"


@pytest.mark.parametrize("newest", [1, 3, 7, 40, 1000])
async def test_the_newest_messages_are_read_from_only_the_parts_they_are_in(sdlog: DeliveryLog, newest: int) -> None:
    """A cold window reads the snapshot's first part and its last ones (the parts' sequences are
    on its last part), and gives the same events as the whole snapshot cut in memory."""
    from baton.log._snapshots import body_of, latest_final, part_seqs
    from gateway._snapshots import read_window, served_of

    run_id, thread_id = unique("run"), unique("th")
    await write_run(sdlog, run_id, noisy_turns(run_id, thread_id, 12))
    final = await latest_final(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    seqs = part_seqs(final)
    assert seqs is not None and len(seqs) > 5  # parts of 700 bytes
    body = await body_of(sdlog.nc, sdlog.cfg, run_id, final)
    assert body is not None
    cut = await read_window(sdlog, run_id, final, newest)
    assert cut is not None and cut.events == served_of(body, final.seq).window(newest).events


async def test_a_cursor_pages_the_snapshot_it_came_from_when_a_later_one_inserted_before_it(
        gateway: Gateway, http: httpx.AsyncClient, sdlog: DeliveryLog) -> None:
    """A tool result that arrives late is placed right after its call's message, before the
    cursor's position in later snapshots: the pages still come from the cursor's snapshot, so
    they put together exactly the messages the window left out."""
    run_id, thread_id = unique("run"), unique("th")
    chunks: list[dict[str, Any]] = [
        {"type": "RUN_STARTED", "threadId": thread_id, "runId": run_id},
        {"type": "TEXT_MESSAGE_START", "messageId": "m", "role": "assistant"},
        {"type": "TEXT_MESSAGE_CONTENT", "messageId": "m", "delta": "Starting a long task."},
        {"type": "TEXT_MESSAGE_END", "messageId": "m"},
        {"type": "TOOL_CALL_START", "toolCallId": "task", "toolCallName": "Task", "parentMessageId": "m"},
        {"type": "TOOL_CALL_ARGS", "toolCallId": "task", "delta": "{}"},
        {"type": "TOOL_CALL_END", "toolCallId": "task"}]
    for i in range(12):
        chunks += [{"type": "TEXT_MESSAGE_START", "messageId": f"n{i}", "role": "assistant"},
                   {"type": "TEXT_MESSAGE_CONTENT", "messageId": f"n{i}", "delta": f"meanwhile {i} " * 20},
                   {"type": "TEXT_MESSAGE_END", "messageId": f"n{i}"}]
    w, _ = await write_run(sdlog, run_id, chunks, close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None and len(found[0].messages) > 6
    snap = found[0]
    async with asyncio.timeout(30):
        got = await read_stream(http, "GET", f"{gateway.url}/api/chat", stop_after=3,
                                params={"runId": run_id, "offset": "snapshot", "messages": "3"})
    cursor = got.events[1][1]["value"]["cursor"]
    # The task's result comes now: later snapshots hold it right after "m", before the cursor.
    await w.append([{"type": "TOOL_CALL_RESULT", "toolCallId": "task", "messageId": "task-r", "content": "done"}])
    await w.close("completed")
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None and final[0].messages[1]["id"] == "task-r"
    older: list[dict[str, Any]] = []
    while cursor:
        r = await http.get(f"{gateway.url}/api/runs/{run_id}/messages", params={"before": cursor, "limit": 2})
        assert r.status_code == 200, r.text
        older = r.json()["messages"] + older
        cursor = r.json()["nextCursor"]
    assert older + got.events[2][1]["messages"] == snap.messages
