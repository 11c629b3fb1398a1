"""The bench's pipelined build of a long run (bench/_pipelined.py) stores exactly the records
the product's writer stores waiting for each acknowledgement: chunks, fence, snapshot parts
(small thresholds: many snapshots of many parts) and close, byte for byte with their headers."""
from __future__ import annotations

import pytest
from nats.aio.client import Client as NATS

from baton.log import DeliveryLog
from baton.log._api import record_at
from bench.long_run import workload, write
from tests.log.conftest import unique_cfg

pytestmark = pytest.mark.timeout(240)


async def _records(log: DeliveryLog) -> list[tuple[bytes, list[tuple[str, str]]]]:
    out = []
    seq = 1
    while (rec := await record_at(log.nc, log.cfg.stream, seq)) is not None:
        # Each side has a stream and subject prefix of its own: the rest must be the same.
        out.append((rec.data, sorted((k, v.replace(log.cfg.subject_prefix, "P")) for k, v in rec.headers.items())))
        seq += 1
    return out


async def test_pipelined_build_stores_what_the_writer_stores(nc: NATS) -> None:
    chunks = workload("r1", 1500)
    stored = []
    for pipelined in (False, True):
        log = DeliveryLog(nc, unique_cfg(snapshot_chunks=200, snapshot_bytes=20_000, snapshot_part_bytes=4096))
        await log.provision()
        try:
            if pipelined:
                await write(log, "r1", chunks)
            else:
                w = log.writer("r1", 1)
                await w.fence()
                for i in range(0, len(chunks), 500):
                    await w.append(chunks[i:i + 500])
                assert await w.close("completed")
            stored.append(await _records(log))
        finally:
            js = nc.jetstream()
            await js.delete_stream(log.cfg.stream)
            await js.delete_key_value(log.cfg.bucket)
    plain, piped = stored
    assert sum(1 for _, h in plain if ("Baton-Kind", "snapshot") in h) > 10  # snapshots in parts were written
    assert len(piped) == len(plain) == len(chunks) + 2 + sum(1 for _, h in plain if ("Baton-Kind", "snapshot") in h)
    assert piped == plain
