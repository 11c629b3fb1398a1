"""Fast failover. A process that died is known at once (its keep-alive stream
resets and its address refuses connections), so its lease is revoked without waiting for the
TTL; a process that is alive but cut off, or paused, keeps the TTL path.

The session TTL here is long (10 s), so "well under the TTL" is unambiguous on a loaded
machine: every bound below is the TTL itself or a large share of it, never a speed target
(those are in ``bench/takeover.py``).
"""
from __future__ import annotations

import re
import time

import pytest

from baton.coordinator_client import CoordinatorClient
from baton_tools.testing.proxy import TcpProxy
from tests.faults.conftest import ClusterFactory
from tests.faults.harness import FaultCluster, eventually

pytestmark = pytest.mark.servers

TTL = 10.0
REVOKED = "lease revoked (fast failover)"
#: A TTL (s) whose first scheduled refresh (a third of it) comes long after a test's kill.
LONG_TTL = 600.0


def _coordinator_log(c: FaultCluster) -> str:
    assert c.coordinator is not None
    return c.coordinator.log_path.read_text(errors="replace")  # type: ignore[union-attr]


async def _epochs(c: FaultCluster, run_id: str) -> set[int]:
    return {r.epoch for r in (await c.stored_log(run_id)).records if r.kind == "fence"}


@pytest.mark.timeout(180)
async def test_host_sigkill_runs_continue_well_under_the_ttl(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster(hosts=2, session_ttl=TTL)
    runs = await c.start_runs(4, seconds=10)
    await c.wait_progress(runs, 15)
    victim, theirs = await c.busiest_host(runs)
    async with c.fault(f"host {victim.host_id} SIGKILL (driving {len(theirs)} runs), TTL {TTL:g} s"):
        killed_at = time.monotonic()
        victim.kill_now()
    await c.finish()
    for r in theirs:
        assert r.reader is not None
        nxt = r.reader.got.first_after(killed_at)
        assert nxt is not None, r.run_id
        # Before the lease would have expired: only the fast path can have handed it over.
        assert nxt - killed_at < TTL, (r.run_id, nxt - killed_at)
    # Which branch of the fast path revoked the lease (its log line, or a revoke that found
    # the lease gone already) depends on timing: how often the fast path fires under load,
    # and how fast, is measured in bench/takeover.py, not asserted here.
    await c.check()


@pytest.mark.timeout(240)
async def test_a_host_killed_soon_after_it_started_is_failed_over_fast(fault_cluster: ClusterFactory) -> None:
    """A host learns its probe address only once it listens, after it opened its session, so
    its first keep-alive refresh carries none; the coordinator arms a session for fast
    failover on the first refresh that carries one. The host sends that refresh as soon as
    it listens, not at its next scheduled one, a third of the TTL later: a host killed in
    between was left to the TTL (seen under load as the fast path skipped). The TTL here
    is 10 minutes, so nothing but the fast path can end these runs within ``finish``'s
    budget."""
    c = await fault_cluster(hosts=1, session_ttl=LONG_TTL)
    runs = await c.start_runs(2, seconds=10)
    victim = c.hosts[0]
    await c.add_host()  # the successor
    await c.wait_progress(runs, 5)
    async with c.fault(f"host {victim.host_id} SIGKILL before its first scheduled refresh, TTL {LONG_TTL:g} s"):
        victim.kill_now()
    await c.finish()
    assert REVOKED in _coordinator_log(c)
    await c.check()


@pytest.mark.faults_slow
@pytest.mark.timeout(180)
async def test_host_cut_from_its_coordinator_keeps_its_session(fault_cluster: ClusterFactory) -> None:
    """The host's coordinator connection (keep-alive included) is reset by a proxy, twice;
    the host lives on, so nothing is revoked and no run changes hands.

    The TTL is the long one: in this cluster a host cut off by the proxy has been seen to
    need 4-5 s to get a keep-alive answered again (a 5 s TTL then loses the session, which
    is the TTL path, not the fast one, at work)."""
    c = await fault_cluster(hosts=0, session_ttl=TTL)
    assert c.coordinator is not None
    proxy = await TcpProxy(c.coordinator.port).start()  # type: ignore[union-attr]
    try:
        cut_off = await c.add_host(coordinator=proxy.endpoint)
        runs = await c.start_runs(2, seconds=20)
        await c.add_host()  # somewhere a needless takeover could go
        await c.wait_progress(runs, 10)
        async with c.fault(f"host {cut_off.host_id}'s coordinator connection reset twice"):
            for n in range(1, 3):
                # Cut until the coordinator judged a broken stream (the host is alive): a cut
                # that lands while the host is still reconnecting finds no stream to break.
                def cut_and_judged(n: int = n) -> bool:
                    if len(re.findall(r"is alive: the TTL decides", _coordinator_log(c))) >= n:
                        return True
                    proxy.cut()
                    return False
                await eventually(cut_and_judged, 30, interval=0.5)
        await c.finish()
    finally:
        await proxy.close()
    log = _coordinator_log(c)
    assert REVOKED not in log
    # The host never lost its session (it would stop its drivers and open a new one).
    assert "opening a new session" not in cut_off.log_text(), cut_off.log_text()[-2000:]
    for r in runs:
        assert (await c.view(r.run_id))["driverHost"] in (cut_off.host_id, None)
        assert len(await _epochs(c, r.run_id)) == 1, r.run_id
    await c.check()


@pytest.mark.faults_slow
@pytest.mark.timeout(240)
async def test_sigstopped_host_takes_the_ttl_path(fault_cluster: ClusterFactory) -> None:
    """A paused host keeps its sockets: no fast path; the TTL hands its runs over, and when it
    wakes nothing of it lands after the successor's fence (``check`` reads the raw log)."""
    c = await fault_cluster(hosts=2, session_ttl=3.0)
    runs = await c.start_runs(3, seconds=14)
    await c.wait_progress(runs, 15)
    victim, theirs = await c.busiest_host(runs)
    async with c.fault(f"host {victim.host_id} SIGSTOP until its runs moved, then SIGCONT"):
        victim.sigstop()
        try:
            async def moved() -> None:
                for r in theirs:
                    v = await c.view(r.run_id)
                    assert v.get("status") != "running" or v.get("driverHost") not in (None, victim.host_id)
            await eventually(moved, 60)
        finally:
            victim.sigcont()
    await c.finish()
    assert REVOKED not in _coordinator_log(c)
    await c.check()


@pytest.mark.timeout(180)
async def test_gateway_sigkill_detaches_its_runs_at_once(fault_cluster: ClusterFactory) -> None:
    """Detached sooner than the TTL path could (it needs at least two thirds of the TTL: the
    lease is renewed every third), by a revoke. The gateway opens its session before it
    listens, so this also shows the session is armed for fast failover soon after (not at its
    next refresh). How soon is load-dependent (bench/results/takeover_fast.json)."""
    ttl = TTL
    c = await fault_cluster(hosts=1, session_ttl=ttl)
    assert c.coordinator is not None and c.gateway is not None
    runs = await c.start_runs(2, seconds=10)
    await c.wait_progress(runs, 10)
    async with CoordinatorClient(c.coordinator.address, token=c.env["BATON_INTERNAL_TOKEN"]) as cc:
        async def detached() -> None:
            for r in runs:
                assert (await cc.get_run(r.run_id)).record.HasField("detached_since"), r.run_id

        async with c.fault("gateway SIGKILL (its readers' runs detach), restarted"):
            killed_at = time.monotonic()
            await c.gateway.kill()
            await eventually(detached, ttl)
            took = time.monotonic() - killed_at
            await c.gateway.start()
    assert REVOKED in _coordinator_log(c)
    assert took < ttl * 2 / 3, took
    await c.finish()
    await c.check()
