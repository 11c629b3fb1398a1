"""Adversarial tests of the coordinator's record cache (coordinator/_cache.py).

Several RunStore replicas (tiny caches included, so entries get evicted and go stale) on
one prefix, against a real etcd. Every answer is checked against a fresh read made just
before the operation by a cache-less store (the oracle), and invariants (epochs, indexes,
claims, presence) are checked against etcd after every step.
"""
from __future__ import annotations

import asyncio
import random
from typing import AsyncIterator, Awaitable, Callable

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient
from baton.coordinator_client import UpdateOutcome as ClientOutcome
from baton_tools.testing.cluster import start_coordinator
from baton_tools.testing.servers import EtcdServer
from baton.v1.runs_pb2 import Claim, RunRecord, RunStatus
from coordinator import _etcd as E
from coordinator._etcd import Etcd
from coordinator._keys import prefix_end
from coordinator._records import is_active, is_terminal
from coordinator._store import RunStore, UpdateOutcome
from coordinator.takeovers import stamp_claim
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
    if out.last_takeover.claimed_at:
        out.last_takeover.claimed_at = 1.0  # the claiming replica's clock: only its presence
    return out


async def _state(oracle: RunStore, run_id: str) -> tuple[RunRecord | None, Claim | None, int]:
    rec, claim = await oracle.get_run(run_id, timeout=T)
    return rec, claim, await oracle.reader_count(run_id, timeout=T)


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
                stamp_claim(pre, exp, f"host-{sid}", 1.0)
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
            active = await oracle.find_active_run(pre.thread_id, timeout=T)
            if st == RUNNING and active is not None and active.run_id != run_id:
                # Back to running while another run of the thread runs: refused.
                with pytest.raises(errors.ThreadBusy):
                    await store.update_run(run_id, RunRecord(status=st), ["status"], 0, 0, timeout=T)
                continue
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


# --- concurrency across replicas ------------------------------------------------------


async def _new_run(store: RunStore, thread_id: str | None = None, tenant: str = "",
                   interrupt: bool = False) -> RunRecord:
    rec, created = await store.create_or_resume(
        RunRecord(run_id=unique("run-"), thread_id=thread_id or unique("th-"), tenant=tenant),
        interrupt, timeout=T)
    assert created
    return rec


async def _claim_or_reason(store: RunStore, run_id: str, sid: int, purpose: str = "drive") -> int | str:
    try:
        epoch, _ = await store.claim_run(run_id, sid, f"host-{sid}", purpose, timeout=T)
        return epoch
    except errors.RunClaimNotAcquired as exc:
        return exc.reason


async def test_claim_storm_across_stale_replicas_has_one_winner_per_round(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    rec = await _new_run(replicas[0])
    others = [await _new_run(replicas[0]) for _ in range(3)]  # evict entries of tiny caches
    sessions = [(await oracle.open_session(30, f"h{i}", timeout=T))[0] for i in range(8)]
    for s in replicas:
        await s.get_run(rec.run_id, timeout=T)
    expected_epoch = 1
    rnd = random.Random(7)
    for _round in range(12):
        # Touch other runs on some replicas so small caches drop (or keep) this run at random.
        for s in replicas:
            if rnd.random() < 0.5:
                await s.get_run(rnd.choice(others).run_id, timeout=T)
        jobs = [_claim_or_reason(replicas[i % len(replicas)], rec.run_id, sessions[i % len(sessions)],
                                 rnd.choice(["drive", "finalize"]))
                for i in range(16)]
        rnd.shuffle(jobs)
        outs = await asyncio.gather(*jobs)
        wins = [o for o in outs if isinstance(o, int)]
        assert wins == [expected_epoch], outs
        assert all(o == "held" for o in outs if not isinstance(o, int)), outs
        fresh, claim = await oracle.get_run(rec.run_id, timeout=T)
        assert fresh is not None and claim is not None
        assert fresh.driver_epoch == claim.epoch == expected_epoch
        # Release from a random replica (its entry may be stale), or kill the session.
        if rnd.random() < 0.5:
            assert await rnd.choice(replicas).release_claim(rec.run_id, claim.session_id, claim.epoch, timeout=T)
        else:
            await rnd.choice(replicas).close_session(claim.session_id, timeout=T)
            sessions[sessions.index(claim.session_id)] = (await oracle.open_session(30, "h", timeout=T))[0]
        expected_epoch += 1


async def test_old_owner_writes_racing_a_takeover_never_land_after_it(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    x, y = replicas[3], replicas[2]
    for _round in range(6):
        rec = await _new_run(x)
        sa, _ = await oracle.open_session(30, "a", timeout=T)
        sb, _ = await oracle.open_session(30, "b", timeout=T)
        ea, _ = await x.claim_run(rec.run_id, sa, "a", "drive", timeout=T)
        await y.get_run(rec.run_id, timeout=T)
        applied: list[int] = []
        lost = 0

        async def old_owner() -> None:
            nonlocal lost
            for i in range(25):
                try:
                    out, got = await x.update_run(rec.run_id, RunRecord(sandbox_key=f"a-{i}"),
                                                  ["sandbox_key"], ea, sa, timeout=T)
                    assert out is UpdateOutcome.APPLIED and got is not None
                    applied.append(got.revision)
                except errors.RunClaimLost:
                    lost += 1
                await asyncio.sleep(0)

        async def takeover() -> tuple[int, int]:
            await asyncio.sleep(0.005 * _round)
            await y.close_session(sa, timeout=T)
            eb, got = await y.claim_run(rec.run_id, sb, "b", "drive", timeout=T)
            out, after = await y.update_run(rec.run_id, RunRecord(sandbox_key="b"), ["sandbox_key"], eb, sb, timeout=T)
            assert out is UpdateOutcome.APPLIED and after is not None
            return got.revision, eb

        _, (claim_rev, eb) = await asyncio.gather(old_owner(), takeover())
        assert eb == ea + 1
        assert all(r < claim_rev for r in applied), (applied, claim_rev)
        fresh, claim = await oracle.get_run(rec.run_id, timeout=T)
        assert fresh is not None and fresh.sandbox_key == "b" and fresh.driver_epoch == eb
        assert claim is not None and claim.session_id == sb
        # The old owner's terminal write is suppressed, from either replica.
        for s in (x, y):
            out, _ = await s.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"], ea, 0, timeout=T)
            assert out is UpdateOutcome.SUPPRESSED
            with pytest.raises(errors.RunClaimLost):
                await s.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"], ea + 1, sa, timeout=T)


async def test_concurrent_field_writes_from_all_replicas_lose_nothing(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    rec = await _new_run(replicas[0])
    s, _ = await oracle.open_session(30, "h", timeout=T)
    epoch, _ = await replicas[1].claim_run(rec.run_id, s, "h", "drive", timeout=T)

    async def write(i: int) -> None:
        st = replicas[i % len(replicas)]
        if i == 0:
            await st.update_run(rec.run_id, RunRecord(sandbox_key="sb"), ["sandbox_key"], epoch, s, timeout=T)
        elif i == 1:
            await st.request_cancel(rec.run_id, "user", timeout=T)
        elif i == 2:
            await st.detach_if_unread(rec.run_id, timeout=T)
        elif i == 3:
            await st.update_run(rec.run_id, RunRecord(parent_run_id="p"), ["parent_run_id"], 0, 0, timeout=T)
        elif i == 4:
            await st.update_run(rec.run_id, RunRecord(driver_host="t"), ["driver_host"], epoch, s, timeout=T)
        elif i == 5:
            await st.update_run(rec.run_id, RunRecord(cancel_on_disconnect=True), ["cancel_on_disconnect"], 0, 0, timeout=T)

    for _ in range(5):
        await asyncio.gather(*[write(i) for i in range(6)])
    fresh, claim = await oracle.get_run(rec.run_id, timeout=T)
    assert fresh is not None and claim is not None
    assert (fresh.sandbox_key, fresh.cancel_requested, fresh.cancel_reason, fresh.parent_run_id, fresh.driver_host,
            fresh.cancel_on_disconnect, fresh.HasField("detached_since"), fresh.driver_epoch) == \
        ("sb", True, "user", "p", "t", True, True, 1)


async def test_reader_register_racing_unregister_and_detach_never_leaves_detached(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    rec = await _new_run(replicas[0])
    g, _ = await oracle.open_session(30, "gw", timeout=T)
    await replicas[0].register_reader(rec.run_id, g, "r0", timeout=T)
    current = "r0"
    rnd = random.Random(3)
    for i in range(25):
        nxt = f"r{i + 1}"
        a, b, c = rnd.sample(replicas, 3)
        await asyncio.gather(a.unregister_reader(rec.run_id, current, timeout=T),
                             b.register_reader(rec.run_id, g, nxt, timeout=T),
                             c.detach_if_unread(rec.run_id, timeout=T))
        current = nxt
        fresh, _ = await oracle.get_run(rec.run_id, timeout=T)
        assert fresh is not None
        assert await oracle.reader_count(rec.run_id, timeout=T) == 1
        assert not fresh.HasField("detached_since"), f"round {i}: detached with a reader"
        kvs, _ = await oracle.etcd.range(oracle.keys.reclaimable_prefix,
                                         prefix_end(oracle.keys.reclaimable_prefix), timeout=T)
        assert not kvs
    # Last reader leaves: detached exactly once, from any replica.
    await replicas[1].unregister_reader(rec.run_id, current, timeout=T)
    fresh, _ = await oracle.get_run(rec.run_id, timeout=T)
    assert fresh is not None and fresh.HasField("detached_since")
    for s in replicas:
        assert await s.detach_if_unread(rec.run_id, timeout=T) is None


async def test_interrupt_by_new_run_on_another_replica_is_not_lost_by_a_cached_owner(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    x, y = replicas[3], replicas[0]
    th = unique("th-")
    r1 = await _new_run(x, th, "ten")
    s, _ = await oracle.open_session(30, "h", timeout=T)
    e1, _ = await x.claim_run(r1.run_id, s, "h", "drive", timeout=T)
    r2 = await _new_run(y, th, "ten", interrupt=True)
    # X's entry for r1 predates the interrupt; its owner write must keep the cancel.
    out, got = await x.update_run(r1.run_id, RunRecord(sandbox_key="sb"), ["sandbox_key"], e1, s, timeout=T)
    assert out is UpdateOutcome.APPLIED and got is not None
    assert got.cancel_requested and got.cancel_reason == "interrupted-by-new-run"
    assert await x.release_claim(r1.run_id, s, e1, timeout=T)
    assert await _claim_or_reason(x, r1.run_id, s, "drive") == "cancel_requested"
    assert await _claim_or_reason(x, r1.run_id, s, "finalize") == e1 + 1
    # Ending r1 does not take the thread index from r2.
    out, _ = await x.update_run(r1.run_id, RunRecord(status=ABORTED), ["status"], e1 + 1, s, timeout=T)
    assert out is UpdateOutcome.APPLIED
    found = await oracle.find_active_run(th, timeout=T)
    assert found is not None and found.run_id == r2.run_id


# --- leases, etcd faults, lost answers ------------------------------------------------


async def test_a_lease_expiring_under_a_cached_claim(cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    x, y = replicas[3], replicas[1]
    rec = await _new_run(x)
    short, _ = await oracle.open_session(1, "dying", timeout=T)  # never kept alive
    e1, _ = await x.claim_run(rec.run_id, short, "dying", "drive", timeout=T)
    await y.get_run(rec.run_id, timeout=T)  # Y caches the claim too

    async def claim_gone() -> bool:
        return (await oracle.get_run(rec.run_id, timeout=T))[1] is None

    await assert_eventually(claim_gone, timeout=10, interval=0.05)
    with pytest.raises(errors.RunClaimLost) as lost:
        await x.update_run(rec.run_id, RunRecord(sandbox_key="late"), ["sandbox_key"], e1, short, timeout=T)
    assert lost.value.observed == "claim-gone"
    with pytest.raises(errors.SessionLost):
        await y.claim_run(rec.run_id, short, "dying", "drive", timeout=T)
    with pytest.raises(errors.SessionLost):
        await x.register_reader(rec.run_id, short, "r", timeout=T)
    live, _ = await oracle.open_session(30, "live", timeout=T)
    assert await _claim_or_reason(y, rec.run_id, live) == e1 + 1
    assert await _claim_or_reason(x, rec.run_id, live) == "held"
    fresh, claim = await oracle.get_run(rec.run_id, timeout=T)
    assert fresh is not None and fresh.sandbox_key == "" and claim is not None and claim.epoch == e1 + 1


async def test_answers_lost_to_tiny_deadlines_never_confuse_the_cache(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    """A write may commit while its caller sees StoreUnavailable: the replica must not act on
    what it believed before."""
    replicas, oracle = cluster
    rec = await _new_run(replicas[0])
    sessions = [(await oracle.open_session(30, f"h{i}", timeout=T))[0] for i in range(3)]
    rnd = random.Random(11)
    max_epoch = 0
    unavailable = 0
    # 60 operations at least, and on until three of them lost their answer to the deadline
    # (a quiet machine answers most even within 0.5 ms: CI once saw none lost in 60).
    for i in range(600):
        if i >= 60 and unavailable >= 3:
            break
        st = rnd.choice(replicas)
        sid = rnd.choice(sessions)
        pre, claim = await oracle.get_run(rec.run_id, timeout=T)
        assert pre is not None
        budget = rnd.choice([0.0005, 0.001, 0.002, 0.005, T])
        op = rnd.choice(["claim", "release", "owner"])
        try:
            if op == "claim":
                epoch, _ = await st.claim_run(rec.run_id, sid, "h", "drive", timeout=budget)
                assert claim is None and epoch == pre.driver_epoch + 1
            elif op == "release" and claim is not None:
                ok = await st.release_claim(rec.run_id, claim.session_id, claim.epoch, timeout=budget)
                assert ok
            elif op == "owner" and claim is not None:
                out, _ = await st.update_run(rec.run_id, RunRecord(sandbox_key=unique("s")), ["sandbox_key"],
                                             claim.epoch, claim.session_id, timeout=budget)
                assert out is UpdateOutcome.APPLIED
        except errors.StoreUnavailable:
            unavailable += 1
        except errors.RunClaimNotAcquired as exc:
            assert claim is not None and exc.reason == "held"
        post, post_claim = await oracle.get_run(rec.run_id, timeout=T)
        assert post is not None and post.driver_epoch >= max_epoch
        max_epoch = post.driver_epoch
        if post_claim is not None:
            assert post_claim.epoch == post.driver_epoch
    assert unavailable > 0


async def test_etcd_sigkill_and_restart_mid_sequence(own_etcd: EtcdServer) -> None:
    prefix = f"/{unique('bk')}/"
    replicas = _stores(own_etcd.endpoint, prefix, (1, 10_000))
    oracle = RunStore(Etcd([own_etcd.endpoint]), prefix, cache_size=0)
    try:
        x, y = replicas
        rec = await _new_run(x)
        other = await _new_run(x)
        sa, _ = await oracle.open_session(60, "a", timeout=T)
        sb, _ = await oracle.open_session(60, "b", timeout=T)
        ea, _ = await x.claim_run(rec.run_id, sa, "a", "drive", timeout=T)
        await y.get_run(rec.run_id, timeout=T)
        # A write races the crash: it may or may not have committed.
        pending = asyncio.ensure_future(x.update_run(rec.run_id, RunRecord(sandbox_key="maybe"), ["sandbox_key"],
                                                     ea, sa, timeout=2.0))
        own_etcd.kill()
        with pytest.raises(errors.StoreUnavailable):
            await y.claim_run(rec.run_id, sb, "b", "drive", timeout=0.5)
        try:
            await pending
        except errors.StoreUnavailable:
            pass
        own_etcd.start()

        async def up() -> bool:
            try:
                await oracle.get_run(other.run_id, timeout=1.0)
                return True
            except errors.StoreUnavailable:
                return False

        await assert_eventually(up, timeout=20, interval=0.1)
        # Leases survive a restart: the claim is still A's, refused as held from both replicas.
        for s in (x, y):
            await assert_eventually(lambda s=s: _retry_unavailable(_claim_or_reason(s, rec.run_id, sb)),
                                    timeout=10)
        assert await _claim_or_reason(y, rec.run_id, sb) == "held"
        assert await _claim_or_reason(x, rec.run_id, sb) == "held"
        # Y (stale on anything written around the crash) takes over after A's session ends.
        await y.close_session(sa, timeout=T)
        assert await _claim_or_reason(y, rec.run_id, sb) == ea + 1
        with pytest.raises(errors.RunClaimLost):
            await x.update_run(rec.run_id, RunRecord(sandbox_key="late"), ["sandbox_key"], ea, sa, timeout=T)
        out, got = await x.update_run(rec.run_id, RunRecord(sandbox_key="b"), ["sandbox_key"], ea + 1, sb, timeout=T)
        assert out is UpdateOutcome.APPLIED and got is not None and got.driver_epoch == ea + 1
        fresh, claim = await oracle.get_run(rec.run_id, timeout=T)
        assert fresh is not None and claim is not None and (fresh.sandbox_key, claim.epoch) == ("b", ea + 1)
    finally:
        await _close([*replicas, oracle])


async def _not(check: Awaitable[bool]) -> bool:
    return not await check


async def _retry_unavailable(coro: "asyncio.Future[object] | object") -> bool:
    try:
        await coro  # type: ignore[misc]
        return True
    except errors.StoreUnavailable:
        return False


# --- tenants --------------------------------------------------------------------------


async def test_racing_first_runs_of_two_tenants_on_one_thread(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    for _round in range(8):
        th = unique("th-")

        async def create(i: int) -> str:
            tenant = f"ten-{i % 2}"
            try:
                rec, created = await replicas[i % len(replicas)].create_or_resume(
                    RunRecord(run_id=unique("run-"), thread_id=th, tenant=tenant), i % 3 == 0, timeout=T)
                return f"ok:{tenant}:{created}"
            except errors.UnknownThread:
                return f"unknown:{tenant}"
            except errors.ThreadBusy:
                return f"busy:{tenant}"

        outs = await asyncio.gather(*[create(i) for i in range(8)])
        ok_tenants = {o.split(":")[1] for o in outs if o.startswith("ok")}
        assert len(ok_tenants) == 1, outs
        owner = ok_tenants.pop()
        assert all(o.split(":")[1] == owner for o in outs if not o.startswith("unknown")), outs
        assert all(o.split(":")[1] != owner for o in outs if o.startswith("unknown")), outs
        runs = await oracle.list_runs(th, "", 0, timeout=T)
        assert runs and {r.tenant for r in runs} == {owner}
        kvs, _ = await oracle.etcd.range(oracle.keys.thread_tenant(th), timeout=T)
        assert kvs and kvs[0].value.decode() == owner
        active = await oracle.find_active_run(th, timeout=T)
        assert active is not None and active.tenant == owner


async def test_another_tenant_cannot_interrupt_or_reuse_a_thread(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    th = unique("th-")
    a = await _new_run(replicas[0], th, "ten-a")
    for s in replicas:
        with pytest.raises(errors.UnknownThread):
            await _new_run(s, th, "ten-b", interrupt=True)
        with pytest.raises(errors.UnknownThread):
            await _new_run(s, th, "", interrupt=True)
    fresh, _ = await oracle.get_run(a.run_id, timeout=T)
    assert fresh is not None and not fresh.cancel_requested
    # Even once every run of the thread has ended, it stays tenant A's.
    await replicas[1].update_run(a.run_id, RunRecord(status=COMPLETED), ["status"], 0, 0, timeout=T)
    for s in replicas:
        with pytest.raises(errors.UnknownThread):
            await _new_run(s, th, "ten-b")
    b2 = await _new_run(replicas[2], th, "ten-a")
    assert b2.tenant == "ten-a"
    assert {r.tenant for r in await oracle.list_runs(th, "", 0, timeout=T)} == {"ten-a"}


# --- through gRPC: two coordinator replicas -------------------------------------------


async def test_two_coordinator_replicas_over_grpc(etcd: EtcdServer) -> None:
    prefix = f"/{unique('bk')}/"
    c1 = await start_coordinator(etcd.endpoint, prefix, in_process=True, record_cache_size=1)
    c2 = await start_coordinator(etcd.endpoint, prefix, in_process=True)
    try:
        async with CoordinatorClient(c1.address) as a, CoordinatorClient(c2.address) as b:
            th = unique("th-")
            rec, _ = await a.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=th, tenant="t"))
            filler, _ = await a.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
            sa = await a.open_session(5.0, owner="ha")
            sb = await b.open_session(5.0, owner="hb")
            for round_ in range(5):
                first, second = (a, b) if round_ % 2 == 0 else (b, a)
                s1, s2 = (sa, sb) if round_ % 2 == 0 else (sb, sa)
                outs = await asyncio.gather(first.claim_run(rec.run_id, s1, "h1"),
                                            second.claim_run(rec.run_id, s2, "h2"),
                                            return_exceptions=True)
                wins = [o for o in outs if not isinstance(o, BaseException)]
                assert len(wins) == 1, outs
                assert all(isinstance(o, errors.RunClaimNotAcquired) and o.reason == "held"
                           for o in outs if isinstance(o, BaseException)), outs
                epoch = wins[0][0]
                assert epoch == round_ + 1
                winner_session = s1 if not isinstance(outs[0], BaseException) else s2
                loser_client = second if winner_session is s1 else first
                await a.get_run(filler.run_id)  # evict rec from c1's one-entry cache
                out, got = await loser_client.update_run(rec.run_id, RunRecord(sandbox_key=f"sb{round_}"),
                                                         ["sandbox_key"], epoch=epoch, session_id=winner_session)
                assert out is ClientOutcome.APPLIED and got is not None and got.sandbox_key == f"sb{round_}"
                assert await loser_client.release_claim(rec.run_id, winner_session, epoch)
            with pytest.raises(errors.UnknownThread):
                await b.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=th, tenant="u"),
                                             interrupt_active=True)
            view = await a.get_run(rec.run_id)
            assert view.claim is None and view.record.driver_epoch == 5 and not view.record.cancel_requested
    finally:
        await c1.stop()
        await c2.stop()


# --- concurrent random batches, checked against etcd's history ------------------------


async def _at(oracle: RunStore, key: bytes, revision: int) -> list:
    kvs, _ = await oracle.etcd.range(key, revision=revision, timeout=T)
    return kvs


async def _concurrent_walk(replicas: list[RunStore], oracle: RunStore, seed: int, batches: int,
                           chaos: "dict[int, Callable[[], Awaitable[None]]] | None" = None) -> dict[str, int]:
    rnd = random.Random(seed)
    k = oracle.keys
    runs = [(await _new_run(replicas[0], tenant="t")).run_id for _ in range(3)]
    sessions = [(await oracle.open_session(30, f"h{i}", timeout=T))[0] for i in range(4)]
    claims_won: list[tuple[str, int, int, int]] = []     # run, session, epoch, revision
    owner_applied: list[tuple[str, int, int, int, bool]] = []  # run, session, epoch, revision, terminal
    readers: dict[str, list[str]] = {r: [] for r in runs}
    counts: dict[str, int] = {}
    reviving: set[str] = set()

    async def one(op: str, store: RunStore, run_id: str) -> None:
        try:
            await one_op(op, store, run_id)
        except errors.StoreUnavailable:
            if not chaos:
                raise
            counts["unavailable"] = counts.get("unavailable", 0) + 1

    async def one_op(op: str, store: RunStore, run_id: str) -> None:
        counts[op] = counts.get(op, 0) + 1
        rec, claim = await oracle.get_run(run_id, timeout=T)  # a hint only: things move meanwhile
        assert rec is not None
        if op == "claim":
            sid = rnd.choice(sessions)
            try:
                epoch, got = await store.claim_run(run_id, sid, "h", rnd.choice(["drive", "finalize"]), timeout=T)
                claims_won.append((run_id, sid, epoch, got.revision))
            except (errors.RunClaimNotAcquired, errors.SessionLost):
                pass
        elif op == "release" and claim is not None:
            await store.release_claim(run_id, claim.session_id, claim.epoch, timeout=T)
        elif op in ("owner", "terminal"):
            if claim is not None and rnd.random() < 0.8:
                sid, epoch = claim.session_id, claim.epoch
            else:
                sid, epoch = rnd.choice(sessions), max(rec.driver_epoch + rnd.choice([-1, 0, 1]), 1)
            if op == "owner":
                patch, paths = RunRecord(sandbox_key=unique("s")), ["sandbox_key"]
            else:
                patch, paths = RunRecord(status=rnd.choice([COMPLETED, INTERRUPTED, RUNNING])), ["status"]
            try:
                out, got = await store.update_run(run_id, patch, paths, epoch, sid, timeout=T)
                if out is UpdateOutcome.APPLIED:
                    assert got is not None
                    owner_applied.append((run_id, sid, epoch, got.revision, is_terminal(patch.status) and op == "terminal"))
            except (errors.RunClaimLost, errors.ThreadBusy):
                pass
        elif op == "cancel":
            await store.request_cancel(run_id, rnd.choice(["user", "x"]), timeout=T)
        elif op == "uncancel":
            await store.update_run(run_id, RunRecord(), ["cancel_requested", "cancel_reason"], 0, 0, timeout=T)
        elif op == "reader":
            rid = unique("r")
            readers[run_id].append(rid)
            await store.register_reader(run_id, sessions[0], rid, timeout=T)
        elif op == "unreader" and readers[run_id]:
            rid = readers[run_id].pop(rnd.randrange(len(readers[run_id])))
            await store.unregister_reader(run_id, rid, timeout=T)
        elif op == "detach":
            await store.detach_if_unread(run_id, timeout=T)
        elif op == "kill" and len(sessions) > 1:
            sid = rnd.choice(sessions[1:])
            sessions.remove(sid)
            sessions.append((await oracle.open_session(30, "h", timeout=T))[0])
            await store.close_session(sid, timeout=T)
        elif op == "revive" and is_terminal(rec.status) and run_id not in reviving:
            reviving.add(run_id)
            rec2 = await _new_run(store, rec.thread_id, "t", interrupt=True)
            runs[runs.index(run_id)] = rec2.run_id
            readers[rec2.run_id] = []

    ops = ["claim", "claim", "claim", "release", "owner", "owner", "terminal", "cancel", "uncancel",
           "reader", "unreader", "detach", "kill", "revive"]
    for batch in range(batches):
        jobs = [one(rnd.choice(ops), rnd.choice(replicas), rnd.choice(runs)) for _ in range(rnd.randint(2, 8))]
        if chaos and batch in chaos:
            # Never last: the jobs start in order, so the ops before it are in flight when
            # the fault lands and at least one op after it meets the fault (a batch whose ops
            # all finish first would leave the outage unseen).
            jobs.insert(rnd.randrange(len(jobs)), chaos[batch]())
        await asyncio.gather(*jobs)
        # Quiescent checks.
        for run_id in runs:
            rec, claim = await oracle.get_run(run_id, timeout=T)
            assert rec is not None
            if claim is not None:
                assert claim.epoch == rec.driver_epoch
            if await oracle.reader_count(run_id, timeout=T) > 0 and is_active(rec):
                assert not rec.HasField("detached_since"), "detached with a registered reader"
            kvs, _ = await oracle.etcd.range(k.thread_active(rec.thread_id), timeout=T)
            if kvs:
                pointed, _ = await oracle.get_run(kvs[0].value.decode(), timeout=T)
                assert pointed is not None and is_active(pointed), "thread index points at a non-running run"
        kvs, _ = await oracle.etcd.range(k.reclaimable_prefix, prefix_end(k.reclaimable_prefix), timeout=T)
        every = [r for r in [(await oracle.get_run(x, timeout=T))[0] for x in {kv.value.decode() for kv in kvs} | set(runs)] if r]
        assert sorted(kv.value.decode() for kv in kvs) == sorted(
            r.run_id for r in every if is_active(r) and r.HasField("detached_since"))
    # History checks: every claim won had no claim before it and raised the epoch by one.
    per_run: dict[str, list[int]] = {}
    for run_id, sid, epoch, rev in claims_won:
        assert not await _at(oracle, k.claim(run_id), rev - 1), "claim won over a live claim"
        before = RunRecord.FromString((await _at(oracle, k.run(run_id), rev - 1))[0].value)
        assert before.driver_epoch == epoch - 1
        now = Claim.FromString((await _at(oracle, k.claim(run_id), rev))[0].value)
        assert (now.session_id, now.epoch) == (sid, epoch)
        per_run.setdefault(run_id, []).append(epoch)
    for epochs in per_run.values():
        assert len(epochs) == len(set(epochs)), "an epoch was won twice"
    # Every applied owner write was made while its claim was live at its epoch.
    for run_id, sid, epoch, rev, terminal in owner_applied:
        kvs = await _at(oracle, k.claim(run_id), rev - 1)
        assert kvs, f"owner write at {rev} applied with no claim"
        c = Claim.FromString(kvs[0].value)
        assert (c.session_id, c.epoch) == (sid, epoch), "owner write applied under another claim"
        before = RunRecord.FromString((await _at(oracle, k.run(run_id), rev - 1))[0].value)
        if terminal:
            assert epoch >= before.driver_epoch
    counts["claims_won"] = len(claims_won)
    counts["owner_applied"] = len(owner_applied)
    return counts


@pytest.mark.parametrize("seed", [5, 6])
async def test_concurrent_random_batches_hold_history_invariants(
        cluster: tuple[list[RunStore], RunStore], seed: int) -> None:
    replicas, oracle = cluster
    counts = await _concurrent_walk(replicas, oracle, seed, 40)
    assert counts["claims_won"] > 5 and counts["owner_applied"] > 5, counts


# --- bugs the breaker found, fixed ----------------------------------------------------


async def test_cache_survives_an_etcd_revision_rollback(own_etcd: EtcdServer) -> None:
    import shutil

    prefix = "/rb/"
    x = RunStore(Etcd([own_etcd.endpoint]), prefix)            # a long-lived replica
    oracle = RunStore(Etcd([own_etcd.endpoint]), prefix, cache_size=0)
    try:
        await x.create_or_resume(RunRecord(run_id="r", thread_id="t", tenant="a"), False, timeout=T)
        s, _ = await oracle.open_session(30, "h", timeout=T)
        e, _ = await x.claim_run("r", s, "h", "drive", timeout=T)
        await x.update_run("r", RunRecord(sandbox_key="old"), ["sandbox_key"], e, s, timeout=T)
        assert await x.release_claim("r", s, e, timeout=T)
        entry = x.cache.get("r")
        assert entry is not None
        cached_mod = entry.run_kv.mod_revision
        # etcd comes back from an older state (here: empty, revision 1).
        own_etcd.kill()
        shutil.rmtree(own_etcd.data_dir / "etcd-data")
        own_etcd.start()
        # Another replica writes first (a run of its own; the store's incarnation key too).
        await oracle.create_or_resume(RunRecord(run_id="w", thread_id="t-w", tenant="a"), False, timeout=T)
        rev = 0
        while rev < cached_mod - 2:
            rev = (await oracle.etcd.txn([], [E.put(b"/filler", b"x")], timeout=T)).revision
        await oracle.create_or_resume(RunRecord(run_id="r", thread_id="t", tenant="a"), False, timeout=T)
        cancelled = await oracle.request_cancel("r", "user", timeout=T)
        assert cancelled.revision == cached_mod  # the new record sits at the cached mod revision
        s2, _ = await oracle.open_session(30, "h2", timeout=T)
        # etcd says: driver_epoch 0, cancel requested, no sandbox -> a drive claim is refused.
        assert await _claim_or_reason(x, "r", s2) == "cancel_requested"
        fresh, _ = await oracle.get_run("r", timeout=T)
        assert fresh is not None and fresh.cancel_requested and fresh.sandbox_key == ""
    finally:
        await _close([x, oracle])


async def test_resumed_older_run_does_not_orphan_the_newer_active_run(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    th = unique("th-")
    r1 = await _new_run(replicas[0], th, "t")
    await replicas[1].update_run(r1.run_id, RunRecord(status=INTERRUPTED), ["status"], 0, 0, timeout=T)  # HITL pause
    r2 = await _new_run(replicas[2], th, "t")                     # r1 not active: no ThreadBusy
    # r1 coming back to running while r2 runs is refused: one active run per thread.
    with pytest.raises(errors.ThreadBusy) as busy:
        await replicas[3].update_run(r1.run_id, RunRecord(status=RUNNING), ["status"], 0, 0, timeout=T)
    assert busy.value.active_run_id == r2.run_id
    r1_now, _ = await oracle.get_run(r1.run_id, timeout=T)
    assert r1_now is not None and r1_now.status == INTERRUPTED
    await replicas[0].update_run(r1.run_id, RunRecord(status=COMPLETED), ["status"], 0, 0, timeout=T)
    r2_now, _ = await oracle.get_run(r2.run_id, timeout=T)
    assert r2_now is not None and r2_now.status == RUNNING
    found = await oracle.find_active_run(th, timeout=T)
    assert found is not None and found.run_id == r2.run_id
    with pytest.raises(errors.ThreadBusy):
        await _new_run(replicas[1], th, "t")


async def test_a_legacy_thread_without_owner_key_keeps_its_tenant(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    replicas, oracle = cluster
    th = unique("th-")
    a = await _new_run(replicas[0], th, "ten-a")
    await replicas[0].update_run(a.run_id, RunRecord(status=COMPLETED), ["status"], 0, 0, timeout=T)
    # Data written before owner keys existed: the thread has runs but no tenant key.
    await oracle.etcd.txn([], [E.delete(oracle.keys.thread_tenant(th))], timeout=T)
    with pytest.raises(errors.UnknownThread):
        await _new_run(replicas[1], th, "ten-b")


async def test_concurrent_batches_with_etcd_sigkilled_and_restarted(own_etcd: EtcdServer) -> None:
    prefix = f"/{unique('bk')}/"
    replicas = _stores(own_etcd.endpoint, prefix, (1, 2, 10_000))
    oracle = RunStore(Etcd([own_etcd.endpoint]), prefix, cache_size=0)

    async def crash() -> None:
        own_etcd.kill()  # at the job's first step, before the batch's later ops start

        async def up() -> bool:
            return await _retry_unavailable(oracle.get_run("x", timeout=1.0))

        # The outage lasts until a read has seen it (not a fixed time), then etcd comes back.
        await assert_eventually(lambda: _not(up()), timeout=20, interval=0.05)
        await asyncio.to_thread(own_etcd.start)
        await assert_eventually(up, timeout=20, interval=0.1)

    try:
        counts = await _concurrent_walk(replicas, oracle, 21, 30, chaos={8: crash, 19: crash})
        assert counts.get("unavailable", 0) > 0 and counts["claims_won"] > 3, counts
    finally:
        await _close([*replicas, oracle])


async def test_reaper_cancel_from_a_stale_replica_respects_a_returned_reader(
        cluster: tuple[list[RunStore], RunStore]) -> None:
    from coordinator.reaper import _cancel_if_still_detached

    replicas, oracle = cluster
    x, y = replicas[3], replicas[0]
    rec = await _new_run(x)
    listed = await x.detach_if_unread(rec.run_id, timeout=T)       # X caches the detached record
    assert listed is not None
    g, _ = await oracle.open_session(30, "gw", timeout=T)
    await y.register_reader(rec.run_id, g, "r", timeout=T)           # a reader came back on Y
    assert await _cancel_if_still_detached(x, listed, T, ttl=0.0, now=None) == "not-claimed"
    fresh, _ = await oracle.get_run(rec.run_id, timeout=T)
    assert fresh is not None and not fresh.cancel_requested and not fresh.HasField("detached_since")
    # Detached again (a new stamp) on Y: the listing X holds is outdated, still not cancelled.
    await y.unregister_reader(rec.run_id, "r", timeout=T)
    assert await _cancel_if_still_detached(x, listed, T, ttl=0.0, now=None) == "not-claimed"
    relisted = (await oracle.get_run(rec.run_id, timeout=T))[0]
    assert relisted is not None
    assert await _cancel_if_still_detached(x, relisted, T, ttl=0.0, now=None) is None
    fresh, _ = await oracle.get_run(rec.run_id, timeout=T)
    assert fresh is not None and fresh.cancel_requested and fresh.cancel_reason == "reaped"
