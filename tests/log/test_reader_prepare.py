"""A read whose consumer was made ahead of its first iteration (``LogReader.prepare``): the
same records, each once; and a prepared read that is closed unread leaves no consumer."""
from __future__ import annotations

import asyncio
from typing import Any

from baton.log import DeliveryLog
from tests.conftest import assert_eventually, unique
from tests.log.conftest import chunk


async def consumers(dlog: DeliveryLog) -> int:
    return len(await dlog.js.consumers_info(dlog.cfg.stream))


async def written(dlog: DeliveryLog, n: int) -> tuple[str, Any, list[str]]:
    """A fresh run's writer, fenced, with ``n`` chunks appended: (run id, writer, offsets)."""
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    return run_id, w, await w.append([chunk(i) for i in range(n)])


async def test_a_prepared_read_of_a_live_log_yields_every_later_chunk_once_in_order(dlog: DeliveryLog) -> None:
    run_id, w, first = await written(dlog, 10)
    reader = dlog.read(run_id, first[4])
    await reader.open()
    reader.prepare()
    reader.prepare()  # idempotent
    await assert_eventually(lambda: consumers(dlog), timeout=10)  # made before any iteration
    later = await w.append([chunk(i) for i in range(10, 20)])  # written while it waits to be read
    await w.close("completed")
    async with asyncio.timeout(15):
        async with reader:
            got = [item async for item in reader]
    assert [o for o, _ in got] == first[5:] + later
    assert [c for _, c in got] == [chunk(i) for i in range(5, 20)]
    assert reader.close_status == "completed"
    await assert_eventually(lambda: _none(dlog), timeout=10)


async def test_a_prepared_read_closed_unread_removes_its_consumer(dlog: DeliveryLog) -> None:
    run_id, _, offsets = await written(dlog, 3)
    reader = dlog.read(run_id, offsets[0])
    await reader.open()
    reader.prepare()
    await assert_eventually(lambda: consumers(dlog), timeout=10)
    await reader.aclose()
    assert await consumers(dlog) == 0
    # Closed at once, while the consumer was still being made: nothing is left either.
    again = dlog.read(run_id, offsets[0])
    await again.open()
    again.prepare()
    await again.aclose()
    await assert_eventually(lambda: _none(dlog), timeout=10)


async def test_prepare_makes_nothing_for_a_read_that_ended_at_its_open(dlog: DeliveryLog) -> None:
    run_id, w, _ = await written(dlog, 1)
    await w.close("completed")
    tail = await dlog.last_record(run_id)
    assert tail is not None and tail.kind == "close"
    reader = dlog.read(run_id, str(tail.offset))
    await reader.open()
    reader.prepare()
    async with reader:
        assert [item async for item in reader] == []
    assert reader.close_status == "completed"
    assert await consumers(dlog) == 0


async def _none(dlog: DeliveryLog) -> bool:
    return await consumers(dlog) == 0
