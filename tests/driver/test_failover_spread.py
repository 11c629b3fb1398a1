"""Orphans of a dead host spread over the hosts with room.

The leader's failover counts its own hand-overs in flight as load (baton.placement), so
the eight runs of one SIGKILLed host do not all land on the host that was least loaded
before any of them was claimed.
"""
from __future__ import annotations

import asyncio
import math
from collections import Counter
from typing import AsyncIterator

import pytest

from baton_tools.testing.servers import EtcdServer, NatsServer
from tests.conftest import assert_eventually
from tests.driver.conftest import Cluster, make_cluster

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
N = 8


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("spread"), hosts=3,
                           BATON_SESSION_TTL="6")  # a loaded test machine must not lose sessions
    try:
        yield c
    finally:
        await c.close()


async def test_orphans_of_a_dead_host_spread_over_the_hosts_with_room(cluster: Cluster) -> None:
    a, b, c = cluster.hosts
    started = await asyncio.gather(*(cluster.start_run(a, LONG, delay=0.05) for _ in range(N)))
    run_ids = [s.record.run_id for s in started]
    a.kill_now()  # its claims go with its lease; the leader hands all eight over at once

    async def all_handed_over() -> Counter[str]:
        recs = [await cluster.record(r) for r in run_ids]
        assert all(rec.driver_epoch >= 2 for rec in recs), [rec.driver_epoch for rec in recs]
        return Counter(rec.driver_host for rec in recs)

    per_host = await assert_eventually(all_handed_over, timeout=60, interval=0.1)
    assert set(per_host) == {b.host_id, c.host_id}
    assert max(per_host.values()) <= math.ceil(N / 2), per_host
    for r in run_ids:
        await cluster.wait_status(r, "completed", timeout=120)
