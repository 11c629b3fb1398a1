"""The coordinator's record cache (coordinator/_cache.py) against a real etcd.

What a user of the coordinator would check: a claim or update of a run the replica knows is
one etcd transaction, and a cache that is wrong (another replica wrote, a lease expired)
never produces a wrong answer: not a lost write, not a false refusal, not an epoch reused.
Two stores on one prefix play two coordinator replicas.
"""
from __future__ import annotations

from typing import Any, AsyncIterator, Sequence

import pytest

from baton import errors
from baton_tools.testing.servers import EtcdServer
from baton.v1.runs_pb2 import RunRecord, RunStatus
from coordinator._cache import RecordCache
from coordinator._etcd import Etcd, KV
from coordinator._store import RunStore, UpdateOutcome
from tests.conftest import unique

T = 5.0  # seconds, every store call's budget


class CountingEtcd(Etcd):
    """The real etcd adapter, counting the round trips it makes."""

    calls = 0

    async def txn(self, *a: Any, **kw: Any) -> Any:
        self.calls += 1
        return await super().txn(*a, **kw)

    async def range(self, *a: Any, **kw: Any) -> Any:
        self.calls += 1
        return await super().range(*a, **kw)


@pytest.fixture
async def replicas(etcd: EtcdServer) -> AsyncIterator[tuple[RunStore, RunStore]]:
    prefix = f"/{unique('rc')}/"
    a = RunStore(CountingEtcd([etcd.endpoint]), prefix)
    b = RunStore(CountingEtcd([etcd.endpoint]), prefix)
    try:
        yield a, b
    finally:
        await a.etcd.close()
        await b.etcd.close()


def _calls(store: RunStore) -> int:
    assert isinstance(store.etcd, CountingEtcd)
    return store.etcd.calls


async def _create(store: RunStore) -> RunRecord:
    rec, created = await store.create_or_resume(
        RunRecord(run_id=unique("run-"), thread_id=unique("th-")), False, timeout=T)
    assert created
    return rec


async def test_claim_and_updates_of_a_known_run_are_one_transaction_each(replicas: tuple[RunStore, RunStore]) -> None:
    a, _ = replicas
    rec = await _create(a)
    session, _ = await a.open_session(10, "host-a", timeout=T)
    n = _calls(a)
    epoch, claimed = await a.claim_run(rec.run_id, session, "host-a", "drive", timeout=T)
    assert (epoch, claimed.driver_epoch, claimed.driver_host) == (1, 1, "host-a")
    assert _calls(a) == n + 1
    out, after = await a.update_run(rec.run_id, RunRecord(sandbox_key="sb-1"), ["sandbox_key"], epoch,
                                    session, timeout=T)
    assert out is UpdateOutcome.APPLIED and after is not None and after.sandbox_key == "sb-1"
    assert _calls(a) == n + 2
    out, after = await a.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED),
                                    ["status"], epoch, session, timeout=T)
    assert out is UpdateOutcome.APPLIED
    # Leaving `running` reads the thread index too (compared in the same transaction).
    assert _calls(a) == n + 4
    # What etcd holds is what the cached path wrote, revision included.
    fresh, claim = await replicas[1].get_run(rec.run_id, timeout=T)
    assert fresh is not None and after is not None
    assert (fresh.status, fresh.sandbox_key, fresh.driver_epoch, fresh.revision) == \
        (RunStatus.RUN_STATUS_COMPLETED, "sb-1", 1, after.revision)
    assert claim is not None and claim.epoch == 1


async def test_a_write_by_another_replica_costs_a_retry_and_is_never_overwritten(replicas: tuple[RunStore, RunStore]) -> None:
    a, b = replicas
    rec = await _create(a)
    sa, _ = await a.open_session(10, "host-a", timeout=T)
    sb, _ = await b.open_session(10, "host-b", timeout=T)
    epoch_a, _ = await a.claim_run(rec.run_id, sa, "host-a", "drive", timeout=T)
    # Replica B moves the run on behind A's back: a field write, then a takeover.
    await b.update_run(rec.run_id, RunRecord(sandbox_key="sb-b"), ["sandbox_key"], 0, 0, timeout=T)
    assert await b.release_claim(rec.run_id, sa, epoch_a, timeout=T)
    epoch_b, _ = await b.claim_run(rec.run_id, sb, "host-b", "drive", timeout=T)
    assert epoch_b == 2
    # A's cache still says "epoch 1, held by sa": its owner write must fail on etcd's state.
    with pytest.raises(errors.RunClaimLost) as lost:
        await a.update_run(rec.run_id, RunRecord(sandbox_key="sb-a"), ["sandbox_key"], epoch_a, sa, timeout=T)
    assert lost.value.held_epoch == epoch_a and lost.value.observed == "epoch@2"
    # A non-owner write from A keeps B's field (the compare failed, A re-read, applied on top).
    n = _calls(a)
    out, after = await a.update_run(rec.run_id, RunRecord(detached_since=5.0), ["detached_since"], 0, 0,
                                    timeout=T)
    assert out is UpdateOutcome.APPLIED and after is not None
    assert (after.sandbox_key, after.driver_epoch, after.driver_host, after.detached_since) == ("sb-b", 2, "host-b", 5.0)
    assert _calls(a) == n + 1  # the failed owner write above already refreshed A's entry
    # The terminal write of the old owner is suppressed against the real epoch.
    out, _ = await a.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_COMPLETED), ["status"],
                                epoch_a, 0, timeout=T)
    assert out is UpdateOutcome.SUPPRESSED
    fresh, claim = await b.get_run(rec.run_id, timeout=T)
    assert fresh is not None and fresh.status == RunStatus.RUN_STATUS_RUNNING
    assert claim is not None and (claim.epoch, claim.session_id) == (2, sb)


async def test_a_stale_entry_never_reuses_an_epoch(replicas: tuple[RunStore, RunStore]) -> None:
    a, b = replicas
    rec = await _create(a)
    s, _ = await a.open_session(10, "h", timeout=T)
    e1, _ = await a.claim_run(rec.run_id, s, "h", "drive", timeout=T)
    assert await a.release_claim(rec.run_id, s, e1, timeout=T)
    for expected in (2, 3):  # B claims twice; A's entry still says driver_epoch 1, unclaimed
        e, _ = await b.claim_run(rec.run_id, s, "h", "drive", timeout=T)
        assert e == expected
        assert await b.release_claim(rec.run_id, s, e, timeout=T)
    e4, rec4 = await a.claim_run(rec.run_id, s, "h", "drive", timeout=T)
    assert (e4, rec4.driver_epoch) == (4, 4)


async def test_a_cached_claim_whose_lease_expired_is_rechecked_before_refusing(replicas: tuple[RunStore, RunStore]) -> None:
    a, b = replicas
    rec = await _create(a)
    dead, _ = await a.open_session(10, "dead-host", timeout=T)
    await a.claim_run(rec.run_id, dead, "dead-host", "drive", timeout=T)
    await b.close_session(dead, timeout=T)  # the lease goes; A's entry still shows the claim
    live, _ = await a.open_session(10, "live-host", timeout=T)
    epoch, out = await a.claim_run(rec.run_id, live, "live-host", "drive", timeout=T)
    assert (epoch, out.driver_host) == (2, "live-host")
    # And a claim that really is held is refused as such, from etcd.
    with pytest.raises(errors.RunClaimNotAcquired) as held:
        await b.claim_run(rec.run_id, live, "other", "drive", timeout=T)
    assert held.value.reason == "held"


async def test_a_cached_cancel_flag_cleared_elsewhere_does_not_refuse_a_claim(replicas: tuple[RunStore, RunStore]) -> None:
    a, b = replicas
    rec = await _create(a)
    await a.request_cancel(rec.run_id, "user", timeout=T)
    await b.update_run(rec.run_id, RunRecord(), ["cancel_requested", "cancel_reason"], 0, 0, timeout=T)
    s, _ = await a.open_session(10, "h", timeout=T)
    epoch, out = await a.claim_run(rec.run_id, s, "h", "drive", timeout=T)
    assert epoch == 1 and not out.cancel_requested
    # "Already so" answers are given from etcd too: B set the flag, A's entry says not set.
    await b.request_cancel(rec.run_id, "user", timeout=T)
    await a.update_run(rec.run_id, RunRecord(), ["cancel_requested", "cancel_reason"], epoch, s, timeout=T)
    await b.request_cancel(rec.run_id, "user", timeout=T)
    got = await a.request_cancel(rec.run_id, "user", timeout=T)
    assert got.cancel_requested and got.cancel_reason == "user"
    fresh, _ = await b.get_run(rec.run_id, timeout=T)
    assert fresh is not None and fresh.revision == got.revision


async def test_a_reader_registering_after_an_unseen_detach_clears_it(replicas: tuple[RunStore, RunStore]) -> None:
    a, b = replicas
    rec = await _create(a)
    s, _ = await a.open_session(10, "gateway", timeout=T)
    await a.get_run(rec.run_id, timeout=T)          # A knows the run, not detached
    stamped = await b.detach_if_unread(rec.run_id, timeout=T)
    assert stamped is not None and stamped.HasField("detached_since")
    await a.register_reader(rec.run_id, s, "r1", timeout=T)
    fresh, _ = await b.get_run(rec.run_id, timeout=T)
    assert fresh is not None and not fresh.HasField("detached_since")
    assert await b.list_reclaimable(stamped.detached_since + 10, 0, 0, timeout=T) == []
    assert await a.reader_count(rec.run_id, timeout=T) == 1
    # With a reader present, a detach from the stale side does nothing.
    assert await a.detach_if_unread(rec.run_id, timeout=T) is None


async def test_cache_disabled_reads_before_every_write(etcd: EtcdServer) -> None:
    store = RunStore(CountingEtcd([etcd.endpoint]), f"/{unique('rc')}/", cache_size=0)
    try:
        rec = await _create(store)
        s, _ = await store.open_session(10, "h", timeout=T)
        n = _calls(store)
        epoch, _ = await store.claim_run(rec.run_id, s, "h", "drive", timeout=T)
        assert epoch == 1 and _calls(store) == n + 2 and len(store.cache) == 0
    finally:
        await store.etcd.close()


# --- the cache on its own (pure) ------------------------------------------------------


def _kv(rev: int) -> KV:
    return KV(key=b"k", value=b"v", mod_revision=rev)


def _ids(cache: RecordCache, ids: Sequence[str]) -> list[str]:
    return [i for i in ids if cache.get(i) is not None]


def test_least_recently_used_goes_first() -> None:
    cache = RecordCache(2)
    cache.put("a", _kv(1), None, 1, b"i1")
    cache.put("b", _kv(2), None, 2, b"i1")
    assert cache.get("a") is not None          # a is now the most recent
    cache.put("c", _kv(3), None, 3, b"i1")
    assert _ids(cache, ["a", "b", "c"]) == ["a", "c"] and len(cache) == 2


def test_an_older_observation_never_replaces_a_newer_one() -> None:
    cache = RecordCache(4)
    cache.put("a", _kv(7), _kv(7), 7, b"i1")
    cache.put("a", _kv(5), None, 6, b"i1")            # a slow read that started before the write
    e = cache.get("a")
    assert e is not None and (e.run_kv.mod_revision, e.claim_kv is not None, e.revision) == (7, True, 7)
    cache.put("a", _kv(7), None, 9, b"i1")            # same record, claim gone by revision 9
    e = cache.get("a")
    assert e is not None and e.claim_kv is None and e.revision == 9
    cache.put("a", None, None, 10, b"i1")             # the record is gone: forget it
    assert cache.get("a") is None


def test_another_incarnation_replaces_an_entry_and_an_unknown_one_forgets_it() -> None:
    cache = RecordCache(4)
    cache.put("a", _kv(900), None, 900, b"i1")
    cache.put("a", _kv(5), None, 5, b"i2")        # etcd's data was replaced: revisions restarted
    e = cache.get("a")
    assert e is not None and (e.revision, e.incarnation) == (5, b"i2")
    cache.put("a", _kv(6), None, 6, b"")         # read while no incarnation key existed
    assert cache.get("a") is None
    cache.put("b", _kv(7), None, 7, b"i2")
    cache.clear()
    assert len(cache) == 0


def test_size_zero_remembers_nothing_and_negative_is_refused() -> None:
    cache = RecordCache(0)
    cache.put("a", _kv(1), None, 1, b"i1")
    assert cache.get("a") is None and len(cache) == 0
    with pytest.raises(ValueError, match="size"):
        RecordCache(-1)
