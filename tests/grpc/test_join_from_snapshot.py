"""gRPC ``JoinRun`` with ``from_snapshot``: the same stream as the HTTP join from a snapshot
(the snapshot's events, only the last with an offset, then the chunks after it, then the end)."""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.v1 import runs_service_pb2 as pb, runs_service_pb2_grpc as pbg
from tests.conftest import unique
from tests.gateway.conftest import write_run
from tests.gateway.test_snapshot_join import turns
from tests.grpc.conftest import read_events

pytestmark = pytest.mark.timeout(120)


async def test_join_from_snapshot_over_grpc(grpc_gateway: Any, runs: pbg.RunsStub, dlog: DeliveryLog,
                                            log_cfg: LogConfig) -> None:
    sdlog = DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500))
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 6)
    w, offsets = await write_run(sdlog, run_id, chunks[:-3], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    k = offsets.index(str(snap.offset)) + 1
    rest = await w.append(chunks[-3:])
    await w.close("completed")
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    got = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run_id, from_snapshot=True)))
    assert got.error is None and got.end == "completed"
    events = final[0].events
    assert [o for o, _ in got.chunks] == [""] * (len(events) - 1) + [rest[-1]]
    assert [json.loads(j) for _, j in got.chunks] == list(events)
    assert k < len(offsets)


async def _joined_to_newest_three(runs: pbg.RunsStub, dlog: DeliveryLog,
                                  log_cfg: LogConfig) -> tuple[str, Any, Any]:
    """A finished 6-turn run with snapshots, joined over gRPC from its newest 3 messages:
    ``(run id, its final snapshot, what the join read)``."""
    sdlog = DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500))
    run_id, thread_id = unique("run"), unique("th")
    await write_run(sdlog, run_id, turns(run_id, thread_id, 6))
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    got = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run_id, from_snapshot=True, snapshot_messages=3)))
    return run_id, final[0], got


async def test_join_from_the_snapshots_newest_messages_over_grpc(grpc_gateway: Any, runs: pbg.RunsStub,
                                                                 dlog: DeliveryLog, log_cfg: LogConfig) -> None:
    """``snapshot_messages``: the newest N messages after a ``snapshot.window`` chunk (no offset),
    as over HTTP with ``messages=N``."""
    run_id, final, got = await _joined_to_newest_three(runs, dlog, log_cfg)
    msgs = final.messages
    assert got.error is None and got.end == "completed"
    events = [json.loads(j) for _, j in got.chunks]
    assert [o for o, _ in got.chunks][:-1] == [""] * (len(events) - 1)
    assert [ev["type"] for ev in events][:3] == ["RUN_STARTED", "CUSTOM", "MESSAGES_SNAPSHOT"]
    window = events[1]["value"]
    assert events[1]["name"] == "snapshot.window" and window["messagesOmitted"] == len(msgs) - 3 and window["cursor"]
    assert events[2]["messages"] == msgs[-3:]
    bad = await read_events(runs.JoinRun(pb.RunJoinRequest(run_id=run_id, from_snapshot=True,
                                                           snapshot_messages=5000)))
    assert bad.error is not None


async def test_the_messages_a_window_left_out_are_paged_over_grpc(grpc_gateway: Any, runs: pbg.RunsStub,
                                                                 dlog: DeliveryLog, log_cfg: LogConfig) -> None:
    """``GetMessages``: from the ``snapshot.window`` chunk's cursor, page by page, the older
    messages, every one once and in order, as ``GET /api/runs/{id}/messages`` gives them."""
    import grpc

    run_id, final, got = await _joined_to_newest_three(runs, dlog, log_cfg)
    msgs = final.messages
    cursor = json.loads(got.chunks[1][1])["value"]["cursor"]
    older: list[Any] = []
    while cursor:
        page = await runs.GetMessages(pb.RunMessagesRequest(run_id=run_id, limit=2, before=cursor))
        assert page.run_id == run_id and page.total == len(msgs) and page.snapshot_offset == str(final.offset)
        assert page.first_index == len(msgs) - 3 - len(older) - len(json.loads(page.messages_json))
        older = json.loads(page.messages_json) + older
        cursor = page.next_cursor
    assert older + msgs[-3:] == msgs
    newest = await runs.GetMessages(pb.RunMessagesRequest(run_id=run_id, limit=2))
    assert json.loads(newest.messages_json) == msgs[-2:] and newest.next_cursor
    # Bad input: INVALID_ARGUMENT naming the field; an unknown run: NOT_FOUND.
    for req, field in ((pb.RunMessagesRequest(run_id=run_id, before="nope"), "before"),
                       (pb.RunMessagesRequest(run_id=run_id, limit=1001), "limit")):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await runs.GetMessages(req)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and field in (err.value.details() or "")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await runs.GetMessages(pb.RunMessagesRequest(run_id=unique("nope")))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
