"""The runs stream takes as many reads at once as BATON_LOG_MAX_CONSUMERS says: nats-server
2.15 gives a stream that names no limit 1,000 consumers, and every read of a run's log is
one (a gateway's shared tail of a run, a lingering tail, a reader behind it). Past the
limit a read waits until another ends, and the service says so."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from nats.aio.client import Client as NATS

from baton.log import DeliveryLog, LogConfig
from baton.log._consumer import OrderedConsumer
from tests.conftest import assert_eventually
from tests.log.conftest import chunk, unique_cfg

pytestmark = pytest.mark.timeout(120)


async def _provisioned(nc: NATS, cfg: LogConfig) -> DeliveryLog:
    log = DeliveryLog(nc, cfg)
    await log.provision()
    return log


async def _drop(nc: NATS, log: DeliveryLog) -> None:
    js = nc.jetstream()
    await js.delete_stream(log.cfg.stream)
    await js.delete_key_value(log.cfg.bucket)


async def test_more_than_a_thousand_runs_are_read_at_once(nc: NATS) -> None:
    log = await _provisioned(nc, unique_cfg())
    try:
        info = await nc.jetstream().stream_info(log.cfg.stream)
        assert info.config.max_consumers == LogConfig().max_consumers == 100_000
        runs = [f"run-{i}" for i in range(1_050)]
        firsts = {}
        for run in runs:
            w = log.writer(run, 1)
            await w.fence()
            firsts[run] = int((await w.append([chunk(0)]))[0])
        readers = [OrderedConsumer(nc, log.cfg.stream, log.cfg.subject(run), firsts[run]) for run in runs]
        try:
            for r in readers:
                await asyncio.wait_for(r.__aenter__(), 10)  # past 1,000 it would wait for a read to end
            got = await asyncio.gather(*(asyncio.wait_for(r.next_raw(), 10) for r in readers))
            assert [seq for seq, *_ in got] == [firsts[run] for run in runs]
        finally:
            await asyncio.gather(*(r.stop() for r in readers))
    finally:
        await _drop(nc, log)


async def test_a_read_past_the_limit_waits_for_another_to_end_and_says_so(
        nc: NATS, caplog: pytest.LogCaptureFixture) -> None:
    log = await _provisioned(nc, unique_cfg(max_consumers=2))
    try:
        w = log.writer("run", 1)
        await w.fence()
        first = int((await w.append([chunk(0)]))[0])

        def reader() -> Any:
            return OrderedConsumer(nc, log.cfg.stream, log.cfg.subject("run"), first)

        a, b, c = reader(), reader(), reader()
        await a.__aenter__()
        await b.__aenter__()
        with caplog.at_level(logging.WARNING, logger="baton.log._consumer"):
            third = asyncio.create_task(c.__aenter__())
            await assert_eventually(lambda: any("max_consumers" in r.getMessage() for r in caplog.records),
                                    timeout=10)
            assert not third.done()  # refused, trying again
        await a.stop()
        await asyncio.wait_for(third, 10)
        seq, *_ = await asyncio.wait_for(c.next_raw(), 10)
        assert seq == first
        await b.stop()
        await c.stop()
    finally:
        await _drop(nc, log)
