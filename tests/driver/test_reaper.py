"""The reaper (docs/design.md §7): one test per sweep outcome, on real servers."""
from __future__ import annotations

import json
from typing import Any, AsyncIterator

import pytest

from baton.v1 import runs_pb2
from coordinator import CoordinatorConfig, LeaderContext, build_store
from coordinator.failover import HostPool
from coordinator.reaper import ReaperSweep
from tests.conftest import assert_eventually, unique
from tests.driver.conftest import CORPUS, Cluster, status_of

LONG = "claude-stream-json/partial-messages-parallel-bash-denied.jsonl"
SHORT = "codex-exec-json/zsh-commands-and-file-change.jsonl"
FAR_FUTURE = 10**10  # a sweep "now" at which every detached run has expired


async def _detach(cluster: Cluster, run_id: str) -> runs_pb2.RunRecord:
    session = await cluster.cc.open_session(ttl=2, owner="test-gateway")
    try:
        reader_id = unique("reader-")
        await cluster.cc.register_reader(run_id, session, reader_id)
        await cluster.cc.unregister_reader(run_id, reader_id)
    finally:
        await session.close()

    async def stamped() -> Any:
        rec = await cluster.record(run_id)
        return rec if rec.HasField("detached_since") else None
    return await assert_eventually(stamped)


async def _seed(cluster: Cluster, journal: str) -> runs_pb2.RunRecord:
    opts = {"journal": str(CORPUS / journal), "speed": 0, "delay": 0}
    seed = runs_pb2.RunRecord(run_id=unique("run-"), thread_id=unique("thr-"), status=runs_pb2.RUN_STATUS_RUNNING,
                              agent=runs_pb2.AgentSpec(kind="replay", options_json=json.dumps(opts)))
    rec, _ = await cluster.cc.create_or_resume_run(seed)
    return rec


def _only(counts: dict[str, int], outcome: str) -> bool:
    return counts.get(outcome) == 1 and sum(counts.values()) == 1


@pytest.fixture
async def sweep(cluster: Cluster) -> AsyncIterator[ReaperSweep]:
    """A reaper on the cluster's store in this process, to interleave with a sweep's steps."""
    cfg = CoordinatorConfig.from_env({}).with_overrides(prefix=cluster.prefix, etcd_endpoints=(cluster.etcd_endpoint,))
    store = build_store(cfg)
    try:
        yield ReaperSweep(LeaderContext(store, cfg, "test", 0), 3600.0)
    finally:
        await store.etcd.close()


async def test_expired_detached_run_is_cancelled_as_reaped(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[0], LONG, delay=0.05, keep_sandbox=True)
    run_id = started.record.run_id
    # StartRun answers once run.accepted is stored, before the sandbox is built (§5.5):
    # detach a run that has its sandbox, so the sweep has one to destroy.
    await assert_eventually(lambda: _has_sandbox_key(cluster, run_id))
    rec = await _detach(cluster, run_id)
    assert rec.sandbox_key
    counts = await cluster.cc.reap(ttl=60, now=FAR_FUTURE)
    assert _only(counts, "expired"), counts
    chunks = [c for _, c in await cluster.read_all(run_id)]
    assert chunks[-2]["name"] == "run.cancelled" and chunks[-2]["value"]["reason"] == "reaped"
    assert chunks[-1] == {"type": "RUN_ERROR", "message": "run cancelled (reaped)", "code": "cancelled"}
    done = await cluster.wait_status(run_id, "aborted")
    assert done.cancel_reason == "reaped"
    await assert_eventually(lambda: _gone(cluster, rec.sandbox_key))


async def _has_sandbox_key(cluster: Cluster, run_id: str) -> bool:
    return bool((await cluster.record(run_id)).sandbox_key)


async def _gone(cluster: Cluster, key: str) -> bool:
    return await cluster.cc.get_sandbox(key) is None


async def test_detached_run_still_driven_is_producing_and_left_alone(cluster: Cluster) -> None:
    started = await cluster.start_run(cluster.hosts[1], LONG, delay=0.05)
    run_id = started.record.run_id
    await _detach(cluster, run_id)
    counts = await cluster.cc.reap(ttl=3600, now=0)
    assert _only(counts, "producing"), counts
    rec = await cluster.record(run_id)
    assert status_of(rec) == "running" and not rec.cancel_requested
    await cluster.cc.request_run_cancel(run_id)  # tidy up: do not leave a slow run behind
    await cluster.wait_status(run_id, "aborted")


async def test_detached_run_nobody_drives_is_driven_to_completion(cluster: Cluster) -> None:
    rec = await _seed(cluster, SHORT)  # never claimed, so the leader's failover leaves it alone
    await _detach(cluster, rec.run_id)
    counts = await cluster.cc.reap(ttl=3600, now=0)
    assert _only(counts, "finalized"), counts
    chunks = [c for _, c in await cluster.read_all(rec.run_id)]
    assert chunks[-1]["type"] == "RUN_FINISHED"
    await cluster.wait_status(rec.run_id, "completed")
    msgs, _ = await cluster.transcripts.load(rec.thread_id)
    assert any(m["role"] == "assistant" for m in msgs)


async def test_reader_that_comes_back_between_listing_and_claim_wins(cluster: Cluster, sweep: ReaperSweep) -> None:
    started = await cluster.start_run(cluster.hosts[0], LONG, delay=0.05)
    run_id = started.record.run_id
    await _detach(cluster, run_id)
    listed = [r for r in await sweep.ctx.store.list_reclaimable(FAR_FUTURE, 60, 0, timeout=5) if r.run_id == run_id]
    assert len(listed) == 1
    session = await cluster.cc.open_session(ttl=2, owner="test-gateway")  # the reader comes back
    try:
        await cluster.cc.register_reader(run_id, session, unique("reader-"))
        pool = HostPool()
        try:
            outcome = await sweep._reap_one(pool, listed[0], expired=True)
        finally:
            await pool.close()
        assert outcome == "not-claimed"
        rec = await cluster.record(run_id)
        assert status_of(rec) == "running" and not rec.cancel_requested
    finally:
        await session.close()
    await cluster.cc.request_run_cancel(run_id)
    await cluster.wait_status(run_id, "aborted")


async def test_run_that_ended_after_listing_is_unknown(cluster: Cluster, sweep: ReaperSweep) -> None:
    started = await cluster.start_run(cluster.hosts[1], LONG, delay=0.05)
    run_id = started.record.run_id
    await _detach(cluster, run_id)
    listed = [r for r in await sweep.ctx.store.list_reclaimable(FAR_FUTURE, 60, 0, timeout=5) if r.run_id == run_id]
    await cluster.cc.request_run_cancel(run_id)
    await cluster.wait_status(run_id, "aborted")
    pool = HostPool()
    try:
        assert await sweep._reap_one(pool, listed[0], expired=True) == "unknown"
    finally:
        await pool.close()


async def test_expired_run_no_host_can_take_is_reclaim_failed(hostless: Cluster) -> None:
    rec = await _seed(hostless, SHORT)
    await _detach(hostless, rec.run_id)
    counts = await hostless.cc.reap(ttl=60, now=FAR_FUTURE)
    assert _only(counts, "reclaim-failed"), counts
    after = await hostless.record(rec.run_id)
    assert after.cancel_requested and after.cancel_reason == "reaped" and status_of(after) == "running"


async def test_store_outage_in_the_middle_of_a_sweep_is_failed(own_etcd: Any) -> None:
    cfg = CoordinatorConfig.from_env({}).with_overrides(prefix=f"/{unique('rf')}/", etcd_endpoints=(own_etcd.endpoint,),
                                                         etcd_timeout=1.0)
    store = build_store(cfg)
    try:
        run_id = unique("run-")
        await store.create_or_resume(runs_pb2.RunRecord(run_id=run_id, thread_id=unique("thr-")), False, timeout=5)
        await store.update_run(run_id, runs_pb2.RunRecord(detached_since=1000.0), ["detached_since"], 0, 0, timeout=5)

        class EtcdDiesAfterListing(ReaperSweep):
            async def _reap_one(self, pool: HostPool, listed: runs_pb2.RunRecord, *, expired: bool) -> str:
                own_etcd.kill()  # a real outage between listing and acting
                return await super()._reap_one(pool, listed, expired=expired)

        counts = await EtcdDiesAfterListing(LeaderContext(store, cfg, "test", 0), 60.0).sweep(60, FAR_FUTURE)
        assert _only(counts, "failed"), counts
    finally:
        await store.etcd.close()
