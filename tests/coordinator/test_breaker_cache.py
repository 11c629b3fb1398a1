"""Adversarial tests of the coordinator's record cache (coordinator/_cache.py).

Several RunStore replicas (tiny caches included, so entries get evicted and go stale) on
one prefix, against a real etcd. Every answer is checked against a fresh read made just
before the operation by a cache-less store (the oracle), and invariants (epochs, indexes,
claims, presence) are checked against etcd after every step.
"""
from __future__ import annotations

import asyncio
import random
import time
from typing import AsyncIterator

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient
from baton.coordinator_client import UpdateOutcome as ClientOutcome
from baton.testing.cluster import start_coordinator
from baton.testing.servers import EtcdServer
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus
from coordinator._etcd import Etcd
from coordinator._keys import prefix_end
from coordinator._records import is_active, is_terminal
from coordinator._store import RunStore, UpdateOutcome
from tests.conftest import assert_eventually, unique

T = 5.0
RUNNING = RunStatus.RUN_STATUS_RUNNING
INTERRUPTED = RunStatus.RUN_STATUS_INTERRUPTED
COMPLETED = RunStatus.RUN_STATUS_COMPLETED
ABORTED = RunStatus.RUN_STATUS_ABORTED


def _stores(endpoint: str, prefix: str, sizes: tuple[int, ...]) -> list[RunStore]:
    return [RunStore(Etcd([endpoint]), prefix, cache_size=n) for n in sizes]


async def _close(stores: list[RunStore]) -> None:
    for s in stores:
        await s.etcd.close()


@pytest.fixture
async def cluster(etcd: EtcdServer) -> AsyncIterator[tuple[list[RunStore], RunStore]]:
    """Four replicas (cache sizes 1, 2, 3 and big) and a cache-less oracle on one prefix."""
    prefix = f"/{unique('bk')}/"
    replicas = _stores(etcd.endpoint, prefix, (1, 2, 3, 10_000))
    oracle = RunStore(Etcd([etcd.endpoint]), prefix, cache_size=0)
    try:
        yield replicas, oracle
    finally:
        await _close([*replicas, oracle])


def _strip(rec: RunRecord | None) -> RunRecord | None:
    if rec is None:
        return None
    out = RunRecord()
    out.CopyFrom(rec)
    out.ClearField("revision")
    if out.HasField("detached_since"):
        out.detached_since = 1.0  # only its presence is predictable
    return out


async def _state(oracle: RunStore, run_id: str) -> tuple[RunRecord | None, Claim | None, int]:
    rec, claim = await oracle.get_run(run_id, timeout=T)
    return rec, claim, await oracle.reader_count(run_id, timeout=T)


async def _lease_alive(oracle: RunStore, sid: int) -> bool:
    return await oracle.etcd.time_to_live(sid, timeout=T) > 0


async def _check_invariants(oracle: RunStore, runs: list[str], threads: list[str],
                            max_epoch: dict[str, int]) -> None:
    k = oracle.keys
    for run_id in runs:
        rec, claim = await oracle.get_run(run_id, timeout=T)
        assert rec is not None
        assert rec.driver_epoch >= max_epoch.get(run_id, 0), "driver_epoch went backwards"
        max_epoch[run_id] = rec.driver_epoch
        if claim is not None:
            assert claim.epoch == rec.driver_epoch, (claim, rec)
    # The reclaimable index is exactly the running, detached runs.
    kvs, _ = await oracle.etcd.range(k.reclaimable_prefix, prefix_end(k.reclaimable_prefix), timeout=T)
    indexed = sorted(kv.value.decode() for kv in kvs)
    recs = [r for r in [(await oracle.get_run(x, timeout=T))[0] for x in runs] if r is not None]
    expected = sorted(r.run_id for r in recs if is_active(r) and r.HasField("detached_since"))
    assert indexed == expected, "reclaimable index disagrees with records"
    # The thread-active index points at a running run of that thread (or nowhere).
    for th in threads:
        kvs, _ = await oracle.etcd.range(k.thread_active(th), timeout=T)
        if kvs:
            rec, _ = await oracle.get_run(kvs[0].value.decode(), timeout=T)
            assert rec is not None and rec.thread_id == th and is_active(rec), (th, rec)
        found = await oracle.find_active_run(th, timeout=T)
        assert found is None or (found.thread_id == th and is_active(found))


async def _random_walk(replicas: list[RunStore], oracle: RunStore, seed: int, steps: int) -> dict[str, int]:
    rnd = random.Random(seed)
    tenant = "tenant-a"
    threads = [unique("th-") for _ in range(2)]
    runs: list[str] = []
    for th in threads:
        for _ in range(2):
            rec, created = await replicas[0].create_or_resume(
                RunRecord(run_id=unique("run-"), thread_id=th, tenant=tenant), True, timeout=T)
            assert created
            runs.append(rec.run_id)
    sessions = [(await oracle.open_session(30, f"h{i}", timeout=T))[0] for i in range(3)]
    closed: list[int] = []
    readers: dict[str, set[tuple[str, int]]] = {r: set() for r in runs}
    max_epoch: dict[str, int] = {}
    counts: dict[str, int] = {}
    # Warm every replica's cache so later ops start from (soon stale) entries.
    for s in replicas:
        for r in runs:
            await s.get_run(r, timeout=T)

    for _step in range(steps):
        store = rnd.choice(replicas)
        run_id = rnd.choice(runs)
        pre, claim, nreaders = await _state(oracle, run_id)
        assert pre is not None
        op = rnd.choice(["claim", "claim", "claim", "release", "owner", "owner", "owner_terminal",
                         "field", "cancel", "uncancel", "status", "reader", "unreader",
                         "detach", "close", "revive"])
        counts[op] = counts.get(op, 0) + 1
        exp = RunRecord()
        exp.CopyFrom(pre)
        if op == "claim":
            sid = rnd.choice(sessions + closed[-1:])
            purpose = rnd.choice(["drive", "drive", "finalize"])
            alive = sid not in closed
            if is_terminal(pre.status):
                want: object = "terminal"
            elif claim is not None:
                want = "held"
            elif purpose == "drive" and pre.cancel_requested:
                want = "cancel_requested"
            elif not alive:
                want = "session_lost"
            else:
                want = pre.driver_epoch + 1
            try:
                epoch, got = await store.claim_run(run_id, sid, f"host-{sid}", purpose, timeout=T)
                outcome: object = epoch
                assert got.driver_epoch == epoch and got.driver_host == f"host-{sid}"
            except errors.RunClaimNotAcquired as exc:
                outcome = exc.reason
            except errors.SessionLost:
                outcome = "session_lost"
            assert outcome == want, (op, pre, claim, outcome, want)
            if isinstance(want, int):
                exp.driver_epoch = want
                exp.driver_host = f"host-{sid}"
        elif op == "release":
            if claim is not None and rnd.random() < 0.7:
                sid, epoch = claim.session_id, claim.epoch
            else:
                sid, epoch = rnd.choice(sessions), rnd.randint(0, pre.driver_epoch + 1)
            want = claim is not None and claim.session_id == sid and claim.epoch == epoch
            assert await store.release_claim(run_id, sid, epoch, timeout=T) == want
        elif op in ("owner", "owner_terminal"):
            if claim is not None and rnd.random() < 0.6:
                sid, epoch = claim.session_id, claim.epoch
            else:
                sid = rnd.choice(sessions)
                epoch = rnd.randint(max(pre.driver_epoch - 1, 0), pre.driver_epoch + 1)
            if op == "owner":
                patch, paths = RunRecord(sandbox_key=unique("sb-")), ["sandbox_key"]
            else:
                patch, paths = RunRecord(status=rnd.choice([COMPLETED, ABORTED]), finished_at=9.0), ["status", "finished_at"]
            new = RunRecord()
            new.CopyFrom(pre)
            for p in paths:
                setattr(new, p, getattr(patch, p))
            if op == "owner_terminal" and epoch < pre.driver_epoch:
                want = UpdateOutcome.SUPPRESSED
            elif claim is None or claim.session_id != sid or claim.epoch != epoch:
                want = "lost"
            else:
                want = UpdateOutcome.APPLIED
            try:
                outcome, _ = await store.update_run(run_id, patch, paths, epoch, sid, timeout=T)
            except errors.RunClaimLost:
                outcome = "lost"
            assert outcome == want, (op, pre, claim, sid, epoch, outcome, want)
            if want is UpdateOutcome.APPLIED:
                exp = new
        elif op == "field":
            patch = RunRecord(sandbox_key=unique("nb-"))
            outcome, got = await store.update_run(run_id, patch, ["sandbox_key"], 0, 0, timeout=T)
            assert outcome is UpdateOutcome.APPLIED
            exp.sandbox_key = patch.sandbox_key
        elif op == "cancel":
            reason = rnd.choice(["user", "other"])
            got = await store.request_cancel(run_id, reason, timeout=T)
            if not is_terminal(pre.status):
                exp.cancel_requested, exp.cancel_reason = True, reason
            assert _strip(got) == _strip(exp)
        elif op == "uncancel":
            await store.update_run(run_id, RunRecord(), ["cancel_requested", "cancel_reason"], 0, 0, timeout=T)
            exp.ClearField("cancel_requested")
            exp.ClearField("cancel_reason")
        elif op == "status":
            if is_terminal(pre.status):
                continue
            st = INTERRUPTED if pre.status == RUNNING else RUNNING
            await store.update_run(run_id, RunRecord(status=st), ["status"], 0, 0, timeout=T)
            exp.status = st
        elif op == "reader":
            sid = rnd.choice(sessions + closed[-1:])
            rid = unique("rd-")
            try:
                await store.register_reader(run_id, sid, rid, timeout=T)
                assert sid not in closed
                readers[run_id].add((rid, sid))
                exp.ClearField("detached_since")
            except errors.SessionLost:
                assert sid in closed
        elif op == "unreader":
            live = [x for x in readers[run_id] if x[1] not in closed]
            if not live:
                continue
            rid, sid = rnd.choice(live)
            readers[run_id].discard((rid, sid))
            await store.unregister_reader(run_id, rid, timeout=T)
            if nreaders == 1 and is_active(pre) and not pre.HasField("detached_since"):
                exp.detached_since = 1.0
        elif op == "detach":
            got = await store.detach_if_unread(run_id, timeout=T)
            should = nreaders == 0 and is_active(pre) and not pre.HasField("detached_since")
            assert (got is not None) == should, (pre, nreaders, got)
            if should:
                exp.detached_since = 1.0
        elif op == "close":
            sid = rnd.choice(sessions)
            await rnd.choice(replicas).close_session(sid, timeout=T)
            sessions.remove(sid)
            closed.append(sid)
            sessions.append((await oracle.open_session(30, "h", timeout=T))[0])
            # the claim (if its) and readers went with the lease: model this run only
            post, post_claim, _ = await _state(oracle, run_id)
            assert post_claim is None or post_claim.session_id != sid
            await _check_invariants(oracle, runs, threads, max_epoch)
            continue
        elif op == "revive":
            # a terminal run is replaced by a new run on its thread (keeps the pool alive)
            if not is_terminal(pre.status):
                continue
            rec, created = await store.create_or_resume(
                RunRecord(run_id=unique("run-"), thread_id=pre.thread_id, tenant=tenant), True, timeout=T)
            assert created
            runs[runs.index(run_id)] = rec.run_id
            readers[rec.run_id] = set()
            for s in replicas:
                if rnd.random() < 0.5:
                    await s.get_run(rec.run_id, timeout=T)
            await _check_invariants(oracle, runs, threads, max_epoch)
            continue
        post, post_claim, _ = await _state(oracle, run_id)
        assert _strip(post) == _strip(exp), (op, pre, post, exp)
        if op == "claim" and isinstance(want, int):
            assert post_claim is not None and post_claim.epoch == want
        await _check_invariants(oracle, runs, threads, max_epoch)
    return counts


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_random_interleavings_across_replicas_match_fresh_etcd(
        cluster: tuple[list[RunStore], RunStore], seed: int) -> None:
    replicas, oracle = cluster
    counts = await _random_walk(replicas, oracle, seed, 150)
    assert counts.get("claim", 0) > 10
