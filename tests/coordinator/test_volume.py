"""The coordinator at volume on a real etcd: paged ranges,
every etcd error translated, the live/ended indexes and their backfill, retention."""
from __future__ import annotations

import asyncio
import signal
import time
from typing import AsyncIterator

import pytest

from baton.errors import InvalidArgument, RunIdRetired, StoreRefused, StoreUnavailable
from baton.v1.coordinator_pb2 import SandboxInstance
from baton.v1.runs_pb2 import RunRecord, RunStatus
from baton_tools.testing.seed import running_record, seed, terminal_record
from baton_tools.testing.servers import EtcdServer
from coordinator import _etcd as E
from coordinator import retention, rules
from coordinator._indexes import LIVE_INDEXES, ensure_indexes, live_runs
from coordinator._keys import prefix_end
from coordinator._store import RunStore
from tests.conftest import assert_eventually, freeze, unique

RUNNING, COMPLETED = RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_COMPLETED


@pytest.fixture
async def store(etcd: EtcdServer) -> AsyncIterator[RunStore]:
    """A store with 3-key pages, so a few records exercise continuation."""
    s = RunStore(E.Etcd([etcd.endpoint], page_size=3), f"/{unique('v')}/", cache_size=0)
    try:
        yield s
    finally:
        await s.etcd.close()


async def test_range_pages_walk_every_key_in_order_at_one_revision(store: RunStore) -> None:
    p = store.keys.prefix.encode() + b"k/"
    await store.etcd.txn([], [E.put(p + b"%02d" % i, b"v") for i in range(10)], timeout=5)
    pages, revs = [], set()
    async for kvs, rev in store.etcd.range_pages(p, prefix_end(p), timeout=5):
        pages.append([kv.key[len(p):] for kv in kvs])
        revs.add(rev)
        if len(pages) == 1:  # written after the first page: not in this snapshot
            await store.etcd.txn([], [E.put(p + b"05a", b"v"), E.delete(p + b"09")], timeout=5)
    assert pages == [[b"00", b"01", b"02"], [b"03", b"04", b"05"], [b"06", b"07", b"08"], [b"09"]]
    assert len(revs) == 1
    kvs, _ = await store.etcd.range_all(p, prefix_end(p), timeout=5, keys_only=True)
    assert [kv.key[len(p):] for kv in kvs] == [b"00", b"01", b"02", b"03", b"04", b"05", b"05a", b"06", b"07", b"08"]


async def test_an_empty_range_yields_one_empty_page_with_the_revision(store: RunStore) -> None:
    p = store.keys.prefix.encode() + b"none/"
    pages = [(kvs, rev) async for kvs, rev in store.etcd.range_pages(p, prefix_end(p), timeout=5)]
    assert len(pages) == 1 and pages[0][0] == [] and pages[0][1] > 0


async def test_a_response_over_the_grpc_limit_is_a_domain_error_and_paging_reads_it(store: RunStore) -> None:
    # Five values of 1 MiB: one unpaged range answers 5 MiB, over gRPC's 4 MiB receive limit.
    p = store.keys.prefix.encode() + b"big/"
    for i in range(5):
        await store.etcd.txn([], [E.put(p + b"%d" % i, b"x" * (1 << 20))], timeout=10)
    with pytest.raises(StoreRefused) as ei:
        await store.etcd.range(p, prefix_end(p), timeout=10)
    assert ei.value.code == "RESOURCE_EXHAUSTED" and "RESOURCE_EXHAUSTED" in str(ei.value)
    kvs, _ = await store.etcd.range_all(p, prefix_end(p), timeout=10, keys_only=True)
    assert len(kvs) == 5
    await store.etcd.txn([], [E.delete(p, prefix_end(p))], timeout=5)


async def test_a_future_revision_is_refused_with_a_domain_error(store: RunStore) -> None:
    _, rev = await store.etcd.range(store.keys.runs, timeout=5)
    with pytest.raises(StoreRefused) as ei:
        await store.etcd.range(store.keys.runs, prefix_end(store.keys.runs), revision=rev + 1000, timeout=5)
    assert ei.value.code == "OUT_OF_RANGE"


async def test_list_runs_pages_and_keeps_the_newest(store: RunStore) -> None:
    now = time.time()
    recs = [terminal_record(i, tag="a", finished_at=now - 100 + i) for i in range(8)]
    recs[2].tenant = "other"
    await seed(store.etcd, store.keys.prefix, recs)
    got = await store.list_runs("", "", 0, timeout=5)
    assert [r.run_id for r in got] == [r.run_id for r in recs]
    newest = await store.list_runs("", "acme", 3, timeout=5)
    assert [r.run_id for r in newest] == [recs[5].run_id, recs[6].run_id, recs[7].run_id]
    assert [r.run_id for r in await store.list_runs("", "other", 0, timeout=5)] == [recs[2].run_id]


async def test_status_writes_keep_the_live_and_ended_indexes(store: RunStore) -> None:
    k = store.keys
    rec, _ = await store.create_or_resume(RunRecord(run_id=unique("r"), thread_id=unique("t"), tenant="acme"),
                                          False, timeout=5)
    assert [r.run_id for r in await live_runs(store, timeout=5)] == [rec.run_id]
    patch = RunRecord(status=COMPLETED, finished_at=1234.5)
    await store.update_run(rec.run_id, patch, ["status", "finished_at"], 0, 0, timeout=5)
    assert await live_runs(store, timeout=5) == []
    ended, _ = await store.etcd.range_all(k.ended_prefix, prefix_end(k.ended_prefix), timeout=5)
    assert [kv.key for kv in ended] == [k.ended(1234.5, rec.run_id)]


async def test_backfill_indexes_a_store_written_before_the_indexes_once(store: RunStore) -> None:
    k = store.keys
    now = time.time()
    old = [terminal_record(i, tag="b", finished_at=now - 10) for i in range(7)]
    live = [running_record(i, tag="b") for i in range(4)]
    await seed(store.etcd, k.prefix, [*old, *live], indexed=False)
    assert await ensure_indexes(store, timeout=5) == 11
    assert sorted(r.run_id for r in await live_runs(store, timeout=5)) == [r.run_id for r in live]
    ended, _ = await store.etcd.range_all(k.ended_prefix, prefix_end(k.ended_prefix), keys_only=True, timeout=5)
    assert len(ended) == 7
    assert await ensure_indexes(store, timeout=5) == 0  # the marker: one read from now on


async def test_retention_deletes_old_terminal_records_their_entries_and_own_sandboxes(store: RunStore) -> None:
    k = store.keys
    now = time.time()
    old = [terminal_record(i, tag="c", finished_at=now - 1000 + i) for i in range(10)]
    young = [terminal_record(100 + i, tag="c", finished_at=now) for i in range(2)]
    live = [running_record(i, tag="c") for i in range(2)]
    await seed(store.etcd, k.prefix, [*old, *young, *live])
    for rec in (old[0], young[0]):
        await store.put_sandbox(SandboxInstance(sandbox_key=rec.sandbox_key, run_id=rec.run_id), timeout=5)
    # A sandbox entry a later run took over stays with it.
    await store.put_sandbox(SandboxInstance(sandbox_key=old[1].sandbox_key, run_id="later"), timeout=5)
    # A record that changes between the read and the delete is not deleted (compare-on-write).
    before, _ = await store.etcd.range(k.run(old[3].run_id), timeout=5)
    await store.etcd.txn([], [E.put(k.run(old[3].run_id), before[0].value)], timeout=5)
    plan = rules.expire(k, old[3].run_id, before[0], k.ended(old[3].finished_at, old[3].run_id), None, cutoff=now)
    assert plan is not None and len(plan[1]) == 8  # record, 3 entries, 4 listing entries
    assert not (await store.etcd.txn(*plan, timeout=5)).succeeded
    assert (await store.get_run(old[3].run_id, timeout=5))[0] is not None
    deleted = await retention.expire(store, now - 500, timeout=5, batch=4, pause=0)
    assert deleted == 10
    left = {r.run_id for r in await store.list_runs("", "", 0, timeout=5)}
    assert left == {r.run_id for r in [*young, *live]}
    assert await store.get_sandbox(old[0].sandbox_key, timeout=5) is None
    assert (await store.get_sandbox(old[1].sandbox_key, timeout=5)) is not None
    assert (await store.get_sandbox(young[0].sandbox_key, timeout=5)) is not None
    members, _ = await store.etcd.range_all(k.prefix.encode() + b"thread-runs/", prefix_end(k.prefix.encode() + b"thread-runs/"),
                                            keys_only=True, timeout=5)
    assert len(members) == 4
    # The thread keeps its owner, so its transcript stays its tenant's.
    assert await store.thread_tenant(old[0].thread_id, timeout=5) == "acme"


async def test_list_page_walks_a_tenant_page_by_page_from_the_index(store: RunStore) -> None:
    now = time.time()
    recs = [terminal_record(i, tag="p", finished_at=now - 100 + i) for i in range(7)]
    recs[3].tenant = "other"
    await seed(store.etcd, store.keys.prefix, recs)
    pages, token = [], ""
    while True:
        got, token = await store.list_page("acme", 2, token, timeout=5)
        pages.append([r.run_id for r in got])
        if not token:
            break
    assert pages == [[recs[i].run_id for i in ids] for ids in ([0, 1], [2, 4], [5, 6])]
    everyone, _ = await store.list_page("", 10, "", timeout=5)
    assert [r.run_id for r in everyone] == [r.run_id for r in recs]
    with pytest.raises(InvalidArgument):
        await store.list_page("acme", 2, "bm90IGEgdG9rZW4", timeout=5)


async def test_a_v1_store_serves_live_runs_at_once_and_gets_its_listing_backfilled(store: RunStore) -> None:
    k = store.keys
    now = time.time()
    old = [terminal_record(i, tag="u", finished_at=now - 10 + i) for i in range(5)]
    live = [running_record(i, tag="u") for i in range(2)]
    await seed(store.etcd, k.prefix, [*old, *live], indexed=False)
    for rec in [*old, *live]:  # live/ended as a v1 coordinator wrote them, no started/
        await store.etcd.txn([], [op for op in rules.backfill_indexes(k, rec)
                                  if not op.request_put.key.startswith(k.prefix.encode() + b"started/")], timeout=5)
    await store.etcd.txn([], [E.put(k.indexes_marker, b"v1")], timeout=5)
    assert await ensure_indexes(store, timeout=5, version=LIVE_INDEXES) == 0  # start-up: one read
    assert sorted(r.run_id for r in await live_runs(store, timeout=5)) == [r.run_id for r in live]
    assert await store.list_runs("", "acme", 10, timeout=5) == []
    assert await ensure_indexes(store, timeout=5) == 7  # the background walk, once
    assert [r.run_id for r in await store.list_runs("", "acme", 3, timeout=5)] == [r.run_id for r in [*old, *live][-3:]]
    assert await ensure_indexes(store, timeout=5) == 0


async def test_a_run_id_retention_deleted_cannot_start_again_while_retired(store: RunStore) -> None:
    k = store.keys
    now = time.time()
    run_id, thread_id = unique("r"), unique("t")
    forever = terminal_record(0, tag=unique("f"), finished_at=now - 1000)
    await seed(store.etcd, k.prefix, [forever])
    assert await retention.expire(store, now - 500, timeout=5, pause=0) == 1  # no log max age: forever
    kvs, _ = await store.etcd.range(k.retired(forever.run_id), timeout=5)
    assert kvs and kvs[0].lease == 0 and kvs[0].value == forever.thread_id.encode()

    rec, _ = await store.create_or_resume(RunRecord(run_id=run_id, thread_id=thread_id, tenant="acme"), False, timeout=5)
    await store.update_run(run_id, RunRecord(status=COMPLETED, finished_at=now - 1000), ["status", "finished_at"],
                           0, 0, timeout=5)
    assert await retention.expire(store, now - 500, timeout=5, pause=0, retired_ttl=2) == 1
    assert (await store.get_run(run_id, timeout=5))[0] is None
    listed = {r.run_id for r in await store.list_runs("", "acme", 0, timeout=5)}
    assert run_id not in listed and forever.run_id not in listed
    # Same thread or another, same tenant or another: refused while retired.
    for tenant, thread in (("acme", thread_id), ("other", unique("t"))):
        with pytest.raises(RunIdRetired) as ei:
            await store.create_or_resume(RunRecord(run_id=run_id, thread_id=thread, tenant=tenant), False, timeout=5)
        assert ei.value.run_id == run_id

    # Once the log's max age has passed (the lease), the id starts a new run from scratch.
    async def starts() -> RunRecord:
        try:
            new, created = await store.create_or_resume(RunRecord(run_id=run_id, thread_id=thread_id, tenant="acme"),
                                                        False, timeout=5)
        except RunIdRetired:
            raise AssertionError("still retired") from None
        assert created
        return new

    new = await assert_eventually(starts, timeout=20)
    assert new.status == RUNNING and new.driver_epoch == 0 and new.started_at > rec.started_at


async def test_retention_passes_share_one_lease_for_the_ids_they_retire(store: RunStore) -> None:
    k = store.keys
    now = time.time()
    day = 86400.0
    recs = [terminal_record(i, tag=unique("l"), finished_at=now - 1000) for i in range(3)]
    # Two passes a while apart (each deletes one record) under a one-day log max age.
    for rec in recs[:2]:
        await seed(store.etcd, k.prefix, [rec])
        assert await retention.expire(store, now - 500, timeout=5, pause=0, retired_ttl=day) == 1
    leases = set()
    for rec in recs[:2]:
        kvs, _ = await store.etcd.range(k.retired(rec.run_id), timeout=5)
        leases.add(kvs[0].lease)
    assert len(leases) == 1 and 0 not in leases  # one lease for both, not one per pass
    lease = leases.pop()
    # At least the max age left (ids stay retired that long), at most one span more.
    assert day <= await store.etcd.time_to_live(lease, timeout=5) <= day + retention.RETIRED_LEASE_SPAN
    named, _ = await store.etcd.range(k.retired_lease, timeout=5)
    assert int(named[0].value) == lease and named[0].lease == lease  # goes with its lease

    # A pass whose max age is longer than the shared lease has left gets a new lease, and
    # the name moves to it: no id is retired for less than the max age.
    await seed(store.etcd, k.prefix, recs[2:])
    assert await retention.expire(store, now - 500, timeout=5, pause=0, retired_ttl=2 * day) == 1
    kvs, _ = await store.etcd.range(k.retired(recs[2].run_id), timeout=5)
    assert kvs[0].lease != lease
    assert 2 * day <= await store.etcd.time_to_live(kvs[0].lease, timeout=5)
    named, _ = await store.etcd.range(k.retired_lease, timeout=5)
    assert int(named[0].value) == kvs[0].lease
    for old in (lease, kvs[0].lease):
        await store.etcd.revoke(old, timeout=5)


async def test_a_read_only_txn_past_its_timeout_is_unavailable_and_etcd_lives_on(own_etcd: EtcdServer) -> None:
    """Its call is not cancelled (etcd <= 3.5.4 panics on a cancelled read-only txn): the
    caller gets ``StoreUnavailable`` at its timeout, etcd keeps answering, and a close
    ends what is still in flight. etcd is paused, so the timeout is certain to pass first
    (a tiny timeout alone raced a fast etcd); it works through the txns once resumed."""
    etcd = own_etcd
    client = E.Etcd([etcd.endpoint])
    key = f"/{unique('ro')}/k".encode()
    try:
        await client.txn([], [E.put(key, b"v")], timeout=5)
        await freeze(etcd.proc)
        try:
            for _ in range(5):
                with pytest.raises(StoreUnavailable):
                    await client.txn([], [E.get(key)] * 100, timeout=0.1)
        finally:
            etcd.proc.send_signal(signal.SIGCONT)
        res = await client.txn([], [E.get(key)], timeout=5)
        assert [kv.value for kv in res.kvs(0)] == [b"v"]
    finally:
        await client.close()
    assert etcd.proc.poll() is None


async def test_closing_the_client_with_reads_in_flight_leaves_etcd_running(own_etcd: EtcdServer) -> None:
    """``close`` lets read-only transactions still running end before it closes the channel.

    Closing a channel cancels its calls, and etcd <= 3.5.4 (the tests' 3.5.1) panics on a
    read-only transaction cancelled while it runs (etcd-io/etcd#14110). Each round sends 10
    reads of a 3 MB range and closes the client as soon as the first is answered, so the
    others are mid-apply; before ``close`` waited for them, the reads were cancelled and etcd
    died within a few rounds. Every read is answered in full, and a call made once the close
    began is refused.
    """
    etcd = own_etcd
    p = f"/{unique('close')}/".encode()
    client = E.Etcd([etcd.endpoint])
    try:
        for i in range(0, 3000, 100):
            await client.txn([], [E.put(p + b"%06d" % j, b"x" * 1000) for j in range(i, i + 100)], timeout=10)
    finally:
        await client.close()
    for _ in range(10):
        client = E.Etcd([etcd.endpoint], close_grace=60)  # the drain is tested, not its bound
        reads = [asyncio.ensure_future(client.txn([], [E.get(p, prefix_end(p))], timeout=30)) for _ in range(10)]
        await asyncio.wait(reads, return_when=asyncio.FIRST_COMPLETED)
        closing = asyncio.ensure_future(client.close())
        await asyncio.sleep(0)  # one turn of the loop: the close begins (no time passes)
        with pytest.raises(StoreUnavailable, match="closed"):
            await client.txn([], [E.get(p)], timeout=30)
        await closing
        answers = await asyncio.gather(*reads, return_exceptions=True)
        assert etcd.proc.poll() is None, etcd.log_tail(1500)
        assert [len(a.kvs(0)) if isinstance(a, E.TxnResult) else a for a in answers] == [3000] * 10
