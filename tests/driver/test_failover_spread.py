"""Orphans of a dead host spread over the hosts with room.

The leader's failover counts its own hand-overs in flight as load (baton.placement), so
the eight runs of one SIGKILLed host do not all land on the host that was least loaded
before any of them was claimed.

What the rule guarantees is where each offer goes, not where every run ends: a host that
does not answer an ``AttachRun`` within its 5 s (a starved machine) is skipped for that run,
which then goes to the next best host (coordinator/failover.py ``attach_somewhere``), and a
run whose successor lost its session is handed over once more. Each such run can tip the
balance by one, so the bound is half the runs plus the runs displaced that way, read from
the coordinator's own log lines and the records' epochs.
"""
from __future__ import annotations

import asyncio
import math
import re
from collections import Counter
from typing import AsyncIterator

import pytest

from baton.v1 import runs_pb2
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

    async def all_handed_over() -> list[runs_pb2.RunRecord]:
        recs = [await cluster.record(r) for r in run_ids]
        assert all(rec.driver_epoch >= 2 for rec in recs), [rec.driver_epoch for rec in recs]
        return recs

    recs = await assert_eventually(all_handed_over, timeout=60, interval=0.1)
    per_host = Counter(rec.driver_host for rec in recs)
    assert set(per_host) <= {b.host_id, c.host_id}, per_host
    coordinator_log = cluster.coordinator.log_path.read_text(errors="replace")
    refused = {r for r in run_ids if re.search(rf"failover: \S+ refused run {r}:", coordinator_log)}
    handed_again = {rec.run_id for rec in recs if rec.driver_epoch > 2}
    displaced = len(refused | handed_again)
    assert max(per_host.values()) <= math.ceil(N / 2) + displaced, (per_host, refused, handed_again)
    if not displaced:
        assert set(per_host) == {b.host_id, c.host_id}, per_host

    async def noted() -> bool:
        # The leader notes each loss on the record after the run's hand-over (both write it):
        # who lost it, who took it, why (the SIGKILLed host's keep-alive broke: crash), when.
        for r in run_ids:
            t = (await cluster.record(r)).last_takeover
            assert (t.from_epoch, t.from_host, t.cause) == (1, a.host_id, "crash"), (r, t)
            assert t.to_host in {b.host_id, c.host_id} and t.lost_at > 0 and t.claimed_at > 0, (r, t)
        return True

    await assert_eventually(noted, timeout=30, interval=0.1)
    for r in run_ids:
        await cluster.wait_status(r, "completed", timeout=120)
