"""The faults baton survives today, each on 3 hosts with live readers and detached
runs, each compared with the uninterrupted replay of its journals (``FaultCluster.check``).

Every case is ``faults_slow``: it runs in ``make test-faults`` (CI runs it after ``make test``),
not in ``make test``, which stays under its 15 minutes.
"""
from __future__ import annotations

import asyncio
import signal

import httpx
import pytest

from tests.faults.conftest import ClusterFactory
from tests.faults.harness import CODEX, SHORT, FaultCluster, eventually

# Every case starts its own etcd, NATS and service processes (never `unit`).
pytestmark = pytest.mark.servers

slow = pytest.mark.faults_slow


async def _stopped(proc: object, seconds: float) -> None:
    """SIGSTOP a server process for ``seconds`` (the length of the fault), then SIGCONT."""
    proc.send_signal(signal.SIGSTOP)  # type: ignore[attr-defined]
    try:
        await asyncio.sleep(seconds)
    finally:
        proc.send_signal(signal.SIGCONT)  # type: ignore[attr-defined]


async def _taken_over(c: FaultCluster, runs: list, victim: str, timeout: float = 60.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
    """Until no unfinished run of ``runs`` is driven by ``victim`` any more."""
    async def moved() -> None:
        for r in runs:
            v = await c.view(r.run_id)
            assert v.get("status") != "running" or v.get("driverHost") not in (None, victim), (r.run_id, v)
    await eventually(moved, timeout)


# --- NATS and etcd ---------------------------------------------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("engine,fault,seconds,detached", [
    pytest.param("nats", "kill", 0, 1, id="nats-killed", marks=slow),
    pytest.param("nats", "kill", 0, 5, id="nats-killed-under-detached-runs", marks=slow),
    pytest.param("nats", "stop", 3, 1, id="nats-stopped-3s", marks=slow),
    # The 10–30 s, at its short end (a 30 s pause adds time, not a different path).
    pytest.param("nats", "stop", 10, 2, id="nats-stopped-10s", marks=slow),
    pytest.param("etcd", "kill", 0, 1, id="etcd-killed", marks=slow),
    pytest.param("etcd", "kill", 0, 5, id="etcd-killed-under-detached-runs", marks=slow),
    # Shorter than a session TTL (2 s): nobody loses a session.
    pytest.param("etcd", "stop", 1.5, 1, id="etcd-stopped-1.5s", marks=slow),
])
async def test_engine_fault(fault_cluster: ClusterFactory, engine: str, fault: str, seconds: float,
                            detached: int) -> None:
    """An engine SIGKILLed and restarted at once, or SIGSTOPped for ``seconds``, under 5 runs of
    which ``detached`` have no reader (all 5: every run detached)."""
    c = await fault_cluster()
    server = c.nats if engine == "nats" else c.etcd
    runs = await c.start_runs(5, seconds=12 if seconds >= 10 else 10, detached=detached)
    if detached == len(runs):
        await eventually(lambda: all(r.reader.got.items for r in runs), 30)  # type: ignore[union-attr]
    else:
        await c.wait_progress(runs, 30)
    what = (f"{engine} SIGKILL, restarted at once" if fault == "kill" else f"{engine} SIGSTOP {seconds:g} s")
    async with c.fault(what + ("; every run detached" if detached == len(runs) else "")):
        if fault == "kill":
            await asyncio.to_thread(server.kill)
            await asyncio.to_thread(server.start)
        else:
            await _stopped(server.proc, seconds)
    await c.finish()
    await c.check()


# --- coordinator, gateway -------------------------------------------------------------------------


@slow
@pytest.mark.timeout(180)
async def test_coordinator_killed(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(5, seconds=10, detached=1)
    await c.wait_progress(runs, 30)
    assert c.coordinator is not None
    async with c.fault("coordinator SIGKILL, restarted on the same port"):
        await c.coordinator.kill()
        await c.coordinator.start()
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(240)
async def test_coordinator_killed_mid_takeover(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(6, seconds=12, detached=1)
    await c.wait_progress(runs, 30)
    victim, _ = await c.busiest_host(runs)
    assert c.coordinator is not None
    async with c.fault(f"host {victim.host_id} SIGKILL, then the coordinator SIGKILL mid-takeover"):
        victim.kill_now()
        await c.coordinator.kill()
        await c.coordinator.start()
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(180)
async def test_gateway_killed_under_readers(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(6, seconds=10, detached=1)
    await c.wait_progress(runs, 30)
    assert c.gateway is not None
    async with c.fault("gateway SIGKILL, restarted on the same port"):
        await c.gateway.kill()
        await c.gateway.start()
    await c.finish()
    assert all(r.reader.got.reconnects >= 1 for r in runs if not r.detached)  # type: ignore[union-attr]
    await c.check()


# --- hosts ----------------------------------------------------------------------------------------


@slow
@pytest.mark.timeout(240)
async def test_host_killed(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(6, seconds=12, detached=2)
    await c.wait_progress(runs, 20)
    victim, theirs = await c.busiest_host(runs)
    async with c.fault(f"host {victim.host_id} SIGKILL (driving {len(theirs)} runs)"):
        victim.kill_now()
        await _taken_over(c, theirs, victim.host_id)
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(240)
async def test_two_hosts_killed_in_a_row(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(6, seconds=14, detached=1)
    await c.wait_progress(runs, 20)
    first, _ = await c.busiest_host(runs)
    async with c.fault(f"host {first.host_id} SIGKILL; once its runs moved, the next busiest SIGKILL"):
        first.kill_now()
        await _taken_over(c, runs, first.host_id)
        live = [r for r in runs if (await c.view(r.run_id)).get("status") == "running"]
        if live:
            second, _ = await c.busiest_host(live)
            second.kill_now()
            await _taken_over(c, runs, second.host_id)
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(240)
async def test_sigstop_zombie_host(fault_cluster: ClusterFactory) -> None:
    """Frozen past its session TTL: others take its runs over; it wakes mid-run and must not
    write past their fences (the raw log check)."""
    c = await fault_cluster()
    runs = await c.start_runs(5, seconds=16, detached=1)
    await c.wait_progress(runs, 20)
    victim, theirs = await c.busiest_host(runs)
    async with c.fault(f"host {victim.host_id} SIGSTOP until its runs moved, then SIGCONT"):
        victim.sigstop()
        try:
            await _taken_over(c, theirs, victim.host_id)
        finally:
            victim.sigcont()
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(240)
async def test_drain_and_kill_at_once(fault_cluster: ClusterFactory) -> None:
    c = await fault_cluster()
    runs = await c.start_runs(6, seconds=12, detached=1)
    await c.wait_progress(runs, 20)
    drained, _ = await c.busiest_host(runs)
    killed = next(h for h in c.hosts if h is not drained)
    async with c.fault(f"host {drained.host_id} SIGTERM (drain) and {killed.host_id} SIGKILL together"):
        assert drained.proc is not None
        drained.proc.send_signal(signal.SIGTERM)
        killed.kill_now()
        await asyncio.to_thread(drained.proc.wait, 30)
    await c.finish()
    await c.check()


@slow
@pytest.mark.timeout(300)
async def test_reconnect_storm_during_a_takeover(fault_cluster: ClusterFactory) -> None:
    """The issue's 800 reconnects, scaled to 200 (2 shared cores): 20 tabs each reconnect
    10 times with ``Last-Event-ID`` while the runs' host dies and is replaced. Every
    reconnect must resume strictly after its offset with the very next stored chunk."""
    c = await fault_cluster()
    runs = await c.start_runs(4, seconds=16)
    await c.wait_progress(runs, 20)
    victim, theirs = await c.busiest_host(runs)
    target = theirs[0]
    seen: list[tuple[str, str]] = []   # (Last-Event-ID sent, first offset received)

    async def tab(i: int) -> None:
        async with httpx.AsyncClient(trust_env=False, timeout=httpx.Timeout(10.0, read=15.0)) as http:
            for _ in range(10):
                assert target.reader is not None
                after = target.reader.got.last_offset or "-1"
                try:
                    async with http.stream("GET", f"{c.url}/api/chat", params={"runId": target.run_id},
                                           headers={"Last-Event-ID": after, "Accept": "text/event-stream"}) as resp:
                        assert resp.status_code == 200, resp.status_code
                        async for line in resp.aiter_lines():
                            if line.startswith("id:"):
                                seen.append((after, line[3:].strip()))
                                break
                            if line == ": end":
                                return
                except httpx.TransportError:
                    pass

    async with c.fault(f"host {victim.host_id} SIGKILL during 200 Last-Event-ID reconnects"):
        victim.kill_now()
        await asyncio.gather(*(tab(i) for i in range(20)))
        await _taken_over(c, theirs, victim.host_id)
    await c.finish()
    await c.check()
    offsets = [o for o, _ in await c.fresh_read(target.run_id)]
    nxt = {a: b for a, b in zip(["-1"] + offsets, offsets)}
    assert seen and all(nxt[a] == b for a, b in seen), [(a, b, nxt.get(a)) for a, b in seen if nxt.get(a) != b][:5]
    c.notes.append(f"{len(seen)} reconnects resumed")


@slow
@pytest.mark.timeout(400)
async def test_fifty_runs_on_a_killed_host(fault_cluster: ClusterFactory) -> None:
    """50 runs on one host (the others join after), which is then SIGKILLed."""
    c = await fault_cluster(hosts=1)
    runs = await c.start_runs(40, CODEX, seconds=25, detached=10)
    runs += await c.start_runs(10, SHORT, seconds=25)
    await c.add_host()
    await c.add_host()
    victim = c.hosts[0]
    assert set((await c.drivers(runs)).values()) == {victim.host_id}
    async with c.fault(f"host {victim.host_id} (driving all 50 runs) SIGKILL"):
        victim.kill_now()
        await _taken_over(c, runs, victim.host_id, timeout=120)
    await c.finish(timeout=240)
    await c.check()
