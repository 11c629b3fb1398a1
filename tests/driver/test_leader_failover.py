"""Failover of a run whose host died while no coordinator led (docs/design.md §3.2).

The failover scheduler watches claim deletions only from the start of its term; a claim
that vanished before (every coordinator was down, or leadership was changing hands) is
found by the sweep each term starts with: running, claimed before, no live claim.
"""
from __future__ import annotations

import asyncio
from typing import AsyncIterator

import pytest

from baton_tools.testing.servers import EtcdServer, NatsServer
from coordinator._etcd import Etcd
from coordinator._store import RunStore
from sandbox_host.translate import translate_bytes
from tests.conftest import assert_eventually
from tests.driver.conftest import CORPUS, Cluster, make_cluster

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"


@pytest.fixture(scope="module")
async def cluster(etcd: EtcdServer, nats: NatsServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Cluster]:
    c = await make_cluster(etcd, nats, tmp_path_factory.mktemp("leader-failover"), hosts=2)
    try:
        yield c
    finally:
        await c.close()


async def test_run_whose_host_died_while_no_coordinator_led_is_taken_over_by_the_next_leader(
        cluster: Cluster) -> None:
    a = cluster.hosts[0]
    started = await cluster.start_run(a, LONG, delay=0.03)
    run_id, thread_id = started.record.run_id, started.record.thread_id

    async def streaming() -> None:  # the agent is launched and its chunks flow
        async with cluster.log.read(run_id, after="-1", stop_at_close=False) as r:
            n = 0
            async for _off, _chunk in r:
                n += 1
                if n >= 20:
                    return

    async with asyncio.timeout(30):
        await streaming()
    await cluster.coordinator.stop()                  # no leader from here on
    a.kill_now()                                       # its claim goes with its lease, unseen
    store = RunStore(Etcd([cluster.etcd_endpoint]), cluster.prefix)
    try:
        async def claim_gone() -> bool:
            _rec, claim = await store.get_run(run_id, timeout=5)
            return claim is None

        await assert_eventually(claim_gone, timeout=15)
    finally:
        await store.etcd.close()
    await cluster.coordinator.start()                  # a new term: it must find the orphan
    rec = await cluster.wait_status(run_id, "completed", timeout=90)
    assert rec.driver_epoch >= 2 and rec.driver_host == cluster.hosts[1].host_id
    chunks = [c for _, c in await cluster.read_all(run_id)]
    expected = translate_bytes("claude-stream-json", (CORPUS / LONG).read_bytes(), run_id, thread_id)
    assert chunks[1]["name"] == "run.accepted" and [chunks[0], *chunks[2:]] == expected  # each chunk once
