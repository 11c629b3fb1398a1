"""Concurrent claims and updates batched into fewer etcd transactions, on a real etcd.

What a user would check: many runs claimed or updated at once each get the answer they
would get alone (the epoch, the refusal, the fence, a lost session), in fewer round trips;
a stale cache entry in a batch costs that run a retry and nothing else.
"""
from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import pytest

from baton import errors
from baton_tools.testing.servers import EtcdServer
from baton.v1.runs_pb2 import RunRecord
from aetcd import rpc

from coordinator import _etcd as E
from coordinator._etcd import Etcd
from coordinator._store import RunStore, UpdateOutcome
from tests.conftest import assert_eventually, unique

T = 10.0  # seconds, every store call's budget
N = 30  # runs at once

pytestmark = pytest.mark.timeout(120)


class _CountingKV:
    """etcd's KV stub, counting the ``Txn`` calls that reach etcd."""

    def __init__(self, kv: Any) -> None:
        self._kv = kv
        self.txns = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)

    def Txn(self, *a: Any, **kw: Any) -> Any:  # noqa: N802 -- the stub's name
        self.txns += 1
        return self._kv.Txn(*a, **kw)


@pytest.fixture
async def stores(etcd: EtcdServer) -> AsyncIterator[tuple[RunStore, RunStore, _CountingKV]]:
    prefix = f"/{unique('bt')}/"
    a, b = RunStore(Etcd([etcd.endpoint]), prefix), RunStore(Etcd([etcd.endpoint]), prefix)
    counting = _CountingKV(a.etcd._kv)
    a.etcd._kv = counting
    try:
        yield a, b, counting
    finally:
        await a.etcd.close()
        await b.etcd.close()


async def _runs(store: RunStore, n: int) -> list[str]:
    out = []
    for _ in range(n):
        rec, created = await store.create_or_resume(
            RunRecord(run_id=unique("run-"), thread_id=unique("th-")), False, timeout=T)
        assert created
        out.append(rec.run_id)
    return out


async def test_concurrent_claims_of_many_runs_each_get_their_epoch_in_fewer_round_trips(
        stores: tuple[RunStore, RunStore, _CountingKV]) -> None:
    a, b, counting = stores
    ids = await _runs(a, N)
    session, _ = await a.open_session(30, "host-a", timeout=T)
    before = counting.txns
    got = await asyncio.gather(*(a.claim_run(r, session, "host-a", "drive", timeout=T) for r in ids))
    assert [(epoch, rec.driver_epoch, rec.driver_host) for epoch, rec in got] == [(1, 1, "host-a")] * N
    assert counting.txns - before < N  # batched: fewer etcd transactions than claims
    # What etcd holds, read by another replica: every record and claim as answered.
    for (epoch, rec), rid in zip(got, ids):
        fresh, claim = await b.get_run(rid, timeout=T)
        assert fresh is not None and claim is not None
        assert (fresh.driver_epoch, fresh.revision, claim.epoch, claim.session_id) == (1, rec.revision, 1, session)
    # Claimed again at once: every one is refused "held", none gets an epoch.
    refused = await asyncio.gather(*(a.claim_run(r, session, "host-a", "drive", timeout=T) for r in ids),
                                   return_exceptions=True)
    assert all(isinstance(x, errors.RunClaimNotAcquired) and x.reason == "held" for x in refused)


async def test_one_run_claimed_twice_in_one_burst_has_one_winner(
        stores: tuple[RunStore, RunStore, _CountingKV]) -> None:
    a, _, _ = stores
    ids = await _runs(a, 5)
    s1, _ = await a.open_session(30, "h1", timeout=T)
    s2, _ = await a.open_session(30, "h2", timeout=T)
    out = await asyncio.gather(*(a.claim_run(r, s, h, "drive", timeout=T)
                                 for r in ids for s, h in ((s1, "h1"), (s2, "h2"))), return_exceptions=True)
    for i in range(len(ids)):
        pair = out[2 * i: 2 * i + 2]
        won = [x for x in pair if not isinstance(x, BaseException)]
        lost = [x for x in pair if isinstance(x, BaseException)]
        assert len(won) == 1 and won[0][0] == 1
        assert len(lost) == 1 and isinstance(lost[0], errors.RunClaimNotAcquired) and lost[0].reason == "held"


async def test_a_stale_entry_or_a_lost_session_in_a_batch_touches_only_its_own_run(
        stores: tuple[RunStore, RunStore, _CountingKV]) -> None:
    a, b, _ = stores
    ids = await _runs(a, N)
    good, _ = await a.open_session(30, "good", timeout=T)
    gone, _ = await a.open_session(30, "gone", timeout=T)
    # Another replica moves one run on behind A's cache; the other session's lease ends.
    await b.update_run(ids[0], RunRecord(sandbox_key="sb-b"), ["sandbox_key"], 0, 0, timeout=T)
    await a.close_session(gone, timeout=T)
    calls = [a.claim_run(r, good, "good", "drive", timeout=T) for r in ids[:-1]]
    calls.append(a.claim_run(ids[-1], gone, "gone", "drive", timeout=T))
    out = await asyncio.gather(*calls, return_exceptions=True)
    assert isinstance(out[-1], errors.SessionLost)
    ok = out[:-1]
    assert all(not isinstance(x, BaseException) and x[0] == 1 for x in ok), ok
    first = ok[0]
    assert not isinstance(first, BaseException) and first[1].sandbox_key == "sb-b"  # B's write kept
    fresh, claim = await b.get_run(ids[-1], timeout=T)
    assert fresh is not None and fresh.driver_epoch == 0 and claim is None


async def test_owner_writes_in_a_batch_are_fenced_each_by_its_own_claim(
        stores: tuple[RunStore, RunStore, _CountingKV]) -> None:
    a, b, _ = stores
    ids = await _runs(a, N)
    sa, _ = await a.open_session(30, "host-a", timeout=T)
    sb, _ = await b.open_session(30, "host-b", timeout=T)
    await asyncio.gather(*(a.claim_run(r, sa, "host-a", "drive", timeout=T) for r in ids))
    # Replica B takes one run over: A's claim on it is gone, A's cache does not know.
    assert await b.release_claim(ids[0], sa, 1, timeout=T)
    assert (await b.claim_run(ids[0], sb, "host-b", "drive", timeout=T))[0] == 2
    out = await asyncio.gather(*(a.update_run(r, RunRecord(sandbox_key="sb-a"), ["sandbox_key"], 1, sa, timeout=T)
                                 for r in ids), return_exceptions=True)
    assert isinstance(out[0], errors.RunClaimLost) and out[0].observed == "epoch@2"
    assert all(not isinstance(x, BaseException) and x[0] is UpdateOutcome.APPLIED for x in out[1:])
    fresh, _ = await b.get_run(ids[0], timeout=T)
    assert fresh is not None and fresh.sandbox_key == "" and fresh.driver_host == "host-b"
    for rid in ids[1:]:
        rec, _ = await b.get_run(rid, timeout=T)
        assert rec is not None and rec.sandbox_key == "sb-a"


async def test_cold_reads_are_batched_and_answer_each_run(etcd: EtcdServer) -> None:
    prefix = f"/{unique('bt')}/"
    writer, cold = RunStore(Etcd([etcd.endpoint]), prefix), RunStore(Etcd([etcd.endpoint]), prefix)
    try:
        ids = await _runs(writer, N)
        out = await asyncio.gather(*(cold.update_run(r, RunRecord(sandbox_key=r), ["sandbox_key"], 0, 0, timeout=T)
                                     for r in ids))
        assert [(o, rec.sandbox_key if rec else None) for o, rec in out] == [(UpdateOutcome.APPLIED, r) for r in ids]
        unknown = await asyncio.gather(*(cold.update_run(unique("nope-"), RunRecord(sandbox_key="x"), ["sandbox_key"],
                                                         0, 0, timeout=T) for _ in range(5)))
        assert unknown == [(UpdateOutcome.UNKNOWN_RUN, None)] * 5
    finally:
        await writer.etcd.close()
        await cold.etcd.close()


async def test_closing_the_client_answers_a_batch_on_its_way_at_once(etcd: EtcdServer) -> None:
    # close() while a batch waits for etcd: each caller in it hears "closed" then, not when its
    # own timeout (a minute here) runs out.
    from coordinator import _etcd as E
    client = Etcd([etcd.endpoint])
    real = client._kv
    sent: list[int] = []

    class _HeldKV(_CountingKV):
        def Txn(self, *a: Any, **kw: Any) -> Any:  # noqa: N802 -- the stub's name
            sent.append(len(a[0].success))
            if len(sent) == 1:
                async def slow() -> Any:  # the first goes alone, answered once the rest wait behind it
                    await assert_eventually(lambda: len(client._waiting) == 4, timeout=20)
                    return await real.Txn(*a, **kw)
                return slow()
            return asyncio.get_running_loop().create_future()  # the batch: no answer comes
    client._kv = _HeldKV(real)
    prefix = f"/{unique('bt')}/".encode()
    calls = [asyncio.create_task(client.txn([], [E.put(prefix + b"%d" % i, b"v")], timeout=60.0, batch=True))
             for i in range(5)]
    try:
        await assert_eventually(lambda: len(sent) >= 2, timeout=20)
        assert sent[1] == 4  # the other four went as one batch, now on its way
        async with asyncio.timeout(10):
            await client.close()
            done = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        for c in calls:
            c.cancel()
    assert not isinstance(done[0], BaseException)  # the first was answered
    assert all(isinstance(d, errors.StoreUnavailable) and "closed" in str(d) for d in done[1:]), done


async def test_batched_reads_stay_a_read_to_etcd(own_etcd: EtcdServer) -> None:
    """Reads that wait behind one another go to etcd side by side in as few reads as etcd's
    op limit allows: each caller gets its own keys, in fewer calls, and etcd's raft log does
    not grow (reads nested in one transaction would be a write to etcd, a raft entry every
    member applies)."""
    client = Etcd([own_etcd.endpoint])
    counting = _CountingKV(client._kv)
    client._kv = counting
    status = rpc.MaintenanceStub(client._channel)
    p = f"/{unique('flat')}/".encode()
    try:
        await client.txn([], [E.put(p + b"%02d" % i, b"v%d" % i) for i in range(N)], timeout=T)
        before = (await status.Status(rpc.StatusRequest(), timeout=T)).raftIndex
        counting.txns = 0
        # 5 reads each: the 29 that wait behind the first are 145, past etcd's 128 per txn.
        out = await asyncio.gather(*(client.txn([], [E.get(p + b"%02d" % i)] + [E.get(p + b"none")] * 4, timeout=T,
                                                batch=True) for i in range(N)))
        assert [[kv.value for kv in r.kvs(0)] + [len(r.kvs(j)) for j in range(1, 5)] for r in out] == [
            [b"v%d" % i, 0, 0, 0, 0] for i in range(N)]
        assert len({r.revision for r in out}) <= counting.txns < N
        assert (await status.Status(rpc.StatusRequest(), timeout=T)).raftIndex == before
    finally:
        await client.close()
