"""Sessions, claims and epochs (docs/design.md §3.2) against a real etcd."""
from __future__ import annotations

import asyncio
import time

import pytest

from baton import errors
from baton.coordinator_client import CoordinatorClient, UpdateOutcome
from baton.v1.runs_pb2 import RunRecord, RunStatus
from baton_tools.testing.cluster import InProcessCoordinator
from baton_tools.testing.proxy import TcpProxy
from tests.conftest import assert_eventually, assert_throughout, unique
from tests.coordinator.conftest import open_bare_session

RUNNING, COMPLETED = RunStatus.RUN_STATUS_RUNNING, RunStatus.RUN_STATUS_COMPLETED


async def _new(cc: CoordinatorClient) -> RunRecord:
    rec, _ = await cc.create_or_resume_run(RunRecord(run_id=unique("run-"), thread_id=unique("th-")))
    return rec


async def test_claim_raises_epoch_and_shows_in_get_run(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    s = await cc.open_session(2.0, owner="host-a")
    epoch, out = await cc.claim_run(rec.run_id, s, "host-a")
    assert epoch == 1 and out.driver_epoch == 1 and out.driver_host == "host-a"
    view = await cc.get_run(rec.run_id)
    assert view.claim is not None
    assert (view.claim.epoch, view.claim.host_id, view.claim.session_id, view.claim.purpose) == (1, "host-a", s.id, "drive")
    assert await cc.release_claim(rec.run_id, s, epoch)
    assert (await cc.get_run(rec.run_id)).claim is None
    assert not await cc.release_claim(rec.run_id, s, epoch)   # already released
    epoch2, _ = await cc.claim_run(rec.run_id, s, "host-a")
    assert epoch2 == 2
    assert not await cc.release_claim(rec.run_id, s, 1)       # a stale epoch releases nothing
    assert (await cc.get_run(rec.run_id)).claim is not None


async def test_a_claim_with_sandbox_answers_the_registered_entry(cc: CoordinatorClient) -> None:
    """A takeover's claim carries the registry entry of the record's sandbox, read once the
    claim landed: the entry as registered, none for an unregistered key, and no read (so the
    host reads it itself) for a record that names no sandbox. A refusal is a refusal."""
    from baton.coordinator_client import SandboxInstance

    s = await cc.open_session(2.0, owner="host-a")
    bare = await _new(cc)
    epoch, out, entry = await cc.claim_run_with_sandbox(bare.run_id, s, "host-a")
    assert (epoch, out.driver_host, entry) == (1, "host-a", None)

    named = await _new(cc)
    await cc.update_run(named.run_id, RunRecord(sandbox_key=named.run_id), ["sandbox_key"])
    epoch, out, entry = await cc.claim_run_with_sandbox(named.run_id, s, "host-a")
    assert (epoch, out.sandbox_key, entry) == (1, named.run_id, (None,))   # not registered
    assert await cc.release_claim(named.run_id, s, epoch)
    sb = SandboxInstance(sandbox_key=named.run_id, provider="local", handle_json='{"key": "k"}',
                         run_id=named.run_id, journal_path="/j/journal.ndjson", created_at=12.5)
    await cc.put_sandbox(sb)
    epoch, out, entry = await cc.claim_run_with_sandbox(named.run_id, s, "host-b")
    assert epoch == 2 and out.driver_host == "host-b" and entry == (sb,)
    with pytest.raises(errors.RunClaimNotAcquired) as ei:
        await cc.claim_run_with_sandbox(named.run_id, s, "host-c")
    assert ei.value.reason == "held"


async def test_claim_refusal_reasons(cc: CoordinatorClient) -> None:
    s = await cc.open_session(2.0)
    with pytest.raises(errors.RunClaimNotAcquired) as ei:
        await cc.claim_run(unique("ghost-"), s, "h")
    assert ei.value.reason == "unknown"

    done = await _new(cc)
    await cc.update_run(done.run_id, RunRecord(status=COMPLETED), ["status"])
    with pytest.raises(errors.RunClaimNotAcquired) as ei:
        await cc.claim_run(done.run_id, s, "h")
    assert ei.value.reason == "terminal" and ei.value.run_id == done.run_id

    held = await _new(cc)
    await cc.claim_run(held.run_id, s, "h")
    with pytest.raises(errors.RunClaimNotAcquired) as ei:
        await cc.claim_run(held.run_id, s, "h")
    assert ei.value.reason == "held"

    cancelled = await _new(cc)
    await cc.request_run_cancel(cancelled.run_id)
    with pytest.raises(errors.RunClaimNotAcquired) as ei:
        await cc.claim_run(cancelled.run_id, s, "h")
    assert ei.value.reason == "cancel_requested"
    # Finalizing a cancelled run is allowed (someone must carry the cancel out).
    epoch, out = await cc.claim_run(cancelled.run_id, s, "h", purpose="finalize")
    assert epoch == 1 and (await cc.get_run(cancelled.run_id)).claim.purpose == "finalize"  # type: ignore[union-attr]


async def test_interrupted_run_can_be_claimed(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    await cc.update_run(rec.run_id, RunRecord(status=RunStatus.RUN_STATUS_INTERRUPTED), ["status"])
    s = await cc.open_session(2.0)
    epoch, _ = await cc.claim_run(rec.run_id, s, "h")
    assert epoch == 1


async def test_100_rounds_of_racing_claims(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    a = await cc.open_session(5.0, owner="a")
    b = await cc.open_session(5.0, owner="b")
    epochs: list[int] = []
    for _ in range(100):
        results = await asyncio.gather(cc.claim_run(rec.run_id, a, "a"), cc.claim_run(rec.run_id, b, "b"),
                                       return_exceptions=True)
        wins = [r for r in results if isinstance(r, tuple)]
        losses = [r for r in results if isinstance(r, BaseException)]
        assert len(wins) == 1 and len(losses) == 1, results
        assert isinstance(losses[0], errors.RunClaimNotAcquired) and losses[0].reason == "held"
        epoch = wins[0][0]
        winner = a if results[0] is wins[0] else b
        epochs.append(epoch)
        assert await cc.release_claim(rec.run_id, winner, epoch)
    assert epochs == sorted(set(epochs)) and epochs == list(range(1, 101))
    assert (await cc.get_run(rec.run_id)).record.driver_epoch == 100


async def test_dead_session_claim_vanishes_and_old_owner_is_fenced(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    dead = await open_bare_session_for(cc)
    epoch, _ = await cc.claim_run(rec.run_id, dead, "host-dead")
    assert epoch == 1
    t0 = time.monotonic()
    await assert_eventually(lambda: _no_claim(cc, rec.run_id), timeout=10)
    assert time.monotonic() - t0 <= 2.0 + 1.0  # TTL + 1 s
    live = await cc.open_session(2.0, owner="host-live")
    epoch2, _ = await cc.claim_run(rec.run_id, live, "host-live")
    assert epoch2 == 2
    # The old owner's terminal write is suppressed; the record stays running.
    outcome, out = await cc.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"], epoch=1)
    assert outcome is UpdateOutcome.SUPPRESSED and out is not None and out.status == RUNNING
    # As an owner write it is refused outright: the claim is no longer its own.
    with pytest.raises(errors.RunClaimLost) as ei:
        await cc.update_run(rec.run_id, RunRecord(sandbox_key="x"), ["sandbox_key"], epoch=1, session_id=dead)
    assert ei.value.held_epoch == 1 and ei.value.observed == "epoch@2"
    # The new owner's writes pass.
    outcome, out = await cc.update_run(rec.run_id, RunRecord(status=COMPLETED), ["status"], epoch=2,
                                       session_id=live)
    assert outcome is UpdateOutcome.APPLIED and out is not None and out.status == COMPLETED


async def open_bare_session_for(cc: CoordinatorClient) -> int:
    return await open_bare_session(cc.addresses[0], 2.0)


async def _no_claim(cc: CoordinatorClient, run_id: str) -> bool:
    return (await cc.get_run(run_id)).claim is None


async def test_owner_write_after_claim_vanished_raises_claim_lost(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    s = await cc.open_session(2.0)
    epoch, _ = await cc.claim_run(rec.run_id, s, "h")
    await cc.release_claim(rec.run_id, s, epoch)
    with pytest.raises(errors.RunClaimLost) as ei:
        await cc.update_run(rec.run_id, RunRecord(sandbox_key="y"), ["sandbox_key"], epoch=epoch, session_id=s)
    assert ei.value.observed == "claim-gone"
    assert (await cc.get_run(rec.run_id)).record.sandbox_key == ""


async def test_session_lost_fires_when_the_lease_is_revoked(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    s = await cc.open_session(2.0)
    await cc.claim_run(rec.run_id, s, "h")
    async with CoordinatorClient(cc.addresses) as other:
        # Another party revokes the lease (as an operator would): the holder learns it.
        from baton.v1 import coordinator_pb2 as pb
        await other._unary("CloseSession", pb.CloseSessionRequest(session_id=s.id))
    async with asyncio.timeout(5):
        await s.lost.wait()
    assert (await cc.get_run(rec.run_id)).claim is None
    with pytest.raises(errors.SessionLost):
        await cc.claim_run(rec.run_id, s, "h")
    with pytest.raises(errors.SessionLost):
        await cc.claim_run(rec.run_id, s.id, "h")       # the server says so too


async def test_session_keepalive_outlives_its_ttl(cc: CoordinatorClient) -> None:
    rec = await _new(cc)
    s = await cc.open_session(2.0)
    await cc.claim_run(rec.run_id, s, "h")
    async def held() -> None:
        assert (await cc.get_run(rec.run_id)).claim is not None
        assert not s.lost.is_set()
    await assert_throughout(held, 3 * s.ttl, interval=0.2)  # the claim stays throughout
    await s.close()
    assert s.lost.is_set()
    assert (await cc.get_run(rec.run_id)).claim is None   # closing revokes at once


async def test_session_holds_while_the_coordinator_answers_slowly(coord: InProcessCoordinator) -> None:
    """Under load (2 cores at load 20) a coordinator answered each refresh in
    about 1.5 s; a client that sent the next refresh a third of the TTL after each *answer*
    let the gap between refreshes reaching etcd grow to the whole TTL, and hosts lost their
    sessions while every answer came in time. A link that holds every byte 0.45 s each way
    (0.9 s per answer, more than TTL/3) must not cost the session or its claim."""
    proxy = await TcpProxy(int(coord.address.rsplit(":", 1)[1])).start()
    try:
        async with CoordinatorClient(proxy.endpoint) as slow:
            rec = await _new(slow)
            s = await slow.open_session(2.0, owner="slow-host")
            await slow.claim_run(rec.run_id, s, "slow-host")
            proxy.latency = 0.45
            # The session must outlive several TTLs: lost by then is the bug.
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(4 * s.ttl):
                    await s.lost.wait()
            proxy.latency = 0.0
            assert await coord.server.etcd.time_to_live(s.id, timeout=5) > 0
            view = await slow.get_run(rec.run_id)
            assert view.claim is not None and view.claim.session_id == s.id
            await s.close()
    finally:
        await proxy.close()


async def test_hosts_registry_lists_live_hosts_only(cc: CoordinatorClient) -> None:
    from baton.coordinator_client import HostInfo

    live = await cc.open_session(2.0)
    dead = await open_bare_session_for(cc)
    a = HostInfo(host_id=unique("ha-"), address="127.0.0.1:7201", capacity=8, provider_kinds=["local", "docker"],
                 session_id=live.id)
    b = HostInfo(host_id=unique("hb-"), address="127.0.0.1:7202", capacity=4, provider_kinds=["local"],
                 session_id=dead)
    await cc.register_host(a)
    await cc.register_host(b)
    ids = {h.host_id: h for h in await cc.list_hosts()}
    assert ids[a.host_id] == a and ids[b.host_id] == b

    async def b_gone() -> bool:
        return b.host_id not in {h.host_id for h in await cc.list_hosts()}
    await assert_eventually(b_gone, timeout=5)
    assert a.host_id in {h.host_id for h in await cc.list_hosts()}
    with pytest.raises(errors.SessionLost):
        await cc.register_host(HostInfo(host_id="late", address="x:1", session_id=dead))
