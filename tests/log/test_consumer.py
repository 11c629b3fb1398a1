"""The ordered consumer under the reader: bounded memory, exact order, any start."""
from __future__ import annotations

import asyncio

from baton.log import DeliveryLog
from baton.log._consumer import OrderedConsumer
from tests.conftest import unique
from tests.log.conftest import chunk


async def test_a_slow_reader_holds_at_most_one_batch(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    offsets: list[str] = []
    for i in range(0, 2000, 200):
        offsets += await w.append([chunk(j) for j in range(i, i + 200)])
    seen: list[int] = []
    most = 0
    async with OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), int(offsets[0]), batch=64) as c:
        while len(seen) < 2000:
            seq, _, _, _ = await c.next_raw()
            seen.append(seq)
            most = max(most, c.buffered)
            if len(seen) % 100 == 0:
                await asyncio.sleep(0.01)  # a slow client: the server must wait for us
        assert c.resets == 0
    assert [str(s) for s in seen] == offsets
    assert most <= 64


async def test_headers_only_delivers_no_bodies(dlog: DeliveryLog) -> None:
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    await w.append([chunk(0)])
    async with OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), 1, headers_only=True) as c:
        await c.next()
        rec = await c.next()
    assert rec.data == b"" and rec.headers["Baton-Kind"] == "chunk" and rec.pending == 0


async def test_records_come_from_the_subscriptions_own_queue(dlog: DeliveryLog) -> None:
    # The consumer takes records from nats-py's queue of a callback-less subscription (a
    # private attribute: this fails when nats-py renames it or stops filling it).
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    offsets = await w.append([chunk(0), chunk(1)])
    async with OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), int(offsets[0])) as c:
        assert c._sub is not None and c._sub._cb is None  # no task of nats-py's between us and the read loop
        assert [(await c.next_raw())[0] for _ in offsets] == [int(o) for o in offsets]


async def test_silence_recreates_the_consumer_with_no_gap(dlog: DeliveryLog) -> None:
    # The consumer is deleted behind the reader's back and its heartbeats stop reaching the
    # subscription: the watchdog wakes the reader, which starts over where it was.
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    first = await w.append([chunk(0)])
    async with OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), int(first[0]),
                               idle_heartbeat=0.2) as c:
        assert (await c.next_raw())[0] == int(first[0])
        assert c._sub is not None
        await c._sub.unsubscribe()  # nothing reaches the queue any more: silence
        later = await w.append([chunk(1), chunk(2)])
        async with asyncio.timeout(30):
            got = [(await c.next_raw())[0] for _ in later]
        assert got == [int(o) for o in later]
        assert c.resets >= 1


async def test_a_consumer_slower_to_create_than_three_heartbeats_is_not_silence(dlog: DeliveryLog) -> None:
    # The watchdog starts once the consumer exists and its first pull waits: a create that a
    # loaded server answers after several heartbeat intervals must not read as silence (that
    # reset deleted the new consumer and created another, as slowly, again and again).
    run_id = unique("run")
    w = dlog.writer(run_id, 1)
    await w.fence()
    offsets = await w.append([chunk(0), chunk(1)])
    c = OrderedConsumer(dlog.nc, dlog.cfg.stream, dlog.cfg.subject(run_id), int(offsets[0]), idle_heartbeat=0.05)
    add = c._jsm.add_consumer

    async def slow_add(*args: object, **kwargs: object) -> object:
        await asyncio.sleep(0.5)  # ten heartbeat intervals before the server's answer is used
        return await add(*args, **kwargs)  # type: ignore[arg-type]
    c._jsm.add_consumer = slow_add  # type: ignore[method-assign]
    async with c:
        async with asyncio.timeout(30):
            got = [(await c.next_raw())[0] for _ in offsets]
        assert got == [int(o) for o in offsets]
        assert c.resets == 0
