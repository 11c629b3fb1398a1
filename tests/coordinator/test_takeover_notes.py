"""The leader's takeover note against real etcd (coordinator/failover.py): its cause is read
at once, its write comes later (the successors append first), and what happens between the
two (the drained host leaving, the run ending, the successor's claim) is handled."""
from __future__ import annotations

from typing import AsyncIterator

import pytest

from baton.v1.coordinator_pb2 import HostInfo
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus
from baton_tools.testing.servers import EtcdServer, free_port
from coordinator import CoordinatorConfig, LeaderContext, build_store
from coordinator import _etcd as E
from coordinator.failover import loss_cause, record_loss
from tests.conftest import unique

pytestmark = pytest.mark.timeout(60)
T = 5.0


@pytest.fixture
async def ctx(etcd: EtcdServer) -> AsyncIterator[LeaderContext]:
    cfg = CoordinatorConfig.from_env({}).with_overrides(prefix=unique("notes-"), etcd_endpoints=(etcd.endpoint,))
    store = build_store(cfg)
    try:
        yield LeaderContext(store, cfg, "test", 0)
    finally:
        await store.etcd.close()


async def lost_claim(ctx: LeaderContext, *, host: HostInfo | None, session_alive: bool) -> tuple[Claim, int]:
    """A running run at epoch 1 whose claim (host-a's session's) was just deleted."""
    store, k = ctx.store, ctx.store.keys
    lease, _ = await store.etcd.grant(60, timeout=T)
    run_id = unique("run-")
    rec = RunRecord(run_id=run_id, thread_id=unique("thr-"), status=RunStatus.RUN_STATUS_RUNNING,
                    driver_epoch=1, driver_host="host-a")
    ops = [E.put(k.run(run_id), rec.SerializeToString())]
    if session_alive:
        ops.append(E.put(k.session(lease), b"x", lease))
    if host is not None:
        host.session_id = lease
        ops.append(E.put(k.host(host.host_id), host.SerializeToString(), lease))
    await store.etcd.txn([], ops, timeout=T)
    return Claim(run_id=run_id, epoch=1, host_id="host-a", session_id=lease, purpose="drive"), lease


async def record(ctx: LeaderContext, run_id: str) -> RunRecord:
    rec, _ = await ctx.store.get_run(run_id, timeout=T)
    assert rec is not None
    return rec


async def test_a_drain_is_noted_drain_although_the_host_left_before_the_write(ctx: LeaderContext) -> None:
    host = HostInfo(host_id="host-a", address=f"127.0.0.1:{free_port()}", draining=True)
    lost, lease = await lost_claim(ctx, host=host, session_alive=True)
    cause = await loss_cause(ctx, lost, 1000.0)
    assert cause == "drain"
    # The drained host exits before the note is written: its entry and session go.
    await ctx.store.etcd.revoke(lease, timeout=T)
    assert await loss_cause(ctx, lost, 1000.0) == "session-lost"  # what a late read would say
    assert await record_loss(ctx, lost, 1000.0, {}, cause=cause) == "drain"
    t = (await record(ctx, lost.run_id)).last_takeover
    assert (t.from_epoch, t.from_host, t.cause, t.lost_at) == (1, "host-a", "drain", 1000.0)


async def test_a_run_that_ended_before_the_write_is_not_noted(ctx: LeaderContext) -> None:
    lost, _ = await lost_claim(ctx, host=None, session_alive=False)
    cause = await loss_cause(ctx, lost, 1000.0)
    assert cause == "session-lost"
    rec = await record(ctx, lost.run_id)
    rec.status = RunStatus.RUN_STATUS_COMPLETED
    await ctx.store.etcd.txn([], [E.put(ctx.store.keys.run(lost.run_id), rec.SerializeToString())], timeout=T)
    assert await record_loss(ctx, lost, 1000.0, {}, cause=cause) is None
    assert not (await record(ctx, lost.run_id)).HasField("last_takeover")
    assert await loss_cause(ctx, lost, 1000.0) is None


async def test_the_successor_s_claim_before_the_write_keeps_its_stamp(ctx: LeaderContext) -> None:
    """A SIGKILLed host (its address refuses): ``crash``, merged into what the claim stamped."""
    host = HostInfo(host_id="host-a", address=f"127.0.0.1:{free_port()}")
    lost, lease = await lost_claim(ctx, host=None, session_alive=False)
    host.session_id = lease
    cause = await loss_cause(ctx, lost, 1000.0)
    rec = await record(ctx, lost.run_id)
    rec.driver_epoch, rec.driver_host = 2, "host-b"
    rec.last_takeover.from_epoch, rec.last_takeover.from_host = 1, "host-a"
    rec.last_takeover.to_host, rec.last_takeover.claimed_at = "host-b", 1001.0
    await ctx.store.etcd.txn([], [E.put(ctx.store.keys.run(lost.run_id), rec.SerializeToString())], timeout=T)
    assert await record_loss(ctx, lost, 1000.0, {"host-a": host}, cause=cause) == "crash"
    t = (await record(ctx, lost.run_id)).last_takeover
    assert (t.from_epoch, t.to_host, t.claimed_at, t.cause, t.lost_at) == (1, "host-b", 1001.0, "crash", 1000.0)
