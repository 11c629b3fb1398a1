"""Compaction of old logs on a schedule (coordinator/compaction.py): the leader compacts a
finished run's log to its final snapshot and its end once it is old enough; a join from the
start says so (``CUSTOM stream.compacted``) and shows the same messages; a young, unfinished
or uncovered log is left whole; a reader in the middle gets a gap, never a silent jump.

Real etcd, nats-server, coordinator subprocess and gateway; logs written by the real writer.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, AsyncIterator

import httpx
import pytest

from baton.errors import OffsetExpired
from baton.log import DeliveryLog, LogConfig, latest_snapshot
from baton.log._api import first_on_subject
from baton.log._compact import is_compacted
from baton.transcript import build_transcript
from baton.v1 import runs_pb2
from coordinator import CoordinatorConfig, build_store
from coordinator._store import RunStore
from coordinator.compaction import CompactionSweep
from tests.conftest import assert_eventually, unique
from tests.gateway.conftest import GatewayFactory, read_stream, write_run
from tests.gateway.test_snapshot_join import turns

pytestmark = pytest.mark.timeout(180)
COMPLETED = runs_pb2.RUN_STATUS_COMPLETED


@pytest.fixture
def sdlog(dlog: DeliveryLog, log_cfg: LogConfig) -> DeliveryLog:
    """The shared log, written with snapshots (a final one at the close)."""
    return DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=10, snapshot_bytes=1500,
                                                    snapshot_part_bytes=700))


@pytest.fixture
def plain_log(dlog: DeliveryLog, log_cfg: LogConfig) -> DeliveryLog:
    """The same stream, written without snapshots (a log no snapshot covers)."""
    return DeliveryLog(dlog.nc, dataclasses.replace(log_cfg, snapshot_chunks=0, snapshot_bytes=0))


@pytest.fixture
async def store(etcd: Any) -> AsyncIterator[RunStore]:
    cfg = CoordinatorConfig.from_env({}).with_overrides(prefix=f"/{unique('cp')}/", etcd_endpoints=(etcd.endpoint,))
    s = build_store(cfg)
    yield s
    await s.etcd.close()


async def _first(log: DeliveryLog, run_id: str) -> Any:
    return await first_on_subject(log.nc, log.cfg.stream, log.cfg.subject(run_id))


async def _finished_run(store: RunStore, log: DeliveryLog, finished_at: float, *, close: bool = True,
                        status: int = COMPLETED) -> tuple[str, list[dict[str, Any]], list[str]]:
    run_id, thread_id = unique("run"), unique("th")
    await store.create_or_resume(runs_pb2.RunRecord(run_id=run_id, thread_id=thread_id), False, timeout=5)
    chunks = turns(run_id, thread_id, 4)
    _w, offsets = await write_run(log, run_id, chunks, close=close)
    if status != runs_pb2.RUN_STATUS_RUNNING:
        await store.update_run(run_id, runs_pb2.RunRecord(status=status, finished_at=finished_at),
                               ["status", "finished_at"], 0, 0, timeout=5)
    return run_id, chunks, offsets


async def test_a_sweep_compacts_old_finished_covered_logs_only_and_is_idempotent(
        store: RunStore, sdlog: DeliveryLog, plain_log: DeliveryLog) -> None:
    now = time.time()
    old, _, old_offsets = await _finished_run(store, sdlog, now - 10)
    uncovered, _, uncovered_offsets = await _finished_run(store, plain_log, now - 9)
    running, _, _ = await _finished_run(store, sdlog, 0, close=False, status=runs_pb2.RUN_STATUS_RUNNING)
    young, _, _ = await _finished_run(store, sdlog, now + 5000)  # ended after the cutoff
    sweep = CompactionSweep(store, sdlog, 3600)
    counts = await sweep.sweep(now + 7200)  # an hour past the age for the old ones
    assert (counts["compacted"], counts["uncovered"], counts["failed"]) == (1, 1, 0), counts
    assert is_compacted(await _first(sdlog, old))
    for run_id in (uncovered, running, young):
        first = await _first(sdlog, run_id)
        assert first is not None and not is_compacted(first), run_id
    async with plain_log.read(uncovered, "-1") as r:  # left whole: every chunk still there
        assert [o async for o, _ in r] == uncovered_offsets
    # Idempotent: the next pass starts after what it looked at; a new leader's pass finds it done.
    assert (await sweep.sweep(now + 7200))["compacted"] == 0
    again = await CompactionSweep(store, sdlog, 3600).sweep(now + 7200)
    assert (again["already"], again["compacted"], again["uncovered"]) == (1, 0, 1), again
    final = await latest_snapshot(sdlog.nc, sdlog.cfg, old)
    assert final is not None and final[0].offset == int(old_offsets[-1])


async def test_a_log_younger_than_the_age_is_left_and_looked_at_again(store: RunStore, sdlog: DeliveryLog) -> None:
    # Its record says it ended long ago, its close was stored just now (clocks apart): not yet.
    run_id, _, _ = await _finished_run(store, sdlog, time.time() - 7200)
    sweep = CompactionSweep(store, sdlog, 3600)
    counts = await sweep.sweep()
    assert counts["young"] == 1 and counts["compacted"] == 0, counts
    assert not is_compacted(await _first(sdlog, run_id))
    assert (await sweep.sweep(time.time() + 3600))["compacted"] == 1  # the same sweep looks again


async def test_a_read_from_the_start_of_a_compacted_log_is_a_gap_not_just_the_close(
        store: RunStore, sdlog: DeliveryLog) -> None:
    # The instant between a join's "is it compacted" check and its read: the read itself
    # starts after the purge. Before, it yielded nothing and ended at the close (a silent gap).
    run_id, _, offsets = await _finished_run(store, sdlog, time.time() - 10)
    assert await sdlog.compact(run_id, now=time.time() + 7200, older_than=3600)
    with pytest.raises(OffsetExpired) as info:
        async with sdlog.read(run_id, "-1") as r:
            got = [o async for o, _ in r]
            assert not got
    assert int(info.value.earliest_offset) > int(offsets[-1])


async def test_a_reader_in_the_middle_gets_a_gap_or_everything_never_a_silent_end(
        store: RunStore, sdlog: DeliveryLog) -> None:
    run_id, thread_id = unique("run"), unique("th")
    chunks = turns(run_id, thread_id, 150)  # ~1,200 chunks: more than one fetch of the reader
    _w, offsets = await write_run(sdlog, run_id, chunks)
    got: list[str] = []
    expired: OffsetExpired | None = None
    async with sdlog.read(run_id, "-1") as r:
        try:
            async for offset, _chunk in r:
                got.append(offset)
                if len(got) == 5:
                    assert await sdlog.compact(run_id, now=time.time() + 7200, older_than=3600)
        except OffsetExpired as exc:
            expired = exc
    if expired is None:
        assert got == offsets  # it had them all before they went
    else:
        assert got == offsets[:len(got)] and int(expired.earliest_offset) > int(got[-1])


async def test_the_leader_compacts_on_its_schedule_and_a_join_from_the_start_says_so(
        etcd: Any, nats: Any, log_cfg: LogConfig, sdlog: DeliveryLog, make_gateway: GatewayFactory,
        tmp_path: Any) -> None:
    from baton.coordinator_client import CoordinatorClient
    from baton_tools.testing.cluster import start_coordinator

    coord = await start_coordinator(
        etcd.endpoint, f"/{unique('cpl')}/", log_dir=tmp_path, detached_run_ttl=3600, reaper_interval=0.5,
        BATON_LOG_COMPACT_AFTER="2", BATON_NATS_URL=nats.url, BATON_RUNS_STREAM=log_cfg.stream,
        BATON_SUBJECT_PREFIX=log_cfg.subject_prefix, BATON_THREADS_BUCKET=log_cfg.bucket)
    cc = CoordinatorClient(coord.address)
    try:
        gw = await make_gateway(coordinator=(coord.address,))
        run_id, thread_id = unique("run"), unique("th")
        other = unique("run")
        for rid in (run_id, other):
            await cc.create_or_resume_run(runs_pb2.RunRecord(run_id=rid, thread_id=unique("th") if rid == other
                                                             else thread_id))
        chunks = turns(run_id, thread_id, 5)
        _w, offsets = await write_run(sdlog, run_id, chunks)
        await cc.update_run(run_id, runs_pb2.RunRecord(status=COMPLETED, finished_at=time.time()),
                            ["status", "finished_at"])
        await write_run(sdlog, other, turns(other, thread_id, 2), close=False)  # unfinished: never compacted

        async def compacted() -> bool:
            return is_compacted(await _first(sdlog, run_id))
        await assert_eventually(compacted, timeout=60, interval=0.2)
        assert not is_compacted(await _first(sdlog, other))
        async with httpx.AsyncClient(trust_env=False, timeout=30) as http:
            got = await read_stream(http, "GET", f"{gw.url}/api/chat", params={"runId": run_id, "offset": "-1"})
        final = await latest_snapshot(sdlog.nc, sdlog.cfg, run_id)
        assert final is not None
        marker = {"type": "CUSTOM", "name": "stream.compacted", "value": {"snapshotOffset": offsets[-1]}}
        assert got.events[0] == (None, marker) and got.ended
        shown = [ev for _, ev in got.events[1:]]
        assert shown == list(final[0].events) and final[0].messages == build_transcript(chunks)
    finally:
        await cc.close()
        await coord.stop()
