"""The five faults that broke (A–E), each compared with the uninterrupted replay
of its journals (``FaultCluster.check``) on top of the case's own expectation.

A case whose fix is not on this branch yet is marked expected-to-fail (not strict).
"""
from __future__ import annotations

import asyncio
import errno
import pathlib
import re
import signal
import subprocess
import time
from typing import Any, Iterator

import httpx
import pytest

from tests.conftest import require
from tests.faults.conftest import ClusterFactory
from tests.faults.harness import CODEX, SHORT, FaultCluster, FaultRun, eventually
from tests.faults.readers import Reader

# Every case starts its own etcd, NATS and service processes (never `unit`).
pytestmark = pytest.mark.servers

slow = pytest.mark.faults_slow



async def _near_end(c: FaultCluster, runs: list[FaultRun], remaining: int, timeout: float = 60.0) -> None:  # noqa: ASYNC109 - a polling budget, as assert_eventually
    """Until every live reader is within ``remaining`` chunks of its run's end."""
    def close_to_end() -> bool:
        return all(len(r.reader.got.items) >= len(r.reference) - remaining
                   for r in runs if r.reader is not None and not r.detached)
    await eventually(close_to_end, timeout, interval=0.02)


# --- A: a run that finishes during a short etcd blip -------------------------------------------


# The finish branch is merged, yet 1 of 2 runs here still timed out with every run
# "running" after the blips (finishing meets StoreUnavailable): kept expected-to-fail.
@slow  # fast once fixed (~30 s): may join `make test` then
@pytest.mark.timeout(180)
async def test_A_runs_finish_during_etcd_blips(fault_cluster: ClusterFactory) -> None:
    """coordinator→etcd through a proxy that drops the link 4 × 0.8 s while 10 runs finish."""
    c = await fault_cluster(etcd_proxy=True)
    runs = await c.start_runs(10, SHORT, seconds=6, detached=2)
    await _near_end(c, runs, 12)
    assert c.etcd_proxy is not None
    async with c.fault("coordinator→etcd link dropped 4 × 0.8 s while 10 runs finish"):
        proxy = c.etcd_proxy
        for _ in range(4):
            await proxy.blip(0.8)
            # Up until the coordinator is back on the link: two drops, not one long one.
            accepted = proxy.connections
            await eventually(lambda: proxy.connections > accepted, 10, interval=0.01)
    await c.finish(timeout=60)
    await c.check()


@slow
@pytest.mark.timeout(180)
async def test_A_etcd_killed_a_few_chunks_before_the_end(fault_cluster: ClusterFactory) -> None:
    """etcd SIGKILL, restarted 2 s later, a few chunks before the runs end (session TTL 10 s:
    no session expires, every finishing write meets a dead store)."""
    c = await fault_cluster(session_ttl=10)
    runs = await c.start_runs(6, seconds=8, detached=1)
    await _near_end(c, runs, 6)
    async with c.fault("etcd SIGKILL a few chunks before the end, restarted once a run's log closed"):
        await asyncio.to_thread(c.etcd.kill)
        # Back once a run reached its end: its log is closed, its status write met the dead store.
        await eventually(lambda: any(r.reader is not None and r.reader.got.ended for r in runs), 60)
        await asyncio.to_thread(c.etcd.start)
    await c.finish(timeout=60)
    await c.check()


# --- B: a paused host wakes after its successors finished ---------------------------------------


@slow
@pytest.mark.timeout(300)
async def test_B_sigstopped_host_wakes_after_successors_finished(fault_cluster: ClusterFactory) -> None:
    """The driving host of 16 runs is frozen until its successors have finished them all;
    woken, it must not regress a saved transcript nor land anything after their fences."""
    c = await fault_cluster(hosts=1)
    runs = await c.start_runs(16, SHORT, seconds=10, detached=4)
    await c.add_host()
    await c.add_host()
    zombie = c.hosts[0]
    assert set((await c.drivers(runs)).values()) == {zombie.host_id}
    log_mark = len(zombie.log_text())
    async with c.fault(f"host {zombie.host_id} (driving 16 runs) SIGSTOP until they all ended elsewhere, SIGCONT"):
        zombie.sigstop()
        try:
            await c.finish(timeout=120)
        finally:
            zombie.sigcont()
    # Woken, the zombie finds its session gone and stops its drivers; whatever it wrote on
    # the way (log records, transcripts) is what the checks below must not see.
    await eventually(lambda: "lost" in zombie.log_text()[log_mark:], 30)
    await c.check(runs)


# --- C: a start is atomic ----------------------------------------------------------------------


def _told_why(refusals: list[tuple[int, str]]) -> None:
    for status, body in refusals:
        assert status >= 500 and body.strip(), f"a refused start must be a 5xx with a reason: {status} {body!r}"


@slow
@pytest.mark.timeout(240)
async def test_C_posts_while_nats_is_paused(fault_cluster: ClusterFactory) -> None:
    """nats-server frozen 8 s while 6 POSTs arrive: each either started with its input durable
    or was told (5xx with a reason) and its retry with the same run id converged to one run."""
    c = await fault_cluster()
    live = await c.start_runs(2, seconds=14)
    assert c.nats.proc is not None
    async with c.fault("nats-server SIGSTOP until each of 6 POSTs was refused once"):
        c.nats.proc.send_signal(signal.SIGSTOP)
        try:
            posted = await c.start_runs(6, SHORT, seconds=4, wait_started=False)
            # Frozen until the gateway has answered every POST (a 5xx: nothing can be stored).
            await eventually(lambda: all(r.reader is not None and r.reader.got.refusals for r in posted), 60)
        finally:
            c.nats.proc.send_signal(signal.SIGCONT)
    await c.finish()
    await c.check()
    for r in posted:
        assert r.reader is not None
        _told_why(r.reader.got.refusals)
    assert live


@slow
@pytest.mark.timeout(300)
async def test_C_gateway_killed_in_a_burst_of_posts(fault_cluster: ClusterFactory) -> None:
    """The gateway SIGKILLed 150 ms into a burst of 30 POSTs; every client re-sends its POST
    (same run id) until it reads the run: 30 runs, each started once, with its input."""
    c = await fault_cluster()
    assert c.gateway is not None
    async with c.fault("gateway SIGKILL once the first of a burst of 30 POSTs streams, restarted"):
        burst = await c.start_runs(30, CODEX, seconds=4, wait_started=False)
        # Mid-burst: one run started, the others' POSTs still being served.
        await eventually(lambda: any(r.reader is not None and r.reader.first_chunk.is_set() for r in burst),
                         60, interval=0.005)
        await c.gateway.kill()
        await c.gateway.start()
    await c.finish(timeout=240)
    await c.check()
    for r in burst:
        assert r.reader is not None
        _told_why(r.reader.got.refusals)


# --- D: the JetStream store fills up -----------------------------------------------------------


@pytest.fixture
def small_tmpfs(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A 64 MB tmpfs (root only)."""
    mnt = tmp_path / "js-store"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)], capture_output=True, text=True)
    # Skipped where the machine cannot mount (not root, no tmpfs); under CI=true that fails.
    require(r.returncode == 0, f"cannot mount a 64 MB tmpfs for the full-disk case: {r.stderr.strip() or r.returncode}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: pathlib.Path) -> int:
    """Write zeros to ``path`` until the file system is full; returns the bytes written."""
    n = 0
    block = b"\0" * (1 << 20)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(block)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                break
        # The last partial block: fill to the byte.
        for size in (1 << 16, 1 << 12, 1 << 8, 1):
            while True:
                try:
                    n += f.write(b"\0" * size)
                except OSError:
                    break
    return n


_CAUSE = re.compile(r"storage|disk|space|full|insufficient", re.I)


def _names_cause(got: Any) -> bool:
    texts = got.comments + [str(c) for _, c, _ in got.items if c.get("type") in ("CUSTOM", "RUN_ERROR")]
    return any(_CAUSE.search(t) for t in texts)


@slow
@pytest.mark.timeout(300)
async def test_D_jetstream_store_full_then_freed(fault_cluster: ClusterFactory, small_tmpfs: pathlib.Path) -> None:
    """The JetStream store (a 64 MB tmpfs) fills mid-run and is freed 15 s later (the issue's
    ~56 s, shortened). Readers are told why, a new POST gets a 503 naming the cause, hosts back
    off instead of handing runs around, nothing is lost, runs go on once there is room.

    nats-server is restarted once the store is freed: after ENOSPC (the disk itself full, not
    ``max_file_store`` reached) JetStream stops answering stores to that stream and freeing
    the disk is not enough (docs/operating-nats.md, measured with nats-server 2.15)."""
    c = await fault_cluster(nats_store=small_tmpfs)
    runs = await c.start_runs(4, seconds=24, detached=1)
    await c.wait_progress(runs, 15)
    epochs = {r.run_id: (await c.view(r.run_id)).get("epoch") for r in runs}
    refused = c.new_run(CODEX, seconds=3)
    filler = small_tmpfs / "filler"
    async with c.fault("JetStream store (64 MB tmpfs) full for 15 s"):
        t_full = time.monotonic()
        await asyncio.to_thread(_fill, filler)
        # nats-server still acknowledges stores for a few seconds after ENOSPC (the block
        # cache): first every reader is told, then a new POST must be refused.
        await eventually(lambda: all(_names_cause(r.reader.got) for r in runs if not r.detached), 60)  # type: ignore[union-attr]
        try:
            # Streamed: a 200 would be an SSE stream that never ends while the store is full.
            async with c.http.stream("POST", f"{c.url}/api/chat", json=refused.body,
                                     headers={"X-Run-Id": refused.run_id}, timeout=15) as resp:
                body = (await resp.aread()).decode(errors="replace") if resp.status_code != 200 else ""
        except httpx.TimeoutException as exc:
            raise AssertionError("a POST while the store is full was not answered within 15 s") from exc
        assert resp.status_code == 503 and _CAUSE.search(body), (resp.status_code, body)
        await asyncio.sleep(max(0.0, t_full + 15 - time.monotonic()))
        filler.unlink()
        await asyncio.to_thread(c.nats.restart)  # see the docstring
    refused.reader = Reader(c.http, c.url, refused).start()
    await c.finish(timeout=180)
    await c.check()
    for r in runs:
        assert (await c.view(r.run_id)).get("epoch", 0) <= (epochs[r.run_id] or 1) + 1, \
            f"{r.run_id}: handed around while the store was full"


# --- E: the leader spreads orphaned runs -------------------------------------------------------


@slow
@pytest.mark.timeout(240)
async def test_E_orphans_spread_over_hosts(fault_cluster: ClusterFactory) -> None:
    """etcd frozen 10 s: every session is lost. The leader hands the 8 orphaned runs over to
    the hosts with room, not all to one."""
    c = await fault_cluster()
    runs = await c.start_runs(8, seconds=30, detached=2)
    await c.wait_progress(runs, 10)
    before = {r.run_id: (await c.view(r.run_id)).get("epoch", 0) for r in runs}
    assert c.etcd.proc is not None
    async with c.fault("etcd SIGSTOP until every host lost its session"):
        c.etcd.proc.send_signal(signal.SIGSTOP)
        try:
            await eventually(lambda: all("lost; stopping drivers" in h.log_text() for h in c.hosts), 60)
        finally:
            c.etcd.proc.send_signal(signal.SIGCONT)

    async def handed_over() -> dict[str, str]:
        out = {}
        for r in runs:
            v = await c.view(r.run_id)
            assert v.get("claimed") and v.get("epoch", 0) > before[r.run_id], (r.run_id, v)
            out[r.run_id] = v["driverHost"]
        return out
    owners = await eventually(handed_over, 60)
    assert len(set(owners.values())) > 1, f"every orphan went to one host: {owners}"
    await c.finish()
    await c.check()
