"""Reading the delivery log from an offset: catch up, tail, end at close, survive restarts."""
from __future__ import annotations

import asyncio
from typing import Any

import nats
import pytest
from nats.aio.client import Client as NATS

from baton.errors import InvalidOffset, OffsetExpired
from baton.log import DeliveryLog, LogReader
from baton_tools.testing.servers import NatsServer
from tests.conftest import assert_eventually, unique
from tests.log.conftest import chunk, unique_cfg


async def collect(reader: LogReader) -> list[tuple[str, dict[str, Any]]]:
    async with reader:
        return [item async for item in reader]


async def test_resume_after_every_offset_yields_exactly_the_rest(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    n = 300
    chunks = [chunk(i) for i in range(n)]
    offsets = await w.append(chunks)
    await w.close("completed")

    full = await collect(dlog.read(run_id, "-1"))
    assert full == list(zip(offsets, chunks))
    # Every offset near both ends, every 7th between (a read costs the rest of the log).
    for k in sorted({*range(20), *range(0, n, 7), *range(n - 20, n)}):
        rest = await collect(dlog.read(run_id, offsets[k]))
        assert [o for o, _ in rest] == offsets[k + 1 :], k
        assert [c for _, c in rest] == chunks[k + 1 :], k


async def test_chunk_at_reads_one_chunk_of_the_run_and_nothing_else(dlog: DeliveryLog) -> None:
    run_id, other = unique("run"), unique("run")
    w, w2 = dlog.writer(run_id, 1), dlog.writer(other, 1)
    fence = await w.fence()
    await w2.fence()
    offsets = await w.append([chunk(0), chunk(1)])
    elsewhere = await w2.append([chunk(7)])
    assert [await dlog.chunk_at(run_id, int(o)) for o in offsets] == [chunk(0), chunk(1)]
    assert await dlog.chunk_at(run_id, int(fence)) is None  # a fence is no chunk
    assert await dlog.chunk_at(run_id, int(elsewhere[0])) is None  # another run's record
    assert await dlog.chunk_at(run_id, int(offsets[-1]) + 100) is None  # nothing stored there
    assert await dlog.chunk_at(other, int(elsewhere[0])) == chunk(7)


async def test_reader_ends_at_close_and_reports_the_status(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    offsets = await w.append([chunk(0), chunk(1)])
    await w.close("failed", {"message": "boom", "code": "agent_exit"})
    r = dlog.read(run_id, "-1")
    assert [o for o, _ in await collect(r)] == offsets
    assert r.close_status == "failed"
    assert r.close_record is not None and r.close_record.error_code == "agent_exit"
    # reading after the last chunk, or from "now", of a closed log ends at once
    for after in (offsets[-1], "now"):
        r2 = dlog.read(run_id, after)
        assert await collect(r2) == []
        assert r2.close_status == "failed"


async def test_reader_attached_while_writing_sees_every_chunk_once_in_order(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    first = await w.append([chunk(i) for i in range(10)])
    seen: list[tuple[str, dict[str, Any]]] = []
    reader = dlog.read(run_id, "-1")

    async def read() -> None:
        async with reader:
            async for item in reader:
                seen.append(item)

    task = asyncio.create_task(read())
    written = list(first)
    for i in range(10, 300, 10):
        written += await w.append([chunk(j) for j in range(i, i + 10)])
    await w.close("completed")
    async with asyncio.timeout(20):
        await task
    assert [o for o, _ in seen] == written
    assert [c for _, c in seen] == [chunk(i) for i in range(300)]
    assert reader.close_status == "completed"


async def test_now_reads_only_what_comes_later(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    await w.append([chunk(0)])
    reader = dlog.read(run_id, "now")
    await reader.open()
    later = await w.append([chunk(1), chunk(2)])
    await w.close("completed")
    assert await collect(reader) == [(later[0], chunk(1)), (later[1], chunk(2))]


async def test_invalid_offsets_are_refused(dlog: DeliveryLog) -> None:
    for bad in ("", "-2", "abc", "1.5", " 3", "0x10", "１２"):
        with pytest.raises(InvalidOffset):
            dlog.read("r", bad)


async def test_expired_offset_gets_the_gap_error_naming_the_earliest(nc: NATS) -> None:
    log = DeliveryLog(nc, unique_cfg(max_msgs_per_subject=5))
    await log.provision()
    try:
        run_id = unique("run")
        w = log.writer(run_id, 1)
        await w.fence()
        offsets = await w.append([chunk(i) for i in range(10)])
        await w.close("completed")
        # retention kept the last 5 records: offsets[6:] and the close
        with pytest.raises(OffsetExpired) as err:
            await collect(log.read(run_id, offsets[2]))
        assert err.value.earliest_offset == offsets[6]
        assert err.value.offset == offsets[2]
        # the earliest kept offset itself is fine, and -1 starts at what is kept
        assert [o for o, _ in await collect(log.read(run_id, offsets[6]))] == offsets[7:]
        assert [o for o, _ in await collect(log.read(run_id, "-1"))] == offsets[6:]
        # A wholly purged log looks, to the log alone, like a run that has not written yet
        # (offsets are stream-wide); the gateway tells an expired one by its terminal
        # record (tests/gateway/test_edges.py::test_a_finished_run_whose_log_expired_gets_the_gap_at_once).
    finally:
        await nc.jetstream().delete_stream(log.cfg.stream)
        await nc.jetstream().delete_key_value(log.cfg.bucket)


async def test_deleted_consumer_is_recovered_without_gap_or_duplicate(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    written = await w.append([chunk(i) for i in range(5)])
    seen: list[str] = []
    reader = dlog.read(run_id, "-1", idle_heartbeat=0.2)

    async def read() -> None:
        async with reader:
            async for offset, _ in reader:
                seen.append(offset)

    task = asyncio.create_task(read())
    await assert_eventually(lambda: len(seen) == 5)
    consumers = await dlog.js.consumers_info(dlog.cfg.stream)
    assert len(consumers) == 1
    await dlog.js.delete_consumer(dlog.cfg.stream, consumers[0].name)
    written += await w.append([chunk(i) for i in range(5, 10)])
    await assert_eventually(lambda: len(seen) == 10)
    written += await w.append([chunk(10)])
    await w.close("completed")
    async with asyncio.timeout(10):
        await task
    assert seen == written


async def test_nats_restart_during_a_tail_loses_and_doubles_nothing(own_nats: NatsServer) -> None:
    nc = await nats.connect(servers=[own_nats.url], max_reconnect_attempts=-1, reconnect_time_wait=0.1)
    try:
        log = DeliveryLog(nc, unique_cfg())
        await log.provision()
        run_id = unique("run")
        w = log.writer(run_id, 1)
        await w.fence()
        written = await w.append([chunk(i) for i in range(20)])
        seen: list[str] = []
        reader = log.read(run_id, "-1", idle_heartbeat=0.2)

        async def read() -> None:
            async with reader:
                async for offset, _ in reader:
                    seen.append(offset)

        task = asyncio.create_task(read())
        await assert_eventually(lambda: len(seen) == 20)
        own_nats.kill()
        await asyncio.to_thread(own_nats.start)
        await assert_eventually(lambda: nc.is_connected, timeout=20)

        async def append_more() -> list[str]:
            return await w.append([chunk(i) for i in range(20, 40)])

        written += await assert_eventually(append_more, timeout=20)
        await w.close("completed")
        async with asyncio.timeout(30):
            await task
        assert seen == written
        assert reader.consumer_resets >= 1
    finally:
        await nc.close()
