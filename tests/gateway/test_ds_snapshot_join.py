"""A run's log on ``/ds`` joined from its latest snapshot (``offset=snapshot``), and a compacted
log read from the start: the snapshot's events, then every chunk after the offset it covers,
exactly once, with real offsets to read on from; a compacted log says so first. With httpx
and the stock ``@durable-streams/client``, on a real nats-server.
"""
from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import httpx
import pytest

from baton.log import DeliveryLog, latest_snapshot
from baton.v1 import runs_pb2
from gateway.durable_streams._runs import to_ds
from tests.conftest import unique
from tests.gateway.conftest import Gateway, write_run
from tests.gateway.test_node import NODE_DIR, need_node, run_node
from tests.gateway.test_snapshot_join import sdlog, turns  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(180)


async def _record(cc: Any, run_id: str, thread_id: str) -> None:
    await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=run_id, thread_id=thread_id, started_at=time.time(),
                                                     status=runs_pb2.RUN_STATUS_RUNNING), interrupt_active=False)


async def test_a_catch_up_read_from_the_snapshot_gives_it_then_the_chunks_after_it(
        gateway: Gateway, http: httpx.AsyncClient, cc: Any, sdlog: DeliveryLog) -> None:  # noqa: F811
    run_id, thread_id = unique("run"), unique("th")
    await _record(cc, run_id, thread_id)
    chunks = turns(run_id, thread_id, 8)
    w, offsets = await write_run(sdlog, run_id, chunks[:-4], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    k = offsets.index(str(snap.offset)) + 1
    assert 0 < k < len(offsets)
    url = f"{gateway.url}/ds/runs/{run_id}"
    r = await http.get(url, params={"offset": "snapshot"})
    assert r.status_code == 200, r.text
    assert r.json() == [*snap.events, *chunks[k:-4]]
    # A real offset (the tail's), not "snapshot": reading on from it gets each later chunk once.
    assert r.headers["stream-next-offset"] == to_ds(int(offsets[-1]))
    assert "stream-closed" not in r.headers
    rest = await w.append(chunks[-4:])
    await w.close("completed")
    more = await http.get(url, params={"offset": r.headers["stream-next-offset"]})
    assert more.json() == chunks[-4:] and more.headers["stream-closed"] == "true"
    # A long-poll from the snapshot answers at once with it.
    final = (await latest_snapshot(sdlog.nc, sdlog.cfg, run_id))
    assert final is not None and final[0].offset == int(rest[-1])
    poll = await http.get(url, params={"offset": "snapshot", "live": "long-poll"})
    assert poll.status_code == 200 and poll.json() == list(final[0].events)
    # Still refused: an offset that is neither a log offset nor "snapshot".
    assert (await http.get(url, params={"offset": "snapshots"})).status_code == 400


async def test_a_run_without_a_snapshot_reads_from_the_start(
        gateway: Gateway, http: httpx.AsyncClient, cc: Any, dlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    await _record(cc, run_id, thread_id)
    chunks = turns(run_id, thread_id, 1)
    await write_run(dlog, run_id, chunks[:-1], close=False)  # open: no final snapshot yet
    assert await latest_snapshot(dlog.nc, dlog.cfg, run_id) is None
    r = await http.get(f"{gateway.url}/ds/runs/{run_id}", params={"offset": "snapshot"})
    assert r.json() == chunks[:-1]


async def test_a_compacted_log_read_from_the_start_says_so_then_gives_the_snapshot(
        gateway: Gateway, http: httpx.AsyncClient, cc: Any, sdlog: DeliveryLog) -> None:  # noqa: F811
    run_id, thread_id = unique("run"), unique("th")
    await _record(cc, run_id, thread_id)
    chunks = turns(run_id, thread_id, 6)
    _, offsets = await write_run(sdlog, run_id, chunks)
    assert await sdlog.compact(run_id, now=time.time() + 7200, older_than=3600)
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert final is not None
    marker = {"type": "CUSTOM", "name": "stream.compacted", "value": {"snapshotOffset": offsets[-1]}}
    url = f"{gateway.url}/ds/runs/{run_id}"
    for params in ({"offset": "-1"}, {}):
        r = await http.get(url, params=params)
        assert r.status_code == 200, r.text
        assert r.json() == [marker, *final[0].events] and r.headers["stream-closed"] == "true"
    snap = await http.get(url, params={"offset": "snapshot"})
    assert snap.json() == list(final[0].events)  # a join from the snapshot: no marker, as over HTTP
    node = need_node("@durable-streams/client")
    for live in ("sse", "long-poll"):
        out = await run_node(node, "ds/run_reader.mjs", {"BATON_DS_URL": url, "BATON_DS_LIVE": live})
        assert out["ok"] and out["items"] == [marker, *final[0].events] and out["closed"], (live, out)


@pytest.mark.parametrize("live", ["sse", "long-poll"])
async def test_the_stock_client_joins_a_live_run_from_its_snapshot_and_reads_on_once(
        gateway: Gateway, cc: Any, sdlog: DeliveryLog, live: str) -> None:  # noqa: F811
    """``@durable-streams/client`` with ``offset: "snapshot"``: the snapshot, then each chunk
    written after it once (across later snapshots), until the run's log closes."""
    node = need_node("@durable-streams/client")
    run_id, thread_id = unique("run"), unique("th")
    await _record(cc, run_id, thread_id)
    chunks = turns(run_id, thread_id, 8)
    w, offsets = await write_run(sdlog, run_id, chunks[:-12], close=False)
    found = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
    assert found is not None
    snap = found[0]
    k = offsets.index(str(snap.offset)) + 1
    env = {**os.environ, "BATON_DS_URL": f"{gateway.url}/ds/runs/{run_id}", "BATON_DS_LIVE": live,
           "BATON_DS_OFFSET": "snapshot"}
    proc = await asyncio.create_subprocess_exec(node, "ds/run_reader.mjs", cwd=NODE_DIR, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        async with asyncio.timeout(90):
            assert proc.stdout is not None
            first = json.loads(await proc.stdout.readline())
            assert "progress" in first, first
            # The reader holds the snapshot: the rest of the run (more snapshots on the way).
            await w.append(chunks[-12:])
            await w.close("completed")
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    result = json.loads([ln for ln in out.decode().splitlines() if ln.startswith('{"ok"')][-1])
    assert result["ok"] and result["closed"], result
    assert result["items"] == [*snap.events, *chunks[k:]]
