"""Replicated engines lose their leaders (3-node etcd, 3-node JetStream with the
delivery log at R3). The runs go on, compared with the uninterrupted replay as everywhere."""
from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any, AsyncIterator

import pytest

from tests.faults.conftest import ClusterFactory
from tests.faults.harness import FaultCluster, eventually
from tests.faults.test_holds import _taken_over

# Every case starts its own etcd, NATS and service processes (never `unit`).
pytestmark = pytest.mark.servers

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
    async with _election_watch(c, name):
        async with c.fault(f"JetStream stream leader {name} SIGKILL (R3: 2 of 3 replicas left)"):
            await asyncio.to_thread(c.nats.node(name).kill)  # type: ignore[attr-defined]
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(300)
async def test_nats_stream_leader_killed_and_back(fault_cluster: ClusterFactory) -> None:
    """The old stream leader comes back mid-run and catches up as a follower."""
    c = await fault_cluster(replicated=True)
    runs = await c.start_runs(5, seconds=14, detached=1)
    await c.wait_progress(runs, 20)
    name = await c.stream_leader()
    node = c.nats.node(name)  # type: ignore[attr-defined]
    async with c.fault(f"JetStream stream leader {name} SIGKILL, restarted once a new leader serves"):
        await asyncio.to_thread(node.kill)
        await eventually(lambda: _leader_is_not(c, name), 30)
        await asyncio.to_thread(node.start)
    await c.finish()
    await c.check()


async def _leader_is_not(c: FaultCluster, name: str) -> bool:
    try:
        return await c.stream_leader() != name
    except Exception:  # noqa: BLE001 - no leader yet (an election is under way)
        return False



@slow
@pytest.mark.timeout(300)
async def test_host_killed_while_an_etcd_member_is_down(fault_cluster: ClusterFactory) -> None:
    """The takeover (session expiry, claim, fence) runs on a 2-of-3 etcd quorum: the
    member that led is down for the whole case, so the coordinator works through the
    new leader from the start of the failover."""
    c = await fault_cluster(replicated=True)
    runs = await c.start_runs(6, seconds=14, detached=2)
    await c.wait_progress(runs, 20)
    member = await asyncio.to_thread(c.etcd.leader)  # type: ignore[attr-defined]
    await asyncio.to_thread(member.kill)
    await asyncio.to_thread(c.etcd.leader)  # type: ignore[attr-defined]  # a new one, of the 2 left
    victim, theirs = await c.busiest_host(runs)
    async with c.fault(f"etcd member {member.member} down (the leader), then host {victim.host_id} SIGKILL "
                       f"(driving {len(theirs)} runs)"):
        victim.kill_now()
        await _taken_over(c, theirs, victim.host_id)
    await c.finish()
    await c.check()


@contextlib.asynccontextmanager
async def _election_watch(c: FaultCluster, old: str) -> AsyncIterator[None]:
    """Around a kill of stream leader ``old``: note how long NATS itself took to elect a new
    one (stream info through a surviving node, from the kill), so the recovery time can be
    split into NATS's part and baton's."""
    import nats

    others = [n.url for n in c.nats.nodes if n.node != old]  # type: ignore[attr-defined]
    nc = await nats.connect(others, max_reconnect_attempts=-1, reconnect_time_wait=0.05)
    try:
        yield
        assert c.fault_started is not None
        js = nc.jetstream(timeout=0.5)

        async def elected() -> bool:
            try:
                info = await js.stream_info(c.env["BATON_RUNS_STREAM"])
            except Exception:  # noqa: BLE001 - no leader yet (an election is under way)
                return False
            return info.cluster is not None and info.cluster.leader not in (None, old)
        await eventually(elected, 60, interval=0.05)
        c.notes.append(f"NATS elected a new stream leader {time.monotonic() - c.fault_started:.2f}s after the kill")
        # The first record JetStream stored after the kill, by its own clock (this machine's).
        killed_at = time.time() - (time.monotonic() - c.fault_started)
        stored = await _first_stored_after(nc.jetstream(timeout=5.0), c.env["BATON_RUNS_STREAM"], killed_at)
        if stored:
            c.notes.append("first append stored after the kill, per run: " + ", ".join(
                f"{t - killed_at:.2f}s" for t in sorted(stored.values())))
    finally:
        await nc.close()


async def _first_stored_after(js: Any, stream: str, at: float) -> dict[str, float]:
    """Per subject (run), when the stream stored its first record at or after ``at``
    (seconds since the epoch, JetStream's clock: this machine's)."""
    import datetime

    from nats.js import api

    start = datetime.datetime.fromtimestamp(at, datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    first: dict[str, float] = {}
    try:
        # A measurement only: JetStream slow to answer right after its elections costs the
        # figure, never the case.
        info = await js.add_consumer(stream, api.ConsumerConfig(
            deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=start, ack_policy=api.AckPolicy.NONE,
            headers_only=True, mem_storage=True, num_replicas=1, inactive_threshold=10.0))
        sub = await js.pull_subscribe_bind(info.name, stream)
    except Exception:  # noqa: BLE001
        return first
    try:
        msgs = await sub.fetch(500, timeout=5)
    except Exception:  # noqa: BLE001 - nothing stored yet: no figure
        msgs = []
    finally:
        await sub.unsubscribe()
    for m in msgs:
        first.setdefault(m.subject, float(m.metadata.timestamp.timestamp()))
    return first
