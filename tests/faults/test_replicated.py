"""Issue 19: replicated engines lose their leaders (3-node etcd, 3-node JetStream with the
delivery log at R3). The runs go on, compared with the uninterrupted replay as everywhere."""
from __future__ import annotations

import asyncio

import pytest

from tests.faults.conftest import ClusterFactory

slow = pytest.mark.faults_slow


@slow
@pytest.mark.timeout(300)
async def test_etcd_leader_killed(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(replicated=True)
    runs = await c.start_runs(5, seconds=12, detached=1)
    await c.wait_progress(runs, 20)
    leader = await asyncio.to_thread(c.etcd.leader)  # type: ignore[attr-defined]
    async with c.fault(f"etcd leader {leader.member} SIGKILL (2 of 3 members left)"):
        await asyncio.to_thread(leader.kill)
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(300)
async def test_nats_stream_leader_killed(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(replicated=True)
    runs = await c.start_runs(5, seconds=12, detached=1)
    await c.wait_progress(runs, 20)
    name = await c.stream_leader()
    async with c.fault(f"JetStream stream leader {name} SIGKILL (R3: 2 of 3 replicas left)"):
        await asyncio.to_thread(c.nats.node(name).kill)  # type: ignore[attr-defined]
    await c.finish()
    await c.check()
